"""The registry of experiments: each a function ``(scale) -> result dataclass``.

An experiment sizes itself from the scale (``ci`` or ``full``), runs the same code on
any device, and never plots. ``python -m memlab run <name> --scale full --out results/``
runs one without Jupyter and stores the result with its provenance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memlab.device import device_memory_bytes, get_scale, pick_device
from memlab.errors import MemlabError, check_choice


@dataclass(frozen=True)
class Experiment:
    """A named experiment: what it measures, which chapter shows it, and its sizes per scale."""

    name: str
    chapter: str
    summary: str
    fn: Callable[[str], object]
    sizes: dict  # scale -> keyword arguments


EXPERIMENTS: dict[str, Experiment] = {}


def register(name: str, *, chapter: str, summary: str, sizes: dict):
    """Decorator adding an experiment function to the registry (chapter: all)."""

    def wrap(fn):
        EXPERIMENTS[name] = Experiment(name=name, chapter=chapter, summary=summary, fn=fn, sizes=sizes)
        return fn

    return wrap


def get_experiment(name: str) -> Experiment:
    """Look an experiment up by name; an unknown one is a one-line error (chapter: all)."""
    check_choice("experiment", name, sorted(EXPERIMENTS))
    return EXPERIMENTS[name]


def refuse_if_too_big(needed_bytes: int, device, what: str, headroom: float = 0.9) -> None:
    """Raise a one-line error *before* allocating when ``needed_bytes`` exceeds the device (chapter: all)."""
    total = device_memory_bytes(device)
    if total is None:
        return
    if needed_bytes > headroom * total:
        raise MemlabError(
            f"{what} needs about {needed_bytes / 2**30:.1f} GiB (traced), more than "
            f"{headroom:.0%} of this {device.type} device's {total / 2**30:.1f} GiB; "
            f"use --scale ci or a larger device"
        )


# Experiments -------------------------------------------------------------------------------
STEP_SIZES = {
    "ci": dict(model="tiny", batch_size=4, seq_len=64),
    "full": dict(model="gpt2", batch_size=8, seq_len=1024),
}


@register(
    "step-memory",
    chapter="chapters/00_toolkit",
    summary="peak memory of one AdamW training step, by category, measured on this device",
    sizes=STEP_SIZES,
)
def step_memory(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """Measure one training step of a real model on this device (returns ``StepMemory``; chapter: 0)."""
    from memlab.measure import measure_step, trace_step

    scale = get_scale(scale)
    size = STEP_SIZES[scale]
    device = pick_device()
    kwargs = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                  precision=precision, optimizer=optimizer)
    if scale == "full" or device.type != "cpu":  # trace first: refuse before allocating
        traced = trace_step(size["model"], **kwargs)
        refuse_if_too_big(traced.peak_bytes, device, f"a {size['model']} training step")
    return measure_step(size["model"], device=device, **kwargs)


TRACE_SIZES = {
    "ci": dict(model="llama2-7b", batch_size=1, seq_len=256),
    "full": dict(model="llama2-7b", batch_size=1, seq_len=2048),
}


@register(
    "trace-7b",
    chapter="chapters/00_toolkit",
    summary="a Llama-2-7B AdamW training step traced under FakeTensorMode, nothing allocated",
    sizes=TRACE_SIZES,
)
def trace_7b(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """Trace a 7B model's training step without allocating it (returns ``StepMemory``; chapter: 0)."""
    from memlab.measure import trace_step

    size = TRACE_SIZES[get_scale(scale)]
    return trace_step(size["model"], batch_size=size["batch_size"], seq_len=size["seq_len"],
                      precision=precision, optimizer=optimizer)


def run_experiment(name: str, scale: str | None = None, out: str | Path | None = None,
                   command: str | None = None):
    """Run an experiment, optionally store its record under ``out``; returns ``(result, record, path)`` (chapter: all)."""
    from memlab.results import make_record, save_record

    exp = get_experiment(name)
    scale = get_scale(scale)
    result = exp.fn(scale)
    record = make_record(name, scale, result, command=command)
    path = save_record(record, out) if out is not None else None
    return result, record, path
