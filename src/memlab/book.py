"""The parts of the book in code: which library folder goes with which chapter page and lab.

The claims engine and the experiment registry find each part's ``claims`` and ``experiments``
modules through :data:`PARTS`; a new part is one row here.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

ROOMS = ("experiments", "claims")  # the registering rooms every part may have


@dataclass(frozen=True)
class Part:
    """One part of the book: its library folder, its chapter page and its lab."""

    folder: str  # memlab.<folder>
    chapter: str  # the page, e.g. 'chapters/00_toolkit'
    lab: str | None  # the lab module in memlab.labs, e.g. 'lab00'
    title: str


PARTS = (
    Part("measure", "chapters/00_toolkit", "lab00", "How memlab measures memory"),
    Part("memory", "chapters/01_where_the_memory_goes", "lab01", "Where the memory goes"),
    Part("precision", "chapters/02_number_formats", "lab02", "Number formats"),
    Part("quant", "chapters/03_quantization", "lab03", "Quantization"),
    Part("attention", "chapters/04_attention", "lab04", "Attention"),
    Part("finetune", "chapters/05_finetuning", "lab05", "Fine-tuning with less memory"),
    Part("distributed", "chapters/06_distributed", "lab06", "Many devices"),
    Part("compute", "chapters/07_compute_for_memory", "lab07", "Trading compute for memory"),
    Part("longcontext", "chapters/08_long_context", "lab08", "Long context and large vocabularies"),
    Part("moe", "chapters/09_mixture_of_experts", "lab09", "Mixture of experts"),
)


def room_modules(room: str) -> list[str]:
    """Names of the parts' modules of one room that exist, in book order (chapter: all)."""
    from memlab.errors import check_choice

    check_choice("room", room, ROOMS)
    names = [f"memlab.{p.folder}.{room}" for p in PARTS]
    return [n for n in names if importlib.util.find_spec(n) is not None]


def import_rooms(room: str) -> None:
    """Import every part's module of one room, which registers what it holds (chapter: all)."""
    for name in room_modules(room):
        importlib.import_module(name)


def part_of_chapter(chapter: str) -> Part:
    """The part whose chapter page is ``chapter`` (chapter: all)."""
    from memlab.errors import check_choice

    check_choice("chapter", chapter, [p.chapter for p in PARTS])
    return next(p for p in PARTS if p.chapter == chapter)


def glue(name: str, value) -> None:
    """Name a computed value for the page's prose, which reads it as {glue:text}`name` (chapter: 8).

    myst-nb's ``glue``, hidden (the cell shows what it prints). Where myst-nb is not installed
    (Colab, Binder) no page is built, so nothing reads the name and nothing is written.
    """
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, value, display=False)
