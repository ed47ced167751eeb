"""Slow-to-fast memory traffic: the tiled forward counts its own loads and stores."""

from __future__ import annotations

import pytest
import torch

from memlab.attention import (
    TrafficCounter,
    flash_attention,
    sram_blocks,
    standard_traffic,
    tiled_traffic,
)
from memlab.errors import MemlabError


@pytest.mark.parametrize("T, hs, bq, bk, causal", [(64, 16, 16, 16, False), (64, 16, 16, 16, True),
                                                    (50, 8, 16, 8, True), (33, 8, 8, 32, False)])
def test_the_count_the_forward_makes_equals_the_formula(T, hs, bq, bk, causal):
    q = torch.randn(1, 2, T, hs)
    with TrafficCounter() as c:
        flash_attention(q, q, q, causal=causal, block_q=bq, block_k=bk)
    # the key blocks a query block reads end at a block boundary (or S)
    keys = 0
    for r0 in range(0, T, bq):
        last = T if not causal else min(T, r0 + min(bq, T - r0))
        keys += min(T, -(-last // bk) * bk)
    per_head = T * hs + 2 * keys * hs + T * (hs + 1)
    assert c.total == 2 * per_head
    if not causal and T % bk == 0:
        assert c.total == 2 * tiled_traffic(T, T, hs, block_q=bq)


def test_tiled_traffic_falls_below_the_standard_algorithms_as_T_grows():
    hs, bq = 64, 64
    ratios = [tiled_traffic(T, T, hs, block_q=bq) / standard_traffic(T, T, hs)
              for T in (512, 2048, 8192)]
    assert ratios[0] > ratios[1] > ratios[2]
    assert standard_traffic(8192, 8192, hs) > 4 * 8192 * 8192  # the T^2 terms dominate


def test_sram_blocks_follow_the_paper():
    assert sram_blocks(100 * 1024 // 4, 64) == (64, 100)  # 100 KiB of fp32
    with pytest.raises(MemlabError):
        sram_blocks(0, 64)
