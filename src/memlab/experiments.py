"""The registry of experiments: each a function ``(scale) -> result dataclass``.

Each part of the book registers its experiments in ``memlab/<part>/experiments.py``; the
registry finds them through :data:`memlab.book.PARTS`. An experiment sizes itself from the
scale (``ci`` or ``full``), runs the same code on any device, and never plots. ``python -m memlab run <name> --scale full --out results/``
runs one without Jupyter and stores the result with its provenance.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memlab.device import env_set, forced_device, get_scale, pick_device
from memlab.errors import MemlabError, check_choice

NEEDS = ("cuda", "cpu", "any")
# cuda: only a GPU measures what it is for (CUDA events, the caching allocator, GPU kernels);
#       elsewhere it returns a status saying so, and no record is written.
# any:  it measures on every device, and a GPU record shows what the CPU run cannot.
# cpu:  its numbers do not depend on the device (traces on fake tensors, formulas, runs the
#       book keeps from the CPU): it runs on the CPU, on any machine, and is a CPU record.


@dataclass(frozen=True)
class Experiment:
    """A named experiment: what it measures, which chapter shows it, its sizes per scale and result type,
    the device it needs, what a full-scale run costs on a GPU, and how early a GPU pass runs it."""

    name: str
    chapter: str
    summary: str
    fn: Callable[[str], object]
    sizes: dict  # scale -> keyword arguments (or a config dataclass)
    result: type  # the frozen dataclass the experiment returns
    needs: str = "any"  # one of NEEDS
    cost_s: float = 60.0  # estimated seconds of a full-scale run on one GPU, start-up included
    priority: int = 100  # a GPU pass runs lower numbers first: placeholders a reader meets first
    gpus: int = 1  # GPUs a run on CUDA needs

    def run_device(self) -> str:
        """Where a run of it does its work here.

        ``cpu`` for a device-independent one, else this process's device.
        """
        return "cpu" if self.needs == "cpu" else pick_device().type


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


def register(name: str, *, chapter: str, summary: str, sizes: dict, result: type, needs: str,
             cost_s: float, priority: int, gpus: int = 1):
    """Decorator adding an experiment function to the registry (chapter: all).

    ``result`` is the frozen dataclass the function returns; a record must be able to store
    every field of it, which is checked here, at import, not after a long run. ``needs`` (one of
    :data:`NEEDS`), ``cost_s`` (estimated seconds at full scale on one GPU, until a record
    gives the measured ones) and ``priority`` plan a GPU pass (``memlab record``).
    """
    from memlab.device import SCALES
    from memlab.results import declare_result_type, writable_type

    if not _is_frozen_dataclass(result):
        raise MemlabError(f"experiment {name!r}: result must be a frozen dataclass, got {result!r}")
    writable_type(result, result.__name__)
    if set(sizes) != set(SCALES):
        raise MemlabError(f"experiment {name!r}: sizes must name every scale ({', '.join(SCALES)}), "
                          f"got {', '.join(sizes)}")
    check_choice(f"needs of experiment {name!r}", needs, NEEDS)
    if not (isinstance(cost_s, (int, float)) and cost_s > 0):
        raise MemlabError(f"experiment {name!r}: cost_s must be positive seconds, got {cost_s!r}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise MemlabError(f"experiment {name!r}: priority must be an integer, got {priority!r}")

    def wrap(fn):
        EXPERIMENTS[name] = Experiment(name=name, chapter=chapter, summary=summary, fn=fn,
                                       sizes=sizes, result=result, needs=needs,
                                       cost_s=float(cost_s), priority=priority, gpus=gpus)
        declare_result_type(name, result)
        return fn

    return wrap


def register_kept(name: str, *, kept_as: str,
                  pick_scale: Callable[[str | None], str] | None = None, **metadata):
    """Decorator registering an experiment whose run is kept: once per process and on disk (chapter: all).

    The decorated function ``run(scale) -> result`` is the run at a named scale. It is kept
    with :func:`memlab.results.kept_on_disk` under the name ``kept_as`` in ``run``'s module
    (the name in the cache's key and file name: one per experiment) and cached per process.
    The function returned, and registered as ``name`` with ``metadata`` (the keywords of
    :func:`register`), takes ``scale=None`` and runs the kept run at ``pick_scale(scale)``
    (:func:`memlab.device.get_scale` by default); it carries ``run``'s name and docstring, and
    the kept run as its attribute ``kept``.
    """
    import functools

    from memlab.results import kept_on_disk

    def wrap(run):
        def kept(scale: str):
            return run(scale)

        kept.__module__, kept.__name__, kept.__qualname__ = run.__module__, kept_as, kept_as
        kept = functools.cache(kept_on_disk(kept))

        def experiment(scale: str | None = None):
            return kept((pick_scale or get_scale)(scale))

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(experiment, attr, getattr(run, attr))
        experiment.__annotations__ = {"scale": "str | None",
                                      "return": run.__annotations__.get("return")}
        experiment.kept = kept
        return register(name, **metadata)(experiment)

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


def check_recordable(exp: Experiment) -> None:
    """Refuse, in one line, to write a record this device cannot make (chapter: all).

    An experiment that needs a GPU measures nothing on a CPU (it returns a status): there is
    nothing to record.
    """
    here = exp.run_device()
    if exp.needs == "cuda" and here != "cuda":
        raise MemlabError(f"{exp.name} measures on a CUDA GPU only and this process runs on "
                          f"{here}: nothing to record; run it without --out to see its status")


def run_experiment(name: str, scale: str | None = None, out: str | Path | None = None,
                   command: str | None = None):
    """Run an experiment, optionally store its record under ``out`` (chapter: all).

    It returns ``(result, record, path)``.

    The record's device is where the work ran (:meth:`Experiment.run_device`): a
    device-independent experiment run on a GPU machine is a CPU record.
    """
    import time

    import torch

    from memlab.results import ARTIFACTS_ENV, make_record, save_record

    exp = get_experiment(name)
    scale = get_scale(scale)
    if out is not None:
        check_recordable(exp)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if exp.needs == "cpu":
            stack.enter_context(forced_device("cpu"))
        if out is not None:  # files written beside the record (memlab.results.artifact_path)
            stack.enter_context(env_set(ARTIFACTS_ENV, str(Path(out) / name)))
        result = exp.fn(scale)
    wall = time.perf_counter() - start
    if not isinstance(result, exp.result):
        raise MemlabError(f"experiment {name!r} returned a {type(result).__name__}, "
                          f"not its declared {exp.result.__name__}")
    device = torch.device(exp.run_device())
    record = make_record(name, scale, result, command=command, device=device, wall_s=wall,
                         sizes=exp.sizes[scale])
    path = save_record(record, out) if out is not None else None
    return result, record, path


