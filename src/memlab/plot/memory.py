"""Figures of chapter 1: bytes per parameter against rules of thumb, the estimator's errors."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, style


def bytes_per_param(curves: dict, rules: dict | None = None, title: str | None = None):
    """Peak bytes per parameter against tokens per step, with rules of thumb as lines (chapter: 1).

    ``curves`` maps a label to ``(tokens, bytes_per_param)`` sequences; ``rules`` maps a label
    to a constant bytes-per-parameter value.
    """
    style()
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for label, (tokens, bpp) in curves.items():
        ax.plot(tokens, bpp, marker="o", ms=3, label=label)
    for i, (label, value) in enumerate((rules or {}).items()):
        ax.axhline(value, color="0.4", ls=("--", ":", "-.")[i % 3], lw=1)
        ax.annotate(label, (1, value), xycoords=("axes fraction", "data"), xytext=(-4, 2),
                    textcoords="offset points", ha="right", fontsize=8, color="0.3")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = [8, 16, 24, 40, 80, 160, 320, 640]
    top = max(max(b) for _, b in curves.values())
    ax.set_yticks([t for t in ticks if t <= 2 * top], [str(t) for t in ticks if t <= 2 * top])
    ax.minorticks_off()
    ax.set_xlabel("tokens per step (batch x sequence)")
    ax.set_ylabel("peak bytes per parameter (log scale)")
    ax.legend(loc="upper left")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)


def error_histogram(errors: list[float], limit: float = 0.03, title: str | None = None):
    """Histogram of relative errors (estimate / measurement - 1) with the tolerance marked (chapter: 1)."""
    style()
    fig, ax = plt.subplots(figsize=(7.0, 3.0))
    pct = [100 * e for e in errors]
    ax.hist(pct, bins=30, color=CATEGORY_COLORS["parameters"])
    for x in (-100 * limit, 100 * limit):
        ax.axvline(x, color="0.3", ls="--", lw=1)
    ax.set_xlabel("peak: estimate / trace - 1 (%)")
    ax.set_ylabel("configurations")
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)


def ratio_heatmap(ratios, *, title: str | None = None, center: float = 1.0,
                  label: str = "ratio", fmt: str = "{:.2f}", marks: dict | None = None):
    """A table of ratios as a heat map, each cell annotated (chapter: 1).

    Colours diverge around ``center``.

    ``ratios`` is a pandas DataFrame (rows x columns of floats). ``marks`` maps a label to a
    predicate on a cell's value, e.g. ``{"✓": lambda r: r <= 1}``: cells where it holds get
    the label (a short symbol such as "✓") beside the number.
    """
    import numpy as np
    from matplotlib.colors import LogNorm

    style()
    values = ratios.to_numpy(dtype=float)
    n_rows, n_cols = values.shape
    fig, ax = plt.subplots(figsize=(2.5 + 1.1 * n_cols, 2.2 + 0.35 * n_rows))
    finite = values[np.isfinite(values) & (values > 0)]
    spread = max(float(np.max(np.abs(np.log(finite / center)))), 1e-3) if finite.size else 1.0
    norm = LogNorm(vmin=center * np.exp(-spread), vmax=center * np.exp(spread))
    image = ax.imshow(values, cmap="RdBu_r", norm=norm, aspect="auto")
    for i in range(n_rows):
        for j in range(n_cols):
            v = values[i, j]
            tag = "".join(f" {k}" for k, test in (marks or {}).items() if test(v))
            ax.text(j, i, fmt.format(v) + tag, ha="center", va="center", fontsize=7,
                    color="white" if abs(np.log(v / center)) > 0.6 * spread else "black")
    ax.set_xticks(range(n_cols), [str(c) for c in ratios.columns], rotation=30, ha="right",
                  fontsize=8)
    ax.set_yticks(range(n_rows), [str(r) for r in ratios.index], fontsize=8)
    ax.grid(False)
    fig.colorbar(image, ax=ax, label=label, fraction=0.04, pad=0.02)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)
