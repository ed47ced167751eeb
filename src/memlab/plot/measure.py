"""Figures of chapter 0 (and 1): a step's bytes by category and by phase."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.errors import check_choice
from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, CATEGORY_LABELS, as_dict, style
from memlab.units import UNITS


def _at_peak(d: dict) -> dict:
    """A result's categories at its peak as ``<category>_bytes``; a row of them passes through."""
    if "phase_breakdown" not in d:
        return d
    return {f"{c}_bytes": v for c, v in d["phase_breakdown"][d["peak_phase"]].items()}


def step_breakdown(results: dict, unit: str = "GiB", title: str | None = None):
    """Stacked bars of memory by category, one bar per labeled result, total at its end (chapter: 0).

    ``results`` maps a label to a result of a step (a :class:`~memlab.measure.step.StepMemory`,
    a :class:`~memlab.memory.MemoryEstimate`), drawn at its peak, or to a row of
    ``<category>_bytes`` fields.
    """
    return _category_bars({k: _at_peak(as_dict(v)) for k, v in results.items()}, unit, title)


def _category_bars(bars: dict[str, dict], unit: str, title: str | None):
    """One stacked bar per label from its ``{'<category>_bytes': bytes}``."""
    style()
    scale = UNITS[check_choice("unit", unit, UNITS)]
    labels = list(bars)
    rows = [bars[k] for k in labels]
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
    return describe(fig)


def step_phases(step, unit: str | None = None, title: str | None = None):
    """One stacked bar per phase of a step at that phase's peak (chapter: 0).

    The phases are forward, backward and optimizer.
    """
    d = as_dict(step)
    rows = {f"{phase} peak": {f"{c}_bytes": v for c, v in cats.items()}
            for phase, cats in d["phase_breakdown"].items()}
    unit = unit or ("GiB" if d["peak_bytes"] >= 2**30 else "MiB")
    return _category_bars(rows, unit, title)


def compare_phases(results: dict, unit: str | None = None, title: str | None = None):
    """Phase-by-phase bars of several results one above the other (chapter: 1).

    The results are an estimate, a trace, a measurement.
    """
    rows = {}
    peak = 0
    for label, res in results.items():
        d = as_dict(res)
        peak = max(peak, d["peak_bytes"])
        for phase, cats in d["phase_breakdown"].items():
            rows[f"{label}: {phase}"] = {f"{c}_bytes": v for c, v in cats.items()}
    unit = unit or ("GiB" if peak >= 2**30 else "MiB")
    return _category_bars(rows, unit, title)
