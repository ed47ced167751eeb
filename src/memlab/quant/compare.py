"""Quantizing the book's trained model every way (chapter: 3).

Bytes stored, held-out quality, per-layer error.

Every scheme replaces the ``nn.Linear`` layers inside the transformer blocks (the attention
projections and the MLP) and keeps the embedding, the norms and the LM head in 16-bit, as
``bitsandbytes`` and ``transformers`` do by default. The int8, LLM.int8(), NF4 and FP4 schemes use
bitsandbytes' own modules (``Linear8bitLt``, ``Linear4bit``); round-to-nearest and GPTQ use
:mod:`memlab.quant.functional` and :mod:`memlab.quant.gptq`. Weight bytes are counted from the
tensors each quantized layer really stores (:func:`layer_bytes`).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from memlab.device import pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int, require
from memlab.model.lm import (
    LMConfig,
    Quality,
    TrainedLM,
    config_for,
    eval_batch,
    evaluate,
    paired_delta,
    trained_reference,
)
from memlab.model.transformer import block_linears, replace_module
from memlab.quant.functional import LLM_INT8_THRESHOLD
from memlab.quant.gptq import GptqColumns
from memlab.quant.schemes import MODEL_SCHEMES
from memlab.results import kept_on_disk

# Schemes -------------------------------------------------------------------------------------------
MODEL_LABELS = {  # how the book's model applies each of MODEL_SCHEMES
    "fp32": "fp32 (reference)",
    "bf16": "bf16",
    "int8": "int8 absmax per-row, weights and inputs (bitsandbytes, threshold 0)",
    "llm-int8": "LLM.int8(): int8 + 16-bit outlier columns (bitsandbytes, threshold 6)",
    "nf4": "NF4, blocks of 64 (bitsandbytes)",
    "fp4": "FP4, blocks of 64 (bitsandbytes)",
    "nf4-dq": "NF4 + double quantization (bitsandbytes)",
    "rtn-4": "4-bit round-to-nearest, zero-point per group of 64",
    "rtn-3": "3-bit round-to-nearest, zero-point per group of 64",
    "gptq-4": "GPTQ 4-bit, zero-point per group of 64",
    "gptq-3": "GPTQ 3-bit, zero-point per group of 64",
}
GROUP_SIZE = 64  # RTN and GPTQ: one fp16 scale and one zero per 64 weights, like NF4's blocks


def _tensor_bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


@dataclass(frozen=True)
class LayerStorage:
    """What one quantized layer stores: codes and scales, and everything bitsandbytes would save."""

    params: int
    weight_bytes: int  # codes + scales (+ zeros): the weight as stored in memory
    saved_bytes: int  # the module's state_dict: also code books and serialized metadata

    @property
    def bits_per_param(self) -> float:
        return 8 * self.weight_bytes / self.params


def layer_bytes(module: nn.Module, params: int) -> LayerStorage:
    """Bytes a (quantized) linear layer stores, counted from its own tensors (chapter: 3)."""
    saved = _tensor_bytes(*module.state_dict().values())
    w = module.weight
    qs = getattr(w, "quant_state", None)
    if qs is not None:  # bitsandbytes Params4bit: packed codes, absmax (and its own absmax)
        extra = [qs.absmax] + ([qs.state2.absmax, qs.offset] if qs.nested else [])
        weight = _tensor_bytes(w.data, *extra)
    elif _int8_scales(module) is not None:  # Int8Params: int8 codes and one fp32 absmax per row
        weight = _tensor_bytes(w.data, _int8_scales(module))
    elif hasattr(module, "stored_bytes"):
        weight = module.stored_bytes
    else:
        weight = _tensor_bytes(w)
    return LayerStorage(params, weight, saved)


def _int8_scales(module: nn.Module) -> torch.Tensor | None:
    """Linear8bitLt's per-row absmax: on the weight until the first forward, then on ``module.state``."""
    scb = getattr(module.weight, "SCB", None)
    if scb is None:
        scb = getattr(getattr(module, "state", None), "SCB", None)
    return scb if isinstance(scb, torch.Tensor) else None


class DequantizedLinear(nn.Linear):
    """A linear layer whose weight is the dequantized value of stored codes (RTN, GPTQ) (chapter: 3).

    It computes with the dequantized fp32 weight (what a dequantize-then-matmul kernel does) and
    reports the bytes of the codes, scales and zeros it stands for in ``stored_bytes`` (the
    weight only: a bias is counted with the model's other parameters, as for every scheme).
    """

    def __init__(self, linear: nn.Linear, q: torch.Tensor, state):
        from memlab.quant.functional import dequantize, stored_bytes

        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device=linear.weight.device)
        with torch.no_grad():
            self.weight.copy_(dequantize(q.cpu(), state).to(linear.weight.device))
            if linear.bias is not None:
                self.bias.copy_(linear.bias)
        self.stored_bytes = stored_bytes(q.cpu(), state)


def bnb_linear(linear: nn.Linear, scheme: str, device: torch.device,
               compute_dtype: torch.dtype = torch.float32,
               cpu_path: str = "dequantize") -> nn.Module:
    """``linear`` as the bitsandbytes module of a scheme, on ``device`` (chapter: 3).

    The scheme is int8, LLM.int8(), NF4 or FP4.

    ``compute_dtype`` is the dtype a 4-bit layer dequantizes its weight to and multiplies in
    (fp32 for the chapter's comparison, so that only the weight's rounding differs).
    ``cpu_path`` is the path a 4-bit layer takes on a CPU (:mod:`memlab.quant.cpu_paths`):
    ``dequantize`` by default, so the arithmetic is the same on every CPU.
    """
    from memlab.quant.cpu_paths import use_cpu_path

    bnb = require("bitsandbytes", f"the {scheme} scheme", extra="quant")
    has_bias = linear.bias is not None
    if scheme in ("int8", "llm-int8"):
        m = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias,
                                has_fp16_weights=False,
                                threshold=LLM_INT8_THRESHOLD if scheme == "llm-int8" else 0.0)
    else:
        m = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                              compute_dtype=compute_dtype, compress_statistics=scheme == "nf4-dq",
                              quant_type="fp4" if scheme == "fp4" else "nf4")
    m.load_state_dict(linear.state_dict())
    return use_cpu_path(m.to(device).eval(), cpu_path)  # moving it to the device quantizes it


@dataclass
class QuantizedLM:
    """A copy of the reference model with its block linears quantized by one scheme (chapter: 3)."""

    scheme: str
    model: nn.Module
    layers: dict[str, LayerStorage]
    other_params: int  # embedding, norms, LM head: kept in 16-bit (fp32 in the fp32 reference)
    other_bytes: int
    quantize_s: float

    @property
    def linear_bytes(self) -> int:
        return sum(s.weight_bytes for s in self.layers.values())

    @property
    def linear_params(self) -> int:
        return sum(s.params for s in self.layers.values())

    @property
    def total_bytes(self) -> int:
        return self.linear_bytes + self.other_bytes


def _round_params(module_params, dtype: torch.dtype) -> int:
    """Round parameters to ``dtype`` in place (computed in fp32 after); their bytes in ``dtype``."""
    n = 0
    with torch.no_grad():
        for p in module_params:
            p.copy_(p.to(dtype).float())
            n += p.numel() * torch.empty((), dtype=dtype).element_size()
    return n


def quantize_model(trained: TrainedLM, scheme: str, *, device=None,
                   group_size: int = GROUP_SIZE) -> QuantizedLM:
    """Quantize a copy of ``trained.model``'s block linears with ``scheme`` (chapter: 3).

    ``group_size`` is the number of weights per scale for RTN and GPTQ (bitsandbytes' 4-bit
    layers use blocks of 64).
    """
    check_choice("scheme", scheme, MODEL_SCHEMES)
    check_positive_int("group_size", group_size)
    dev = pick_device(device)
    start = time.perf_counter()
    model = copy.deepcopy(trained.model).to(dev).eval()
    linears = block_linears(model)
    linear_ids = {id(m.weight) for m in linears.values()}
    others = [p for p in model.parameters() if id(p) not in linear_ids]
    other_params = sum(p.numel() for p in others)
    if scheme == "fp32":
        layers = {n: layer_bytes(m, m.weight.numel()) for n, m in linears.items()}
        return QuantizedLM(scheme, model, layers, other_params, _tensor_bytes(*others),
                           time.perf_counter() - start)
    other_bytes = _round_params(others, torch.bfloat16)  # embedding, norms, head: 16-bit
    if scheme == "bf16":
        _round_params([m.weight for m in linears.values()], torch.bfloat16)
        layers = {n: LayerStorage(m.weight.numel(), m.weight.numel() * 2, m.weight.numel() * 2)
                  for n, m in linears.items()}
    elif scheme.startswith("gptq"):
        layers = _gptq_model(model, trained.config, int(scheme[-1]), dev, group_size)
    else:
        layers = {}
        for name, lin in linears.items():
            if scheme.startswith("rtn"):
                from memlab.quant.gptq import rtn_quantize

                q, st = rtn_quantize(lin.weight.detach().float().cpu(), int(scheme[-1]),
                                     group_size=group_size)
                new = DequantizedLinear(lin, q, st)
            else:
                new = bnb_linear(lin, scheme, dev)
            replace_module(model, name, new)
            layers[name] = layer_bytes(new, lin.weight.numel())
    return QuantizedLM(scheme, model, layers, other_params, other_bytes, time.perf_counter() - start)


@torch.no_grad()
def capture_inputs(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs every named module receives when the model runs on ``x``, as (N, in) fp32 (chapter: 3)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def hook(_m, args, name=name):
            seen[name] = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _gptq_model(model: nn.Module, cfg: LMConfig, bits: int, dev: torch.device,
                group_size: int, blocks: int | None = None) -> dict[str, LayerStorage]:
    """GPTQ block by block, as in the paper: each block's Hessians come from the inputs it gets
    from the blocks before it, already quantized. ``blocks``: only the first that many."""
    from memlab.quant.gptq import gptq_quantize, hessian

    x, _ = eval_batch(cfg, calibration=True)
    x = x.to(dev)
    layers: dict[str, LayerStorage] = {}
    for i in range(len(model.blocks) if blocks is None else blocks):
        names = [n for n in block_linears(model) if n.startswith(f"blocks.{i}.")]
        inputs = capture_inputs(model, names, x)
        for name in names:
            lin = model.get_submodule(name)
            H = hessian(inputs[name].cpu())
            q, st = gptq_quantize(lin.weight.detach().float().cpu(), H, bits, group_size=group_size)
            new = DequantizedLinear(lin, q, st)
            replace_module(model, name, new)
            layers[name] = layer_bytes(new, lin.weight.numel())
    return layers


@dataclass(frozen=True)
class GptqLayerColumns:
    """GPTQ on one layer of the chapter's model, column by column, beside round-to-nearest (chapter: 3)."""

    layer: str
    bits: int
    group_size: int
    run: GptqColumns  # what each column was when rounded, and the errors it passed on
    rtn: torch.Tensor  # (out, in) round-to-nearest on the same grid, in processing order
    path: dict  # relative output error on the calibration inputs as columns are rounded


def gptq_layer_by_column(layer: str = "blocks.0.mlp.down_proj", bits: int = 3, scale: str | None = None, *,
                     device=None, config: LMConfig | None = None,
                     group_size: int = GROUP_SIZE) -> GptqLayerColumns:
    """The chapter's GPTQ run on one block linear, kept column by column (chapter: 3).

    The model is prepared as :func:`quantize_model` prepares it (embedding, norms and head in
    bf16, the blocks before the layer GPTQ-quantized), so the layer's Hessian comes from the
    same calibration inputs and its codes are ``gptq-<bits>``'s codes for this layer.
    """
    cfg = config_for(scale, config)
    check_positive_int("bits", bits)
    if not 2 <= bits <= 8:
        raise MemlabError(f"bits must be between 2 and 8 (codes are stored as uint8), got {bits}")
    check_positive_int("group_size", group_size)
    return _layer_by_column(cfg, layer, bits, str(pick_device(device)), group_size)


@functools.cache
def _layer_by_column(cfg: LMConfig, layer: str, bits: int, device: str, group_size: int) -> GptqLayerColumns:
    from memlab.quant.functional import dequantize
    from memlab.quant.gptq import gptq_by_column, hessian, rtn_quantize

    trained = trained_reference(cfg, device)
    check_choice("layer", layer, list(block_linears(trained.model)))
    dev = pick_device(device)
    model = copy.deepcopy(trained.model).to(dev).eval()
    linear_ids = {id(m.weight) for m in block_linears(model).values()}
    _round_params([p for p in model.parameters() if id(p) not in linear_ids], torch.bfloat16)
    block = int(layer.split(".")[1])
    _gptq_model(model, trained.config, bits, dev, group_size, blocks=block)  # the blocks before
    x, _ = eval_batch(trained.config, calibration=True)
    xin = capture_inputs(model, [layer], x.to(dev))[layer].cpu()  # (N, in)
    w = model.get_submodule(layer).weight.detach().float().cpu()  # (out, in)
    run = gptq_by_column(w, hessian(xin), bits, group_size=group_size)
    rtn = dequantize(*rtn_quantize(w, bits, group_size=group_size))[:, run.order]
    return GptqLayerColumns(layer, bits, group_size, run, rtn, run.relative_error_path(rtn))


@torch.no_grad()
def layer_errors(reference: nn.Module, quantized: nn.Module, cfg: LMConfig) -> dict[str, float]:
    """Relative output error of each quantized block linear, ||y_q - y|| / ||y|| (chapter: 3).

    On the reference's own inputs.

    The inputs come from held-out sequences (as many as the calibration set), never from the
    calibration sequences GPTQ fits its updates to: the error is measured out of sample.
    """
    x, _ = eval_batch(cfg)
    x = x[: cfg.calib_sequences]
    dev = next(reference.parameters()).device
    names = list(block_linears(reference))
    inputs = capture_inputs(reference, names, x.to(dev))
    out = {}
    for name in names:
        xin = inputs[name]
        y = reference.get_submodule(name)(xin).float()
        yq = quantized.get_submodule(name)(xin).float()
        out[name] = float((yq - y).norm() / y.norm())
    return out


@dataclass(frozen=True)
class SchemeRow:
    """One scheme on the reference model: bytes, quality and per-layer error (chapter: 3)."""

    scheme: str
    label: str
    linear_params: int
    linear_bytes: int  # codes + scales of the quantized block linears
    saved_bytes: int  # what the quantized layers' state_dicts hold (code books, metadata too)
    other_bytes: int  # embedding, norms, LM head
    total_bytes: int
    bits_per_param: float  # of the block linears, scales included
    loss: float  # held-out, nats
    excess: float  # loss above the chain's own, nats
    perplexity: float
    accuracy: float
    mean_layer_error: float  # mean relative output error of the block linears
    max_layer_error: float
    quantize_s: float
    other_params: int  # parameters of the embedding, norms and LM head
    loss_delta: float  # held-out loss minus the fp32 reference's, same sequences, nats
    loss_delta_se: float  # its standard error over the held-out sequences (paired), nats

    @property
    def linear_bits_per_param(self) -> float:
        """Stored bits per weight of the quantized block linears, scales included (= ``bits_per_param``)."""
        return self.bits_per_param

    @property
    def model_bits_per_param(self) -> float:
        """Stored bits per parameter of the whole model: block linears, embedding, norms and head."""
        return 8 * self.total_bytes / (self.linear_params + self.other_params)


@dataclass(frozen=True)
class QuantComparison:
    """Every scheme on one trained model (chapter: 3)."""

    rows: list[SchemeRow]
    layer_errors: dict[str, dict[str, float]]  # scheme -> layer -> relative output error
    reference: Quality
    config: LMConfig
    train_s: float
    device: str
    seq_losses: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)
    # scheme -> (eval_sequences,) held-out loss per sequence, nats: for paired comparisons

    @property
    def fp32_bytes(self) -> int:
        """Bytes of the whole model in fp32: 4 per parameter, whichever schemes were compared."""
        r = self.rows[0]
        return 4 * (r.linear_params + r.other_params)

    def row(self, scheme: str) -> SchemeRow:
        check_choice("scheme", scheme, [r.scheme for r in self.rows])
        return next(r for r in self.rows if r.scheme == scheme)

    def paired(self, scheme: str, against: str) -> tuple[float, float]:
        """Held-out loss of ``scheme`` minus ``against``'s (chapter: 3).

        On the same sequences, with its standard error, nats.
        """
        names = [r.scheme for r in self.rows]
        check_choice("scheme", scheme, names)
        check_choice("against", against, names)
        if scheme not in self.seq_losses or against not in self.seq_losses:
            raise MemlabError("this comparison kept no per-sequence losses; run compare_schemes again")
        d = self.seq_losses[scheme] - self.seq_losses[against]  # (n,)
        return float(d.mean()), float(d.std() / d.numel() ** 0.5)

    def table(self, columns: str = "all"):
        """Bytes, quality or both per scheme, as a DataFrame (chapter: 3).

        ``columns="memory"``, ``"quality"`` or ``"all"``.

        Bits per linear weight count the quantized block linears with their scales; bits per
        parameter (whole model) add the embedding, norms and head (16-bit) over all parameters.
        The loss difference is each scheme's held-out loss minus fp32's on the same sequences.
        """
        import pandas as pd

        check_choice("columns", columns, TABLE_COLUMNS)
        memory = [{
            "scheme": r.scheme, "linear KiB": r.linear_bytes / 1024,
            "bits per linear weight": r.bits_per_param,
            "bits per parameter (whole model)": r.model_bits_per_param,
            "total KiB": r.total_bytes / 1024, "memory / fp32's": r.total_bytes / self.fp32_bytes,
        } for r in self.rows]
        quality = [{
            "scheme": r.scheme, "loss (nats)": r.loss, "excess (nats)": r.excess,
            "loss - fp32's (nats)": r.loss_delta, "2 SE (nats)": 2 * r.loss_delta_se,
            "accuracy": r.accuracy, "mean layer error": r.mean_layer_error,
            "max layer error": r.max_layer_error,
        } for r in self.rows]
        m = pd.DataFrame(memory).set_index("scheme")
        q = pd.DataFrame(quality).set_index("scheme")
        return {"memory": m, "quality": q, "all": m.join(q)}[columns]


TABLE_COLUMNS = ("all", "memory", "quality")


@dataclass(frozen=True)
class NoiseRow:
    """One scheme's paired difference from fp32, in standard errors (chapter: 3)."""

    scheme: str
    delta: float  # held-out loss minus fp32's, nats
    se: float  # its paired standard error, nats
    z: float  # delta / se
    beyond: bool  # |delta| > z_each * se
    beyond_corrected: bool  # |delta| > z_family * se (Bonferroni)


@dataclass(frozen=True)
class NoiseCheck:
    """Several paired comparisons at once: how many would cross the interval by chance (chapter: 3).

    With ``n`` comparisons at ``z_each`` standard errors, each crosses by chance with probability
    ``1 - coverage`` when nothing differs, so about ``n (1 - coverage)`` are expected to;
    Bonferroni's ``z_family`` keeps that chance for all ``n`` together at one comparison's.
    """

    comparisons: int
    z_each: float
    coverage: float  # P(|N(0, 1)| <= z_each), two-sided
    expected_by_chance: float  # comparisons x (1 - coverage)
    z_family: float  # Bonferroni: P(any of n crosses) <= 1 - coverage
    rows: list[NoiseRow]

    def frame(self):
        """The rows as a DataFrame, one per scheme (chapter: 3)."""
        import pandas as pd

        return pd.DataFrame([{
            "scheme": r.scheme, "loss - fp32's (nats)": r.delta, "SE (nats)": r.se,
            "in SE": r.z, f"beyond {self.z_each:g} SE": r.beyond,
            f"beyond {self.z_family:.2f} SE (Bonferroni)": r.beyond_corrected,
        } for r in self.rows]).set_index("scheme")


def noise_check(comparison: QuantComparison, z: float = 2.0) -> NoiseCheck:
    """Every scheme against fp32 at ``z`` standard errors (chapter: 3).

    With the count expected by chance and Bonferroni's wider interval.
    """
    if isinstance(z, bool) or not isinstance(z, (int, float)) or not z > 0:
        raise MemlabError(f"z must be a positive number of standard errors, got {z!r}")
    rows = [r for r in comparison.rows if r.scheme != "fp32"]
    n = len(rows)
    if n == 0:
        raise MemlabError("the comparison holds no scheme besides fp32")
    coverage = math.erf(z / math.sqrt(2))
    alpha = (1 - coverage) / n  # per comparison, so that n of them cross with chance <= 1 - coverage
    z_family = float(torch.special.ndtri(torch.tensor(1 - alpha / 2, dtype=torch.float64)))
    out = []
    for r in rows:
        if r.loss_delta_se > 0:
            zs = r.loss_delta / r.loss_delta_se
        else:  # identical losses on every sequence, or a difference with no spread
            zs = math.copysign(math.inf, r.loss_delta) if r.loss_delta else 0.0
        out.append(NoiseRow(r.scheme, r.loss_delta, r.loss_delta_se, zs,
                            abs(r.loss_delta) > z * r.loss_delta_se,
                            abs(r.loss_delta) > z_family * r.loss_delta_se))
    return NoiseCheck(n, float(z), coverage, n * (1 - coverage), z_family, out)


def compare_schemes(scale: str | None = None, schemes=MODEL_SCHEMES, *, device=None,
                    config: LMConfig | None = None, group_size: int = GROUP_SIZE) -> QuantComparison:
    """Quantize the reference model with every scheme (chapter: 3).

    It measures bytes, held-out quality and per-layer error.

    Computed once per process for the same config, schemes, device and ``group_size`` (weights
    per scale for RTN and GPTQ); ``config`` replaces the scale's :class:`LMConfig`.
    """
    schemes = tuple(check_choice("scheme", s, MODEL_SCHEMES) for s in schemes)
    check_positive_int("group_size", group_size)
    return _compare(config_for(scale, config), schemes, str(pick_device(device)), group_size)


@functools.cache
@kept_on_disk
def _compare(cfg: LMConfig, schemes: tuple[str, ...], device: str, group_size: int) -> QuantComparison:
    trained = trained_reference(cfg, device)
    cfg = trained.config
    reference = evaluate(trained.model, cfg)
    rows, errors, seq = [], {}, {}
    for s in schemes:
        qm = quantize_model(trained, s, device=device, group_size=group_size)
        quality = evaluate(qm.model, cfg)
        errs = layer_errors(trained.model, qm.model, cfg)
        errors[s] = errs
        saved = sum(st.saved_bytes for st in qm.layers.values())
        rows.append(SchemeRow(
            s, MODEL_LABELS[s], qm.linear_params, qm.linear_bytes, saved, qm.other_bytes,
            qm.total_bytes, 8 * qm.linear_bytes / qm.linear_params, quality.loss, quality.excess,
            quality.perplexity, quality.accuracy, sum(errs.values()) / len(errs), max(errs.values()),
            qm.quantize_s, qm.other_params, *paired_delta(quality, reference)))
        seq[s] = quality.seq_loss
    return QuantComparison(rows, errors, reference, cfg, trained.train_s,
                           trained.device, seq)
