"""Peak memory of a callable, and of one training step split by category.

Two questions, one module:

* :func:`measure_peak` -- how many bytes did this call need at most? On CUDA it reads
  the caching allocator's own counters. On CPU it replays the profiler's allocation
  events, which include memory that aten kernels allocate in C++ (Python's
  ``tracemalloc`` sees none of it). Elsewhere (MPS) a dispatch-mode tracker adds up the
  storages that tensor operations create and drops them when they are freed.
* :func:`measure_step` and :func:`trace_step` -- where do a training step's bytes go?
  Both run the same step (``_run_step``) under PyTorch's ``MemTracker``, which files every
  tensor storage as a parameter, gradient, optimizer state, activation or temporary.
  ``measure_step`` allocates the model for real; ``trace_step`` runs it under
  ``FakeTensorMode``, so a 7B model's step is counted on a laptop without allocating it.

The step is run twice and the second iteration is reported: the first one creates the
optimizer states, the second one is the steady state every later step repeats.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.train import OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, make_optimizer
from memlab.model.transformer import ATTENTION_IMPLS, ModelConfig, build_model, get_config, lm_loss
from memlab.units import to_unit

METHODS = ("auto", "cuda-allocator", "cpu-profiler", "dispatch")
PHASES = ("forward", "backward", "optimizer")  # a training step's phases (inference: memory.inference)
CATEGORIES = (
    "parameters", "gradients", "optimizer_states", "activations", "temporaries", "other",
)

# Parameter dtype, and the dtype autocast runs the forward in (None: no autocast).
_PARAM_DTYPE = {
    "fp32": torch.float32, "fp16-mixed": torch.float32,
    "bf16-mixed": torch.float32, "bf16": torch.bfloat16,
}
_AUTOCAST_DTYPE = {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


def param_dtype(precision: str) -> torch.dtype:
    """The dtype a step of this precision keeps its parameters in (chapter: 0)."""
    check_choice("precision", precision, tuple(_PARAM_DTYPE))
    return _PARAM_DTYPE[precision]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The dtype autocast runs a step's forward in, or None without autocast (chapter: 0)."""
    check_choice("precision", precision, tuple(_PARAM_DTYPE))
    return _AUTOCAST_DTYPE.get(precision)


# Peak of a callable ------------------------------------------------------------------------
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


def checkpointing_words(label) -> str:
    """', checkpointing' (full), ', <plan> checkpointing' or '' for a setup's value, as tables write it (chapters: 0, 7)."""
    plan = parse_checkpointing(label)
    if not plan:
        return ""
    return ", checkpointing" if plan.kind == "full" else f", {plan.name} checkpointing"


# A training step, split by category ---------------------------------------------------------
@dataclass(frozen=True)
class StepSpec:
    """One training step, validated once: model, batch shape, precision, optimizer and switches.

    The one description of a step that :func:`measure_step`, :func:`trace_step`,
    :func:`memlab.memory.estimate`, the command line and the estimator widget all take (chapters: 0, 1).
    ``attention`` (``None``: the model's own) replaces the config's attention implementation.
    """

    config: ModelConfig | str
    batch_size: int
    seq_len: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"  # 'foreach' (CUDA's default), 'fused' or 'for-loop'
    # Activation checkpointing (memlab.model.checkpoint): False (none), True (full: one saved
    # input per block), or a plan name: 'selective', 'every-K', 'segments-K'.
    checkpointing: bool | str = False
    grad_accum_steps: int = 1  # micro-batches whose gradients add up before one optimizer step
    attention: str | None = None
    # Applied to the built model before the step (inside the fake mode when traced): freezing,
    # adapters, a quantized base (chapter 5). Named in ``as_dict`` by its ``name`` attribute.
    prepare: Callable[[torch.nn.Module], object] | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        if isinstance(cfg, str):
            cfg = get_config(cfg)
        if not isinstance(cfg, ModelConfig):
            raise MemlabError(f"model must be a preset name or a ModelConfig, got {cfg!r}")
        if self.attention is not None:
            check_choice("attention", self.attention, ATTENTION_IMPLS)
            if self.attention != cfg.attention:
                cfg = replace(cfg, attention=self.attention)
        object.__setattr__(self, "config", cfg)
        object.__setattr__(self, "attention", cfg.attention)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("seq_len", self.seq_len)
        if self.seq_len > cfg.max_seq_len:
            raise MemlabError(
                f"seq_len {self.seq_len} exceeds max_seq_len {cfg.max_seq_len} of model {cfg.name!r}"
            )
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.optimizer == "adamw-8bit" and self.optimizer_impl == "fused":
            raise MemlabError("optimizer 'adamw-8bit' has its own kernels; accepted optimizer_impl "
                              "for it: foreach, for-loop")
        object.__setattr__(self, "checkpointing", parse_checkpointing(self.checkpointing).label)
        check_positive_int("grad_accum_steps", self.grad_accum_steps)
        if self.prepare is not None and not callable(self.prepare):
            raise MemlabError(f"prepare must be a callable taking the model, got {self.prepare!r}")

    @classmethod
    def of(cls, config_or_spec, **switches) -> StepSpec:
        """A spec from a spec (no switches allowed), a config or a preset name and switches (chapters: 0, 1)."""
        if isinstance(config_or_spec, StepSpec):
            if switches:
                raise MemlabError(f"pass either a StepSpec or switches, not both: {sorted(switches)}")
            return config_or_spec
        return cls(config_or_spec, **switches)

    def as_dict(self) -> dict:
        """Model name, parameter count, batch shape and switches, as stored in StepMemory.setup (chapter: 0)."""
        cfg = self.config
        return {
            "model": cfg.name,
            "parameters": cfg.num_parameters(),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "optimizer_impl": self.optimizer_impl,
            "checkpointing": self.checkpointing,
            "grad_accum_steps": self.grad_accum_steps,
            "attention": cfg.attention,
            **({"prepare": getattr(self.prepare, "name", getattr(self.prepare, "__name__",
                                                                 "custom"))}
               if self.prepare is not None else {}),
        }


@dataclass(frozen=True)
class StepMemory:
    """Bytes of one steady-state training step, by category, at the moment of its peak.

    * parameters: ``nn.Parameter`` storages. Module buffers are counted under ``other``.
    * gradients: ``.grad`` of the parameters.
    * optimizer_states: the optimizer's persistent state (Adam's m and v plus its 4-byte
      step counters, SGD's momentum).
    * activations: tensors made in the forward pass (kept for backward, the autocast
      weight-cast cache, recomputation under checkpointing).
    * temporaries: backward-pass temporaries, plus the optimizer step's scratch tensors
      (foreach intermediates, which MemTracker files with the optimizer states).
    * other: the batch of token ids and module buffers.

    On CUDA, MemTracker rounds each storage up to 512 bytes as the caching allocator does,
    and Adam's step counters (host tensors unless fused) are not counted: only bytes on the
    device are.
    """

    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    activations_bytes: int
    temporaries_bytes: int
    other_bytes: int
    peak_bytes: int  # the sum of the six categories above
    phase_peak_bytes: dict[str, int]  # 'forward' | 'backward' | 'optimizer' -> peak in that phase
    peak_phase: str  # the phase holding the overall peak
    mode: str  # 'measured' (real tensors) or 'traced' (FakeTensorMode)
    device: str  # where the tensors live ('cpu' when traced: fake CPU tensors)
    setup: dict  # StepSpec.as_dict(): model, parameters, batch_size, seq_len, ...
    phase_breakdown: dict[str, dict[str, int]] = field(default_factory=dict)  # categories at each phase's peak
    saved_activations_bytes: int = 0  # activations alive at the end of the forward pass, for backward
    # CUDA only: the allocator's peaks in the recorded step, above what was allocated (reserved)
    # before the model was built; a cross-check of peak_bytes that also sees kernel workspaces.
    allocator_peak_bytes: int | None = None
    allocator_reserved_bytes: int | None = None
    # FLOPs of the recorded step as torch.utils.flop_counter.FlopCounterMode counts them
    # (matrix multiplies and attention; elementwise work such as the optimizer's is not
    # counted), in total and by phase; a checkpointed forward run again counts in 'backward'.
    flops: int | None = None  # None: not counted (count_flops=False)
    flops_by_phase: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The fields as a plain dict, bytes as ints (chapter: 0)."""
        return asdict(self)

    def table(self, unit: str | None = None) -> str:
        """The categories as a text table in MiB or GiB with their share of the peak (chapter: 0)."""
        unit = unit or ("GiB" if self.peak_bytes >= 2**30 else "MiB")
        s = self.setup
        ckpt = checkpointing_words(s.get("checkpointing"))
        lines = [
            f"{self.mode} training step on {self.device}: {s.get('model')} "
            f"({s.get('parameters', 0):,} parameters), batch {s.get('batch_size')} x "
            f"seq {s.get('seq_len')}, {s.get('precision')}, {s.get('optimizer')} "
            f"({s.get('optimizer_impl')}), {s.get('attention')} attention{ckpt}",
            f"{'category':<18}{unit:>12}{'share of peak':>16}",
        ]
        share = (lambda b: 100.0 * b / self.peak_bytes) if self.peak_bytes else (lambda b: 0.0)
        for name in CATEGORIES:
            b = getattr(self, f"{name}_bytes")
            lines.append(f"{name.replace('_', ' '):<18}{to_unit(b, unit):>12.3f}{share(b):>15.1f}%")
        lines.append(
            f"{'peak':<18}{to_unit(self.peak_bytes, unit):>12.3f}{100.0:>15.1f}%"
            f"   (in the {self.peak_phase} phase)"
        )
        phases = ", ".join(
            f"{p} {to_unit(b, unit):.3f}" for p, b in self.phase_peak_bytes.items()
        )
        lines.append(f"phase peaks ({unit}): {phases}")
        if self.allocator_peak_bytes is not None:
            lines.append(
                f"CUDA allocator peak {to_unit(self.allocator_peak_bytes, unit):.3f} {unit}, "
                f"reserved {to_unit(self.allocator_reserved_bytes or 0, unit):.3f} {unit}"
            )
        return "\n".join(lines)


def _mem_tracker_class():
    try:
        from torch.distributed._tools import mem_tracker
    except ImportError as exc:
        raise MemlabError(
            f"the step breakdown needs torch.distributed._tools.mem_tracker, which torch "
            f"{torch.__version__} here lacks ({exc})"
        ) from None
    return mem_tracker


def _quant_state_tensors(p: torch.Tensor) -> list[torch.Tensor]:
    """The tensors of a bitsandbytes 4-bit weight's quant_state: absmax (and, nested, its own
    absmax and offset); none for any other tensor."""
    qs = getattr(p, "quant_state", None)
    if qs is None:
        return []
    out = [qs.absmax]
    if getattr(qs, "nested", False):
        out += [qs.state2.absmax, qs.offset]
    return [t for t in out if isinstance(t, torch.Tensor)]


def _step_tracker():
    """A MemTracker that keeps only the step-wide peak, and can restart it per phase.

    The one place that touches MemTracker internals (read against torch 2.13's
    ``mem_tracker.py``): ``_curr_mem_snap`` / ``_peak_mem`` / ``_peak_mem_snap`` hold the
    current bytes and the cumulative peak per device, and ``_update_peak_stats`` runs after
    every operation. The override drops MemTracker's per-module peaks, which scan every
    module on every operation (a 7B step goes from about 40 s to a few seconds); this
    module reports no per-module numbers.
    """
    mt = _mem_tracker_class()
    total = mt._TOTAL_KEY

    class _NoHook:
        def remove(self) -> None:
            pass

    frozen = (_NoHook(), _NoHook())

    class _Tracker(mt.MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # MemTracker hooks every parameter's gradient, which a frozen parameter (no
            # requires_grad: a frozen layer, a quantized base) refuses; mark those as hooked.
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = frozen
                # A 4-bit weight's block scales live on its quant_state, outside any module:
                # they are part of the stored weight, so they count as parameters.
                for t in _quant_state_tensors(p):
                    self._update_and_maybe_create_winfos(t, mt._MemRefType.PARAM)
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[total]:
                    self._peak_mem[dev] = snap[total]
                    self._peak_mem_snap[dev] = dict(snap)

        def restart_peak(self) -> None:
            """Start a new peak from the bytes live now."""
            self._peak_mem_snap = self.get_tracker_snapshot("current")
            self._peak_mem = {dev: snap[total] for dev, snap in self._peak_mem_snap.items()}

        def bytes_on(self, device: torch.device, kind: str = "current") -> dict[str, int]:
            """Bytes per MemTracker category ('PARAM', ..., 'Total') on ``device``."""
            out = dict.fromkeys([r.name for r in mt._MemRefType] + ["Total"], 0)
            for dev, snap in self.get_tracker_snapshot(kind).items():
                if dev.type != device.type:
                    continue
                for key, n_bytes in snap.items():
                    out[key.name if isinstance(key, mt._MemRefType) else key] += n_bytes
            return out

    return _Tracker()


def _categories(snap: dict[str, int], optimizer_states: int) -> dict[str, int]:
    """Map MemTracker's categories onto the book's; OPT above the persistent states is scratch."""
    states = min(snap["OPT"], optimizer_states)
    cats = {
        "parameters": snap["PARAM"],
        "gradients": snap["GRAD"],
        "optimizer_states": states,
        "activations": snap["ACT"],
        "temporaries": snap["TEMP"] + snap["OPT"] - states,
        "other": snap["BUFFER"] + snap["OTH"],
    }
    if sum(cats.values()) != snap["Total"]:  # pragma: no cover - a MemTracker change
        raise MemlabError(f"categories {cats} do not add up to the tracked total {snap['Total']}")
    return cats


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build tensors in ``dtype`` inside the block, torch's default again after it (chapters: 0, 1)."""
    # Build low-precision models with their final dtype (``module.to`` fails on fake tensors).
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def step_optimizer(setup: StepSpec, params) -> torch.optim.Optimizer:
    """The optimizer a step of ``setup`` runs, at the book's learning rate for it (chapters: 0, 7)."""
    lr = 1e-4 if setup.optimizer in ("adamw", "adam", "adamw-8bit") else 1e-3
    return make_optimizer(setup.optimizer, params, lr=lr, impl=setup.optimizer_impl)


@contextlib.contextmanager
def step_autocast(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast as a step of ``precision`` runs its forward on ``device``; refused where torch lacks it (chapters: 0, 7)."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        if not torch.is_autocast_enabled(device.type):
            raise MemlabError(
                f"precision {precision!r} needs autocast to {dtype} on {device.type}, which "
                f"torch {torch.__version__} does not support there; accepted: bf16-mixed, bf16, fp32"
            )
        yield


def _iteration(setup, device, model, optimizer, idx, targets, tracker, phase_snaps,
               flops: _PhaseFlops | None = None) -> None:
    """One training step; with ``phase_snaps`` a dict, store each phase's peak categories in it.

    With ``flops``, each phase's FLOPs (as PyTorch's counter counts them) are added up in it.

    With gradient accumulation the step runs ``grad_accum_steps`` forward and backward passes
    (on the same micro-batch) before the optimizer steps; a phase's peak is the largest over
    the micro-batches, which is the last one, when the gradients of the others are alive.
    """

    def phase_done(name: str) -> None:
        if flops is not None:
            flops.phase_done(name)
        if phase_snaps is not None:
            snap = tracker.bytes_on(device, "peak")
            if name not in phase_snaps or snap["Total"] >= phase_snaps[name]["Total"]:
                phase_snaps[name] = snap
                phase_snaps[f"{name}:end"] = tracker.bytes_on(device, "current")
        tracker.restart_peak()

    tracker.restart_peak()
    for micro in range(setup.grad_accum_steps):
        if micro:
            tracker.reset_mod_stats()  # MemTracker refuses a second forward otherwise
        with step_autocast(setup.precision, device):
            loss = lm_loss(model(idx), targets)  # the logits die inside lm_loss, as in training
        phase_done("forward")
        loss.backward()
        del loss
        phase_done("backward")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # grads do not survive into the next step
    phase_done("optimizer")


class _PhaseFlops:
    """FLOPs per phase from a running ``FlopCounterMode``: each phase gets what was counted since
    the previous phase ended (micro-batches of an accumulated step add up)."""

    def __init__(self, counter) -> None:
        self.counter = counter
        self.seen = 0
        self.by_phase = dict.fromkeys(PHASES, 0)

    def phase_done(self, name: str) -> None:
        total = self.counter.get_total_flops()
        self.by_phase[name] += total - self.seen
        self.seen = total


def _flop_counter():
    """PyTorch's FLOP counter, with the CPU attention kernel's formulas registered."""
    from torch.utils.flop_counter import FlopCounterMode

    from memlab.measure.flops import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()  # else SDPA on a CPU counts 0
    counter = FlopCounterMode(display=False)
    # The counter's module tracker hooks every module's outputs for the backward pass, which
    # keeps them alive longer and would change the bytes this step measures; only the total is
    # needed, so every count goes to 'Global' (read against torch 2.13's flop_counter.py).
    if hasattr(counter, "mod_tracker"):
        counter.mod_tracker = _GlobalOnly()
    return counter


class _GlobalOnly:
    """A stand-in for FlopCounterMode's module tracker: no hooks, every FLOP filed as 'Global'."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *args) -> None:
        return None


def _prime_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step on zero gradients: the states exist afterwards, as after a first step."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _run_step(setup: StepSpec, *, device: torch.device, traced: bool, seed: int,
              count_flops: bool = False) -> StepMemory:
    """Run a training step after a first one under MemTracker and return its breakdown.

    Measured, the first step is a real one; traced, it is one optimizer step on zero
    gradients, which creates the same optimizer states at a third of the cost.

    The single implementation behind :func:`measure_step` (real tensors on ``device``) and
    :func:`trace_step` (fake CPU tensors): everything, the model's construction included,
    happens inside the fake mode when ``traced``. ``count_flops`` runs one more step under
    PyTorch's FLOP counter.
    """
    if setup.optimizer == "adamw-8bit":
        raise MemlabError(f"{'trace' if traced else 'measure_step'} supports optimizers "
                          + ", ".join(o for o in OPTIMIZERS if o != "adamw-8bit")
                          + "; 'adamw-8bit' runs in bitsandbytes kernels (see chapter 3)")
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = setup.config
    cuda = device.type == "cuda" and not traced
    with FakeTensorMode() if traced else contextlib.nullcontext():
        if cuda:
            gc.collect()
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            start_allocated = torch.cuda.memory_allocated(device)
            start_reserved = torch.cuda.memory_reserved(device)
        with default_dtype(_PARAM_DTYPE[setup.precision]):
            model = build_model(cfg, device=device, seed=seed, checkpointing=setup.checkpointing)
            if setup.prepare is not None:
                try:
                    setup.prepare(model)
                except RuntimeError as exc:  # e.g. bitsandbytes' 4-bit weights on fake tensors
                    if not traced:
                        raise
                    if "Tensor subclass" not in str(exc):
                        raise
                    raise MemlabError("the prepare hook makes tensor subclasses that fake "
                                      "tensors cannot stand in for (bitsandbytes' quantized "
                                      "weights): measure the step on real tensors instead "
                                      "(measure_step)") from None
        optimizer = step_optimizer(setup, [p for p in model.parameters() if p.requires_grad])
        gen = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, cfg.vocab_size, (2, setup.batch_size, setup.seq_len),
                               generator=gen).to(device)
        idx, targets = tokens[0], tokens[1]  # (B, T) each

        tracker = _step_tracker()
        tracker.track_external(model, optimizer, tokens)  # the token ids count as 'other'
        phase_snaps: dict[str, dict[str, int]] = {}
        step = partial(_iteration, setup, device, model, optimizer, idx, targets, tracker)
        with tracker:
            if traced:  # fake tensors need no warm-up: create the optimizer states directly
                _prime_optimizer(model, optimizer)
            else:  # a real first step also warms kernels and the allocator (cuBLAS workspace)
                step(None)
                tracker.reset_mod_stats()  # MemTracker refuses a second iteration otherwise
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            optimizer_states = tracker.bytes_on(device)["OPT"]
            step(phase_snaps)  # the steady state, recorded
            if cuda:
                torch.cuda.synchronize(device)
                allocator_peak = torch.cuda.max_memory_allocated(device) - start_allocated
                allocator_reserved = torch.cuda.max_memory_reserved(device) - start_reserved
            # FLOPs in one more step, after the bytes are recorded: a checkpoint that stops its
            # recomputation early unwinds through the counter's frames, which keeps tensors
            # alive a little longer than the step itself does.
            if count_flops:
                tracker.reset_mod_stats()
                counter = _flop_counter()
                with counter:
                    flops = _PhaseFlops(counter)
                    step(None, flops)

    breakdown = {p: _categories(phase_snaps[p], optimizer_states) for p in PHASES}
    saved = phase_snaps["forward:end"]["ACT"]
    phase_peak = {p: phase_snaps[p]["Total"] for p in PHASES}
    peak_phase = max(PHASES, key=lambda p: phase_peak[p])  # the earliest phase on a tie
    at_peak = breakdown[peak_phase]
    return StepMemory(
        **{f"{c}_bytes": at_peak[c] for c in CATEGORIES},
        peak_bytes=phase_peak[peak_phase],
        phase_peak_bytes=phase_peak,
        peak_phase=peak_phase,
        mode="traced" if traced else "measured",
        device=device.type,
        setup=setup.as_dict(),
        phase_breakdown=breakdown,
        saved_activations_bytes=saved,
        allocator_peak_bytes=int(allocator_peak) if cuda else None,
        allocator_reserved_bytes=int(allocator_reserved) if cuda else None,
        flops=sum(flops.by_phase.values()) if count_flops else None,
        flops_by_phase=dict(flops.by_phase) if count_flops else {},
    )


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MemlabError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


def measure_step(
    config_or_spec: StepSpec | ModelConfig | str,
    *,
    device=None,
    seed: int = 0,
    count_flops: bool = False,
    **switches,
) -> StepMemory:
    """Bytes of a real training step on the device, by category, at its peak (chapter: 0).

    Takes a :class:`StepSpec`, or a config (or preset name) and the spec's switches:
    ``batch_size``, ``seq_len``, ``precision``, ``optimizer``, ``optimizer_impl``,
    ``checkpointing``, ``grad_accum_steps``, ``attention``. ``count_flops=True`` also counts
    the step's FLOPs with ``FlopCounterMode`` (in one more step, which costs its time).
    """
    spec = StepSpec.of(config_or_spec, **switches)
    return _run_step(spec, device=pick_device(device), traced=False, seed=_check_seed(seed),
                     count_flops=_check_flag("count_flops", count_flops))


def trace_step(config_or_spec: StepSpec | ModelConfig | str, *, count_flops: bool = False,
               **switches) -> StepMemory:
    """Bytes of a training step counted on fake tensors, without allocating it (chapters: 0, 7).

    Takes what :func:`measure_step` takes, less ``device`` and ``seed``.
    """
    spec = StepSpec.of(config_or_spec, **switches)
    return _run_step(spec, device=torch.device("cpu"), traced=True, seed=0,
                     count_flops=_check_flag("count_flops", count_flops))


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise MemlabError(f"{name} must be True or False, got {value!r}")
    return value
