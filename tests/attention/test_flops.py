"""FLOP counts of attention: the CPU SDPA kernel gets torch's own formula."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memlab.attention import attention_flops, flash_attention, naive_attention


def _qkv(T=64, hs=16, nh=2):
    return [torch.randn(1, nh, T, hs, requires_grad=True) for _ in range(3)]


def test_cpu_sdpa_is_counted_after_registration():
    q, k, v = _qkv()
    counts = attention_flops(F.scaled_dot_product_attention, q, k, v)
    # forward: two (T x hs) @ (hs x T) matmuls per head, 2 FLOPs per multiply-add
    assert counts["forward"] == 2 * 2 * 2 * 64 * 64 * 16
    assert counts["backward"] == 2.5 * counts["forward"]  # torch's formula: 5 matmuls


def test_naive_counts_the_same_forward_and_flash_recomputes_in_backward():
    q, k, v = _qkv()
    naive = attention_flops(naive_attention, q, k, v, causal=False)
    flash = attention_flops(flash_attention, q, k, v, causal=False, block_q=16, block_k=16)
    assert naive["forward"] == flash["forward"] == 2 * 2 * 2 * 64 * 64 * 16
    assert naive["backward"] == 2 * naive["forward"]  # dV, dP, dQ, dK: four matmuls
    assert flash["backward"] == 2.5 * flash["forward"]  # plus recomputing S = Q K^T


def test_causal_flash_skips_tiles_above_the_diagonal():
    q, k, v = _qkv(T=64)
    full = attention_flops(flash_attention, q, k, v, causal=False, block_q=16, block_k=16)
    causal = attention_flops(flash_attention, q, k, v, causal=True, block_q=16, block_k=16)
    # 4 x 4 tiles, 10 on or below the diagonal
    assert causal["forward"] == full["forward"] * 10 / 16
