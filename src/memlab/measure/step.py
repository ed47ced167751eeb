"""One training step split by category: where do a training step's bytes go? (chapter 0)

:func:`measure_step` and :func:`trace_step` both run the same step (``_run_step``) under PyTorch's
``MemTracker``, which files every tensor storage as a parameter, gradient, optimizer state,
activation or temporary. ``measure_step`` allocates the model for real; ``trace_step`` runs it
under ``FakeTensorMode``, so a 7B model's step is counted on a laptop without allocating it.
The step is described by :class:`memlab.model.step.StepSpec`; :func:`memlab.measure.peak.measure_peak`
measures the peak of any callable.

The step is run twice and the second iteration is reported: the first one creates the
optimizer states, the second one is the steady state every later step repeats.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import ClassVar

import torch

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice
from memlab.model.config import OPTIMIZERS, ModelConfig
from memlab.model.step import CATEGORIES, PHASES, StepSpec, checkpointing_words, step_bytes
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, model_loss
from memlab.units import to_unit

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

    # Names older memlab wrote for these bytes: a record carrying one is refused in one line.
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"activations_bytes": "activations_at_peak_bytes"}
    # The byte fields of every result of a step (memlab.model.step.STEP_BYTES, STYLE.md), as the
    # estimate (memlab.memory.MemoryEstimate) has them: parameters, gradients and optimizer
    # states whole, as the optimizer step holds them; the saved activations at the end of the
    # forward pass; activations, temporaries and other at the peak.
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    saved_activations_bytes: int
    activations_at_peak_bytes: int
    temporaries_bytes: int
    other_bytes: int
    peak_bytes: int  # the six categories at the peak, summed (phase_breakdown[peak_phase])
    peak_phase: str  # the phase holding the overall peak
    phase_peak_bytes: dict[str, int]  # 'forward' | 'backward' | 'optimizer' -> peak in that phase
    phase_breakdown: dict[str, dict[str, int]]  # categories at each phase's peak
    mode: str  # 'measured' (real tensors) or 'traced' (FakeTensorMode)
    device: str  # where the tensors live ('cpu' when traced: fake CPU tensors)
    setup: dict  # StepSpec.as_dict(): model, parameters, batch_size, seq_len, ...
    # CUDA only: the allocator's peaks in the recorded step, above what was allocated (reserved)
    # before the model was built; a cross-check of peak_bytes that also sees kernel workspaces.
    allocator_peak_bytes: int | None = None
    allocator_reserved_bytes: int | None = None
    # FLOPs of the recorded step as torch.utils.flop_counter.FlopCounterMode counts them
    # (matrix multiplies and attention; elementwise work such as the optimizer's is not
    # counted), in total and by phase; a checkpointed forward run again counts in 'backward'.
    flops: int | None = None  # None: not counted (count_flops=False)
    flops_by_phase: dict[str, int] = field(default_factory=dict)
    # Activation offloading (memlab.model.offload.OffloadStats of the recorded step's last
    # micro-batch): the bytes on the host after the forward pass and those moved each way.
    offloaded: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """The fields as a plain dict, bytes as ints (chapter: 0)."""
        return asdict(self)

    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the peak, summing to ``peak_bytes`` (what a stacked bar shows) (chapter: 0)."""
        return dict(self.phase_breakdown[self.peak_phase])

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
        at_peak = self.phase_breakdown[self.peak_phase]
        for name in CATEGORIES:
            b = at_peak[name]
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
    """Autocast as a step of ``precision`` runs its forward on ``device`` (chapters: 0, 7).

    Refused where torch lacks it.
    """
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
        if model.offload is not None:
            model.offload.reset()
        with step_autocast(setup.precision, device):
            loss = model_loss(model, idx, targets, setup.loss_chunks)
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


class FakeScalars:
    """Answer a fake tensor's data-dependent scalar (``.item()``) with 1 (chapter: 8).

    Fake tensors hold no values: torch's Adafactor reads its step and two norms per tensor with
    ``.item()`` to scale the update, which no shape or dtype depends on, so the traced step
    reads 1 there and counts the same tensors the real step allocates.
    """

    def __new__(cls):
        from torch._subclasses.fake_tensor import DataDependentOutputException
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                try:
                    return func(*args, **(kwargs or {}))
                except DataDependentOutputException:
                    if func is not torch.ops.aten._local_scalar_dense.default:
                        raise
                    return True if args[0].dtype == torch.bool else (
                        1.0 if args[0].is_floating_point() else 1)

        return Mode()


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
            model = build_model(cfg, device=device, seed=seed, checkpointing=setup.checkpointing,
                                offload_activations=setup.offload_activations)
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
        with tracker, FakeScalars() if traced else contextlib.nullcontext():
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
    offloaded = model.offload.stats.as_dict() if model.offload is not None else {}

    breakdown = {p: _categories(phase_snaps[p], optimizer_states) for p in PHASES}
    saved = phase_snaps["forward:end"]["ACT"]
    phase_peak = {p: phase_snaps[p]["Total"] for p in PHASES}
    peak_phase = max(PHASES, key=lambda p: phase_peak[p])  # the earliest phase on a tie
    return StepMemory(
        **step_bytes(breakdown, phase_peak, peak_phase, saved),
        mode="traced" if traced else "measured",
        device=device.type,
        setup=setup.as_dict(),
        allocator_peak_bytes=int(allocator_peak) if cuda else None,
        allocator_reserved_bytes=int(allocator_reserved) if cuda else None,
        flops=sum(flops.by_phase.values()) if count_flops else None,
        flops_by_phase=dict(flops.by_phase) if count_flops else {},
        offloaded=offloaded,
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
