"""Outlier features in the book's model and injected outliers (chapter: 3).

With plain int8 against LLM.int8().
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from memlab.device import pick_device
from memlab.errors import MemlabError, check_positive_int
from memlab.model.lm import LMConfig, config_for, eval_batch, evaluate, trained_reference
from memlab.model.transformer import block_linears
from memlab.quant.compare import bnb_linear, capture_inputs, layer_errors, quantize_model
from memlab.quant.functional import LLM_INT8_THRESHOLD
from memlab.results import kept_on_disk

# Outlier features and LLM.int8() -------------------------------------------------------------------
NORMED_INPUTS = {"norm1": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
           "norm2": ("mlp.gate_proj", "mlp.up_proj")}  # each norm feeds these linears


@dataclass(frozen=True)
class OutlierStats:
    """How large one linear layer's inputs get, on the calibration sequences (chapter: 3)."""

    layer: str
    max_abs: float
    outlier_columns: int  # features with any |x| >= threshold
    features: int
    rows_touched: float  # share of tokens with at least one outlier value


@torch.no_grad()
def activation_outliers(model: nn.Module, cfg: LMConfig, *, threshold: float = LLM_INT8_THRESHOLD) -> list[OutlierStats]:
    """Largest input magnitude and outlier columns of every block linear (chapter: 3)."""
    from memlab.quant.functional import outlier_columns

    x, _ = eval_batch(cfg, calibration=True)
    names = list(block_linears(model))
    inputs = capture_inputs(model, names, x.to(next(model.parameters()).device))
    out = []
    for name in names:
        xin = inputs[name]
        cols = outlier_columns(xin, threshold)
        touched = float((xin.abs() >= threshold).any(dim=1).double().mean())
        out.append(OutlierStats(name, float(xin.abs().max()), int(cols.numel()), xin.shape[1], touched))
    return out


@torch.no_grad()
def inject_outliers(model: nn.Module, channels, alpha: float) -> nn.Module:
    """A copy of ``model`` whose normed inputs have outlier features (chapter: 3).

    It computes the same function.

    Each block's norm weights are multiplied by ``alpha`` on ``channels``, and the matching input
    columns of the linears the norms feed are divided by ``alpha``: in exact arithmetic nothing
    changes, but the inputs of q/k/v and of the MLP's first layers now have a few features
    ``alpha`` times larger than the rest, as the systematic outlier features of large models do.
    """
    if not alpha > 0:
        raise MemlabError(f"alpha must be positive, got {alpha!r}")
    d = model.blocks[0].norm1.weight.numel()
    ch = torch.as_tensor(list(channels), dtype=torch.long)
    if ch.numel() and (int(ch.min()) < 0 or int(ch.max()) >= d):
        raise MemlabError(f"channels must lie in 0..{d - 1} (d_model={d}), got {ch.tolist()}")
    m = copy.deepcopy(model)
    for block in m.blocks:
        for norm, targets in NORMED_INPUTS.items():
            getattr(block, norm).weight[ch] *= alpha
            for t in targets:
                block.get_submodule(t).weight[:, ch] /= alpha
    return m


@dataclass(frozen=True)
class OutlierRow:
    """One scheme on the model with injected outliers."""

    scheme: str
    excess: float  # nats above the optimum
    accuracy: float
    mean_layer_error: float


@dataclass(frozen=True)
class OutlierStudy:
    """Outlier features: found in the trained model and injected (chapter: 3).

    With what int8 and LLM.int8() do with them.
    """

    threshold: float
    alpha: float
    channels: list[int]
    found: list[OutlierStats]  # the trained model as it is
    injected: list[OutlierStats]  # after injection
    injected_fp32_change: float  # max |logit change| the injection causes in fp32 (rounding only)
    rows: list[OutlierRow]  # fp32 / int8 / llm-int8 on the original and the injected model
    sweep_alpha: list[float]  # one layer, outlier size swept
    sweep_int8: list[float]  # relative output error, plain int8 (threshold 0)
    sweep_llm_int8: list[float]  # relative output error, LLM.int8() (threshold 6)
    sweep_layer: str
    scratch_vs_bnb: float  # max |from-scratch LLM.int8() - bitsandbytes| on that layer, relative to max |y|


def outlier_study(scale: str | None = None, *, alpha: float = 32.0, n_channels: int = 4,
                  device=None, config: LMConfig | None = None) -> OutlierStudy:
    """Find outlier features, inject some, and measure plain int8 against LLM.int8() (chapter: 3).

    Computed once per process for the same arguments; ``config`` replaces the scale's :class:`LMConfig`.
    """
    check_positive_int("n_channels", n_channels)
    if not alpha > 0:
        raise MemlabError(f"alpha must be positive, got {alpha!r}")
    cfg = config_for(scale, config)
    if n_channels > cfg.d_model:
        raise MemlabError(f"n_channels must be at most d_model={cfg.d_model}, got {n_channels}")
    return _outliers(cfg, float(alpha), n_channels, str(pick_device(device)))


@functools.cache
@kept_on_disk
def _outliers(cfg: LMConfig, alpha: float, n_channels: int, device: str) -> OutlierStudy:
    from memlab.quant.functional import llm_int8_matmul

    trained = trained_reference(cfg, device)
    g = torch.Generator().manual_seed(cfg.seed)
    channels = sorted(torch.randperm(cfg.d_model, generator=g)[:n_channels].tolist())
    injected = inject_outliers(trained.model, channels, alpha)
    x, _ = eval_batch(cfg)
    dev = next(trained.model.parameters()).device
    with torch.no_grad():
        change = float((injected(x.to(dev)) - trained.model(x.to(dev))).abs().max())
    rows = []
    for tag, model in (("", trained.model), ("injected ", injected)):
        variant = replace(trained, model=model)
        for s in ("fp32", "int8", "llm-int8"):
            qm = quantize_model(variant, s, device=device)
            q = evaluate(qm.model, cfg)
            errs = layer_errors(model, qm.model, cfg)
            rows.append(OutlierRow(tag + s, q.excess, q.accuracy, sum(errs.values()) / len(errs)))
    # One layer, outliers of growing size: the same injection applied to its input and weight.
    layer = "blocks.0.attn.q_proj"
    xin = capture_inputs(trained.model, [layer], x[: cfg.calib_sequences].to(dev))[layer].cpu()
    w = trained.model.get_submodule(layer).weight.detach().float().cpu()
    alphas = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    e8, ellm = [], []
    for a in alphas:
        xa, wa = xin.clone(), w.clone()
        xa[:, channels] *= a
        wa[:, channels] /= a
        y = xa @ wa.t()
        for thr, acc in ((0.0, e8), (LLM_INT8_THRESHOLD, ellm)):
            yq = llm_int8_matmul(xa, wa, threshold=thr).float()
            acc.append(float((yq - y).norm() / y.norm()))
    xa, wa = xin.clone(), w.clone()
    xa[:, channels] *= alpha
    wa[:, channels] /= alpha
    vs = _bnb_vs_scratch(xa, wa)
    return OutlierStudy(LLM_INT8_THRESHOLD, alpha, channels, activation_outliers(trained.model, cfg),
                        activation_outliers(injected, cfg), change, rows, alphas, e8, ellm, layer, vs)


def _bnb_vs_scratch(x: torch.Tensor, w: torch.Tensor) -> float:
    """Largest difference between memlab's LLM.int8() and bitsandbytes' Linear8bitLt, relative to max |y|."""
    from memlab.quant.functional import llm_int8_matmul

    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    m = bnb_linear(lin, "llm-int8", torch.device("cpu"))
    with torch.no_grad():
        y_bnb = m(x.half()).float()
    y = llm_int8_matmul(x.half(), w, threshold=LLM_INT8_THRESHOLD).float()
    return float((y - y_bnb).abs().max() / y_bnb.abs().max())
