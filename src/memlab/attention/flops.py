"""FLOPs of attention as PyTorch's own counter sees them, with the CPU kernel's formula added.

``torch.utils.flop_counter.FlopCounterMode`` counts 0 FLOPs for SDPA on a CPU; the formulas
for that kernel are registered by :func:`memlab.measure.flops.register_cpu_sdpa_flops` (one
place for every part that counts FLOPs) before counting.
"""

from __future__ import annotations

import torch

from memlab.measure.flops import register_cpu_sdpa_flops


def attention_flops(fn, *args, backward: bool = True, **kwargs) -> dict[str, int]:
    """FLOPs that FlopCounterMode counts for ``fn(*args, **kwargs)``, forward and backward (chapter: 4)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as fwd:
        out = fn(*args, **kwargs)
    counts = {"forward": fwd.get_total_flops()}
    if backward:
        with FlopCounterMode(display=False) as bwd:
            out.backward(torch.ones_like(out))
        counts["backward"] = bwd.get_total_flops()
    return counts


def windowed_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int,
                             block: int | None = None) -> torch.Tensor:
    """The book's FlashAttention with a sliding window of ``window`` keys (chapter: 4).

    Causal attention in which each block of ``block`` queries sees only the ``window`` keys
    before the block and the keys of the block itself, so the key tiles outside that band are
    never visited, as FlashAttention-2's ``window_size`` skips them inside its kernel. Each
    block runs :func:`memlab.model.flash.flash_attention` on its band; the work grows as
    ``T * (window + block)``, not ``T**2``. It is a different attention from full causal
    attention (a query does not see keys further back), used to count what the window changes.
    """
    from memlab.errors import check_positive_int
    from memlab.model.config import DEFAULT_BLOCK
    from memlab.model.flash import flash_attention

    block = DEFAULT_BLOCK if block is None else block
    check_positive_int("window", window)
    check_positive_int("block", block)
    T = q.size(2)
    outs = []
    for i0 in range(0, T, block):
        i1 = min(i0 + block, T)
        s0 = max(0, i0 - window)
        outs.append(flash_attention(q[:, :, i0:i1], k[:, :, s0:i1], v[:, :, s0:i1], causal=True,
                                    block_q=block, block_k=block))
    return torch.cat(outs, dim=2)  # (B, nh, T, hs)


def windowed_flops(lengths=(256, 512, 1024), *, window: int = 128, head_size: int = 64,
                   block: int | None = None) -> dict[int, dict[str, int]]:
    """Forward and backward FLOPs of :func:`windowed_flash_attention` at each T, counted (chapter: 4).

    One head of ``head_size``, batch 1, counted by ``FlopCounterMode``; ``{T: {"forward": ...,
    "backward": ...}}``.
    """
    from memlab.errors import check_positive_int

    out = {}
    for T in lengths:
        check_positive_int("T", T)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 1, T, head_size, generator=g).requires_grad_()
                   for _ in range(3))
        out[T] = attention_flops(windowed_flash_attention, q, k, v, window=window, block=block)
    return out
