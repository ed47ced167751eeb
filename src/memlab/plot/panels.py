"""What the figures of chapter 7 share: one-panel and several-panel axes, titles wrapped to
their width, units, plain log ticks, labels that keep clear of each other, and the colours of
measured, estimated and counted numbers (chapter: 7)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from memlab.errors import MemlabError, check_choice
from memlab.units import UNITS

MEASURED_COLOR, ESTIMATED_COLOR, COUNTED_COLOR = "tab:blue", "black", "0.55"


def check_type(obj, cls: type, what: str):
    """``obj`` if it is a ``cls``, else a one-line MemlabError (chapter: 7).

    Figures take the dataclass only.
    """
    if isinstance(obj, cls):
        return obj
    raise MemlabError(f"{what} must be {_a(cls.__name__)}, got {type(obj).__name__}")


def _a(name: str) -> str:
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def pick_unit(unit: str | None, largest: float) -> tuple[str, int]:
    """``unit`` (GiB from 1 GiB up, else MiB, when None) and its bytes (chapter: 7)."""
    unit = unit or ("GiB" if largest >= 2**30 else "MiB")
    return unit, UNITS[check_choice("unit", unit, UNITS)]


def one_ax(ax, figsize: tuple[float, float]):
    """(figure, axes, whether this call made the figure) (chapter: 7)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax, True
    if not isinstance(ax, Axes):
        raise MemlabError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__}")
    return ax.figure, ax, False


def many_axes(axes, n: int, figsize: tuple[float, float]):
    """(figure, list of n axes, whether this call made the figure) (chapter: 7).

    Axes this call makes are stacked, one above the other, so the figure reads at the column's
    width (:data:`memlab.plot.style.MAX_FIGURE_WIDTH_IN`).
    """
    if axes is None:
        fig, made = plt.subplots(n, 1, figsize=figsize, squeeze=False)
        return fig, list(made[:, 0]), True
    flat = list(np.ravel(np.asarray(axes, dtype=object))) if not isinstance(axes, Axes) \
        else [axes]
    if len(flat) != n or not all(isinstance(a, Axes) for a in flat):
        raise MemlabError(f"axes must be {n} matplotlib Axes or None, got "
                          f"{len(flat)} of {', '.join(sorted({type(a).__name__ for a in flat}))}")
    return flat[0].figure, flat, False


def finish(fig, made: bool, title: str | None, default: str, ax: Axes | None = None) -> None:
    """The figure's title (on ``ax`` for one panel, else above all) and its layout (chapter: 7).

    A given ``title`` is set as it is; the ``default`` is wrapped to the width it sits over. On
    axes the caller made, a several-panel figure gets no title above all unless one is given.
    """
    if made:
        fig.tight_layout()
    if title is None:
        width = fig.get_figwidth() * (ax.get_position().width if ax is not None else 1.0)
        title = textwrap.fill(" ".join(default.split()), max(30, int(width * 72 / 6.5)))
    elif ax is None and not made:
        fig.suptitle(title, fontsize=10)
        return
    if ax is not None:
        ax.set_title(title, fontsize=10)
    elif made:
        fig.suptitle(title, fontsize=10)
    if made:
        fig.tight_layout()


def plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2 and 5 times the powers of ten, written as plain numbers (chapter: 7)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def label_points(ax, points: Sequence[tuple[float, float, str]], color, min_px: float = 11.0,
                  taken: list | None = None) -> list:
    """Annotate points (x, y, text), leaving out a label closer than ``min_px`` to one placed (chapter: 7)."""
    taken = [] if taken is None else taken
    for x, y, text in points:
        px, py = ax.transData.transform((x, y))
        if any(math.hypot(px - qx, py - qy) < min_px for qx, qy in taken):
            continue
        taken.append((px, py))
        ax.annotate(text, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7,
                    color=color)
    return taken
