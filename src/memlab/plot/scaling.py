"""Figure of chapter 7's scaling law: held-out loss against tokens with the fitted law, the
compute-optimal model size of the grid's fits, and the quoted fits over their own range.

It takes a :class:`memlab.compute.grid.ScalingGrid` (the dataclass; a record's is
``Record.value()``) and returns the ``Figure``; what it computes itself is a fitted law's
compute-optimal split.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np

from memlab.compute.grid import (
    ScalingGrid,
)
from memlab.compute.scaling import (
    CHINCHILLA_FLOPS_QUOTED,
    CHINCHILLA_PARAMS_QUOTED,
    HOFFMANN_URL,
    PUBLISHED,
    budget_key,
    compute_optimal,
    n_opt_exponent,
)
from memlab.errors import MemlabError
from memlab.plot.alt import describe
from memlab.plot.panels import (
    check_type,
    finish,
    many_axes,
)
from memlab.plot.style import MAX_FIGURE_WIDTH_IN, style

HOFFMANN_PARAMS_RANGE_QUOTED = (70e6, 16e9)
"""Smallest and largest parameter counts Hoffmann et al. 2022 trained ("from 70 million to over
16 billion parameters", the abstract of arXiv:2203.15556, :data:`HOFFMANN_RANGE_SOURCE`): the
range a quoted fit's N_opt(C) is drawn solid over (chapter: 7)."""
HOFFMANN_RANGE_SOURCE = HOFFMANN_URL


# 7. The scaling law --------------------------------------------------------------------------


def _n_opt_line(ax, fit, flops: np.ndarray, **kw) -> bool:
    """N_opt(C) of a law over ``flops``; False where the law has no optimum."""
    try:
        ns = [compute_optimal(fit, float(c)).n_opt for c in flops]
        a = n_opt_exponent(fit)
    except MemlabError:
        return False
    ax.plot(flops, ns, label=f"{kw.pop('label')}: N_opt ~ C^{a:.2f}", **kw)
    return True


def scaling_fit(grid, axes=None, title: str | None = None):
    """Held-out loss against tokens with the E-free fit, and compute-optimal N (chapter: 7).

    The grid's compute-optimal N against C; the quoted fits' N_opt(C) in a panel of their own.

    ``grid`` is a :class:`memlab.compute.grid.ScalingGrid`; the panels are stacked. Top: the measured held-out loss
    of every run (one colour per model size) against its tokens, the E-free fit of L(N, D) as
    lines, the task's entropy (exact) dashed and the fitted E dotted with its bootstrap
    interval shaded. Middle: N_opt(C) of both fits (E free, E fixed to the entropy) over the
    grid's FLOPs, the grid's budgets marked with their bootstrap intervals, the runs as grey
    dots. Bottom: the quoted fits (:data:`memlab.compute.scaling.PUBLISHED`), solid where their
    N_opt lies inside the parameter range Hoffmann et al. trained
    (:data:`HOFFMANN_PARAMS_RANGE_QUOTED`), dashed on to Chinchilla's quoted budget, Chinchilla
    itself marked.

    The quoted fits get a panel of their own, not the middle one's axes: their budgets lie
    about fourteen decades of FLOPs above the grid's and their losses are of another task and
    tokenizer, so on one axis only the slopes (the exponents in the legends) would compare, and
    a shared line would read as an extrapolation from one to the other.
    """
    grid = check_type(grid, ScalingGrid, "grid")
    runs = list(grid.runs)
    if not runs:
        raise MemlabError("scaling_fit needs a grid with at least one run")
    free, fixed = grid.fit_free, grid.fit_fixed
    entropy = grid.entropy_nats
    style()
    fig, (ax, ax2, ax3), made = many_axes(axes, 3, (MAX_FIGURE_WIDTH_IN, 12.6))

    # Top: loss against tokens.
    sizes = sorted({r.n_params for r in runs})
    cmap = plt.get_cmap("viridis")
    tokens = np.array([r.tokens for r in runs], dtype=np.float64)
    dense = np.geomspace(tokens.min(), tokens.max(), 64)
    for i, n in enumerate(sizes):
        color = cmap(0.1 + 0.75 * i / max(1, len(sizes) - 1))
        sel = sorted((r for r in runs if r.n_params == n), key=lambda r: r.tokens)
        ax.plot([r.tokens for r in sel], [r.loss for r in sel], linestyle="none",
                marker="o", color=color, label=f"N = {n:,}, measured")
        ax.plot(dense, free.predict(np.full_like(dense, n), dense), "-", color=color, lw=1.2)
    ax.axhline(entropy, color="black", linestyle="--", lw=1,
               label=f"task entropy {entropy:.3f} nats (exact)")
    lo, hi = grid.boot_free.intervals["E"]
    ax.axhline(free.E, color="0.4", linestyle=":", lw=1.2,
               label=f"fitted E {free.E:.3f} [{lo:.3f}, {hi:.3f}]")
    if math.isfinite(lo) and math.isfinite(hi):
        ax.axhspan(lo, hi, color="0.5", alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_xlabel("tokens seen in training D")
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title("loss against tokens; lines: the E-free fit", fontsize=9)
    ax.legend(fontsize=9)

    # Middle: the grid's fits, compute-optimal N against C.
    flops = np.array([r.flops for r in runs], dtype=np.float64)
    span = np.geomspace(flops.min(), flops.max(), 64)
    ax2.plot(flops, [r.n_params for r in runs], linestyle="none", marker=".",
             color="0.7", label="runs of the grid")
    missing = []
    for fit, boot_key, opt_key, label, color in (
            (free, "boot_free", "optimal_free", "E free", "tab:blue"),
            (fixed, "boot_fixed", "optimal_fixed", "E fixed to the entropy", "tab:red")):
        if not _n_opt_line(ax2, fit, span, color=color, label=label):
            missing.append(label)
            continue
        opts = list(getattr(grid, opt_key))
        intervals = getattr(grid, boot_key).intervals
        cs = [o.flops for o in opts]
        ns = [o.n_opt for o in opts]
        bands = [intervals.get(budget_key("n_opt", c), (math.nan, math.nan)) for c in cs]
        err = np.array([[max(n - b[0], 0.0) if math.isfinite(b[0]) else 0.0 for n, b in
                         zip(ns, bands, strict=True)],
                        [max(b[1] - n, 0.0) if math.isfinite(b[1]) else 0.0 for n, b in
                         zip(ns, bands, strict=True)]])
        if cs:
            ax2.errorbar(cs, ns, yerr=err, linestyle="none", marker="o", markersize=4,
                         color=color, capsize=3)
    if missing:
        ax2.text(0.02, 0.98, "no optimum: " + ", ".join(missing), transform=ax2.transAxes,
                 va="top", fontsize=8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("compute budget C = 6ND (FLOPs)")
    ax2.set_ylabel("compute-optimal parameters N_opt")
    ax2.set_title("this grid's fits (bars: bootstrap intervals)", fontsize=9)
    ax2.legend(fontsize=9)

    # Bottom: the quoted fits over their own range.
    n_lo, n_hi = HOFFMANN_PARAMS_RANGE_QUOTED
    for i, law in enumerate(PUBLISHED.values()):
        a = n_opt_exponent(law)
        g = compute_optimal(law, 6.0).n_opt  # N_opt at C = 6, i.e. C / 6 = 1: the constant G
        c_lo, c_hi = 6 * (n_lo / g) ** (1 / a), 6 * (n_hi / g) ** (1 / a)
        color = f"C{i + 2}"
        inside = np.geomspace(c_lo, c_hi, 32)
        _n_opt_line(ax3, law, inside, color=color, label=f"{law.name} ({law.label})")
        if c_hi < CHINCHILLA_FLOPS_QUOTED:
            beyond = np.geomspace(c_hi, CHINCHILLA_FLOPS_QUOTED, 16)
            ax3.plot(beyond, [compute_optimal(law, float(c)).n_opt for c in beyond], "--",
                     color=color, lw=1)
    ax3.plot([CHINCHILLA_FLOPS_QUOTED], [CHINCHILLA_PARAMS_QUOTED], linestyle="none", marker="*",
             markersize=11, color="black", label="Chinchilla (quoted)")
    ax3.set_xscale("log")
    ax3.set_yscale("log")
    ax3.set_xlabel("compute budget C (FLOPs)")
    ax3.set_ylabel("compute-optimal parameters N_opt")
    ax3.set_title("quoted fits (dashed: past the sizes they trained)", fontsize=9)
    ax3.legend(fontsize=9, loc="upper left")
    finish(fig, made, title, (
        f"A scaling law fitted on {len(runs)} runs measured on {grid.device}, beside "
        "the quoted fits"))
    slopes = []
    for fit, label in ((free, "E free"), (fixed, "E fixed to the entropy")):
        try:
            slopes.append(f"C^{n_opt_exponent(fit):.2f} ({label})")
        except MemlabError:
            slopes.append(f"no optimum ({label})")
    quoted = ", ".join(f"{law.name} C^{n_opt_exponent(law):.2f}" for law in PUBLISHED.values())
    return describe(fig, (
        f"{len(runs)} runs of {len(sizes)} model sizes: held-out loss falls from "
        f"{max(r.loss for r in runs):.3f} to {min(r.loss for r in runs):.3f} nats; the fitted "
        f"E is {free.E:.3f} [{lo:.3f}, {hi:.3f}] against the task's exact entropy "
        f"{entropy:.3f}; the compute-optimal size grows as " + " and ".join(slopes)
        + f"; the quoted fits: {quoted}"))
