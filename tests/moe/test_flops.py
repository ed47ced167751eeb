"""An MoE step's FLOPs from the shapes equal PyTorch's counter, for any routing and capacity."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from memlab.compute.flops import (
    active_flops,
    counted_flops,
    matmul_parameters,
    moe_mlp_flops,
    moe_rows,
    step_flops,
)
from memlab.errors import MemlabError
from memlab.model.config import MoEConfig, get_config
from memlab.model.moe import Routing, trace_routing
from memlab.model.step import StepSpec


def _skewed(E: int, seed: int) -> Routing:
    rng = random.Random(seed)
    return Routing([rng.choice([0, 1, 2, 7]) for _ in range(E - 1)] + [1])


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("plan", ["none", "full"])
def test_step_flops_is_the_counters_count_for_moe(seed, plan, random_moe):
    cfg = random_moe(random.Random(seed), seed)
    spec = StepSpec(cfg, batch_size=1 + seed % 2, seq_len=8 + seed, checkpointing=plan)
    routing = _skewed(cfg.moe.experts, seed) if seed % 2 else None
    with trace_routing(routing or Routing.balanced(cfg.moe.experts)):  # the count's split
        c = counted_flops(spec)
    f = step_flops(spec, routing=routing)
    assert (f.forward, f.total) == (c["forward"], c["total"])


def test_rows_follow_the_routing_and_the_capacity():
    cfg = get_config("tiny-moe")
    assert moe_rows(cfg, 10) == [5, 5, 5, 5]
    assert moe_rows(cfg, 10, Routing([1, 0, 0, 1])) == [10, 0, 0, 10]
    capped = replace(cfg, moe=MoEConfig(experts=4, top_k=2, d_ff=64, capacity_factor=1.0))
    assert moe_rows(capped, 10, Routing([1, 0, 0, 1])) == [5, 0, 0, 5]
    assert moe_mlp_flops(capped, 10, Routing([1, 0, 0, 1])) < moe_mlp_flops(capped, 10)
    with pytest.raises(MemlabError, match="routing must be a Routing with 4 shares"):
        moe_rows(cfg, 10, Routing([1, 1]))


def test_active_flops_are_those_of_the_active_parameters():
    a = active_flops("mixtral-8x7b", seq_len=4096)
    cfg = get_config("mixtral-8x7b")
    assert a.parameters == cfg.num_parameters()
    assert a.active_parameters == cfg.active_parameters()
    assert a.per_token == step_flops(cfg, batch_size=1, seq_len=4096).total // 4096
    assert a.six_n_active == 6 * matmul_parameters(cfg) < a.per_token
    assert 0.25 < a.compute_share < 0.5  # 2 of 8 experts, plus attention and the head
    with pytest.raises(MemlabError, match="needs an MoE config"):
        active_flops("tiny", seq_len=16)
