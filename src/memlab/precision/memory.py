"""Memory per precision mode (chapter: 2).

A training step's bytes by category and phase, and autocast's crossover.

Memory per mode comes from :func:`memlab.measure.step.measure_step` (the small model, real tensors),
:func:`memlab.measure.step.trace_step` (under FakeTensorMode) or chapter 1's estimator (a 7B
model; chapter 1 holds it to the trace). ``fp16-autocast`` and ``fp16-scaled`` hold the same
tensors (precision ``fp16-mixed``); the scaler adds its own two one-element tensors, counted from
the scaler itself. :func:`autocast_crossover` finds the batch from which autocast's saved
activations, and its peak, fall below fp32's.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch

from memlab.device import pick_device
from memlab.errors import check_choice, check_positive_int
from memlab.model.config import ModelConfig
from memlab.model.transformer import build_model
from memlab.precision.modes import MODE_PRECISION, MODES, check_modes, model_config
from memlab.units import fmt_bytes

HOWS = ("measured", "traced", "estimated")


@dataclass(frozen=True)
class ModeMemory:
    """One mode's training-step bytes: per-parameter state, activations, weight-cast cache, peak, by phase.

    Parameters, gradients and optimizer states are read in the optimizer phase, where all of
    them are alive; ``saved_activations_bytes`` is what the forward pass leaves for backward,
    the weight-cast cache included. ``phase_breakdown`` holds the bytes by category at each
    phase's peak (they add up to ``phase_peak_bytes``); the GradScaler's tensors count as
    ``other``, and ``peak_bytes`` is the largest phase peak.
    """

    mode: str
    precision: str  # the memlab.measure.step precision holding the same tensors
    how: str  # 'measured' (real tensors), 'traced' (FakeTensorMode) or 'estimated' (closed form)
    device: str  # where it was measured, or the conventions it was estimated with
    model: str
    parameters: int
    batch_size: int
    seq_len: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int  # AdamW m and v, plus its 4-byte step counters
    state_bytes_per_param: float  # (parameters + gradients + optimizer states) / parameters
    saved_activations_bytes: int
    weight_cast_cache_bytes: int  # 16-bit copies of the weights autocast keeps for backward
    grad_scaler_bytes: int  # the GradScaler's own tensors (fp16-scaled only)
    peak_bytes: int
    peak_phase: str
    peak_ratio_to_fp32: float | None  # None when fp32 is not among the modes
    at_peak: dict[str, int]  # bytes by memlab.measure.step category at the step's peak
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)  # phase -> bytes at its peak
    phase_breakdown: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> category -> bytes


class _CastCounter:
    """Counts the bytes of the casts autocast makes of the model's parameters in a forward."""

    def __init__(self, param_ids: set[int]):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten._to_copy.default and id(args[0]) in param_ids:
                    counter.bytes += out.untyped_storage().nbytes()
                return out

        self.bytes = 0
        self.mode = _Mode()


def weight_cast_cache_bytes(model: ModelConfig | str, precision: str, *, traced: bool = True,
                            device=None) -> int:
    """Bytes of the weight copies autocast casts in one forward pass, measured (chapter: 2).

    These copies are the cast cache.

    Counts the outputs of every cast whose input is a parameter; 0 without autocast.
    ``traced=True`` runs the forward on fake tensors, so a 7B model costs no memory.
    """
    from memlab.model.config import PRECISIONS

    check_choice("precision", precision, PRECISIONS)
    cfg = model_config(model)
    return _cast_bytes(cfg, precision, traced, None if traced else _device_type(device))


def _device_type(device) -> str:
    return pick_device(device).type


@functools.cache
def _cast_bytes(cfg: ModelConfig, precision: str, traced: bool, device: str | None) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = {"fp16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    if dtype is None:
        return 0
    dev = torch.device("cpu" if traced else device)
    with FakeTensorMode() if traced else contextlib.nullcontext():
        model = build_model(cfg, device=dev, seed=0)
        idx = torch.zeros(1, 1, dtype=torch.long, device=dev)
        counter = _CastCounter({id(p) for p in model.parameters()})
        with torch.autocast(device_type=dev.type, dtype=dtype), counter.mode:
            model(idx)
    return counter.bytes


def grad_scaler_bytes(device=None) -> int:
    """Bytes of the tensors a ``torch.amp.GradScaler`` keeps between steps (chapter: 2).

    Counted after a real step.
    """
    dev = pick_device(device)
    w = torch.nn.Parameter(torch.ones(4, device=dev))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler(dev.type)
    scaler.scale((w * 2).sum()).backward()
    scaler.step(opt)
    scaler.update()
    # _scale and _growth_tracker persist; unscale_'s inverse scale and the found-inf flag
    # (one-element tensors too) live only inside a step.
    return sum(v.untyped_storage().nbytes() for v in vars(scaler).values()
               if isinstance(v, torch.Tensor))


@functools.cache
def traced_step(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str):
    """A step of ``precision`` traced with :func:`memlab.measure.step.trace_step` (chapter: 2).

    Once per configuration.
    """
    from memlab.measure.step import trace_step

    return trace_step(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision)


def _estimated_step(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str,
                    device: str):
    from memlab.memory.estimator import estimate

    return estimate(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                    device=device)


def _estimated_cast_bytes(est, n_layer: int) -> int:
    """The weight-cast cache among an estimate's saved tensors: every 16-bit weight copy."""
    return sum(t.bytes * (n_layer if t.scope == "layer" else 1) for t in est.saved
               if "weight" in t.name and "cast" in t.name)


_CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporaries", "other")


def memory_by_mode(
    model: ModelConfig | str,
    *,
    batch_size: int,
    seq_len: int,
    modes=MODES,
    how: str = "measured",
    device=None,
    model_overrides: dict | None = None,
) -> list[ModeMemory]:
    """Each mode's step bytes by category and phase, and its peak / fp32 (chapter: 2).

    The bytes are ``peak_bytes`` and ``phase_breakdown``.

    ``how='measured'`` runs real steps on the device with :func:`memlab.measure.step.measure_step`;
    ``'traced'`` counts them under FakeTensorMode with :func:`memlab.measure.step.trace_step`
    (cached per configuration); ``'estimated'`` takes chapter 1's closed form,
    :func:`memlab.memory.estimator.estimate`, with ``device`` naming its conventions (``'cuda'``,
    the default, or ``'cpu'``). The two fp16 modes share one ``fp16-mixed`` step; the scaled one
    adds the GradScaler's bytes.
    """
    from memlab.measure.step import measure_step

    modes = check_modes(modes)
    check_choice("how", how, HOWS)
    cfg = model_config(model, model_overrides)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    if how == "estimated":
        from memlab.memory.estimator import DEVICES

        dev = torch.device("cpu")
        convention = check_choice("estimator device", device or "cuda", DEVICES)
    else:
        dev = torch.device("cpu") if how == "traced" else pick_device(device)
        convention = None
    steps, casts = {}, {}
    for prec in dict.fromkeys(MODE_PRECISION[m] for m in modes):
        if how == "estimated":
            steps[prec] = _estimated_step(cfg, batch_size, seq_len, prec, convention)
            casts[prec] = _estimated_cast_bytes(steps[prec], cfg.n_layer)
            continue
        if how == "traced":
            steps[prec] = traced_step(cfg, batch_size, seq_len, prec)
        else:
            steps[prec] = measure_step(cfg, batch_size=batch_size, seq_len=seq_len,
                                       precision=prec, device=dev)
        casts[prec] = _cast_bytes(cfg, prec, how == "traced",
                                  None if how == "traced" else dev.type)
    scaler_bytes = grad_scaler_bytes(dev)
    n = cfg.num_parameters()
    rows = []
    for m in modes:
        prec = MODE_PRECISION[m]
        s = steps[prec]
        extra = scaler_bytes if m == "fp16-scaled" else 0
        phases = {}
        for phase, cats in s.phase_breakdown.items():
            phases[phase] = {c: int(cats.get(c, 0)) for c in _CATEGORIES}
            phases[phase]["other"] += extra  # the scaler's scale and growth tracker
        phase_peak = {phase: sum(cats.values()) for phase, cats in phases.items()}
        peak_phase = s.peak_phase  # the scaler's bytes are alive in every phase alike
        steady = phases["optimizer"]
        saved = s.saved_activations_bytes  # one name in the estimate and the trace
        rows.append(dict(
            mode=m, precision=prec, how=how, device=convention or s.device, model=cfg.name,
            parameters=n, batch_size=batch_size, seq_len=seq_len,
            parameters_bytes=steady["parameters"], gradients_bytes=steady["gradients"],
            optimizer_states_bytes=steady["optimizer_states"],
            state_bytes_per_param=(steady["parameters"] + steady["gradients"]
                                   + steady["optimizer_states"]) / n,
            saved_activations_bytes=saved, weight_cast_cache_bytes=casts[prec],
            grad_scaler_bytes=extra, peak_bytes=phase_peak[peak_phase], peak_phase=peak_phase,
            at_peak=dict(phases[peak_phase]), phase_peak_bytes=phase_peak,
            phase_breakdown=phases,
        ))
    ref = next((r["peak_bytes"] for r in rows if r["mode"] == "fp32"), None)
    return [ModeMemory(**r, peak_ratio_to_fp32=r["peak_bytes"] / ref if ref else None)
            for r in rows]


@dataclass(frozen=True)
class AutocastCrossover:
    """Where autocast starts to save memory against fp32, estimated batch by batch.

    Autocast saves 16-bit activations instead of 32-bit ones, a saving that grows with the
    tokens of a step, and keeps a 16-bit copy of every weight a matmul uses (the weight-cast
    cache), a fixed cost. ``rows`` holds batch 1 and the batches on either side of each
    crossover: ``batch``, ``tokens``, and ``saved_fp32``, ``saved_mixed``, ``peak_fp32``,
    ``peak_mixed`` in bytes, with the phase of each peak.
    """

    model: str
    seq_len: int
    precision: str  # 'bf16-mixed' or 'fp16-mixed'
    device: str  # the estimator's conventions
    weight_cast_cache_bytes: int
    saved_batch: int | None  # smallest batch whose saved activations are below fp32's
    peak_batch: int | None  # smallest batch whose peak is below fp32's
    max_batch: int  # the largest batch tried
    rows: list[dict]

    @property
    def saved_tokens(self) -> int | None:
        """Tokens per step (batch x seq_len) from which autocast's saved activations are smaller."""
        return None if self.saved_batch is None else self.saved_batch * self.seq_len

    @property
    def peak_tokens(self) -> int | None:
        """Tokens per step (batch x seq_len) from which autocast's peak is smaller."""
        return None if self.peak_batch is None else self.peak_batch * self.seq_len

    def summary(self) -> str:
        """Where each crossover lies, as one line per quantity (chapter: 2)."""
        head = (f"{self.model}, seq {self.seq_len}, {self.precision} against fp32 (estimated, "
                f"{self.device} conventions); weight-cast cache {fmt_bytes(self.weight_cast_cache_bytes)}")
        lines = [head]
        for what, b in (("saved activations", self.saved_batch), ("peak", self.peak_batch)):
            if b is None:
                lines.append(f"{what}: not below fp32's up to batch {self.max_batch}")
            else:
                lines.append(f"{what}: below fp32's from batch {b} ({b * self.seq_len:,} tokens "
                             f"per step)" + ("" if b > 1 else ", already at batch 1"))
        return "\n".join(lines)


def autocast_crossover(
    model: ModelConfig | str | dict,
    *,
    seq_len: int,
    precision: str = "bf16-mixed",
    device: str = "cuda",
    max_batch: int = 1024,
    model_overrides: dict | None = None,
) -> AutocastCrossover:
    """The smallest batch at which autocast's estimates fall below fp32's (chapter: 2).

    For its estimated saved activations (``saved_batch``) and peak (``peak_batch``).

    Estimated with :func:`memlab.memory.estimator.estimate` (AdamW, foreach) for batches 1 to
    ``max_batch``; ``device`` names the estimator's conventions.
    """
    from memlab.memory.estimator import DEVICES

    check_choice("autocast precision", precision, ("bf16-mixed", "fp16-mixed"))
    check_choice("estimator device", device, DEVICES)
    check_positive_int("seq_len", seq_len)
    check_positive_int("max_batch", max_batch)
    cfg = model_config(model, model_overrides)

    def row(b: int) -> dict:
        f = _estimated_step(cfg, b, seq_len, "fp32", device)
        m = _estimated_step(cfg, b, seq_len, precision, device)
        return dict(batch=b, tokens=b * seq_len, saved_fp32=f.saved_activations_bytes,
                    saved_mixed=m.saved_activations_bytes, peak_fp32=f.peak_bytes,
                    peak_mixed=m.peak_bytes, peak_phase_fp32=f.peak_phase,
                    peak_phase_mixed=m.peak_phase)

    saved_b = peak_b = None
    for b in range(1, max_batch + 1):
        r = row(b)
        if saved_b is None and r["saved_mixed"] < r["saved_fp32"]:
            saved_b = b
        if peak_b is None and r["peak_mixed"] < r["peak_fp32"]:
            peak_b = b
        if saved_b is not None and peak_b is not None:
            break
    shown = sorted({1, *(x for b in (saved_b, peak_b) if b for x in (b - 1, b) if x >= 1)})
    cache = _estimated_cast_bytes(_estimated_step(cfg, 1, seq_len, precision, device), cfg.n_layer)
    return AutocastCrossover(model=cfg.name, seq_len=seq_len, precision=precision, device=device,
                             weight_cast_cache_bytes=cache, saved_batch=saved_b, peak_batch=peak_b,
                             max_batch=max_batch, rows=[row(b) for b in shown])
