"""The registry of experiments: each a function ``(scale) -> result dataclass``.

Each part of the book registers its experiments in ``memlab/<part>/experiments.py``; the
registry finds them through :data:`memlab.book.PARTS`. An experiment sizes itself from the
scale (``ci`` or ``full``), runs the same code on any device, and never plots. ``python -m memlab run <name> --scale full --out results/``
runs one without Jupyter and stores the result with its provenance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memlab.device import get_scale
from memlab.errors import MemlabError, check_choice


@dataclass(frozen=True)
class Experiment:
    """A named experiment: what it measures, which chapter shows it, its sizes per scale and result type."""

    name: str
    chapter: str
    summary: str
    fn: Callable[[str], object]
    sizes: dict  # scale -> keyword arguments (or a config dataclass)
    result: type  # the frozen dataclass the experiment returns


EXPERIMENTS: dict[str, Experiment] = {}  # filled by discover(); read it through experiments()


def discover() -> None:
    """Import every part's ``experiments`` module, which registers its experiments (chapter: all)."""
    from memlab.book import import_rooms

    import_rooms("experiments")


def experiments() -> dict[str, Experiment]:
    """Every registered experiment, by name, after discovery (chapter: all)."""
    discover()
    return EXPERIMENTS


def _is_frozen_dataclass(tp) -> bool:
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)
            and tp.__dataclass_params__.frozen)


def register(name: str, *, chapter: str, summary: str, sizes: dict, result: type):
    """Decorator adding an experiment function to the registry (chapter: all).

    ``result`` is the frozen dataclass the function returns; a record must be able to store
    every field of it, which is checked here, at import, not after a long run.
    """
    from memlab.device import SCALES
    from memlab.results import writable_type

    if not _is_frozen_dataclass(result):
        raise MemlabError(f"experiment {name!r}: result must be a frozen dataclass, got {result!r}")
    writable_type(result, result.__name__)
    if set(sizes) != set(SCALES):
        raise MemlabError(f"experiment {name!r}: sizes must name every scale ({', '.join(SCALES)}), "
                          f"got {', '.join(sizes)}")

    def wrap(fn):
        EXPERIMENTS[name] = Experiment(name=name, chapter=chapter, summary=summary, fn=fn,
                                       sizes=sizes, result=result)
        return fn

    return wrap


def get_experiment(name: str) -> Experiment:
    """Look an experiment up by name; an unknown one is a one-line error (chapter: all)."""
    check_choice("experiment", name, sorted(experiments()))
    return EXPERIMENTS[name]


def describe_sizes(size) -> str:
    """One line for an experiment's size at a scale: ``key=value`` pairs (chapter: all)."""
    if dataclasses.is_dataclass(size) and not isinstance(size, type):
        size = {f.name: getattr(size, f.name) for f in dataclasses.fields(size)}
    if isinstance(size, dict):
        return ", ".join(f"{k}={{{describe_sizes(v)}}}" if isinstance(v, dict)
                         else f"{k}={getattr(v, 'name', v)}" if dataclasses.is_dataclass(v)
                         else f"{k}={v}" for k, v in size.items())
    return str(size)


def run_experiment(name: str, scale: str | None = None, out: str | Path | None = None,
                   command: str | None = None):
    """Run an experiment, optionally store its record under ``out``; returns ``(result, record, path)`` (chapter: all)."""
    from memlab.results import make_record, save_record

    exp = get_experiment(name)
    scale = get_scale(scale)
    result = exp.fn(scale)
    if not isinstance(result, exp.result):
        raise MemlabError(f"experiment {name!r} returned a {type(result).__name__}, "
                          f"not its declared {exp.result.__name__}")
    record = make_record(name, scale, result, command=command)
    path = save_record(record, out) if out is not None else None
    return result, record, path


