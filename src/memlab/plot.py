"""All of the book's figures: one house style, no experiments inside.

Functions take results (dataclasses or the dicts stored in records) and return a
matplotlib ``Figure``; they never measure anything themselves.
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt

from memlab.errors import check_choice
from memlab.units import UNITS

# One colour per memory category, used on every page.
CATEGORY_COLORS = {
    "parameters": "#4C72B0",
    "gradients": "#DD8452",
    "optimizer_states": "#55A868",
    "activations": "#C44E52",
    "temporaries": "#8172B3",
    "other": "#937860",
}
CATEGORY_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "activations": "activations",
    "temporaries": "temporaries",
    "other": "other",
}


def style() -> None:
    """Apply the book's matplotlib style (chapter: all)."""
    plt.rcParams.update({
        "figure.figsize": (7.0, 3.6),
        "figure.dpi": 110,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.titlesize": 11,
        "axes.titleweight": "bold",
        "legend.frameon": False,
        "font.size": 10,
    })


def _as_dict(result) -> dict:
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    return dict(result)


def step_breakdown(results: dict, unit: str = "GiB", title: str | None = None):
    """Stacked bars of memory by category, one bar per labeled result, total at its end (chapter: 0)."""
    style()
    scale = UNITS[check_choice("unit", unit, UNITS)]
    labels = list(results)
    rows = [_as_dict(results[k]) for k in labels]
    fig, ax = plt.subplots(figsize=(8.0, 1.2 + 0.55 * len(labels)))
    left = [0.0] * len(labels)
    for cat, color in CATEGORY_COLORS.items():
        vals = [row.get(f"{cat}_bytes", 0) / scale for row in rows]
        if not any(vals):
            continue
        ax.barh(labels, vals, left=left, color=color, label=CATEGORY_LABELS[cat])
        left = [a + b for a, b in zip(left, vals, strict=True)]
    for i, total in enumerate(left):
        ax.annotate(f"{total:,.2f} {unit}", (total, i), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=9)
    ax.set_xlabel(f"bytes alive ({unit})")
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.2 if max(left) > 0 else 1)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def step_phases(step, unit: str | None = None, title: str | None = None):
    """One stacked bar per phase of a step (forward, backward, optimizer) at that phase's peak (chapter: 0)."""
    d = _as_dict(step)
    rows = {f"{phase} peak": {f"{c}_bytes": v for c, v in cats.items()}
            for phase, cats in d["phase_breakdown"].items()}
    unit = unit or ("GiB" if d["peak_bytes"] >= 2**30 else "MiB")
    return step_breakdown(rows, unit=unit, title=title)


def compare_phases(results: dict, unit: str | None = None, title: str | None = None):
    """Phase-by-phase bars of several results (estimate, trace, measurement) one above the other (chapter: 1)."""
    rows = {}
    peak = 0
    for label, res in results.items():
        d = _as_dict(res)
        peak = max(peak, d["peak_bytes"])
        for phase, cats in d["phase_breakdown"].items():
            rows[f"{label}: {phase}"] = {f"{c}_bytes": v for c, v in cats.items()}
    unit = unit or ("GiB" if peak >= 2**30 else "MiB")
    return step_breakdown(rows, unit=unit, title=title)


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
