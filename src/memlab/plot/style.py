"""The book's figure style: one colour per memory category, matplotlib settings (chapter: all)."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt

from memlab.errors import MemlabError

MAX_FIGURE_WIDTH_IN = 7.2
"""The widest a figure of more than one panel is drawn, in inches: at the style's 110 dpi about the
book's text column (~700 px), so its 9-10 pt text stays 9-10 pt on the page; its panels are stacked
to fit it (chapter: all)."""

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


def as_dict(result) -> dict:
    """A result dataclass's fields as a dict, nested ones too (chapter: all).

    A figure takes the dataclass an experiment returns (a record's is ``Record.value()``);
    anything else is a one-line :class:`MemlabError`.
    """
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    raise MemlabError(f"a figure takes a result dataclass (a record's is Record.value()), got "
                      f"{type(result).__name__}")
