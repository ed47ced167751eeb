"""Mixed-precision training, measured (chapter: 2).

Every mode trained on the same data, and the chapter's experiment.

The modes (:mod:`memlab.precision.modes`), all from the same seed, are trained on the same batches
of one synthetic task. The task is a first-order Markov chain over the vocabulary, fixed by a
seed: every token has four possible successors, reached with the probabilities
``MarkovTask.PROBS``, so the best possible loss and accuracy on the held-out set are computed
exactly from the chain. A run on the seed's own task is kept on disk when the book asks
(:func:`memlab.results.kept_on_disk`), so the claims appendix reuses what the chapter trained.

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

:func:`mixed_precision_run` is the chapter's experiment: both settings, memory per mode
(:mod:`memlab.precision.memory`) and GPU step times (:mod:`memlab.precision.speed`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.config import ModelConfig
from memlab.model.tasks import MarkovTask
from memlab.model.train import TrainConfig, train_loop
from memlab.model.transformer import build_model, lm_loss
from memlab.precision.formats import spec
from memlab.precision.memory import ModeMemory, memory_by_mode
from memlab.precision.modes import (
    AUTOCAST_FORMAT,
    MODES,
    check_mode,
    check_modes,
    mode_autocast,
    model_config,
)
from memlab.precision.speed import StepTimes, step_times
from memlab.results import kept_on_disk
from memlab.units import fmt_bytes

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
    """Train one mode on the Markov task (chapter: 2).

    It records per-step ``loss`` (nats), ``grad_norm`` and gradient shares.

    ``loss_divisor`` K divides the loss before backward, as accumulating K micro-batches does;
    ``init_scale`` is the GradScaler's first scale (``fp16-scaled`` only).
    """
    check_mode(mode)
    cfg = model_config(model, model_overrides)
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
                         loss_divisor=loss_divisor, autocast=AUTOCAST_FORMAT.get(mode),
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
    with torch.no_grad(), mode_autocast(mode, dev):
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
        check_mode(mode)
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
    """Train every mode on the same batches (chapter: 2).

    The loss is divided by ``loss_divisor``; it returns per-run curves and shares.
    """
    check_choice("setting", name, SETTINGS)
    modes = check_modes(modes)
    cfg = model_config(model, model_overrides)
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
    cfg = model_config(model, model_overrides)
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
