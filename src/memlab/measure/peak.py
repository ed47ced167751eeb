"""Peak memory of a callable: how many bytes did this call need at most? (chapter 0)

On CUDA :func:`measure_peak` reads the caching allocator's own counters. On CPU it replays the
profiler's allocation events, which include memory that aten kernels allocate in C++ (Python's
``tracemalloc`` sees none of it). Elsewhere (MPS) a dispatch-mode tracker adds up the storages
that tensor operations create and drops them when they are freed.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice

METHODS = ("auto", "cuda-allocator", "cpu-profiler", "dispatch")


@dataclass(frozen=True)
class PeakMemory:
    """Peak bytes of one call, relative to what was allocated when it started."""

    device: str  # 'cuda' | 'mps' | 'cpu'
    method: str  # 'cuda-allocator' | 'cpu-profiler' | 'dispatch'
    peak_allocated_bytes: int  # most bytes live at once during the call, above the start
    peak_reserved_bytes: int | None  # CUDA only: new memory the caching allocator reserved
    end_allocated_bytes: int  # bytes still allocated when the call returned (e.g. its result)

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 0)."""
        return asdict(self)


def measure_peak(
    fn: Callable, *args, device=None, method: str = "auto", **kwargs
) -> tuple[Any, PeakMemory]:
    """Run ``fn(*args, **kwargs)``; return its result and its peak bytes above the start (chapter: 0).

    ``method='auto'`` picks ``'cuda-allocator'`` on CUDA, ``'cpu-profiler'`` on CPU and
    ``'dispatch'`` elsewhere; ``'dispatch'`` works on every device. ``device`` and
    ``method`` are taken by this function, so ``fn`` cannot receive arguments of those names;
    instead ``fn`` runs with ``device`` as the default device, so ``measure_peak(torch.empty,
    n, device="cuda")`` allocates on the GPU.
    """
    if not callable(fn):
        raise MemlabError(f"measure_peak needs a callable, got {fn!r}")
    check_choice("measurement method", method, METHODS)
    dev = pick_device(device)
    if method == "auto":
        method = {"cuda": "cuda-allocator", "cpu": "cpu-profiler"}.get(dev.type, "dispatch")
    if method == "cuda-allocator" and dev.type != "cuda":
        raise MemlabError(
            f"method 'cuda-allocator' needs device 'cuda', got {dev.type!r}; accepted there: "
            "cpu-profiler (cpu), dispatch (any)"
        )
    if method == "cpu-profiler" and dev.type != "cpu":
        raise MemlabError(
            f"method 'cpu-profiler' needs device 'cpu', got {dev.type!r}; accepted there: "
            + ("cuda-allocator, dispatch" if dev.type == "cuda" else "dispatch")
        )
    gc.collect()  # garbage from earlier cells must not be freed inside the measured call
    run = {"cuda-allocator": _peak_cuda, "cpu-profiler": _peak_cpu_profiler,
           "dispatch": _peak_dispatch}[method]
    with torch.device(dev):  # factory calls inside fn allocate on the measured device
        result, peak, reserved, end = run(dev, fn, args, kwargs)
    return result, PeakMemory(
        device=dev.type,
        method=method,
        peak_allocated_bytes=int(max(peak, 0)),
        peak_reserved_bytes=None if reserved is None else int(max(reserved, 0)),
        end_allocated_bytes=int(end),
    )


def _peak_cuda(dev, fn, args, kwargs):
    # The caching allocator counts every tensor byte, kernels' workspaces included. Its
    # peak counter is global, so reset it and subtract what was already allocated.
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    start_allocated = torch.cuda.memory_allocated(dev)
    start_reserved = torch.cuda.memory_reserved(dev)
    result = fn(*args, **kwargs)
    torch.cuda.synchronize(dev)  # kernels are asynchronous: let them finish first
    peak = torch.cuda.max_memory_allocated(dev) - start_allocated
    reserved = torch.cuda.max_memory_reserved(dev) - start_reserved
    end = torch.cuda.memory_allocated(dev) - start_allocated
    return result, peak, reserved, end


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while Kineto prints its start and stop lines from C++ (chapter: 0)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2: nothing to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _peak_cpu_profiler(dev, fn, args, kwargs):
    # The profiler records one "[memory]" event per CPU allocation (+bytes) and free
    # (-bytes), including those made inside aten kernels. Replaying them in time order
    # gives the live bytes after each event; the largest prefix sum is the peak. Only the
    # call runs between start() and stop(), so the profiler's own set-up is not counted.
    from torch.profiler import ProfilerActivity, profile

    if not torch.autograd.kineto_available():
        raise MemlabError(
            "method 'cpu-profiler' needs torch's Kineto profiler, which this torch build "
            "lacks; use method='dispatch'"
        )
    # A second profiler session would silently end the caller's one: refuse instead.
    if getattr(torch._C._autograd, "_profiler_enabled", lambda: False)():
        raise MemlabError(
            "method 'cpu-profiler' cannot run inside another torch profiler session; "
            "use method='dispatch'"
        )
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    try:
        with quiet_stderr():
            prof.start()
    except RuntimeError as exc:
        raise MemlabError(
            f"method 'cpu-profiler' could not start the torch profiler ({exc}); "
            "use method='dispatch'"
        ) from None
    try:
        result = fn(*args, **kwargs)
    finally:
        with quiet_stderr():
            prof.stop()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise MemlabError(
            f"method 'cpu-profiler' found no profiler results in torch {torch.__version__}; "
            "use method='dispatch'"
        )
    cpu = torch.autograd.DeviceType.CPU
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in results.events()
        if e.name() == "[memory]" and e.device_type() == cpu
    )
    live = peak = 0
    for _, n_bytes in events:
        live += n_bytes
        peak = max(peak, live)
    return result, peak, None, live


class _StorageTracker(TorchDispatchMode):
    """Adds up the storages that operations create; drops each one when it is freed.

    A storage first seen as an *input* existed before the call: it is remembered with 0
    bytes, so a view or in-place op on it is not counted as new memory. Misses memory a
    kernel allocates and frees internally, and storages resized in place.
    """

    def __init__(self) -> None:
        super().__init__()
        self._bytes: dict[int, int] = {}  # id(storage) -> bytes counted for it
        self._refs: dict[int, weakref.ref] = {}
        self.live_bytes = 0
        self.peak_bytes = 0

    def _see(self, t: torch.Tensor, new: bool) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no plain storage
            return
        key = id(st)  # storage objects stay the same Python object while they live
        if key in self._bytes:
            return
        n_bytes = st.nbytes() if new else 0
        self._bytes[key] = n_bytes
        self._refs[key] = weakref.ref(st, partial(self._freed, key))
        self.live_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def _freed(self, key: int, _ref) -> None:
        self._refs.pop(key, None)
        self.live_bytes -= self._bytes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                self._see(t, new=False)
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t, new=True)
        return out


def _peak_dispatch(dev, fn, args, kwargs):
    tracker = _StorageTracker()
    with tracker:
        result = fn(*args, **kwargs)
    return result, tracker.peak_bytes, None, tracker.live_bytes
