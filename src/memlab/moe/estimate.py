"""The bytes of an MoE model's training step, by phase, for a given routing (chapter: 9)."""

from __future__ import annotations

from memlab.memory.activations import (
    PARAM_BYTES,
    BackwardGrads,
    activation_bytes,
    activation_peaks,
    param_groups,
)
from memlab.memory.estimator import (
    MemoryEstimate,
    optimizer_state_bytes,
    optimizer_step_scratch_bytes,
    step_estimate,
)
from memlab.model.config import ModelConfig, get_config
from memlab.model.moe import Routing
from memlab.moe.saved import moe_saved_tensors, moe_weight_numel


def _moe_grads(cfg: ModelConfig, precision: str) -> BackwardGrads:
    C, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    _, block, head = param_groups(cfg)
    pb = PARAM_BYTES[precision]
    total = sum(block)
    qkv_w = C * C + 2 * C * kv
    mlp = total - 2 * C - qkv_w - C * C
    cast = 2 if precision.endswith("-mixed") else 0
    in_block = {"attention norm": (pb * (total - C), cast * qkv_w),
                "attention": (pb * (C * C + C + mlp), cast * qkv_w),
                "MLP norm": (pb * mlp, cast * (qkv_w + C * C)),
                "MLP": (pb * mlp // 3, cast * (moe_weight_numel(cfg) - mlp // 3))}
    return BackwardGrads(pb * total, pb * sum(head), pb * max(block), in_block)


def estimate_moe(cfg: ModelConfig | str, *, batch_size: int, seq_len: int,
                 precision: str = "fp32", optimizer: str = "adamw",
                 optimizer_impl: str = "foreach", device: str = "cuda",
                 routing: Routing | None = None) -> MemoryEstimate:
    """Estimate an MoE training step's bytes by category and phase, no checkpointing (chapter: 9)."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    B, T = batch_size, seq_len
    n = cfg.num_parameters()
    P = G = PARAM_BYTES[precision] * n
    S = optimizer_state_bytes(cfg, precision, optimizer, optimizer_impl, device)
    saved = moe_saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision, device=device,
                              routing=routing)
    block = [t for t in saved if t.scope == "layer"]
    A = activation_bytes(saved, cfg.n_layer)
    fwd, bwd = activation_peaks(cfg, saved, B, T, precision, False, device, block=block,
                                grads=_moe_grads(cfg, precision))
    tokens = 2 * B * T * 8
    VC = cfg.vocab_size * cfg.d_model * PARAM_BYTES[precision]
    end = P + S + G + (2 * VC if cfg.tied else 0) + tokens
    return step_estimate(
        parameters=n, P=P, G=G, S=S, A=A, tokens=tokens, fwd=fwd, bwd=bwd, end=end,
        scratch=optimizer_step_scratch_bytes(cfg, precision, optimizer, optimizer_impl),
        accumulating=False, saved=saved,
        setup=dict(model=cfg.name, parameters=n, batch_size=B, seq_len=T, precision=precision,
                   optimizer=optimizer, device=device, mode="train"))
