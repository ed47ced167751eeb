"""Ring attention (memlab.longcontext.ring) against SDPA on the whole sequence, on 2 and 4 ranks."""

from __future__ import annotations

import os
import random

import pytest
import torch

from memlab.errors import MemlabError
from memlab.longcontext.ring import (
    causal_pairs,
    kv_bytes_sent_per_step,
    local_tokens,
    ring_attention,
    token_positions,
)

# The shapes are drawn, not picked: MEMLAB_TEST_SEED draws another set.
SEED = int(os.environ.get("MEMLAB_TEST_SEED", "2026"))


def _cases(world: int, n: int) -> list[dict]:
    rng = random.Random(SEED * 10 + world)
    cases = []
    for _ in range(n):
        kv_heads = rng.choice([1, 2, 3])
        layout = rng.choice(["zigzag", "contiguous"])
        parts = 2 * world if layout == "zigzag" else world
        cases.append(dict(batch=rng.randrange(1, 3), heads=kv_heads * rng.choice([1, 2, 4]),
                          kv_heads=kv_heads, seq_len=parts * rng.randrange(1, 6),
                          head_dim=rng.choice([4, 8, 16]), causal=rng.choice([True, False]),
                          layout=layout, dtype=rng.choice(["fp32", "fp64"]), seed=rng.randrange(10**6)))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_sdpa_outputs_and_gradients(world):
    from memlab.distributed.launch import launch

    cases = _cases(world, 6)
    run = launch("memlab.longcontext.ring:compare_with_sdpa", dict(cases=cases), nproc=world,
                 timeout_s=300)
    assert [a["rank"] for a in run.ranks] == list(range(world))
    for answer in run.ranks:
        for res in answer["results"]:
            for name, err in res["errors"].items():
                assert err <= res["tolerance"], (name, err, res["case"])
            # bytes this rank sent, counted as they were sent, equal the formula
            assert res["bytes_sent"] == {f"{k}_bytes_sent": v for k, v in res["formula"].items()}


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_every_token_is_held_by_exactly_one_rank(world):
    for layout in ("zigzag", "contiguous"):
        T = 2 * world * 3
        held = torch.cat([token_positions(r, world, T, layout) for r in range(world)])
        assert sorted(held.tolist()) == list(range(T))
        x = torch.arange(T).view(1, 1, T, 1)
        assert torch.equal(local_tokens(x, 1 % world, world, layout).flatten(),
                           token_positions(1 % world, world, T, layout))


def test_zigzag_balances_the_causal_work_and_contiguous_does_not():
    world, T = 4, 64
    zig = [causal_pairs(r, world, T, "zigzag") for r in range(world)]
    cont = [causal_pairs(r, world, T, "contiguous") for r in range(world)]
    assert len(set(zig)) == 1 and sum(zig) == sum(cont) == T * (T + 1) // 2
    # contiguous: each rank works more than the one before; the last about 2N-1 times the first
    S = T // world
    assert cont == sorted(cont) and cont[-1] / cont[0] == ((world - 1) * S + (S + 1) / 2) / (
        (S + 1) / 2)
    assert cont[0] < zig[0] < cont[-1]


def test_bytes_sent_follow_the_ring():
    one = kv_bytes_sent_per_step(1, 8, 4096, 128, 1, 2)
    assert one == {"forward": 0, "backward": 0}  # one rank: the block never leaves
    f = kv_bytes_sent_per_step(1, 8, 4096, 128, 4, 2)
    assert f["forward"] == 3 * 2 * 8 * 1024 * 128 * 2


@pytest.mark.parametrize("kw, match", [
    (dict(seq_len=10, world=4, layout="zigzag"), "positive multiple of 8, got 10"),
    (dict(seq_len=10, world=4, layout="contiguous"), "positive multiple of 4, got 10"),
    (dict(seq_len=16, world=4, layout="striped"), "layout 'striped'"),
    (dict(seq_len=16, world=4, layout="zigzag", rank=4), "rank must be from 0 to 3, got 4"),
])
def test_bad_layouts_are_one_line(kw, match):
    rank = kw.pop("rank", 0)
    with pytest.raises(MemlabError, match=match):
        token_positions(rank, kw["world"], kw["seq_len"], kw["layout"])


def test_without_a_process_group_ring_attention_says_how_to_launch():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(MemlabError, match="needs a process group"):
        ring_attention(q, q, q)
