"""Quantizing the book's trained model every way: bytes stored, held-out quality, per-layer error (chapter: 3).

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
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from memlab.device import pick_device
from memlab.errors import check_choice, check_positive_int, require
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


def bnb_linear(linear: nn.Linear, scheme: str, device: torch.device) -> nn.Module:
    """``linear`` as the bitsandbytes module of an int8, LLM.int8(), NF4 or FP4 scheme, on ``device`` (chapter: 3)."""
    bnb = require("bitsandbytes", f"the {scheme} scheme", extra="quant")
    has_bias = linear.bias is not None
    if scheme in ("int8", "llm-int8"):
        m = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias,
                                has_fp16_weights=False,
                                threshold=LLM_INT8_THRESHOLD if scheme == "llm-int8" else 0.0)
    else:
        m = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                              compute_dtype=torch.float32, compress_statistics=scheme == "nf4-dq",
                              quant_type="fp4" if scheme == "fp4" else "nf4")
    m.load_state_dict(linear.state_dict())
    return m.to(device).eval()  # moving it to the device quantizes the weight


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
                group_size: int) -> dict[str, LayerStorage]:
    """GPTQ block by block, as in the paper: each block's Hessians come from the inputs it gets
    from the blocks before it, already quantized."""
    from memlab.quant.gptq import gptq_quantize, hessian

    x, _ = eval_batch(cfg, calibration=True)
    x = x.to(dev)
    layers: dict[str, LayerStorage] = {}
    for i in range(len(model.blocks)):
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


@torch.no_grad()
def layer_errors(reference: nn.Module, quantized: nn.Module, cfg: LMConfig) -> dict[str, float]:
    """Relative output error of each quantized block linear, ||y_q - y|| / ||y||, on the reference's own inputs (chapter: 3).

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


@dataclass(frozen=True)
class QuantComparison:
    """Every scheme on one trained model (chapter: 3)."""

    rows: list[SchemeRow]
    layer_errors: dict[str, dict[str, float]]  # scheme -> layer -> relative output error
    reference: Quality
    config: LMConfig
    train_s: float
    device: str

    @property
    def fp32_bytes(self) -> int:
        """Bytes of the whole model in fp32: 4 per parameter, whichever schemes were compared."""
        r = self.rows[0]
        return 4 * (r.linear_params + r.other_params)

    def row(self, scheme: str) -> SchemeRow:
        check_choice("scheme", scheme, [r.scheme for r in self.rows])
        return next(r for r in self.rows if r.scheme == scheme)

    def table(self):
        """Bytes, quality and error per scheme, as a DataFrame."""
        import pandas as pd

        return pd.DataFrame([{
            "scheme": r.scheme, "linear KiB": r.linear_bytes / 1024,
            "bits/param": r.bits_per_param, "total KiB": r.total_bytes / 1024,
            "vs fp32": r.total_bytes / self.fp32_bytes,
            "loss (nats)": r.loss, "excess (nats)": r.excess,
            "vs fp32 (nats)": r.loss_delta, "2 SE": 2 * r.loss_delta_se, "accuracy": r.accuracy,
            "mean layer error": r.mean_layer_error, "max layer error": r.max_layer_error,
        } for r in self.rows]).set_index("scheme")


def compare_schemes(scale: str | None = None, schemes=MODEL_SCHEMES, *, device=None,
                    config: LMConfig | None = None, group_size: int = GROUP_SIZE) -> QuantComparison:
    """Quantize the reference model with every scheme; measure bytes, held-out quality, per-layer error (chapter: 3).

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
    rows, errors = [], {}
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
    return QuantComparison(rows, errors, reference, cfg, trained.train_s,
                           trained.device)
