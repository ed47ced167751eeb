"""What a figure shows, in words: its alt text, computed from what it drew (chapter: all).

Every figure of the book states what it shows. A plot function may add its own sentence (the
point of the figure, with numbers from its data) with :func:`describe`; :func:`figure_alt` adds
to it what every figure's axes hold: the kind of chart, its titles, what each axis measures and
over which range of the data drawn, and the series in its legend. In a notebook the figure's PNG
carries that text twice: in its output metadata (``{"image/png": {"alt": ...}}``) and in the
PNG itself (its ``Description``), where the book's build reads it into the page's ``<img alt>``.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection, QuadMesh
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

ALT_ATTR = "_memlab_alt"  # where describe() keeps a figure's own sentence
MAX_SERIES = 6  # legend entries named per panel; more are counted


def describe(fig: Figure, text: str = "") -> Figure:
    """Store what ``fig`` shows, one or more sentences computed from its data (chapter: all).

    The sentence comes first in the figure's alt text (:func:`figure_alt`). Returns ``fig``.
    """
    text = " ".join(str(text).split())
    if text and text[-1] not in ".!?":
        text += "."
    setattr(fig, ALT_ATTR, text)
    register_png_alt()
    return fig


def _num(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
        return f"{v:.2g}"
    return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"


def _clean(text: str) -> str:
    return " ".join(text.replace("$", "").split())


def _data(ax: Axes) -> tuple[list[float], list[float], str]:
    """x and y values drawn on ``ax`` (lines, bars, points, images) and the kind of chart."""
    xs: list[float] = []
    ys: list[float] = []
    bars = [p for c in ax.containers if isinstance(c, BarContainer) for p in c]
    lines = [ln for ln in ax.get_lines() if len(np.atleast_1d(ln.get_xdata())) > 1
             or ln.get_marker() not in (None, "None", "", " ")]
    points = [c for c in ax.collections if isinstance(c, PathCollection)]
    images = [im for im in ax.get_images() if isinstance(im, AxesImage)] + \
        [c for c in ax.collections if isinstance(c, QuadMesh)]
    if images:
        kind = "heat map"
    elif bars:
        horizontal = any(getattr(c, "orientation", None) == "horizontal" for c in ax.containers)
        kind = "horizontal bar chart" if horizontal else "bar chart"
        for b in bars:
            (xs if horizontal else ys).append(b.get_x() + b.get_width() if horizontal
                                              else b.get_y() + b.get_height())
    elif lines and all(ln.get_linestyle() in ("None", "", " ") for ln in lines):
        kind = "scatter plot"
    elif lines:
        kind = "line chart"
    elif points:
        kind = "scatter plot"
    else:
        kind = "diagram"
    for ln in lines:
        try:
            x = np.asarray(ln.get_xdata(), dtype=float).ravel()
            y = np.asarray(ln.get_ydata(), dtype=float).ravel()
            x_data, y_data = ln.get_transform().contains_branch_seperately(ax.transData)
        except (TypeError, ValueError):
            continue
        # a line across the axes (axhline, axvline) has the other coordinate in axes units
        xs += [v for v in x if math.isfinite(v)] if x_data else []
        ys += [v for v in y if math.isfinite(v)] if y_data else []
    for c in points:
        off = np.asarray(c.get_offsets(), dtype=float)
        if off.ndim == 2 and off.shape[1] == 2:
            xs += [v for v in off[:, 0] if math.isfinite(v)]
            ys += [v for v in off[:, 1] if math.isfinite(v)]
    return xs, ys, kind


def _axis(label: str, values: list[float], scale: str, ticks: list[str]) -> str:
    label = _clean(label)
    words = [_clean(t) for t in ticks if t and "$" not in t and not _is_number(t)]
    if words:
        shown = ", ".join(words[:8]) + (f" and {len(words) - 8} more" if len(words) > 8 else "")
        return f"{label + ': ' if label else ''}{shown}"
    if not label and not values:
        return ""
    out = label or "values"
    if values:
        lo, hi = min(values), max(values)
        out += f" ({_num(lo)} to {_num(hi)}" if lo != hi else f" ({_num(lo)}"
        out += ", log scale)" if scale == "log" else ")"
    return out


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", "").replace("\u2212", "-").rstrip("%x"))
    except ValueError:
        return False
    return True


def _label(ax: Axes, which: str) -> str:
    """The axis's label, or that of a panel sharing the axis (stacked panels label one)."""
    own = getattr(ax, f"get_{which}label")()
    if own:
        return own
    shared = getattr(ax, f"get_shared_{which}_axes")().get_siblings(ax)
    return next((t for a in shared if (t := getattr(a, f"get_{which}label")())), "")


def _panel(ax: Axes) -> str:
    if not ax.axison:  # a drawing: its title and its legend say what it is
        title = _clean(ax.get_title())
        return "diagram" + (f" titled '{title}'" if title else "") + _series(ax)
    xs, ys, kind = _data(ax)
    parts = [kind]
    title = _clean(ax.get_title())
    if title:
        parts[0] += f" titled '{title}'"
    x = _axis(_label(ax, "x"), xs, ax.get_xscale(), [t.get_text() for t in ax.get_xticklabels()])
    y = _axis(_label(ax, "y"), ys, ax.get_yscale(), [t.get_text() for t in ax.get_yticklabels()])
    if y and x:
        parts.append(f"{y} against {x}")
    elif y or x:
        parts.append(y or x)
    return ", ".join(parts) + _series(ax)


def _series(ax: Axes) -> str:
    legend = ax.get_legend()
    names = [_clean(t.get_text()) for t in legend.get_texts()] if legend is not None else []
    names = [n for n in names if n]
    if not names:
        return ""
    more = f" and {len(names) - MAX_SERIES} more" if len(names) > MAX_SERIES else ""
    return ", series: " + "; ".join(names[:MAX_SERIES]) + more


def panels(fig: Figure) -> list[Axes]:
    """The figure's visible axes that hold a chart, colour bars left out (chapter: all)."""
    return [ax for ax in fig.get_axes() if ax.get_visible() and ax.get_label() != "<colorbar>"]


def figure_alt(fig: Figure) -> str:
    """The figure's alt text: its own sentence (:func:`describe`), then its panels (chapter: all).

    Every panel is named by its kind (line chart, bar chart, heat map, ...), its title, its
    axes with the range of the values drawn on them, and its legend's series.
    """
    own = getattr(fig, ALT_ATTR, "")
    suptitle = _clean(fig._suptitle.get_text()) if fig._suptitle is not None else ""
    axes = panels(fig)
    described = [_panel(ax) for ax in axes]
    if len(described) == 1:
        body = "A " + described[0] + "."
    elif described:
        body = f"{len(described)} panels, top to bottom. " + " ".join(
            f"Panel {i}: a {d}." for i, d in enumerate(described, 1))
    else:
        body = "A diagram."
    head = f"Figure '{suptitle}'. " if suptitle else ""
    names = [_clean(t.get_text()) for leg in fig.legends for t in leg.get_texts()]
    if names:
        body += " Series in every panel: " + "; ".join(names) + "."
    return " ".join(p for p in (own, head + body) if p)


def _png_with_alt(printer):
    """A PNG printer that adds the figure's alt text to the PNG and to its output metadata."""
    def print_png(fig):
        alt = figure_alt(fig)
        data = printer(fig, metadata={"Description": alt})
        return (data, {"alt": alt}) if data is not None else None
    print_png.memlab_alt = True
    return print_png


def register_png_alt() -> bool:
    """Make the running IPython shell's PNG figures carry their alt text (chapter: all).

    Wraps the inline backend's PNG printer for matplotlib figures (its size and DPI settings
    kept); a no-op outside IPython, where none is set, or when it is already wrapped. True when
    the printer carries alt text.
    """
    import sys

    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or getattr(shell, "display_formatter", None) is None:
        return False
    png = shell.display_formatter.formatters.get("image/png")
    if png is None:
        return False
    try:
        printer = png.lookup_by_type(Figure)
    except KeyError:
        return False
    if getattr(printer, "memlab_alt", False):
        return True
    png.for_type(Figure, _png_with_alt(printer))
    return True


def figure_problems(fig: Figure) -> list[str]:
    """What keeps ``fig`` from being read at the column's width or without the image (chapter: all).

    Its alt text must be at least one sentence of words, not a file name; a figure of more than
    one panel must be at most :data:`memlab.plot.style.MAX_FIGURE_WIDTH_IN` wide. Empty when
    neither is wrong.
    """
    import re

    from memlab.plot.style import MAX_FIGURE_WIDTH_IN

    problems = []
    alt = figure_alt(fig)
    if len(alt.split()) < 6 or not alt.rstrip().endswith(".") or \
            re.fullmatch(r"\S+\.(png|jpe?g|svg|pdf)", alt.strip()):
        problems.append(f"alt text is not a sentence: {alt!r}")
    n = len(panels(fig))
    if n > 1 and fig.get_figwidth() > MAX_FIGURE_WIDTH_IN + 1e-9:
        problems.append(f"{n} panels in a figure {fig.get_figwidth():.2f} in wide, more than "
                        f"{MAX_FIGURE_WIDTH_IN} in")
    return problems
