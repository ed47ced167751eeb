"""Training with fewer bits: 8-bit optimizer states and quantization-aware training (chapter: 3).

Two experiments on the book's small language model (:mod:`memlab.quant.schemes`):

* **8-bit optimizer states** (:func:`optimizer_comparison`). The same fresh model, from the
  same seed and on the same batches, trained with torch's AdamW (two fp32 moments, 8 bytes per
  parameter) and with bitsandbytes' ``AdamW8bit`` (Dettmers et al. 2021, arXiv:2110.02861):
  both moments stored as 8-bit codes of a dynamic code book, with one fp32 absmax per block of
  256 values, about ``2 + 2 * 4 / 256 = 2.03`` bytes per parameter. bitsandbytes keeps every
  tensor with fewer than ``min_8bit_size`` elements (4096 by default) in 32-bit, so a small
  model's norms and embeddings stay at 8 bytes per parameter: the bytes are reported over the
  tensors the optimizer really stored in 8 bits (read from its state's dtypes) and over all.
  The bytes are counted from the optimizer's state tensors; the two code books (256 fp32
  values each) are one tensor shared by every 8-bit parameter, and are counted once.

* **Quantization-aware training with a learned scale** (:func:`qat_vs_ptq`). LSQ, "Learned
  Step Size Quantization" (Esser et al. 2019, arXiv:1902.08153): every linear layer inside the
  transformer blocks computes with the weight it will be stored as,
  ``w_q = round(clamp(w / s, -qmax, qmax)) * s``, one step size ``s`` per output row and a
  trained parameter. ``round`` has a zero gradient almost everywhere, so backward treats it as
  the identity (the straight-through estimator); the gradient reaching ``s`` is then LSQ's
  (its eq. 3): ``round(w/s) - w/s`` for a weight inside the range and ``+-qmax`` for one
  clipped to its end, times LSQ's gradient scale ``g = 1 / sqrt(n * qmax)``, ``n`` the weights
  sharing one step size (LSQ §2.2). After fine-tuning, the model is exported as real integer
  codes with the learned step sizes and compared with round-to-nearest post-training
  quantization (PTQ) of the same model, and with an fp32 model fine-tuned for as many steps
  and then quantized (so that the gain of QAT is not just extra training). A third variant,
  ``scale_mode="minmax"``, fake-quantizes the same way but recomputes ``s`` from the current
  weights' row absmax at every step, with no gradient: what an observer-based fake
  quantization such as PyTorch's does. :func:`torch_fake_quant_facts` inspects PyTorch's own
  classes to say which kind they are.

The adaptive optimizers here normalize every parameter's update by its own gradient size, so
LSQ's gradient scale ``g`` changes little under AdamW (through its ``eps`` only), and a step
size moves by at most about the learning rate per step, as a weight does; LSQ was introduced
with SGD, where ``g`` sets the step size's learning rate. The module keeps it
because it is part of the method, and the tests check that it is applied.
"""

from __future__ import annotations

import copy
import functools
import math
import statistics
import time
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.config import OPTIMIZERS
from memlab.model.lm import (
    LMConfig,
    Quality,
    TrainedLM,
    evaluate,
    lm_config,
    measure_state,
    paired_delta,
    reference_model,
    train_lm,
)
from memlab.model.transformer import block_linears, replace_module
from memlab.quant.functional import absmax_quantize, dequantize
from memlab.results import kept_on_disk

OPT_STEPS = {"ci": 200, "full": 1000}  # steps of each optimizer run in optimizer_comparison
QAT_STEPS = {"ci": 200, "full": 600}  # fine-tuning steps of qat_vs_ptq (QAT, min/max, control)
# Fine-tuning starts from a converged model: a tenth of the training learning rate lets the
# weights (and step sizes) settle onto the grid without undoing training. At 'ci' scale, 3 bits,
# 200 steps, a quarter of it or twice it changed QAT's excess loss by less than 0.002 nats.
FINETUNE_LR_RATIO = 0.1
# Fine-tuning batches use seeds from here on: none of the reference's training batches
# (seeds 0 .. steps-1) and none of the held-out or calibration sequences (10**6, 2 * 10**6).
FINETUNE_SEED_OFFSET = 100_000
SCALE_MODES = ("learned", "minmax")
MIN_BITS, MAX_BITS = 2, 8  # codes in [-qmax, qmax] stored as int8; 1 bit would leave only 0
MIN_STEP = 1e-8  # learned step sizes are clamped above this, so that w / s stays finite
COMPARED_OPTIMIZERS = ("adamw", "adamw-8bit")  # 8-bit AdamW against the 32-bit one it replaces
MOVED = 0.01  # a step size counts as moved when learned / initial differs from 1 by more


def _check_bits(bits) -> int:
    check_positive_int("bits", bits)
    if not MIN_BITS <= bits <= MAX_BITS:
        raise MemlabError(f"bits must be between {MIN_BITS} and {MAX_BITS} (signed codes in "
                          f"[-qmax, qmax], stored as int8), got {bits}")
    return bits


def _qmax(bits: int) -> int:
    return 2 ** (bits - 1) - 1


# 8-bit optimizer states --------------------------------------------------------------------------
@dataclass(frozen=True)
class OptimizerRun:
    """One optimizer's run: its state bytes, loss curve and held-out quality (chapter: 3)."""

    optimizer: str
    state_bytes: int  # every distinct optimizer state tensor after the last step
    trained_params: int
    bytes_per_param: float  # state_bytes / trained_params
    eligible_bytes_per_param: float  # over the tensors the 8-bit optimizer stores in 8 bits
    small_bytes_per_param: float | None  # over the rest (kept in 32-bit), None if there are none
    shared_bytes: int  # state tensors shared by many parameters (8-bit code books), counted once
    losses: list[float]  # training loss per step, nats
    quality: Quality  # held-out, after the last step
    train_s: float  # seconds of training


@dataclass(frozen=True)
class OptimizerComparison:
    """AdamW against bitsandbytes' AdamW8bit on the same model and batches (chapter: 3)."""

    scale: str
    config: LMConfig
    steps: int
    device: str
    runs: list[OptimizerRun]
    eligible_params: int  # parameters AdamW8bit stores in 8 bits (its state's dtype is 1 byte)
    small_params: int  # parameters it keeps in 32-bit
    eligible_tensors: tuple[str, ...]
    small_tensors: tuple[str, ...]
    min_8bit_size: int | None  # bitsandbytes' threshold, read from the optimizer's arguments
    seconds: float  # wall time of the whole comparison

    def run(self, optimizer: str) -> OptimizerRun:
        """One run by optimizer name ('adamw' or 'adamw-8bit')."""
        check_choice("optimizer", optimizer, [r.optimizer for r in self.runs])
        return next(r for r in self.runs if r.optimizer == optimizer)

    @property
    def loss_gap(self) -> float:
        """Held-out loss of AdamW8bit minus AdamW's, nats."""
        return self.run("adamw-8bit").quality.loss - self.run("adamw").quality.loss

    def frame(self):
        """State bytes and held-out quality per optimizer, as a DataFrame (chapter: 3).

        The loss against AdamW's, with 2 paired SE.
        """
        import pandas as pd

        base = self.run("adamw").quality if "adamw" in [r.optimizer for r in self.runs] else None
        rows = []
        for r in self.runs:
            d, se = paired_delta(r.quality, base) if base is not None else (math.nan, math.nan)
            rows.append({"optimizer": r.optimizer, "state bytes": r.state_bytes,
                         "bytes/param": r.bytes_per_param,
                         "bytes/param (8-bit-eligible tensors)": r.eligible_bytes_per_param,
                         "held-out excess (nats)": r.quality.excess, "accuracy": r.quality.accuracy,
                         "vs adamw (nats)": d, "2 SE": 2 * se})
        return pd.DataFrame(rows).set_index("optimizer")

    def table(self) -> str:
        """State bytes, bytes per parameter and held-out quality as text (chapter: 3)."""
        lines = [f"{self.steps} steps on {self.device}; {self.eligible_params:,} parameters in "
                 f"{len(self.eligible_tensors)} tensors stored in 8 bits, {self.small_params:,} "
                 f"in {len(self.small_tensors)} small tensors kept in 32-bit "
                 f"(min_8bit_size {self.min_8bit_size})",
                 f"{'optimizer':<11}{'state':>11}{'B/param':>9}{'8-bit-eligible':>16}"
                 f"{'small':>7}{'eval excess':>13}{'train s':>9}"]
        for r in self.runs:
            small = "-" if r.small_bytes_per_param is None else f"{r.small_bytes_per_param:.2f}"
            lines.append(f"{r.optimizer:<11}{r.state_bytes:>11,}{r.bytes_per_param:>9.3f}"
                         f"{r.eligible_bytes_per_param:>16.3f}{small:>7}"
                         f"{r.quality.excess:>13.4f}{r.train_s:>9.1f}")
        return "\n".join(lines)


def optimizer_comparison(scale: str | None = None, *, steps: int | None = None, device=None,
                         config: LMConfig | None = None,
                         optimizers: tuple[str, ...] = COMPARED_OPTIMIZERS) -> OptimizerComparison:
    """Train one fresh model with AdamW and with AdamW8bit (chapter: 3).

    State bytes per parameter, loss, quality.

    ``config`` replaces the scale's :class:`memlab.quant.schemes.LMConfig` (the tests use a
    smaller one). All runs start from the same seed and see the same batches. The 8-bit-eligible
    parameters are those AdamW8bit's state holds in 1-byte codes; every optimizer's bytes are
    also reported over them.
    """
    start = time.perf_counter()
    for name in optimizers:
        check_choice("optimizer", name, OPTIMIZERS)
    if "adamw-8bit" not in optimizers:
        raise MemlabError(f"optimizers must include 'adamw-8bit' (it defines the 8-bit-eligible "
                          f"tensors), got {tuple(optimizers)!r}")
    scale = get_scale(scale)
    cfg = config or lm_config(scale)
    steps = check_positive_int("steps", steps if steps is not None else OPT_STEPS[scale])
    dev = pick_device(device)
    trained = {}
    for name in optimizers:
        trained[name] = train_lm(cfg, steps=steps, optimizer=name, device=dev.type,
                                 keep_optimizer=True)
    tr8 = trained["adamw-8bit"]
    sb8 = tr8.state
    runs = []
    for name, tr in trained.items():
        sb = measure_state(tr.opt, tr.model, eligible=set(sb8.eligible_names))
        runs.append(OptimizerRun(
            optimizer=name, state_bytes=sb.state_bytes, trained_params=sb.trained_params,
            bytes_per_param=sb.bytes_per_param,
            eligible_bytes_per_param=sb.eligible_bytes_per_param,
            small_bytes_per_param=sb.other_bytes_per_param, shared_bytes=sb.shared_bytes,
            losses=tr.losses, quality=evaluate(tr.model, cfg), train_s=tr.train_s))
    return OptimizerComparison(
        scale=scale, config=cfg, steps=steps, device=device_name(dev), runs=runs,
        eligible_params=sb8.eligible_params, small_params=sb8.other_params,
        eligible_tensors=sb8.eligible_names, small_tensors=sb8.other_names,
        min_8bit_size=getattr(getattr(tr8.opt, "args", None), "min_8bit_size", None),
        seconds=time.perf_counter() - start)


def gain(before: Quality, after: Quality) -> str:
    """How much lower ``after``'s held-out loss is than ``before``'s, nats (chapter: 3).

    With 2 paired standard errors.
    """
    d, se = paired_delta(before, after)
    return f"{d:+.4f} +- {2 * se:.4f}"


# Fake quantization with a learned step size (LSQ) ------------------------------------------------
class _RoundSTE(torch.autograd.Function):
    """round() forward, identity backward: the straight-through estimator."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GradScale(torch.autograd.Function):
    """Identity forward; multiplies the gradient by ``scale`` backward (LSQ's g)."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _row_step(w: torch.Tensor, qmax: int) -> torch.Tensor:
    """Row absmax / qmax, (out, 1); 1.0 for an all-zero row (any step stores it exactly)."""
    absmax = w.detach().abs().amax(dim=1, keepdim=True)  # (out, 1)
    return torch.where(absmax > 0, absmax / qmax, torch.ones_like(absmax))


class FakeQuantLinear(nn.Module):
    """An ``nn.Linear`` that computes with its weight quantized to ``bits`` (chapter: 3).

    One step size per row.

    ``scale_mode="learned"`` (LSQ): the step sizes are an ``nn.Parameter``, initialised to the
    row's absmax / qmax, so that at the start the layer computes exactly what per-row absmax
    round-to-nearest stores: fine-tuning starts from the PTQ model, and every change of a
    step size is measured against the choice PTQ makes. ``"minmax"``: the step sizes are
    recomputed from the current weights' row absmax at every forward pass, with no gradient.
    The weight, the bias and the module's other attributes are the wrapped layer's own.
    """

    def __init__(self, linear: nn.Linear, bits: int = 4, *, scale_mode: str = "learned",
                 grad_scale: bool = True):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise MemlabError(f"FakeQuantLinear wraps an nn.Linear, got {type(linear).__name__}")
        self.bits = _check_bits(bits)
        self.qmax = _qmax(bits)
        self.scale_mode = check_choice("scale_mode", scale_mode, SCALE_MODES)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # (out, in), the same Parameter
        self.bias = linear.bias  # (out,) or None
        step = _row_step(linear.weight, self.qmax)  # (out, 1)
        self.register_buffer("initial_step", step.clone())
        if scale_mode == "learned":
            self.step_size = nn.Parameter(step.clone())  # (out, 1)
        else:
            self.step_size = None
        # LSQ §2.2: g = 1 / sqrt(N * Qp), N the weights one step size serves (a row).
        self.grad_scale = 1.0 / math.sqrt(self.in_features * self.qmax) if grad_scale else 1.0

    def step(self) -> torch.Tensor:
        """The step size of every row, (out, 1): learned (kept above MIN_STEP), or from the current weights."""
        if self.step_size is None:
            return _row_step(self.weight, self.qmax)
        return _GradScale.apply(self.step_size.clamp_min(MIN_STEP), self.grad_scale)

    def quantized_weight(self) -> torch.Tensor:
        """round(clamp(w / s, -qmax, qmax)) * s, (out, in), with the STE for round.

        Learned: as in LSQ eq. 3, a weight with ``|w/s| >= qmax`` counts as clipped: it gets no
        gradient and gives ``s`` the gradient ``+-qmax``; inside, ``w`` gets the identity and
        ``s`` ``round(w/s) - w/s``. Min/max: as in ``torch.fake_quantize_per_channel_affine``, a
        weight is clipped when its rounded code is out of range; with ``s`` from the row's
        absmax none is, so every weight gets the identity (and each row's largest keeps moving).
        """
        s = self.step()  # (out, 1)
        v = self.weight / s  # (out, in)
        if self.step_size is None:
            inside = torch.round(v.detach()).abs() <= self.qmax
        else:
            inside = v.detach().abs() < self.qmax
        v = torch.where(inside, v, torch.sign(v.detach()) * self.qmax)
        return _RoundSTE.apply(v) * s

    def codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The integer codes (out, in) int8 and the step sizes (out, 1) float32 the layer stores."""
        with torch.no_grad():
            s = self.step().detach()
            q = torch.round(torch.clamp(self.weight.float() / s, -self.qmax, self.qmax))
        return q.to(torch.int8), s

    def export(self) -> nn.Linear:
        """A plain ``nn.Linear`` whose weight is codes * step sizes: what a checkpoint would hold."""
        q, s = self.codes()
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(q.to(s.dtype) * s)
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out

    def forward(self, x):  # (..., in) -> (..., out)
        return F.linear(x, self.quantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bits={self.bits}, scale_mode={self.scale_mode}")


def wrap_linears(model: nn.Module, bits: int, *, scale_mode: str = "learned",
                 grad_scale: bool = True) -> list[str]:
    """Replace every ``nn.Linear`` in ``model.blocks`` by a :class:`FakeQuantLinear` (chapter: 3).

    The model is changed in place.

    Returns the names of the wrapped layers; the embedding, the norms and the LM head stay fp32.
    """
    _check_bits(bits)
    names = []
    for name, linear in block_linears(model).items():
        replace_module(model, name, FakeQuantLinear(linear, bits, scale_mode=scale_mode,
                                                    grad_scale=grad_scale))
        names.append(name)
    return names


def export_model(model: nn.Module) -> nn.Module:
    """A copy of a fake-quantized model with its fake-quantized layers exported (chapter: 3).

    Every :class:`FakeQuantLinear` becomes a plain ``nn.Linear``.
    """
    out = copy.deepcopy(model)
    for name, fq in block_linears(out, FakeQuantLinear).items():
        replace_module(out, name, fq.export())
    return out


def ptq_model(model: nn.Module, bits: int) -> nn.Module:
    """A copy with every ``nn.Linear`` in the blocks round-to-nearest quantized (chapter: 3).

    Per-row absmax.
    """
    _check_bits(bits)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for linear in block_linears(out).values():
            w = linear.weight  # (out, in)
            q, st = absmax_quantize(w.detach().float().cpu(), bits, granularity="row")
            w.copy_(dequantize(q, st).to(w.device, w.dtype))
    return out


@dataclass(frozen=True)
class LayerScale:
    """How far one layer's learned step sizes moved from their absmax / qmax start (chapter: 3)."""

    name: str
    rows: int
    median_ratio: float  # median over rows of learned / initial step size
    min_ratio: float
    max_ratio: float
    moved_share: float  # rows whose ratio differs from 1 by more than MOVED


@dataclass(frozen=True)
class TorchFakeQuantFacts:
    """What PyTorch's own fake quantization does with its scale (chapter: 3).

    Found by inspecting the objects.
    """

    torch_version: str
    fake_quantize: str | None  # the class, if torch.ao.quantization.FakeQuantize exists
    default_qat_weight: str | None  # the weight fake-quantize of the default QAT qconfig
    scale_is_parameter: bool | None  # of the default QAT weight fake-quantize
    scale_is_buffer: bool | None
    scale_gets_grad: bool | None  # does backward give its scale a gradient?
    scale_follows_data: bool | None  # does its scale change when only the input changes?
    learnable: str | None  # where _LearnableFakeQuantize lives, if anywhere
    learnable_public: bool  # importable from torch.ao.quantization itself
    learnable_scale_is_parameter: bool | None


def torch_fake_quant_facts() -> TorchFakeQuantFacts:
    """Inspect torch.ao.quantization's fake-quantize scale (chapter: 3).

    Is it learned, or computed by an observer?
    """
    with warnings.catch_warnings():  # torch.ao's observers use the deprecated torch.jit API
        warnings.simplefilter("ignore", DeprecationWarning)
        return _torch_fake_quant_facts()


def _torch_fake_quant_facts() -> TorchFakeQuantFacts:
    try:
        import torch.ao.quantization as aq
    except ImportError:  # pragma: no cover - a torch without torch.ao
        aq = None
    fq_cls = getattr(aq, "FakeQuantize", None) if aq is not None else None
    default = is_param = is_buffer = gets_grad = follows = None
    if fq_cls is not None and hasattr(aq, "get_default_qat_qconfig"):
        fq = aq.get_default_qat_qconfig().weight()
        default = f"{type(fq).__module__}.{type(fq).__qualname__}"
        is_param = isinstance(fq.scale, nn.Parameter)
        is_buffer = any(t is fq.scale for t in fq.buffers())
        g = torch.Generator().manual_seed(0)
        x = torch.randn(8, 16, generator=g, requires_grad=True)  # (out, in): a weight
        fq(x).sum().backward()
        gets_grad = fq.scale.grad is not None or any(
            p.grad is not None for p in fq.parameters())
        before = fq.scale.detach().clone()
        for _ in range(20):  # moving-average observers need several looks to move far
            fq(x.detach() * 4)
        follows = not torch.allclose(before, fq.scale.detach())
    learn_cls, where = None, None
    try:
        from torch.ao.quantization import _learnable_fake_quantize as lfq

        learn_cls = getattr(lfq, "_LearnableFakeQuantize", None)
        where = f"{lfq.__name__}._LearnableFakeQuantize" if learn_cls is not None else None
    except ImportError:
        pass
    learn_param = None
    if learn_cls is not None:
        m = learn_cls(observer=aq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
        learn_param = isinstance(m.scale, nn.Parameter)
    return TorchFakeQuantFacts(
        torch_version=torch.__version__,
        fake_quantize=f"{fq_cls.__module__}.{fq_cls.__qualname__}" if fq_cls else None,
        default_qat_weight=default, scale_is_parameter=is_param, scale_is_buffer=is_buffer,
        scale_gets_grad=gets_grad, scale_follows_data=follows, learnable=where,
        learnable_public=aq is not None and hasattr(aq, "_LearnableFakeQuantize"),
        learnable_scale_is_parameter=learn_param)


@dataclass(frozen=True)
class QatResult:
    """PTQ, QAT with learned step sizes, QAT with min/max step sizes, and fine-tune-then-PTQ (chapter: 3)."""

    scale: str
    bits: int
    steps: int  # fine-tuning steps of every variant
    lr: float  # their peak learning rate
    device: str
    layers: list[str]  # the quantized layers (inside the blocks)
    reference: Quality  # the fp32 model every variant starts from
    ptq: Quality  # per-row absmax round-to-nearest of the reference
    qat: Quality  # LSQ fine-tuned, exported as integer codes * learned step sizes
    qat_fake_quant: Quality  # the same model before export (must equal qat)
    qat_minmax: Quality  # fake-quant fine-tuned with step sizes recomputed from row absmax
    control_fp32: Quality  # fp32 fine-tuned as long, not quantized
    control: Quality  # fp32 fine-tuned as long, then PTQ
    scales: list[LayerScale]
    scale_change_median: float  # median over all rows of |learned / initial - 1|
    minmax_change_median: float  # the same for min/max QAT's step sizes (moved by the weights)
    qat_losses: list[float]  # training loss per step of the LSQ fine-tuning, nats
    minmax_losses: list[float]
    control_losses: list[float]
    torch_fake_quant: TorchFakeQuantFacts
    seconds: float  # wall time of the whole experiment

    @property
    def export_matches(self) -> bool:
        """The exported integer model evaluates exactly as the fake-quant model trained."""
        return self.qat.loss == self.qat_fake_quant.loss and (
            self.qat.accuracy == self.qat_fake_quant.accuracy)

    @property
    def qat_gain(self) -> float:
        """PTQ's excess loss minus QAT's, nats: what fake-quant fine-tuning buys."""
        return self.ptq.excess - self.qat.excess

    @property
    def learned_scale_gain(self) -> float:
        """Min/max-scale QAT's excess loss minus learned-scale QAT's, nats."""
        return self.qat_minmax.excess - self.qat.excess

    def table(self) -> str:
        """Excess loss and accuracy of every variant as text (chapter: 3)."""
        rows = [("fp32 reference", self.reference), (f"PTQ int{self.bits}", self.ptq),
                ("fine-tune fp32", self.control_fp32),
                (f"fine-tune, then PTQ int{self.bits}", self.control),
                (f"QAT int{self.bits}, min/max scale", self.qat_minmax),
                (f"QAT int{self.bits}, learned scale", self.qat)]
        lines = [f"{self.bits}-bit per-row weights in {len(self.layers)} layers; fine-tuning "
                 f"{self.steps} steps at lr {self.lr:g} on {self.device}",
                 f"{'model':<34}{'excess loss':>12}{'accuracy':>10}{'vs PTQ +- 2 SE (nats)':>24}"]
        for n, q in rows:
            d, se = paired_delta(q, self.ptq)
            lines.append(f"{n:<34}{q.excess:>12.4f}{q.accuracy:>10.4f}"
                         + f"{d:>+15.4f} +- {2 * se:.4f}")
        lines.append(f"learned / initial step size: median |change| {self.scale_change_median:.1%}"
                     f" (min/max QAT's, following the weights: {self.minmax_change_median:.1%})"
                     "; per layer median " + ", ".join(
                         f"{s.name.removeprefix('blocks.')} {s.median_ratio:.3f}"
                         for s in self.scales))
        return "\n".join(lines)


def _scale_stats(model: nn.Module) -> tuple[list[LayerScale], float]:
    stats, changes = [], []
    for name, m in block_linears(model, FakeQuantLinear).items():
        ratio = (m.step().detach() / m.initial_step).reshape(-1).cpu()  # (out,)
        change = (ratio - 1).abs()
        changes += change.tolist()
        stats.append(LayerScale(name=name, rows=ratio.numel(), median_ratio=float(ratio.median()),
                                min_ratio=float(ratio.min()), max_ratio=float(ratio.max()),
                                moved_share=float((change > MOVED).double().mean())))
    return stats, statistics.median(changes)


def qat_vs_ptq(scale: str | None = None, *, bits: int = 3, steps: int | None = None, device=None,
               lr: float | None = None, reference: TrainedLM | None = None) -> QatResult:
    """PTQ against LSQ quantization-aware training (and its controls) of the book's model (chapter: 3).

    Starts from ``reference`` (default :func:`memlab.model.lm.reference_model`), which is
    deep-copied and never changed. Every fine-tuning (LSQ QAT, min/max QAT, fp32 control) runs
    ``steps`` steps at peak ``lr`` (default a tenth of the training rate) on the same batches,
    none of which the reference trained on. Without ``reference`` the result is computed once
    per process for the same scale, bits, steps, device and ``lr`` (and kept on disk when
    ``$MEMLAB_CACHE_DIR`` is set), so the chapter's run and claim C19's are one run.
    """
    bits = _check_bits(bits)
    scale = get_scale(scale)
    steps = check_positive_int("steps", steps if steps is not None else QAT_STEPS[scale])
    if lr is not None and not lr > 0:
        raise MemlabError(f"lr must be positive, got {lr!r}")
    dev = pick_device(device)
    if reference is None:
        return _qat_vs_ptq_default(scale, bits, steps, dev.type, lr)
    return _qat_vs_ptq(scale, bits, steps, dev, lr, reference)


@functools.cache
@kept_on_disk
def _qat_vs_ptq_default(scale: str, bits: int, steps: int, device: str, lr: float | None) -> QatResult:
    """:func:`qat_vs_ptq` from the scale's reference model, once per process for its arguments."""
    dev = pick_device(device)
    return _qat_vs_ptq(scale, bits, steps, dev, lr, reference_model(scale, device=dev.type))


def _qat_vs_ptq(scale: str, bits: int, steps: int, dev: torch.device, lr: float | None,
                ref: TrainedLM) -> QatResult:
    start = time.perf_counter()
    cfg = ref.config
    lr = cfg.lr * FINETUNE_LR_RATIO if lr is None else lr
    kw = dict(steps=steps, lr=lr, device=dev.type, seed_offset=FINETUNE_SEED_OFFSET)
    base = copy.deepcopy(ref.model).to(dev)

    qat = copy.deepcopy(base)
    layers = wrap_linears(qat, bits)
    qat_run = train_lm(cfg, model=qat, **kw)
    fake_q = evaluate(qat, cfg)
    scales, change = _scale_stats(qat)

    minmax = copy.deepcopy(base)
    wrap_linears(minmax, bits, scale_mode="minmax")
    minmax_run = train_lm(cfg, model=minmax, **kw)
    minmax_change = _scale_stats(minmax)[1]

    control = copy.deepcopy(base)
    control_run = train_lm(cfg, model=control, **kw)

    return QatResult(
        scale=scale, bits=bits, steps=steps, lr=lr, device=device_name(dev), layers=layers,
        reference=evaluate(base, cfg), ptq=evaluate(ptq_model(base, bits), cfg),
        qat=evaluate(export_model(qat), cfg), qat_fake_quant=fake_q,
        qat_minmax=evaluate(export_model(minmax), cfg),
        control_fp32=evaluate(control, cfg), control=evaluate(ptq_model(control, bits), cfg),
        scales=scales, scale_change_median=change, minmax_change_median=minmax_change,
        qat_losses=qat_run.losses,
        minmax_losses=minmax_run.losses, control_losses=control_run.losses,
        torch_fake_quant=torch_fake_quant_facts(), seconds=time.perf_counter() - start)


@functools.cache
def qat_vs_ptq_ci(bits: int = 3) -> QatResult:
    """:func:`qat_vs_ptq` at scale 'ci' on the CPU, computed once per process (chapter: 3)."""
    return qat_vs_ptq("ci", bits=bits, device="cpu")
