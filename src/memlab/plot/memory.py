"""Figures of chapter 1: bytes per parameter against rules of thumb, the estimator's errors."""

from __future__ import annotations

import matplotlib.pyplot as plt

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
    return fig


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
    return fig
