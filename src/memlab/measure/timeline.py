"""Memory over one training step, measured with PyTorch's own tools (chapter 0).

:func:`measure_timeline` measures one steady-state training step: on CUDA,
``torch.cuda.memory._record_memory_history`` and a snapshot (the pickle that
https://pytorch.org/memory_viz opens); on the CPU, the profiler's memory timeline
(``torch.profiler._memory_profiler``), which files every byte under a category. The allocator's
rules and the out-of-memory message are in :mod:`memlab.measure.allocator`.

The step is the one :func:`memlab.measure.step.measure_step` runs: the same model, optimizer,
batch and seed, with a first iteration that creates the optimizer states left out of the timeline.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice
from memlab.measure.peak import quiet_stderr
from memlab.measure.step import autocast_dtype, default_dtype, param_dtype
from memlab.model.step import CATEGORIES, PHASES, StepSpec
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, lm_loss
from memlab.units import to_unit

# A memory timeline of one step -------------------------------------------------------------
TIMELINE_METHODS = ("auto", "profiler", "cuda-snapshot")
# The profiler's categories (torch.profiler._memory_profiler.Category; UNKNOWN: no tensor known,
# e.g. a kernel's scratch or foreach intermediates) and the book's category each one goes under.
PROFILER_TO_BOOK = {
    "PARAMETER": "parameters",
    "GRADIENT": "gradients",
    "OPTIMIZER_STATE": "optimizer_states",
    "ACTIVATION": "activations",
    "TEMPORARY": "temporaries",
    "AUTOGRAD_DETAIL": "temporaries",
    "UNKNOWN": "temporaries",
    "INPUT": "other",
}
_PHASE_TAG = "memlab::"


def profiler_export_categories() -> tuple[str, ...]:
    """The categories of the profiler's exported timeline (chapter: 0).

    In its column order after the leading 0.
    """
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX

    order = sorted(_CATEGORY_TO_INDEX.items(), key=lambda kv: kv[1])
    return tuple("UNKNOWN" if c is None else c.name for c, _ in order)


@dataclass(frozen=True)
class MemoryTimeline:
    """Bytes alive over one training step, by category, with the step's phases (chapter: 0).

    ``times_us`` are microseconds from the start of the forward pass; ``category_bytes`` maps a
    category to the bytes alive at each time: the book's categories from the profiler, or
    ``'allocated'`` (requested bytes) from a CUDA snapshot, which also fills ``reserved_bytes``.
    """

    method: str  # 'profiler' | 'cuda-snapshot'
    device: str
    setup: dict  # StepSpec.as_dict()
    times_us: tuple[float, ...]
    category_bytes: dict[str, tuple[int, ...]]
    phase_spans_us: dict[str, tuple[float, float]]  # phase -> (start, end)
    reserved_bytes: tuple[int, ...] | None = None  # CUDA: the allocator's reserved bytes
    profiler_bytes_at_peak: dict[str, int] = field(default_factory=dict)  # torch's own categories
    allocator_peak_bytes: int | None = None  # CUDA: allocated_bytes.all.peak during the step
    file: str | None = None  # the exported timeline (profiler, JSON) or snapshot (CUDA, pickle)

    @property
    def total_bytes(self) -> tuple[int, ...]:
        """Bytes alive at each time, all categories (chapter: 0)."""
        return tuple(sum(v) for v in zip(*self.category_bytes.values(), strict=True))

    @property
    def peak_index(self) -> int:
        """Index of the first time holding the peak (chapter: 0)."""
        total = self.total_bytes
        return max(range(len(total)), key=total.__getitem__)

    @property
    def peak_bytes(self) -> int:
        """The most bytes alive at once during the step (chapter: 0)."""
        return self.total_bytes[self.peak_index]

    @property
    def peak_time_us(self) -> float:
        """Microseconds from the start of the forward pass to the peak (chapter: 0)."""
        return self.times_us[self.peak_index]

    def phase_at(self, t_us: float) -> str:
        """The phase running at time ``t_us``: the last one started by then (chapter: 0)."""
        started = [p for p in PHASES if self.phase_spans_us[p][0] <= t_us]
        return started[-1] if started else PHASES[0]

    @property
    def peak_phase(self) -> str:
        """The phase holding the peak (chapter: 0)."""
        return self.phase_at(self.peak_time_us)

    def at_peak(self) -> dict[str, int]:
        """Bytes of each category at the peak (chapter: 0)."""
        return {c: v[self.peak_index] for c, v in self.category_bytes.items()}

    def phase_peak_bytes(self) -> dict[str, int]:
        """The peak of each phase, bytes (chapter: 0)."""
        out = dict.fromkeys(PHASES, 0)
        for t, b in zip(self.times_us, self.total_bytes, strict=True):
            p = self.phase_at(t)
            out[p] = max(out[p], b)
        return out

    def table(self, unit: str = "MiB") -> str:
        """The categories at the peak as a text table, with the peak's phase and time (chapter: 0)."""
        s = self.setup
        lines = [f"memory timeline ({self.method}) of a training step on {self.device}: "
                 f"{s.get('model')}, batch {s.get('batch_size')} x seq {s.get('seq_len')}, "
                 f"{s.get('precision')}, {s.get('optimizer')} ({s.get('optimizer_impl')})",
                 f"{'category at the peak':<24}{unit:>10}"]
        for c, b in self.at_peak().items():
            lines.append(f"{c.replace('_', ' '):<24}{to_unit(b, unit):>10.3f}")
        start, end = self.phase_spans_us[self.peak_phase]
        lines.append(f"{'peak':<24}{to_unit(self.peak_bytes, unit):>10.3f}   in the "
                     f"{self.peak_phase} phase, {(self.peak_time_us - start) / (end - start):.0%} "
                     "of the way through it")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 0)."""
        return asdict(self)


class _Step:
    """One training step, built the way measure_step builds it, with its phases marked."""

    def __init__(self, spec: StepSpec, device: torch.device, seed: int):
        self.spec, self.device = spec, device
        with default_dtype(param_dtype(spec.precision)):
            self.model = build_model(spec.config, device=device, seed=seed,
                                     checkpointing=spec.checkpointing)
        lr = 1e-4 if spec.optimizer in ("adamw", "adam") else 1e-3
        self.optimizer = make_optimizer(spec.optimizer, self.model.parameters(), lr=lr,
                                        impl=spec.optimizer_impl)
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, spec.config.vocab_size, (2, spec.batch_size, spec.seq_len),
                               generator=gen).to(device)
        self.idx, self.targets = tokens[0], tokens[1]  # (B, T) each
        self.marks: dict[str, tuple[int, int]] = {}  # phase -> host clock (us) at start, end

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        start = time.time_ns() // 1000
        with torch.profiler.record_function(_PHASE_TAG + name):
            yield
        self.marks[name] = (start, time.time_ns() // 1000)

    def run(self) -> None:
        dtype = autocast_dtype(self.spec.precision)
        with self._phase("forward"):
            cast = (torch.autocast(self.device.type, dtype=dtype) if dtype is not None
                    else contextlib.nullcontext())
            with cast:
                loss = lm_loss(self.model(self.idx), self.targets)
        with self._phase("backward"):
            loss.backward()
            del loss
        with self._phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def _profiler_timeline(step: _Step, path: str | None):
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    if getattr(torch._C._autograd, "_profiler_enabled", lambda: False)():
        raise MemlabError("measure_timeline cannot run inside another torch profiler session")
    activities = [ProfilerActivity.CPU]
    if step.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities, profile_memory=True, record_shapes=True,
                   with_stack=True)
    with quiet_stderr():
        prof.start()
    try:
        step.run()
    finally:
        with quiet_stderr():
            prof.stop()
    device_str = str(step.device) if step.device.index is not None or step.device.type == "cpu" \
        else f"{step.device.type}:0"
    mem = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = mem._coalesce_timeline(device_str)  # us; [0, bytes per category...] each
    if path:
        mem.export_memory_timeline(path, device_str)  # the same [times, sizes] as JSON
    spans = {}
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:  # the phases' record_function ranges, on the memory events' clock
        e = stack.pop()
        if e.name.startswith(_PHASE_TAG):
            spans[e.name[len(_PHASE_TAG):]] = (e.start_time_ns // 1000, e.end_time_ns // 1000)
        stack.extend(e.children)
    if set(spans) != set(PHASES):
        raise MemlabError(f"the profiler saw phases {sorted(spans)}; expected {PHASES}")
    names = {i: ("UNKNOWN" if c is None else c.name) for c, i in _CATEGORY_TO_INDEX.items()}
    book: dict[str, list[int]] = {}
    raw_peak: dict[str, int] = {}
    totals = [sum(row) for row in sizes]
    k = max(range(len(totals)), key=totals.__getitem__)
    for i, name in names.items():
        col = [row[i + 1] for row in sizes]
        target = PROFILER_TO_BOOK[name]
        acc = book.setdefault(target, [0] * len(col))
        book[target] = [a + b for a, b in zip(acc, col, strict=True)]
        raw_peak[name] = col[k]
    t0 = spans["forward"][0]
    return dict(
        times_us=tuple(float(t - t0) for t in times),
        category_bytes={c: tuple(book[c]) for c in CATEGORIES if c in book},
        phase_spans_us={p: (float(a - t0), float(b - t0)) for p, (a, b) in spans.items()},
        profiler_bytes_at_peak=raw_peak,
    )


def _cuda_snapshot_timeline(step: _Step, path: str | None, max_entries: int):
    dev = step.device
    mem = torch.cuda.memory
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_stats(dev)
    # Python stacks only: the pickle stays small enough to carry, and memory_viz still names the
    # line that allocated each block.
    mem._record_memory_history(max_entries=max_entries, device=dev, stacks="python")
    try:
        step.run()
        torch.cuda.synchronize(dev)
        snapshot = mem._snapshot(dev)
        if path:
            mem._dump_snapshot(path)  # the pickle pytorch.org/memory_viz opens
    finally:
        mem._record_memory_history(enabled=None, device=dev)
    stats = torch.cuda.memory_stats(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    trace = snapshot["device_traces"][index]
    if len(trace) >= max_entries:
        raise MemlabError(f"the snapshot's trace is full ({max_entries} entries): its start is "
                          "lost; pass a larger max_entries")
    if trace and "time_us" not in trace[0]:
        raise MemlabError(f"torch {torch.__version__}'s snapshot has no time_us per event; "
                          "use method='profiler'")
    live = start["requested_bytes.all.current"]
    reserved = start["reserved_bytes.all.current"]
    t0 = step.marks["forward"][0]
    times, alive, held = [0.0], [live], [reserved]
    for e in trace:
        action, size = e["action"], e.get("size", 0)
        if action == "alloc":
            live += size
        elif action == "free_completed":
            live -= size
        elif action in ("segment_alloc", "segment_map"):
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
        else:
            continue
        times.append(float(e["time_us"] - t0))
        alive.append(live)
        held.append(reserved)
    return dict(
        times_us=tuple(times),
        category_bytes={"allocated": tuple(alive)},
        phase_spans_us={p: (float(a - t0), float(b - t0)) for p, (a, b) in step.marks.items()},
        reserved_bytes=tuple(held),
        allocator_peak_bytes=int(stats["allocated_bytes.all.peak"]),
    )


def measure_timeline(
    config_or_spec: StepSpec | str,
    *,
    device=None,
    seed: int = 0,
    method: str = "auto",
    path: str | os.PathLike | None = None,
    max_entries: int = 200_000,
    **switches,
) -> MemoryTimeline:
    """Bytes alive over one steady-state training step, by category, measured over time (chapter: 0).

    Takes a :class:`StepSpec`, or a preset and the spec's switches, as ``measure_step`` does.
    ``method='auto'`` picks ``'cuda-snapshot'`` on CUDA (``_record_memory_history`` with
    ``max_entries``, then ``_snapshot``; ``path`` receives the pickle for
    pytorch.org/memory_viz) and ``'profiler'`` on the CPU (the profiler's memory timeline with
    categories; ``path`` receives it as JSON, ``[times_us, [bytes per category]]``).
    """
    spec = StepSpec.of(config_or_spec, **switches)
    check_choice("timeline method", method, TIMELINE_METHODS)
    dev = pick_device(device)
    if method == "auto":
        method = "cuda-snapshot" if dev.type == "cuda" else "profiler"
    if method == "cuda-snapshot" and dev.type != "cuda":
        raise MemlabError(f"method 'cuda-snapshot' needs device 'cuda', got {dev.type!r}; "
                          "accepted there: profiler")
    if method == "profiler" and dev.type not in ("cpu", "cuda"):
        raise MemlabError(f"the profiler's memory timeline needs device 'cpu' or 'cuda', got "
                          f"{dev.type!r}")
    if spec.optimizer == "adamw-8bit":
        raise MemlabError("measure_timeline supports optimizers adamw, adam, sgd, sgd-momentum; "
                          "'adamw-8bit' runs in bitsandbytes kernels (see chapter 3)")
    if spec.grad_accum_steps != 1:
        raise MemlabError(f"measure_timeline measures one forward and backward per step; "
                          f"grad_accum_steps must be 1, got {spec.grad_accum_steps}")
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries <= 0:
        raise MemlabError(f"max_entries must be a positive integer, got {max_entries!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MemlabError(f"seed must be a non-negative integer, got {seed!r}")
    path = os.fspath(path) if path is not None else None
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    gc.collect()
    step = _Step(spec, dev, seed)
    step.run()  # the first iteration creates the optimizer states: left out
    if method == "profiler":
        fields = _profiler_timeline(step, path)
    else:
        fields = _cuda_snapshot_timeline(step, path, max_entries)
    return MemoryTimeline(method=method, device=dev.type, setup=spec.as_dict(), file=path,
                          **fields)
