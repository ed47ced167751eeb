"""Mixed-precision training, measured: five ways to train the same model on the same data (chapter: 2).

The modes, all from the same seed, on the same batches of one synthetic task:

* ``fp32``           everything in fp32 (the reference).
* ``fp16-autocast``  ``torch.autocast`` to fp16 and no loss scaling: small gradients can
  round to zero in fp16 (underflow).
* ``fp16-scaled``    the same, with ``torch.amp.GradScaler``: the loss is multiplied by a
  scale before backward, the gradients divided by it before the step, and a step whose
  gradients hold inf or NaN is skipped (and the scale halved).
* ``bf16-autocast``  autocast to bf16: fp32's exponent range, so no scaler is needed.
* ``bf16-pure``      model, gradients and AdamW states all in bf16.

The task is a first-order Markov chain over the vocabulary, fixed by a seed: every token has
four possible successors, reached with the probabilities ``MarkovTask.PROBS``, so the best
possible loss and accuracy on the held-out set are computed exactly from the chain.

Every step records the loss, the gradient norm, the GradScaler's scale and skipped steps, and
gradient statistics: the activation gradients (the gradients of every ``nn.Linear`` output,
captured with tensor hooks) and the parameter gradients, counted as exactly zero, as values
that would round to zero in fp16 (underflow), or to fp16's subnormal range (fewer significant
bits), and binned by log2|g| as in Micikevicius et al. 2018 (arXiv:1710.03740, Figure 3).

Two settings are trained: the loss as a plain mean over the micro-batch's tokens, and the same
loss divided by ``K`` as gradient accumulation over ``K`` micro-batches does. The second gives
each backward pass the per-token gradient size of a batch ``K`` times larger, as in LLM
pre-training with batches of millions of tokens. Each step runs one micro-batch: underflow
happens inside each micro-batch's backward, so one is enough to show it, and AdamW's update is
nearly independent of the gradient's overall scale (its eps aside), so fp32 learns alike in both.

Memory per mode comes from :func:`memlab.measure.step.measure_step` (the small model, real tensors),
:func:`memlab.measure.step.trace_step` (under FakeTensorMode) or chapter 1's estimator (a 7B
model; chapter 1 holds it to the trace). ``fp16-autocast`` and ``fp16-scaled`` hold the same
tensors (precision ``fp16-mixed``); the scaler adds its own two one-element tensors, counted from
the scaler itself. :func:`autocast_crossover` finds the batch from which autocast's saved
activations, and its peak, fall below fp32's.

:func:`step_times` and :func:`fp8_matmul` need a CUDA GPU (fp8 one of compute capability 8.9 or
newer); elsewhere they return a result whose ``status`` says why nothing was measured.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn

from memlab.device import device_name, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.timing import not_measurable, time_ms
from memlab.model.config import ModelConfig, get_config
from memlab.model.tasks import MarkovTask
from memlab.model.train import AUTOCAST_DTYPES, TrainConfig, make_optimizer, train_loop
from memlab.model.transformer import build_model, lm_loss
from memlab.precision.formats import spec
from memlab.results import kept_on_disk
from memlab.units import fmt_bytes

MODES = ("fp32", "fp16-autocast", "fp16-scaled", "bf16-autocast", "bf16-pure")
# The memlab.measure.step precision whose tensors each mode holds.
MODE_PRECISION = {
    "fp32": "fp32", "fp16-autocast": "fp16-mixed", "fp16-scaled": "fp16-mixed",
    "bf16-autocast": "bf16-mixed", "bf16-pure": "bf16",
}
_AUTOCAST_FORMAT = {"fp16-autocast": "fp16", "fp16-scaled": "fp16", "bf16-autocast": "bf16"}
SETTINGS = ("token-mean", "accumulation")
# log2|g| histogram: bin i counts nonzero finite values with floor(log2|g|) = HIST_LO + i;
# values below 2**HIST_LO fall in the first bin, values of 2**HIST_HI or more in the last.
HIST_LO, HIST_HI = -100, 20
HIST_EDGES = list(range(HIST_LO, HIST_HI + 1))  # bin i covers [2**e_i, 2**(e_i + 1))
EVAL_SEQUENCES = 32  # held-out sequences every run is evaluated on
_FP16 = spec("fp16")
# Where storing a magnitude a >= 0 in fp16 (round to nearest even) changes what it is, as
# float32 comparisons: a <= FLUSH becomes 0 (half the smallest subnormal is a tie, to the even 0);
# a < SUBNORMAL_TOP becomes a subnormal (half a subnormal step below the smallest normal is a tie,
# to the even smallest normal); a >= OVERFLOW becomes inf (half a step above the max is a tie, to
# the even inf). All three are exact in float32.
_FLUSH = _FP16.min_subnormal / 2
_SUBNORMAL_TOP = _FP16.min_normal - _FP16.min_subnormal / 2
_OVERFLOW = _FP16.max + 2.0 ** math.frexp(_FP16.max)[1] * _FP16.eps / 4


def _check_mode(mode) -> str:
    return check_choice("mixed-precision mode", mode, MODES)


def _check_modes(modes) -> tuple[str, ...]:
    if isinstance(modes, str) or not modes:
        raise MemlabError(f"modes must be a non-empty list of modes, got {modes!r}; "
                          f"accepted: {', '.join(MODES)}")
    return tuple(_check_mode(m) for m in modes)


def _config(model: ModelConfig | str | dict, overrides: dict | None = None) -> ModelConfig:
    if isinstance(model, dict):  # a config as a result stores it (ModelConfig.to_dict)
        model = ModelConfig(**model)
    if isinstance(model, ModelConfig):
        return replace(model, **overrides) if overrides else model
    if not isinstance(model, str):
        raise MemlabError(f"model must be a preset name, a ModelConfig or its dict, got {model!r}")
    return get_config(model, **(overrides or {}))


# Gradient statistics -----------------------------------------------------------------------------
class _GradCounter:
    """Counts gradient values: total, exactly zero, fp16 underflow / subnormal / overflow, log2 bins.

    Gradients handed to :meth:`add` during a step are counted together in :meth:`end_step`, by
    comparing magnitudes with the thresholds where fp16 rounding changes them (the same counts as
    casting to fp16 and looking, in fewer passes), and binned by the float32 exponent bits.
    """

    def __init__(self, device: torch.device):
        self.pending: list[torch.Tensor] = []
        self.hist = torch.zeros(len(HIST_EDGES), dtype=torch.int64, device=device)
        # [values, exact zeros, nonzero but zero in fp16, fp16 subnormal, overflow to inf in fp16]
        self.total = [0] * 5

    def add(self, g: torch.Tensor) -> None:
        self.pending.append(g.detach())

    def end_step(self) -> list[int]:
        if not self.pending:
            return [0] * 5
        a = torch.cat([g.reshape(-1) for g in self.pending]).float().abs_()
        self.pending.clear()
        n = a.numel()
        zeros, flushed, below_normal, overflow, inf, finite = torch.stack([
            (a == 0).sum(), (a <= _FLUSH).sum(), (a < _SUBNORMAL_TOP).sum(),
            (a >= _OVERFLOW).sum(), torch.isinf(a).sum(), torch.isfinite(a).sum(),
        ]).tolist()
        counts = [n, zeros, flushed - zeros, below_normal - flushed, overflow - inf]
        # floor(log2|g|) from the biased exponent; zeros and float32 subnormals land in the first
        # bin (clamped), inf and NaN in the last: take them out again.
        e = ((a.view(torch.int32) >> 23) & 0xFF) - 127
        hist = torch.bincount(e.clamp_(HIST_LO, HIST_HI).sub_(HIST_LO), minlength=len(HIST_EDGES))
        hist[0] -= zeros
        hist[-1] -= n - finite
        self.hist += hist
        self.total = [t + c for t, c in zip(self.total, counts, strict=True)]
        return counts


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


@contextlib.contextmanager
def _capture_activation_grads(model: nn.Module, counter: _GradCounter) -> Iterator[None]:
    """Count the gradient of every ``nn.Linear`` output as backward computes it."""

    def forward_hook(_module, _inputs, out):
        if torch.is_grad_enabled() and out.requires_grad:
            out.register_hook(counter.add)

    handles = [m.register_forward_hook(forward_hook) for m in model.modules()
               if isinstance(m, nn.Linear)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


# One training run ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainRun:
    """One mode trained for ``steps`` steps: per-step curves, gradient statistics, final quality.

    Shares are fractions of all values counted in that step. Activation gradients are those of
    every ``nn.Linear`` output, as backward computes them (in the autocast dtype under autocast,
    multiplied by the scale under ``fp16-scaled``); parameter gradients are read after the
    scaler has divided them back (``fp16-scaled``), in the parameters' dtype.
    """

    mode: str
    setting: str  # 'token-mean' | 'accumulation'
    loss_divisor: int  # the loss is divided by this before backward
    loss: list[float | None]  # training loss per step, nats, before the division; None if inf/NaN
    grad_norm: list[float | None]  # global L2 norm of the parameter gradients; None if inf/NaN
    scale: list[float] | None  # GradScaler scale used in each step (fp16-scaled only)
    skipped_steps: list[int]  # steps whose update the scaler skipped (inf/NaN gradients)
    nonfinite_grad_steps: list[int]  # steps with inf/NaN gradients (applied unless skipped)
    act_zero_share: list[float]  # activation-gradient values exactly zero
    act_underflow_share: list[float]  # nonzero values that round to zero when stored in fp16
    act_subnormal_share: list[float]  # values that land in fp16's subnormal range
    param_zero_share: list[float]
    param_underflow_share: list[float]
    act_totals: dict[str, int]  # counts over the whole run: values, zeros, underflow, subnormal, overflow
    param_totals: dict[str, int]
    act_grad_hist: list[int]  # nonzero finite activation-gradient values per log2 bin (HIST_EDGES)
    param_grad_hist: list[int]
    final_loss: float | None  # mean training loss over the last tenth of the steps, nats
    eval_loss: float | None  # held-out loss at the end, nats
    eval_accuracy: float | None  # held-out next-token accuracy at the end
    seconds: float  # wall time of the run on this device (not a speed comparison on CPU)
    eval_seq_loss: list[float] | None = None  # held-out loss of each sequence, nats (for paired SEs)

    @property
    def act_underflow(self) -> float:
        """Share of all activation-gradient values that underflow in fp16, over the run."""
        return _share(self.act_totals["underflow"], self.act_totals["values"])


_COUNT_KEYS = ("values", "zeros", "underflow", "subnormal", "overflow")


def _autocast(mode: str, device: torch.device):
    dtype = AUTOCAST_DTYPES.get(_AUTOCAST_FORMAT.get(mode))
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def _global_norm(params) -> float | None:
    norms = [torch.linalg.vector_norm(p.grad.float()) for p in params if p.grad is not None]
    if not norms:
        return 0.0
    total = float(torch.linalg.vector_norm(torch.stack(norms)))
    return total if math.isfinite(total) else None


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def train(
    mode: str,
    *,
    model: ModelConfig | str = "tiny",
    model_overrides: dict | None = None,
    steps: int = 40,
    batch_size: int = 8,
    seq_len: int = 32,
    lr: float = 1e-2,
    loss_divisor: int = 1,
    init_scale: float = 2.0**16,
    seed: int = 0,
    eval_sequences: int = EVAL_SEQUENCES,
    device=None,
    task: MarkovTask | None = None,
    setting: str | None = None,
) -> TrainRun:
    """Train one mode on the Markov task; per-step ``loss`` (nats), ``grad_norm`` and gradient shares (chapter: 2).

    ``loss_divisor`` K divides the loss before backward, as accumulating K micro-batches does;
    ``init_scale`` is the GradScaler's first scale (``fp16-scaled`` only).
    """
    _check_mode(mode)
    cfg = _config(model, model_overrides)
    for what, v in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len),
                    ("loss_divisor", loss_divisor), ("eval_sequences", eval_sequences)):
        check_positive_int(what, v)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise MemlabError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(init_scale, (int, float)) and init_scale > 0):
        raise MemlabError(f"init_scale must be a positive number, got {init_scale!r}")
    dev = pick_device(device)
    if task is not None and task.vocab_size != cfg.vocab_size:
        raise MemlabError(f"task vocab_size {task.vocab_size} differs from the model's "
                          f"{cfg.vocab_size}")
    setting = check_choice("setting", setting or ("token-mean" if loss_divisor == 1
                                                  else "accumulation"), SETTINGS)
    args = (mode, cfg, steps, batch_size, seq_len, float(lr), loss_divisor, float(init_scale), seed,
            eval_sequences, str(dev), setting)
    if task is None:  # the seed's own task: the same run as any other call with these arguments
        return _train_kept(*args)
    return _train(*args, task)


@functools.cache
@kept_on_disk
def _train_kept(*args) -> TrainRun:
    """:func:`_train` on the seed's task, once per process (and kept on disk when asked)."""
    return _train(*args, None)


def _train(mode: str, cfg: ModelConfig, steps: int, batch_size: int, seq_len: int, lr: float,
           loss_divisor: int, init_scale: float, seed: int, eval_sequences: int, device: str,
           setting: str, task: MarkovTask | None) -> TrainRun:
    """One training run, arguments checked by :func:`train`."""
    dev = torch.device(device)
    task = task or MarkovTask(cfg.vocab_size, seed=seed)

    # The same batches for every mode: one draw of steps x batch_size sequences.
    xs, ys = task.sample(steps * batch_size, seq_len, seed=seed + 1)
    xs = xs.view(steps, batch_size, seq_len).to(dev)
    ys = ys.view(steps, batch_size, seq_len).to(dev)
    ex, ey = task.sample(eval_sequences, seq_len, seed=seed + 2)
    ex, ey = ex.to(dev), ey.to(dev)

    model_ = build_model(cfg, device=dev, seed=seed,
                         dtype=torch.bfloat16 if mode == "bf16-pure" else None)
    params = [p for p in model_.parameters()]
    config = TrainConfig(steps=steps, lr=lr, betas=(0.9, 0.95), eps=1e-8,
                         optimizer_impl="foreach" if dev.type == "cuda" else None,
                         loss_divisor=loss_divisor, autocast=_AUTOCAST_FORMAT.get(mode),
                         grad_scaler=init_scale if mode == "fp16-scaled" else None)
    act, par = _GradCounter(dev), _GradCounter(dev)
    rec: dict[str, list] = {k: [] for k in ("grad_norm", "nonfinite", "act", "param")}

    def after_backward(step: int, loss: torch.Tensor) -> None:
        norm = _global_norm(params)  # of the unscaled gradients
        rec["grad_norm"].append(norm)
        if norm is None:
            rec["nonfinite"].append(step)
        for p in params:
            if p.grad is not None:
                par.add(p.grad)

    def after_step(step: int, loss: torch.Tensor) -> None:
        rec["act"].append(act.end_step())
        rec["param"].append(par.end_step())

    with _capture_activation_grads(model_, act):
        log = train_loop(model_, lambda step: (xs[step], ys[step]), config, device=dev,
                         after_backward=after_backward, after_step=after_step)
    rec["loss"], rec["scale"], rec["skipped"] = log.losses, log.scales, log.skipped_steps
    seconds = log.seconds

    model_.eval()
    with torch.no_grad(), _autocast(mode, dev):
        logits = model_(ex)
    eval_loss = float(lm_loss(logits, ey))
    eval_acc = float((logits.argmax(-1) == ey).double().mean())
    seq_loss = torch.nn.functional.cross_entropy(
        logits.float().flatten(0, 1), ey.flatten(), reduction="none").view(ey.shape).mean(1)
    tail = rec["loss"][-max(1, steps // 10):]
    final = statistics.fmean(tail) if all(math.isfinite(x) for x in tail) else math.nan

    def shares(rows, i):
        return [_share(r[i], r[0]) for r in rows]

    return TrainRun(
        mode=mode, setting=setting, loss_divisor=loss_divisor,
        loss=[_finite_or_none(x) for x in rec["loss"]], grad_norm=rec["grad_norm"],
        scale=rec["scale"],
        skipped_steps=rec["skipped"], nonfinite_grad_steps=rec["nonfinite"],
        act_zero_share=shares(rec["act"], 1), act_underflow_share=shares(rec["act"], 2),
        act_subnormal_share=shares(rec["act"], 3),
        param_zero_share=shares(rec["param"], 1), param_underflow_share=shares(rec["param"], 2),
        act_totals=dict(zip(_COUNT_KEYS, act.total, strict=True)),
        param_totals=dict(zip(_COUNT_KEYS, par.total, strict=True)),
        act_grad_hist=act.hist.tolist(), param_grad_hist=par.hist.tolist(),
        final_loss=_finite_or_none(final), eval_loss=_finite_or_none(eval_loss),
        eval_accuracy=eval_acc if math.isfinite(eval_loss) else None,
        seconds=seconds,
        eval_seq_loss=seq_loss.tolist() if math.isfinite(eval_loss) else None,
    )


# A setting: every mode trained on the same data ---------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """All modes trained with one loss normalisation, and what underflows in fp16.

    The ``fp32_*`` shares come from the fp32 reference run: of all its activation-gradient
    values, those that would round to zero (underflow) or to a subnormal if stored in fp16.
    ``fp16_act_zero_share`` and ``scaled_act_zero_share`` are the exactly-zero shares that the
    unscaled and the scaled fp16 runs really had; ``fp32_act_zero_share`` is the baseline.
    """

    name: str  # 'token-mean' | 'accumulation'
    loss_divisor: int
    tokens_per_gradient: int  # the loss is a mean over this many tokens' worth (B x T x K)
    description: str
    runs: list[TrainRun]
    fp32_act_zero_share: float | None
    fp32_act_underflow_share: float | None
    fp32_act_subnormal_share: float | None
    fp32_param_underflow_share: float | None
    fp16_act_zero_share: float | None  # fp16-autocast (no scaler)
    scaled_act_zero_share: float | None  # fp16-scaled
    fp16_param_zero_share: float | None
    scaled_param_zero_share: float | None
    fp32_param_zero_share: float | None

    def run(self, mode: str) -> TrainRun:
        """The run of one mode in this setting."""
        _check_mode(mode)
        for r in self.runs:
            if r.mode == mode:
                return r
        raise MemlabError(f"mode {mode!r} was not run in setting {self.name!r}; run: "
                          f"{', '.join(r.mode for r in self.runs)}")


def _totals_share(run: TrainRun | None, which: str, key: str) -> float | None:
    if run is None:
        return None
    t = run.act_totals if which == "act" else run.param_totals
    return _share(t[key], t["values"])


def train_setting(
    name: str,
    *,
    modes=MODES,
    loss_divisor: int = 1,
    model: ModelConfig | str = "tiny",
    model_overrides: dict | None = None,
    steps: int = 40,
    batch_size: int = 8,
    seq_len: int = 32,
    lr: float = 1e-2,
    seed: int = 0,
    device=None,
) -> Setting:
    """Train every mode on the same batches with the loss divided by ``loss_divisor``; per-run curves and shares (chapter: 2)."""
    check_choice("setting", name, SETTINGS)
    modes = _check_modes(modes)
    cfg = _config(model, model_overrides)
    runs = [train(m, model=cfg, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                  loss_divisor=loss_divisor, seed=seed, device=device, setting=name)
            for m in modes]  # every run on the seed's task, so on the same batches
    by = {r.mode: r for r in runs}
    tokens = batch_size * seq_len * loss_divisor
    if loss_divisor == 1:
        desc = f"loss = mean cross-entropy over the micro-batch's {batch_size} x {seq_len} tokens"
    else:
        desc = (f"loss = mean over the micro-batch's {batch_size} x {seq_len} tokens, divided by "
                f"K = {loss_divisor:,} as gradient accumulation over K micro-batches does: each "
                f"backward sees the per-token gradients of a {tokens:,}-token batch")
    fp32 = by.get("fp32")
    return Setting(
        name=name, loss_divisor=loss_divisor, tokens_per_gradient=tokens, description=desc,
        runs=runs,
        fp32_act_zero_share=_totals_share(fp32, "act", "zeros"),
        fp32_act_underflow_share=_totals_share(fp32, "act", "underflow"),
        fp32_act_subnormal_share=_totals_share(fp32, "act", "subnormal"),
        fp32_param_underflow_share=_totals_share(fp32, "param", "underflow"),
        fp16_act_zero_share=_totals_share(by.get("fp16-autocast"), "act", "zeros"),
        scaled_act_zero_share=_totals_share(by.get("fp16-scaled"), "act", "zeros"),
        fp16_param_zero_share=_totals_share(by.get("fp16-autocast"), "param", "zeros"),
        scaled_param_zero_share=_totals_share(by.get("fp16-scaled"), "param", "zeros"),
        fp32_param_zero_share=_totals_share(fp32, "param", "zeros"),
    )


# Memory per mode --------------------------------------------------------------------------------
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
    """Bytes of the weight copies autocast casts in one forward pass (the cast cache), measured (chapter: 2).

    Counts the outputs of every cast whose input is a parameter; 0 without autocast.
    ``traced=True`` runs the forward on fake tensors, so a 7B model costs no memory.
    """
    from memlab.model.config import PRECISIONS

    check_choice("precision", precision, PRECISIONS)
    cfg = _config(model)
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
    """Bytes of the tensors a ``torch.amp.GradScaler`` keeps between steps, counted after a real step (chapter: 2)."""
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
def _traced_step(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str):
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
    """Each mode's step bytes by category and phase (``peak_bytes``, ``phase_breakdown``) and its peak / fp32 (chapter: 2).

    ``how='measured'`` runs real steps on the device with :func:`memlab.measure.step.measure_step`;
    ``'traced'`` counts them under FakeTensorMode with :func:`memlab.measure.step.trace_step`
    (cached per configuration); ``'estimated'`` takes chapter 1's closed form,
    :func:`memlab.memory.estimator.estimate`, with ``device`` naming its conventions (``'cuda'``,
    the default, or ``'cpu'``). The two fp16 modes share one ``fp16-mixed`` step; the scaled one
    adds the GradScaler's bytes.
    """
    from memlab.measure.step import measure_step

    modes = _check_modes(modes)
    check_choice("how", how, HOWS)
    cfg = _config(model, model_overrides)
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
            steps[prec] = _traced_step(cfg, batch_size, seq_len, prec)
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
        saved = s.activations_bytes if how == "estimated" else s.saved_activations_bytes
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
    """The smallest batch at which autocast's estimated saved activations (``saved_batch``) and peak (``peak_batch``) fall below fp32's (chapter: 2).

    Estimated with :func:`memlab.memory.estimator.estimate` (AdamW, foreach) for batches 1 to
    ``max_batch``; ``device`` names the estimator's conventions.
    """
    from memlab.memory.estimator import DEVICES

    check_choice("autocast precision", precision, ("bf16-mixed", "fp16-mixed"))
    check_choice("estimator device", device, DEVICES)
    check_positive_int("seq_len", seq_len)
    check_positive_int("max_batch", max_batch)
    cfg = _config(model, model_overrides)

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


# Step times and fp8 matmuls on a GPU --------------------------------------------------------------
@dataclass(frozen=True)
class StepTimeRow:
    """One mode's training-step time on the GPU, CUDA events, warm-up excluded."""

    mode: str
    median_ms: float
    min_ms: float
    max_ms: float
    tokens_per_s: float  # batch_size x seq_len / median step time
    speedup_vs_fp32: float | None


@dataclass(frozen=True)
class StepTimes:
    """Per-mode step times, or a status saying why they could not be measured here."""

    status: str  # 'measured on <GPU>' or 'not measurable on <device>: <reason>'
    device: str
    model: str
    batch_size: int
    seq_len: int
    warmup: int
    steps: int
    rows: list[StepTimeRow] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        """Whether the rows hold measurements."""
        return bool(self.rows)


def step_times(
    model: ModelConfig | str = "gpt2",
    *,
    batch_size: int = 8,
    seq_len: int = 1024,
    modes=MODES,
    steps: int = 20,
    warmup: int = 5,
    lr: float = 1e-4,
    device=None,
    model_overrides: dict | None = None,
) -> StepTimes:
    """Median training-step time per mode in ``median_ms``, timed with CUDA events after ``warmup`` steps (chapter: 2).

    A step is forward, backward, (scaler,) AdamW step and zero_grad on random tokens. Needs a
    CUDA GPU; elsewhere the result's ``status`` says "not measurable" and ``rows`` is empty.
    """
    modes = _check_modes(modes)
    cfg = _config(model, model_overrides)
    for what, v in (("batch_size", batch_size), ("seq_len", seq_len), ("steps", steps)):
        check_positive_int(what, v)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    dev = pick_device(device)
    base = dict(device=dev.type, model=cfg.name, batch_size=batch_size, seq_len=seq_len,
                warmup=warmup, steps=steps)
    if dev.type != "cuda":
        return StepTimes(status=not_measurable(dev, "step times are taken with CUDA events, "
                                                     "which need a CUDA GPU"), **base)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    from memlab.device import refuse_if_too_big

    times: dict[str, list[float]] = {}
    for m in modes:
        traced = _traced_step(cfg, batch_size, seq_len, MODE_PRECISION[m])
        refuse_if_too_big(traced.peak_bytes, dev, f"a {cfg.name} {m} training step")
        times[m] = time_ms(_step_fn(m, cfg, batch_size, seq_len, lr, dev), warmup=warmup, repeats=steps,
                           device=dev)
        gc.collect()  # the mode's model and optimizer are garbage now: give their memory back
        torch.cuda.empty_cache()
    rows = []
    for m in modes:
        med = statistics.median(times[m])
        rows.append(StepTimeRow(mode=m, median_ms=med, min_ms=min(times[m]), max_ms=max(times[m]),
                                tokens_per_s=batch_size * seq_len / (med / 1e3),
                                speedup_vs_fp32=(statistics.median(times["fp32"]) / med
                                                 if "fp32" in times else None)))
    return StepTimes(status=f"measured on {device_name(dev)}", rows=rows, **base)


def _step_fn(mode: str, cfg: ModelConfig, batch_size: int, seq_len: int, lr: float,
             dev: torch.device):
    """One training step of ``mode`` on fixed random tokens, as a closure returning the loss."""
    model = build_model(cfg, device=dev, seed=0,
                        dtype=torch.bfloat16 if mode == "bf16-pure" else None)
    optimizer = make_optimizer("adamw", model.parameters(), lr=lr, weight_decay=0.01)  # torch's default
    scaler = torch.amp.GradScaler(dev.type) if mode == "fp16-scaled" else None
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len), generator=g).to(dev)
    idx, targets = tokens[0], tokens[1]  # (B, T) each

    def one_step() -> torch.Tensor:
        with _autocast(mode, dev):
            loss = lm_loss(model(idx), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return one_step


@dataclass(frozen=True)
class Fp8Matmul:
    """An fp8 (e4m3) matmul through ``torch._scaled_mm`` against bf16, timed and checked against fp64."""

    status: str  # 'measured on <GPU>' or 'not measurable on <device>: <reason>'
    device: str
    m: int
    n: int
    k: int
    fp8_ms: float | None = None  # median over the timed repeats, CUDA events
    bf16_ms: float | None = None
    fp8_tflops: float | None = None  # 2 m n k / time
    bf16_tflops: float | None = None
    speedup: float | None = None  # bf16_ms / fp8_ms
    fp8_rel_error: float | None = None  # ||C - C_ref||_F / ||C_ref||_F, C_ref in fp64
    bf16_rel_error: float | None = None
    repeats: int = 0

    def table(self) -> str:
        """The status, and where measured the times, TFLOP/s and errors, as text (chapter: 2)."""
        lines = [f"fp8 (e4m3) vs bf16 matmul, {self.m} x {self.k} x {self.n}: {self.status}"]
        if self.fp8_ms is not None:
            lines += [
                f"fp8  {self.fp8_ms:.3f} ms, {self.fp8_tflops:.1f} TFLOP/s, relative error "
                f"{self.fp8_rel_error:.2e}",
                f"bf16 {self.bf16_ms:.3f} ms, {self.bf16_tflops:.1f} TFLOP/s, relative error "
                f"{self.bf16_rel_error:.2e}",
                f"fp8 is {self.speedup:.2f}x the speed of bf16 (median of {self.repeats})",
            ]
        return "\n".join(lines)


def fp8_matmul(m: int = 8192, n: int = 8192, k: int = 8192, *, repeats: int = 20,
               warmup: int = 5, device=None) -> Fp8Matmul:
    """Time ``torch._scaled_mm`` on float8_e4m3fn against bf16: ``fp8_tflops``, ``bf16_tflops``, relative errors (chapter: 2).

    Inputs are standard-normal, scaled per tensor so their largest magnitude maps to e4m3's
    448; the second operand is column-major, as ``_scaled_mm`` requires; the output is bf16.
    Needs a CUDA GPU of compute capability 8.9 or newer; elsewhere ``status`` says why not.
    """
    for what, v in (("m", m), ("n", n), ("k", k), ("repeats", repeats)):
        check_positive_int(what, v)
        if what != "repeats" and v % 16:
            raise MemlabError(f"fp8 matmul {what} must be a multiple of 16, got {v}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    dev = pick_device(device)
    base = dict(device=dev.type, m=m, n=n, k=k)
    if dev.type != "cuda":
        return Fp8Matmul(status=not_measurable(
            dev, "fp8 matmuls (torch._scaled_mm) are timed with CUDA events on a GPU of compute "
                 "capability 8.9 or newer"), **base)
    cc = torch.cuda.get_device_capability(dev)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if cc < (8, 9) or fp8 is None or not hasattr(torch, "_scaled_mm"):
        return Fp8Matmul(status=not_measurable(
            dev, f"compute capability {cc[0]}.{cc[1]} has no fp8 tensor cores (8.9 or newer "
                 "needed)"), **base)
    from memlab.device import refuse_if_too_big

    # a, b in fp32 and fp64 references, fp8 and bf16 copies, fp64 output: about 30 bytes/element.
    refuse_if_too_big(30 * (m * k + k * n + m * n), dev, f"an fp8 matmul of {m}x{k}x{n}")
    a, b, a8, b8, scale_a, scale_b = _fp8_operands(m, n, k, dev)
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)  # b16 keeps b's column-major layout

    def run_fp8():
        return _fp8_mm(a8, b8, scale_a, scale_b)

    def run_bf16():
        return a16 @ b16

    try:
        c8 = run_fp8()
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Fp8Matmul(status=not_measurable(dev, f"torch._scaled_mm failed ({msg})"), **base)
    ref = a.double() @ b.double()
    fp8_err, bf16_err = _rel_error(c8, ref), _rel_error(run_bf16(), ref)
    del ref, c8
    fp8_ms = statistics.median(time_ms(run_fp8, warmup=warmup, repeats=repeats, device=dev))
    bf16_ms = statistics.median(time_ms(run_bf16, warmup=warmup, repeats=repeats, device=dev))
    flop = 2 * m * n * k
    return Fp8Matmul(status=f"measured on {device_name(dev)}", fp8_ms=fp8_ms, bf16_ms=bf16_ms,
                     fp8_tflops=flop / (fp8_ms * 1e-3) / 1e12,
                     bf16_tflops=flop / (bf16_ms * 1e-3) / 1e12, speedup=bf16_ms / fp8_ms,
                     fp8_rel_error=fp8_err, bf16_rel_error=bf16_err, repeats=repeats, **base)


def _fp8_operands(m: int, n: int, k: int, dev: torch.device):
    """Standard-normal a (m, k) row-major and b (k, n) column-major, their e4m3 copies and scales.

    Per-tensor scaling: x8 = x / s with s = amax(x) / 448 (e4m3's largest value), so the
    dequantized value is x8 * s; ``_scaled_mm`` takes these s as ``scale_a`` and ``scale_b``.
    """
    fp8 = torch.float8_e4m3fn
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(m, k, device=dev, generator=g)  # row-major (m, k)
    b = torch.randn(n, k, device=dev, generator=g).t()  # (k, n), column-major
    fmax = torch.finfo(fp8).max
    scale_a = (a.abs().max() / fmax).float()  # 0-d fp32 tensors on the device
    scale_b = (b.abs().max() / fmax).float()
    a8 = (a / scale_a).to(fp8)
    b8 = (b.t() / scale_b).to(fp8).t()  # cast the row-major (n, k), then view it as (k, n)
    return a, b, a8, b8, scale_a, scale_b


def _fp8_mm(a8, b8, scale_a, scale_b) -> torch.Tensor:
    """``a8 @ b8`` on fp8 inputs with their dequantization scales, bf16 out (torch 2.13 signature)."""
    return torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def _rel_error(c: torch.Tensor, ref: torch.Tensor) -> float:
    """||c - ref||_F / ||ref||_F, in fp64."""
    return float(torch.linalg.vector_norm(c.double() - ref) / torch.linalg.vector_norm(ref))


# The experiment -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MixedPrecisionResult:
    """Five modes trained in two settings, their memory on the small model and a 7B trace, GPU step times."""

    model: dict  # the trained model's ModelConfig as a dict
    parameters: int
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    seed: int
    task: dict  # vocab_size, successor probabilities, best loss and accuracy on the held-out set
    fp16: dict  # min_subnormal, min_normal, max of fp16, from memlab.precision.formats.spec
    hist_edges_log2: list[int]  # bin i of every histogram covers [2**e_i, 2**(e_i + 1))
    settings: list[Setting]
    memory: list[ModeMemory]  # the trained model, measured on this device
    memory_large: list[ModeMemory]  # a 7B-class model, estimated (every batch size given)
    step_times: StepTimes
    device: str
    seconds: float  # wall time of the whole experiment

    def setting(self, name: str) -> Setting:
        """One setting by name ('token-mean' or 'accumulation')."""
        check_choice("setting", name, [s.name for s in self.settings])
        return next(s for s in self.settings if s.name == name)

    def table(self) -> str:
        """Final losses, underflow shares and memory ratios as text (chapter: 2)."""
        lines = [f"{self.model['name']} ({self.parameters:,} parameters), {self.steps} steps of "
                 f"{self.batch_size} x {self.seq_len} tokens on {self.device}; best possible "
                 f"held-out loss {self.task['optimal_eval_loss']:.3f} nats"]
        for s in self.settings:
            lines.append(f"\n[{s.name}] {s.description}")
            lines.append(f"{'mode':<15}{'final loss':>11}{'eval loss':>11}{'eval acc':>10}"
                         f"{'act zeros':>11}{'skipped':>9}")
            for r in s.runs:
                fl = "nan" if r.final_loss is None else f"{r.final_loss:.3f}"
                el = "nan" if r.eval_loss is None else f"{r.eval_loss:.3f}"
                ea = "-" if r.eval_accuracy is None else f"{r.eval_accuracy:.3f}"
                z = _share(r.act_totals["zeros"], r.act_totals["values"])
                lines.append(f"{r.mode:<15}{fl:>11}{el:>11}{ea:>10}{z:>11.2%}"
                             f"{len(r.skipped_steps):>9}")
            if s.fp32_act_underflow_share is not None:
                lines.append(f"fp32 activation gradients that fp16 would flush to zero: "
                             f"{s.fp32_act_underflow_share:.2%}, make subnormal: "
                             f"{s.fp32_act_subnormal_share:.2%}")
        for rows in (self.memory, self.memory_large):
            for r in rows:
                ratio = "" if r.peak_ratio_to_fp32 is None else (
                    f", x{r.peak_ratio_to_fp32:.2f} of fp32")
                lines.append(f"{r.how} {r.model} batch {r.batch_size} x {r.seq_len} {r.mode:<14}"
                             f" peak {fmt_bytes(r.peak_bytes)}{ratio}, state "
                             f"{r.state_bytes_per_param:.2f} B/param, saved activations "
                             f"{fmt_bytes(r.saved_activations_bytes)} (weight-cast cache "
                             f"{fmt_bytes(r.weight_cast_cache_bytes)})")
        lines.append(f"step times: {self.step_times.status}")
        return "\n".join(lines)


def mixed_precision_run(
    *,
    model: ModelConfig | str = "tiny",
    model_overrides: dict | None = None,
    steps: int = 40,
    batch_size: int = 8,
    seq_len: int = 32,
    lr: float = 1e-2,
    accumulation: int = 4096,
    accumulation_modes=("fp32", "fp16-autocast", "fp16-scaled", "bf16-autocast"),
    seed: int = 0,
    large: dict | None = None,
    times: dict | None = None,
    device=None,
) -> MixedPrecisionResult:
    """The chapter's experiment: all five modes in both settings, memory by mode, step times (chapter: 2).

    ``large`` (``model``, ``batch_sizes``, ``seq_len``, optionally ``how`` and ``device`` of
    :func:`memory_by_mode`) names the 7B-class model whose memory is estimated (by default, with
    CUDA's conventions); ``times`` (keyword arguments of :func:`step_times`) sizes the GPU timing.
    """
    start = time.perf_counter()
    cfg = _config(model, model_overrides)
    dev = pick_device(device)
    kw = dict(model=cfg, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed,
              device=dev)
    settings = [train_setting("token-mean", **kw),
                train_setting("accumulation", modes=accumulation_modes,
                              loss_divisor=accumulation, **kw)]
    task = MarkovTask(cfg.vocab_size, seed=seed)
    ex, ey = task.sample(EVAL_SEQUENCES, seq_len, seed=seed + 2)  # the set train() evaluates on
    best_loss, best_acc = task.optimal(ex, ey)
    memory = memory_by_mode(cfg, batch_size=batch_size, seq_len=seq_len, device=dev)
    large = large or {}
    memory_large = []
    if large:
        for b in large["batch_sizes"]:
            memory_large += memory_by_mode(large["model"], batch_size=b, seq_len=large["seq_len"],
                                           how=large.get("how", "estimated"),
                                           device=large.get("device"))
    if times or dev.type != "cuda":  # off CUDA this returns at once, saying why
        timing = step_times(device=dev, **(times or dict(model=cfg, batch_size=batch_size,
                                                         seq_len=seq_len)))
    else:
        timing = StepTimes(status="not run: step times are taken at scale 'full'",
                           device=dev.type, model=cfg.name, batch_size=batch_size,
                           seq_len=seq_len, warmup=0, steps=0)
    return MixedPrecisionResult(
        model=cfg.to_dict(), parameters=cfg.num_parameters(), steps=steps,
        batch_size=batch_size, seq_len=seq_len, lr=lr, seed=seed,
        task=dict(vocab_size=cfg.vocab_size, successor_probs=list(MarkovTask.PROBS),
                  entropy_nats=task.entropy_nats, optimal_eval_loss=best_loss,
                  optimal_eval_accuracy=best_acc, eval_sequences=EVAL_SEQUENCES),
        fp16=dict(min_subnormal=_FP16.min_subnormal, min_normal=_FP16.min_normal,
                  max=_FP16.max),
        hist_edges_log2=HIST_EDGES, settings=settings, memory=memory,
        memory_large=memory_large, step_times=timing, device=dev.type,
        seconds=time.perf_counter() - start,
    )
