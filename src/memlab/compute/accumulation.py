"""Gradient accumulation: a large batch's update from small micro-batches (chapter 7).

A step over a global batch of B samples can run as k forward and backward passes over
micro-batches of m = B / k samples each, the gradients adding up in ``.grad`` before one
optimizer step. Only one micro-batch's activations are alive at a time, so the activation side
of the peak shrinks with m; the gradients, which live through every micro-batch, do not. The
price is time: k smaller passes use the device less well than one large one.

Three questions, three functions, measured on the book's model:

* :func:`accumulation_sweep` -- the peak of a step at each micro-batch size (measured with
  :func:`memlab.measure.step.measure_step`) beside the estimator's
  (:func:`memlab.memory.estimator.estimate`), and the time per sample of a real step.
* :func:`accumulated_update` -- the same update? One SGD step on the whole batch against k
  micro-batches whose losses are divided by k, from the same weights, within a tolerance derived
  from fp32 rounding; forgetting the 1/k is caught.
* :func:`accumulation_buffer` -- with 16-bit parameters ``.grad`` is 16-bit too, and adding k
  micro-batch gradients in bf16 rounds each partial sum to 8 significant bits. Megatron-LM
  accumulates into an fp32 ``main_grad`` buffer instead (4 bytes per parameter more); the
  function counts and measures that buffer and measures both errors against an fp64 sum.

:func:`accumulation_experiment` bundles the three at the scale of the machine.
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from memlab.device import get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import default_dtype, measure_step, param_dtype, step_autocast
from memlab.measure.timing import time_ms
from memlab.memory.estimator import estimate
from memlab.model.config import PRECISIONS, ModelConfig, get_config
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, lm_loss
from memlab.units import to_unit

FP32_UNIT_ROUNDOFF = 2.0**-24  # u: half the gap between 1 and the next fp32 number
# Megatron-LM keeps an fp32 gradient buffer per parameter (``main_grad``) and adds every
# micro-batch's 16-bit gradient into it (megatron/core/distributed/, quoted as a design).
MAIN_GRAD_SOURCE = "https://github.com/NVIDIA/Megatron-LM/tree/main/megatron/core/distributed"
MAIN_GRAD_BYTES_PER_PARAMETER = 4  # one fp32 value per trainable parameter

# The experiment's sizes: the book's tiny model on a 2-core CPU, GPT-2 small on a GPU.
ACCUMULATION_SIZES = {
    "ci": dict(sweep=dict(model="tiny", global_batch=4, micro_batches=(4, 2, 1), seq_len=64,
                          precision="fp32", repeats=3),
               update=dict(model="tiny", global_batch=8, micro_batches=4, seq_len=32),
               buffer=dict(model="tiny", micro_batches=(1, 2, 4, 8, 16), micro_batch_size=1,
                           seq_len=32)),
    "full": dict(sweep=dict(model="gpt2", global_batch=16, micro_batches=(16, 8, 4, 2, 1),
                            seq_len=512, precision="bf16-mixed", repeats=5),
                 update=dict(model="gpt2", global_batch=8, micro_batches=4, seq_len=256),
                 buffer=dict(model="gpt2", micro_batches=(1, 2, 4, 8, 16, 32),
                             micro_batch_size=2, seq_len=256)),
}


def _config(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return get_config(model)
    raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")


def _estimator_device(device: torch.device) -> str:
    """The estimator's convention for a device: 'cpu' on the CPU, CUDA's elsewhere."""
    return "cpu" if device.type == "cpu" else "cuda"


def _tokens(cfg: ModelConfig, shape: tuple[int, ...], seed: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (2, *shape), generator=gen).to(device)


def divisors(n: int) -> tuple[int, ...]:
    """Every micro-batch size that divides a global batch of ``n`` samples, largest first (chapter: 7)."""
    check_positive_int("global_batch", n)
    return tuple(m for m in range(n, 0, -1) if n % m == 0)


# 1. Peak and time per sample against the micro-batch size ----------------------------------
@dataclass(frozen=True)
class AccumulationRow:
    """One micro-batch size of a sweep (chapter: 7).

    It holds peak bytes measured and estimated, and ms per sample measured.
    """

    micro_batch: int  # samples per forward/backward pass
    grad_accum_steps: int  # micro-batches per optimizer step (global batch / micro_batch)
    measured_peak_bytes: int  # measure_step: MemTracker's peak of a steady-state step
    estimated_peak_bytes: int  # memlab.memory.estimate with the same switches
    measured_over_estimated: float
    peak_phase: str  # the measured step's peak phase
    step_ms: float  # measured: median of a whole step (k micro-batches and the optimizer)
    ms_per_sample: float  # step_ms / global batch

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class AccumulationSweep:
    """Peak bytes and ms per sample of a training step at several micro-batch sizes (chapter: 7).

    Every micro-batch size splits one global batch.
    """

    model: str
    parameters: int
    global_batch: int
    seq_len: int
    precision: str
    device: str  # where the steps ran ('cpu', 'cuda', ...)
    rows: tuple[AccumulationRow, ...]  # largest micro-batch first

    def as_dict(self) -> dict:
        """The sweep as a plain dict, rows as dicts (chapter: 7)."""
        return asdict(self)

    def table_rows(self) -> list[dict]:
        """One row per micro-batch for a page's table (chapter: 7).

        Each row has the peak measured and over the estimate, and the time per sample.
        """
        return [dict(micro_batch=r.micro_batch, steps=r.grad_accum_steps,
                     peak_MiB_measured=round(r.measured_peak_bytes / 2**20, 3),
                     measured_over_estimated=round(r.measured_over_estimated, 3),
                     ms_per_sample=round(r.ms_per_sample, 2)) for r in self.rows]

    def smallest_and_largest(self) -> tuple[AccumulationRow, AccumulationRow]:
        """The rows of the smallest and the largest micro-batch, by size, in any order (chapter: 7)."""
        if not self.rows:
            raise MemlabError("the sweep has no rows")
        by_size = sorted(self.rows, key=lambda r: r.micro_batch)
        return by_size[0], by_size[-1]

    def table(self, unit: str = "MiB") -> str:
        """The sweep as a text table: peaks measured and estimated, time per sample (chapter: 7)."""
        lines = [f"gradient accumulation on {self.device}: {self.model} ({self.parameters:,} "
                 f"parameters), global batch {self.global_batch} x seq {self.seq_len}, "
                 f"{self.precision}",
                 f"{'micro-batch':>12}{'steps':>7}{'measured ' + unit:>16}"
                 f"{'estimated ' + unit:>16}{'ratio':>8}{'ms/sample':>11}"]
        for r in self.rows:
            lines.append(f"{r.micro_batch:>12}{r.grad_accum_steps:>7}"
                         f"{to_unit(r.measured_peak_bytes, unit):>16.3f}"
                         f"{to_unit(r.estimated_peak_bytes, unit):>16.3f}"
                         f"{r.measured_over_estimated:>8.3f}{r.ms_per_sample:>11.3f}")
        return "\n".join(lines)


def micro_batch_trade(sweep: AccumulationSweep, unit: str = "MiB") -> str:
    """What a smaller micro-batch buys and costs in a sweep, in words, measured (chapter: 7).

    From the largest micro-batch to the smallest (rows picked by their size, not their place):
    the peak and the time per sample, e.g. 'micro-batch 4 -> 1 (1 -> 4 accumulation steps):
    peak 9.12 -> 5.40 MiB, 1.10 -> 2.30 ms per sample'.
    """
    small, large = sweep.smallest_and_largest()
    return (f"micro-batch {large.micro_batch} -> {small.micro_batch} ({large.grad_accum_steps} "
            f"-> {small.grad_accum_steps} accumulation steps): peak "
            f"{to_unit(large.measured_peak_bytes, unit):.2f} -> "
            f"{to_unit(small.measured_peak_bytes, unit):.2f} {unit}, "
            f"{large.ms_per_sample:.2f} -> {small.ms_per_sample:.2f} ms per sample")


def _check_micro_batches(global_batch: int, micro_batches) -> tuple[int, ...]:
    accepted = divisors(global_batch)
    if micro_batches is None:
        return accepted
    if isinstance(micro_batches, int) and not isinstance(micro_batches, bool):
        micro_batches = (micro_batches,)
    if not isinstance(micro_batches, Sequence) or not micro_batches:
        raise MemlabError(f"micro_batches must be a non-empty sequence of sizes, got "
                          f"{micro_batches!r}; accepted sizes: {', '.join(map(str, accepted))}")
    for m in micro_batches:
        check_positive_int("micro-batch size", m)
        if global_batch % m:
            raise MemlabError(f"micro-batch size {m} does not divide the global batch "
                              f"{global_batch}; accepted: {', '.join(map(str, accepted))}")
    return tuple(sorted(set(micro_batches), reverse=True))


def accumulated_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     idx: torch.Tensor, targets: torch.Tensor, grad_accum_steps: int, *,
                     precision: str = "fp32", scale_loss: bool = True) -> float:
    """One optimizer step over ``idx`` split into ``grad_accum_steps`` micro-batches (chapter: 7).

    It returns the mean loss, nats.

    Each micro-batch's loss is divided by ``grad_accum_steps`` before its backward pass
    (``scale_loss=False`` leaves it out, the classic slip), so the gradients that add up in
    ``.grad`` are those of the whole batch's mean loss.
    """
    check_positive_int("grad_accum_steps", grad_accum_steps)
    if idx.size(0) % grad_accum_steps:
        raise MemlabError(f"grad_accum_steps {grad_accum_steps} does not divide the batch of "
                          f"{idx.size(0)} samples; accepted: "
                          f"{', '.join(str(d) for d in reversed(divisors(idx.size(0))))}")
    total = 0.0
    for x, y in zip(idx.chunk(grad_accum_steps), targets.chunk(grad_accum_steps), strict=True):
        with step_autocast(precision, idx.device):
            loss = lm_loss(model(x), y)
        (loss / grad_accum_steps if scale_loss else loss).backward()
        total += float(loss.detach())
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / grad_accum_steps


def accumulation_sweep(model: ModelConfig | str, *, global_batch: int,
                       micro_batches: Sequence[int] | None = None, seq_len: int,
                       precision: str = "fp32", device=None, repeats: int = 3,
                       seed: int = 0) -> AccumulationSweep:
    """Peak bytes (measured, estimated) and ms per sample of a step at each micro-batch size (chapter: 7).

    ``micro_batches``: sizes that divide ``global_batch`` (``None``: every divisor). The peak is
    :func:`~memlab.measure.step.measure_step`'s with ``batch_size=m`` and
    ``grad_accum_steps=global_batch // m`` (which repeats one micro-batch: the bytes do not depend
    on the tokens), beside :func:`~memlab.memory.estimator.estimate` with the same switches. The
    time is of a real step over ``global_batch`` distinct samples (:func:`accumulated_step`,
    AdamW), the median of ``repeats`` after two warm-up steps.
    """
    cfg = _config(model)
    check_positive_int("global_batch", global_batch)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, PRECISIONS)
    check_positive_int("repeats", repeats)
    sizes = _check_micro_batches(global_batch, micro_batches)
    dev = pick_device(device)
    rows = []
    for m in sizes:
        k = global_batch // m
        switches = dict(batch_size=m, seq_len=seq_len, precision=precision, grad_accum_steps=k)
        measured = measure_step(cfg, device=dev, seed=seed, **switches)
        estimated = estimate(cfg, device=_estimator_device(dev), **switches)
        step_ms = _time_step(cfg, global_batch, k, seq_len, precision, dev, repeats, seed)
        rows.append(AccumulationRow(
            micro_batch=m, grad_accum_steps=k, measured_peak_bytes=measured.peak_bytes,
            estimated_peak_bytes=estimated.peak_bytes,
            measured_over_estimated=measured.peak_bytes / estimated.peak_bytes,
            peak_phase=measured.peak_phase, step_ms=step_ms, ms_per_sample=step_ms / global_batch))
    return AccumulationSweep(model=cfg.name, parameters=cfg.num_parameters(),
                             global_batch=global_batch, seq_len=seq_len, precision=precision,
                             device=dev.type, rows=tuple(rows))


def _time_step(cfg, global_batch, k, seq_len, precision, dev, repeats, seed) -> float:
    with default_dtype(param_dtype(precision)):
        net = build_model(cfg, device=dev, seed=seed)
    opt = make_optimizer("adamw", net.parameters(), lr=1e-4)
    idx, targets = _tokens(cfg, (global_batch, seq_len), seed, dev)
    times = time_ms(lambda: accumulated_step(net, opt, idx, targets, k, precision=precision),
                    warmup=2, repeats=repeats, device=dev)
    return statistics.median(times)


# 2. The same update? -------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateCheck:
    """One SGD step on a whole batch against k accumulated micro-batches: weight differences (chapter: 7).

    Both start from the same weights. ``max_abs_diff``: the largest difference of any weight
    after the two steps. ``max_rel_diff``: that difference over the largest weight change of the
    whole-batch step (about k - 1 when the 1/k is forgotten). ``tolerance_abs``: what fp32
    rounding allows, see :func:`accumulated_update`.
    """

    model: str
    parameters: int
    global_batch: int
    micro_batches: int  # k
    seq_len: int
    lr: float
    loss_scaled: bool  # whether each micro-batch's loss was divided by k
    max_abs_diff: float
    max_rel_diff: float
    max_abs_update: float  # largest weight change of the whole-batch step
    max_abs_grad: float  # largest gradient of the whole-batch step
    tolerance_abs: float
    within_tolerance: bool
    tolerance_rule: str  # how tolerance_abs was computed, in words and numbers

    def as_dict(self) -> dict:
        """The check as a plain dict (chapter: 7)."""
        return asdict(self)


def gamma(n: int, u: float = FP32_UNIT_ROUNDOFF) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of an n-term float sum (chapter: 7)."""
    check_positive_int("n", n)
    if n * u >= 1:
        raise MemlabError(f"gamma needs n u < 1, got n={n}, u={u}")
    return n * u / (1 - n * u)


def accumulated_update(model: ModelConfig | str = "tiny", *, global_batch: int = 8,
                       micro_batches: int = 4, seq_len: int = 32, lr: float = 1e-2,
                       scale_loss: bool = True, seed: int = 0, device=None) -> UpdateCheck:
    """Max abs and relative weight difference of a whole-batch step and accumulation (chapter: 7).

    The whole-batch step is held to k accumulated micro-batches, with fp32 SGD.

    Both copies start from the same fp32 weights and see the same ``global_batch`` samples; the
    second runs :func:`accumulated_step` with ``micro_batches`` = k. Plain SGD makes the weight
    change ``lr`` times the gradient, so a gradient difference shows one for one. (Adam's first
    step divides the gradient by its own size, about ``lr`` times its sign, so a missing 1/k would
    barely show there.)

    The tolerance. Every weight's gradient is a sum over the N = global_batch x seq_len tokens
    of the batch; the two runs add the same terms in different groupings. An fp32 sum of N terms
    is within gamma_N x (sum of |terms|) of the exact one, gamma_N = N u / (1 - N u), u = 2^-24
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. 4.4), so the two
    differ by at most 2 gamma_N times it. The terms are not kept; the bound takes the largest
    whole-batch gradient for their size, which holds while the tokens' terms do not cancel by
    more than the bound's slack (a worst case that random rounding errors, about sqrt(N) u,
    stay far below). Each weight update rounds once more, by u of the weight at most in each run.
    So ``tolerance_abs = lr x 2 gamma_N x max|g| + 2 u x max|w|``.
    """
    cfg = _config(model)
    check_positive_int("global_batch", global_batch)
    check_positive_int("micro_batches", micro_batches)
    check_positive_int("seq_len", seq_len)
    if global_batch % micro_batches:
        raise MemlabError(f"micro_batches {micro_batches} does not divide the global batch "
                          f"{global_batch}; accepted: "
                          f"{', '.join(str(d) for d in reversed(divisors(global_batch)))}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise MemlabError(f"lr must be a positive number, got {lr!r}")
    dev = pick_device(device)
    with default_dtype(torch.float32):
        whole = build_model(cfg, device=dev, seed=seed)
    split = copy.deepcopy(whole)
    start = [p.detach().clone() for p in whole.parameters()]
    idx, targets = _tokens(cfg, (global_batch, seq_len), seed, dev)

    opt_whole = make_optimizer("sgd", whole.parameters(), lr=lr)
    lm_loss(whole(idx), targets).backward()
    max_grad = max(float(p.grad.detach().abs().max()) for p in whole.parameters())
    opt_whole.step()
    opt_split = make_optimizer("sgd", split.parameters(), lr=lr)
    accumulated_step(split, opt_split, idx, targets, micro_batches, scale_loss=scale_loss)

    pairs = [(a.detach(), b.detach())
             for a, b in zip(whole.parameters(), split.parameters(), strict=True)]
    diff = max(float((a - b).abs().max()) for a, b in pairs)
    update = max(float((a - s).abs().max()) for (a, _), s in zip(pairs, start, strict=True))
    max_w = max(float(a.abs().max()) for a, _ in pairs)
    n_tokens = global_batch * seq_len
    g = gamma(n_tokens)
    u = FP32_UNIT_ROUNDOFF
    tol = lr * 2 * g * max_grad + 2 * u * max_w
    rule = (f"lr x 2 gamma_N x max|g| + 2 u x max|w| with N = {n_tokens} tokens, u = 2^-24, "
            f"gamma_N = {g:.3e}, max|g| = {max_grad:.3e}, max|w| = {max_w:.3e}")
    return UpdateCheck(
        model=cfg.name, parameters=cfg.num_parameters(), global_batch=global_batch,
        micro_batches=micro_batches, seq_len=seq_len, lr=float(lr), loss_scaled=scale_loss,
        max_abs_diff=diff, max_rel_diff=diff / update if update else math.inf,
        max_abs_update=update, max_abs_grad=max_grad, tolerance_abs=tol,
        within_tolerance=diff <= tol, tolerance_rule=rule)


# 3. 16-bit gradients and an fp32 accumulation buffer ----------------------------------------
@dataclass(frozen=True)
class BufferRow:
    """Relative L2 errors of k accumulated bf16 micro-batch gradients against their fp64 sum (chapter: 7)."""

    micro_batches: int  # k
    bf16_grad_error: float  # accumulated in the parameters' bf16 .grad, as autograd does
    fp32_buffer_error: float  # accumulated into an fp32 main_grad buffer

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class AccumulationBuffer:
    """Bytes an fp32 gradient-accumulation buffer costs and the errors it saves (chapter: 7).

    The parameters are bf16.
    """

    model: str
    trainable_parameters: int
    extra_bytes_counted: int  # 4 x trainable parameters
    extra_bytes_measured: int  # storage bytes of the buffers created
    micro_batch_size: int
    seq_len: int
    device: str
    rows: tuple[BufferRow, ...]  # smallest k first

    def as_dict(self) -> dict:
        """The result as a plain dict (chapter: 7)."""
        return asdict(self)

    def table(self) -> str:
        """The errors by k as a text table, with the buffer's bytes (chapter: 7)."""
        lines = [f"bf16 gradient accumulation on {self.device}: {self.model} "
                 f"({self.trainable_parameters:,} trainable parameters), micro-batch "
                 f"{self.micro_batch_size} x seq {self.seq_len}; fp32 buffer "
                 f"{self.extra_bytes_measured:,} bytes measured, "
                 f"{self.extra_bytes_counted:,} counted",
                 f"{'k':>4}{'bf16 .grad error':>20}{'fp32 buffer error':>20}"]
        for r in self.rows:
            lines.append(f"{r.micro_batches:>4}{r.bf16_grad_error:>20.3e}"
                         f"{r.fp32_buffer_error:>20.3e}")
        return "\n".join(lines)


def _relative_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    num = sum(float(((a.double() - r.double()) ** 2).sum()) for a, r in zip(got, ref, strict=True))
    den = sum(float((r.double() ** 2).sum()) for r in ref)
    return math.sqrt(num / den) if den else 0.0


def accumulation_buffer(model: ModelConfig | str = "tiny", *,
                        micro_batches: Sequence[int] = (1, 2, 4, 8, 16),
                        micro_batch_size: int = 1, seq_len: int = 32, seed: int = 0,
                        device=None) -> AccumulationBuffer:
    """Bytes of an fp32 main_grad buffer and the error of bf16 accumulation (chapter: 7).

    The buffer's bytes are counted and measured; bf16 accumulation is held to fp32 over k
    micro-batches.

    The model's parameters are bf16. For each k, the first k micro-batches (losses divided by
    k) run twice from the same weights: once letting autograd add each new gradient into the
    bf16 ``.grad`` (each partial sum rounded to bf16), once with a hook that adds each
    micro-batch's bf16 gradient into an fp32 buffer and clears ``.grad``, as Megatron-LM's
    ``main_grad`` does (:data:`MAIN_GRAD_SOURCE`). The same hook adds it into an fp64 sum, the
    reference: both methods start from the same micro-batch gradients, so the errors are the
    accumulation's alone (relative L2 norm over all parameters).
    """
    cfg = _config(model)
    check_positive_int("micro_batch_size", micro_batch_size)
    check_positive_int("seq_len", seq_len)
    if isinstance(micro_batches, int) or not isinstance(micro_batches, Sequence) \
            or not micro_batches:
        raise MemlabError(f"micro_batches must be a non-empty sequence of counts k, got "
                          f"{micro_batches!r}")
    ks = sorted({check_positive_int("micro_batches", k) for k in micro_batches})
    dev = pick_device(device)
    ref_dev = dev if dev.type in ("cpu", "cuda") else torch.device("cpu")  # fp64 where it exists
    with default_dtype(torch.bfloat16):
        net = build_model(cfg, device=dev, seed=seed)
    params = [p for p in net.parameters() if p.requires_grad]
    tokens = _tokens(cfg, (ks[-1], micro_batch_size, seq_len), seed, dev)  # (2, K, m, T)

    main_grad = [torch.zeros_like(p, dtype=torch.float32) for p in params]
    reference = [torch.zeros(p.shape, dtype=torch.float64, device=ref_dev) for p in params]
    measured = sum(b.untyped_storage().nbytes() for b in main_grad)
    trainable = sum(p.numel() for p in params)

    def run(k: int) -> None:
        for j in range(k):
            (lm_loss(net(tokens[0, j]), tokens[1, j]) / k).backward()

    def into_buffers(i: int):
        def hook(p: torch.Tensor) -> None:
            main_grad[i].add_(p.grad)  # bf16 gradient added in fp32
            reference[i].add_(p.grad.to(ref_dev, torch.float64))
            p.grad = None  # the next micro-batch's gradient arrives fresh
        return hook

    rows = []
    for k in ks:
        for p in params:
            p.grad = None
        run(k)  # autograd accumulates into the bf16 .grad
        bf16_sum = [p.grad.detach().clone() for p in params]
        for p in params:
            p.grad = None
        for b in main_grad + reference:
            b.zero_()
        handles = [p.register_post_accumulate_grad_hook(into_buffers(i))
                   for i, p in enumerate(params)]
        try:
            run(k)
        finally:
            for h in handles:
                h.remove()
        rows.append(BufferRow(micro_batches=k,
                              bf16_grad_error=_relative_error(bf16_sum, reference),
                              fp32_buffer_error=_relative_error(main_grad, reference)))
    return AccumulationBuffer(
        model=cfg.name, trainable_parameters=trainable,
        extra_bytes_counted=MAIN_GRAD_BYTES_PER_PARAMETER * trainable,
        extra_bytes_measured=measured, micro_batch_size=micro_batch_size, seq_len=seq_len,
        device=dev.type, rows=tuple(rows))


# 4. The experiment ---------------------------------------------------------------------------
@dataclass(frozen=True)
class AccumulationExperiment:
    """The accumulation experiment (chapter: 7).

    It holds the sweep, the update check (with and without 1/k) and the fp32 buffer.
    """

    scale: str
    device: str
    sweep: AccumulationSweep
    update: UpdateCheck  # losses divided by k
    update_unscaled: UpdateCheck  # the slip: losses not divided by k
    buffer: AccumulationBuffer

    def as_dict(self) -> dict:
        """The experiment as a plain dict (chapter: 7)."""
        return asdict(self)


def accumulation_experiment(scale: str | None = None, device=None) -> AccumulationExperiment:
    """Gradient accumulation measured on the book's model (chapter: 7).

    It measures peaks, time per sample, the same update and the fp32 buffer.

    Sizes by scale (:data:`ACCUMULATION_SIZES`): ``ci`` the ``tiny`` preset in seconds on a
    2-core CPU, ``full`` GPT-2 small on a GPU.
    """
    dev = pick_device(device)
    scale = get_scale(scale, dev)
    size = ACCUMULATION_SIZES[scale]
    sweep = accumulation_sweep(device=dev, **size["sweep"])
    update = accumulated_update(device=dev, **size["update"])
    unscaled = accumulated_update(device=dev, scale_loss=False, **size["update"])
    buffer = accumulation_buffer(device=dev, **size["buffer"])
    return AccumulationExperiment(scale=scale, device=dev.type, sweep=sweep, update=update,
                                  update_unscaled=unscaled, buffer=buffer)
