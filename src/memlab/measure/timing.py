"""Timing: milliseconds of a callable, with CUDA events on a GPU and ``perf_counter`` elsewhere.

A GPU runs kernels asynchronously, so a wall-clock time read right after a call measures the
launch, not the work. On CUDA each repeat is bracketed by events and the device is synchronised
before they are read; untimed warm-up calls come first (allocator, autotuning, caches). Where a
quantity can only be measured on a GPU, experiments report :func:`not_measurable` instead of a
number.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from memlab.device import device_name, pick_device
from memlab.errors import MemlabError, check_positive_int


def time_ms(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 10,
            device: str | torch.device | None = None) -> list[float]:
    """Milliseconds of each of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones (chapters: 2, 3)."""
    check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    dev = pick_device(device)
    for _ in range(warmup):
        fn()
    out = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)  # kernels are asynchronous: wait before reading the events
            out.append(start.elapsed_time(end))
        return out
    for _ in range(repeats):
        if dev.type == "mps":
            torch.mps.synchronize()
        start = time.perf_counter()
        fn()
        if dev.type == "mps":
            torch.mps.synchronize()
        out.append(1e3 * (time.perf_counter() - start))
    return out


def not_measurable(device: torch.device, reason: str) -> str:
    """The status of a measurement this device cannot make (chapters: 2, 3).

    It reads ``'not measurable on <device>: why'``.
    """
    where = device_name(device) if device.type == "cuda" else device.type
    return f"not measurable on {where}: {reason}"
