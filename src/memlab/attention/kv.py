"""The KV cache: bytes per token, the longest context a GPU holds, and where it outgrows the weights.

Every number is estimated with :func:`memlab.memory.inference.estimate_inference` (chapter 1's
inference estimator, held to ``trace_inference``) against a GPU's usable memory
(:mod:`memlab.gpus`).
"""

from __future__ import annotations

from memlab.errors import check_positive_int
from memlab.gpus import GPU, get_gpu
from memlab.memory.estimator import DTYPE_BYTES, estimate_inference
from memlab.model.config import ModelConfig, get_config, kv_cache_bytes


def kv_bytes_per_token(model: ModelConfig | str, kv_precision: str = "bf16") -> int:
    """KV-cache bytes one token adds: 2 x layers x KV heads x head size x bytes per value (chapter: 4)."""
    from memlab.errors import check_choice

    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_choice("kv_precision", kv_precision, DTYPE_BYTES)
    return kv_cache_bytes(cfg, batch_size=1, tokens=1, bytes_per_value=DTYPE_BYTES[kv_precision])


def tokens_where_cache_equals_weights(model: ModelConfig | str, *, precision: str = "bf16",
                                      kv_precision: str | None = None) -> int:
    """Tokens in the cache (batch x context) at which it holds as many bytes as the weights (chapter: 4)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    weights = cfg.num_parameters() * DTYPE_BYTES[precision]
    return -(-weights // kv_bytes_per_token(cfg, kv_precision or precision))


def longest_context(model: ModelConfig | str, gpu: str | GPU, *, batch_size: int = 1,
                    precision: str = "bf16", kv_precision: str | None = None,
                    new_tokens: int = 1) -> int:
    """Longest context whose estimated generation peak fits the GPU's usable memory (chapter: 4).

    The context is prompt + generated tokens; 0 if none fits.

    Capped at the model's ``max_seq_len``.
    """
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("new_tokens", new_tokens)
    usable = get_gpu(gpu).usable_bytes

    def fits(total: int) -> bool:
        est = estimate_inference(cfg, batch_size, total - new_tokens, precision, new_tokens,
                                 kv_precision=kv_precision)
        return est.peak_bytes <= usable

    lo, hi = new_tokens, cfg.max_seq_len
    if hi <= new_tokens or not fits(new_tokens + 1):
        return 0
    lo += 1
    if fits(hi):
        return hi
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
