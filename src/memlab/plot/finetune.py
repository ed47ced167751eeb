"""Figures of chapter 5: the LoRA update drawn to shape, memory by fine-tuning set-up, LoRA at long
context, and which GPU fits which set-up."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.errors import check_choice
from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, CATEGORY_LABELS, MAX_FIGURE_WIDTH_IN, style
from memlab.units import UNITS

SETUP_COLORS = {"full": "tab:red", "LoRA": "tab:blue", "share": "tab:purple"}


def lora_diagram(in_features: int = 4096, out_features: int = 4096, r: int = 8,
                 title: str | None = None):
    """The frozen weight W (out x in) beside the update B (out x r) times A (r x in) (chapter: 5).

    With their parameter counts.

    The rank is drawn wider than to scale (at least a tenth of W's side), so that B and A stay
    visible; the counts in the labels are exact.
    """
    import matplotlib.patches as patches

    style()
    side = 4.0  # W's drawn height and width
    w = side * in_features / max(in_features, out_features)
    h = side * out_features / max(in_features, out_features)
    thin = max(side * r / max(in_features, out_features), 0.4)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.add_patch(patches.Rectangle((0, 0), w, h, facecolor="0.82", edgecolor="0.3"))
    ax.text(w / 2, h / 2, f"W (frozen)\n{out_features:,} x {in_features:,}\n"
            f"{out_features * in_features:,} weights", ha="center", va="center", fontsize=9)
    x = w + 0.5
    ax.text(x + 0.55, h / 2, "+  α/r  x", ha="center", va="center", fontsize=13)
    x += 1.4
    ax.add_patch(patches.Rectangle((x, 0), thin, h, facecolor="#F2B8A0", edgecolor="0.3"))
    ax.text(x + thin / 2, -0.25, f"B: {out_features:,} x {r}\n(starts at 0)", ha="center",
            va="top", fontsize=8)
    x += thin + 0.3
    ax.text(x + 0.1, h - thin / 2, "·", ha="center", va="center", fontsize=18)
    x += 0.4
    ax.add_patch(patches.Rectangle((x, h - thin), w, thin, facecolor="#A8C8E8", edgecolor="0.3"))
    ax.text(x + w / 2, h - thin - 0.2, f"A: {r} x {in_features:,}", ha="center", va="top",
            fontsize=8)
    ax.text(x + w / 2, h / 2 - 0.6, f"trainable: r x (in + out)\n= {r * (in_features + out_features):,}"
            f" weights\n({r * (in_features + out_features) / (in_features * out_features):.2%}"
            " of W)", ha="center", va="center", fontsize=9)
    ax.set_xlim(-0.2, x + w + 0.2)
    ax.set_ylim(-1.2, h + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"LoRA: W + (α/r) B A, rank r = {r} (r drawn wider than to scale)",
                 fontsize=10)
    fig.tight_layout()
    trainable = r * (in_features + out_features)
    return describe(fig, (
        f"Diagram of LoRA: the frozen weight W, {out_features:,} x {in_features:,} "
        f"({out_features * in_features:,} weights), plus alpha/r times B ({out_features:,} x {r}, "
        f"starting at 0) times A ({r} x {in_features:,}); B and A hold {trainable:,} trainable "
        f"weights, {trainable / (in_features * out_features):.2%} of W"))


def memory_by_setup(comparison, unit: str | None = None, title: str | None = None):
    """Bytes by category at each set-up's measured peak, one stacked bar per set-up (chapter: 5).

    ``comparison`` is a :class:`memlab.finetune.FinetuneComparison`; each bar's top is the
    set-up's peak, labelled with its ratio to the first set-up's (full fine-tuning).
    """
    style()
    rows = list(comparison.rows)
    peak = max((r.peak_bytes for r in rows), default=0)
    unit = unit or ("GiB" if peak >= 2**30 else "MiB")
    scale = UNITS[check_choice("unit", unit, UNITS)]
    narrow = len(rows) <= 6  # at the column's width, the legend below
    fig, ax = plt.subplots(figsize=(MAX_FIGURE_WIDTH_IN, 5.4) if narrow else
                           (1.3 * len(rows) + 2.5, 4.2))
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    for cat, color in CATEGORY_COLORS.items():
        vals = [r.categories.get(cat, 0) / scale for r in rows]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, width=0.7, color=color, label=CATEGORY_LABELS[cat])
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    ref = rows[0].peak_bytes if rows else 1
    for x, r, top in zip(xs, rows, bottom, strict=True):
        ax.annotate(f"{top:,.1f}\nx{r.peak_bytes / ref:.2f}", (x, top), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [f"{r.name}\n{r.trainable_parameters:,} trainable" for r in rows],
                  fontsize=7)
    ax.set_ylabel(f"bytes at the step's peak ({unit})")
    ax.set_ylim(0, max(bottom, default=1) * 1.18)
    if narrow:
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    else:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title or f"One fine-tuning step by set-up, measured on {comparison.device}",
                 fontsize=10)
    fig.tight_layout()
    return describe(fig, "Peak of one fine-tuning step by set-up: " + "; ".join(
        f"{r.name} {r.peak_bytes / scale:,.1f} {unit} ({r.peak_bytes / ref:.2f}x the first)"
        for r in rows))


def lora_context(sweep, title: str | None = None):
    """Full fine-tuning's and LoRA's peaks against T (chapter: 5).

    And LoRA over full with the activations' share.

    ``sweep`` is a :class:`memlab.finetune.plan.ContextSweep`.
    """
    style()
    rows = sorted(sweep.rows, key=lambda r: r.seq_len)
    Ts = [r.seq_len for r in rows]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(MAX_FIGURE_WIDTH_IN, 6.8), sharex=True)
    ax.semilogx(Ts, [r.full_peak_bytes / 2**30 for r in rows], "o-", base=2,
                color=SETUP_COLORS["full"], label="full fine-tuning")
    ax.semilogx(Ts, [r.lora_peak_bytes / 2**30 for r in rows], "s-", base=2,
                color=SETUP_COLORS["LoRA"], label="LoRA r=8 on q, v")
    ax.semilogx(Ts, [r.lora_activation_bytes / 2**30 for r in rows], "s:", base=2,
                color=SETUP_COLORS["LoRA"], label="of which LoRA's saved activations")
    ax.set_ylabel("estimated peak (GiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    ax2.semilogx(Ts, [r.lora_over_full for r in rows], "o-", base=2, color=SETUP_COLORS["LoRA"],
                 label="LoRA's peak / full's")
    ax2.semilogx(Ts, [r.activation_share for r in rows], "s--", base=2,
                 color=SETUP_COLORS["share"], label="saved activations / LoRA's peak")
    ax2.set_xlabel("sequence length T")
    ax2.set_ylabel("ratio")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=9)
    fig.suptitle(title or f"{sweep.model}, batch {sweep.batch_size}: LoRA against full\n"
                 "fine-tuning as the context grows (estimated)", fontsize=10)
    fig.tight_layout()
    first, last = rows[0], rows[-1]
    return describe(fig, (
        f"LoRA's estimated peak over full fine-tuning's goes from {first.lora_over_full:.2f} at "
        f"T = {first.seq_len:,} to {last.lora_over_full:.2f} at T = {last.seq_len:,}; saved "
        f"activations are {first.activation_share:.0%} of LoRA's peak at first and "
        f"{last.activation_share:.0%} at the end"))


def fit_grid(fit, title: str | None = None):
    """Estimated peak (GiB) of each model and set-up, checkpointing off and on (chapter: 5).

    With the smallest GPU that fits.

    ``fit`` is a :class:`memlab.finetune.plan.FitTable`; colour is the peak on a log scale.
    """
    import numpy as np
    from matplotlib.colors import LogNorm

    style()
    keys = list(dict.fromkeys((r.model, r.setup) for r in fit.rows))
    ckpts = sorted({r.checkpointing for r in fit.rows})
    values = np.full((len(keys), len(ckpts)), np.nan)
    labels = [["" for _ in ckpts] for _ in keys]
    for r in fit.rows:
        i, j = keys.index((r.model, r.setup)), ckpts.index(r.checkpointing)
        values[i, j] = r.peak_bytes / 2**30
        labels[i][j] = f"{values[i, j]:,.0f} GiB: {fit.smallest_gpu(r) or 'none fits'}"
    fig, ax = plt.subplots(figsize=(7.5, 1.6 + 0.32 * len(keys)))
    finite = values[np.isfinite(values)]
    image = ax.imshow(values, cmap="viridis_r", aspect="auto",
                      norm=LogNorm(vmin=finite.min(), vmax=finite.max()))
    mid = np.sqrt(finite.min() * finite.max())
    for i in range(len(keys)):
        for j in range(len(ckpts)):
            ax.text(j, i, labels[i][j], ha="center", va="center", fontsize=7,
                    color="white" if values[i, j] > mid else "black")
    ax.set_xticks(range(len(ckpts)), ["checkpointing" if c else "no checkpointing"
                                      for c in ckpts], fontsize=8)
    ax.set_yticks(range(len(keys)), [f"{m}, {s}" for m, s in keys], fontsize=8)
    for i in range(1, len(keys)):
        if keys[i][0] != keys[i - 1][0]:
            ax.axhline(i - 0.5, color="white", lw=2)
    ax.grid(False)
    fig.colorbar(image, ax=ax, label="estimated peak (GiB)", fraction=0.04, pad=0.02)
    ax.set_title(title or f"Batch {fit.batch_size} x {fit.seq_len} tokens: estimated peak and "
                 "the smallest GPU that fits", fontsize=10)
    fig.tight_layout()
    return describe(fig)
