"""What an MoE step saves for backward, estimated, equals its trace for any routing and capacity."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from memlab.errors import MemlabError
from memlab.measure.step import trace_step
from memlab.memory.activations import activation_bytes
from memlab.model.config import ModelConfig, get_config
from memlab.model.moe import Routing, trace_routing
from memlab.moe.saved import moe_saved_tensors
from memlab.moe.where import routing_bytes, skewed_routing


def _random_step(case, seed: int) -> tuple[ModelConfig, dict, Routing | None]:
    rng = random.Random(seed)
    cfg = case(rng, seed)
    step = dict(batch_size=rng.randrange(1, 3), seq_len=rng.randrange(8, 100),
                precision=rng.choice(["fp32", "bf16-mixed", "bf16"]))
    routing = None if rng.random() < 0.5 else Routing([rng.choice([0, 1, 3, 9])
                                                       for _ in range(cfg.moe.experts - 1)] + [1])
    return cfg, step, routing


@pytest.mark.parametrize("seed", range(16))
def test_saved_activations_are_the_traces(seed, random_moe):
    cfg, step, routing = _random_step(random_moe, seed)
    est = activation_bytes(moe_saved_tensors(cfg, **step, routing=routing), cfg.n_layer)
    with trace_routing(routing or Routing.balanced(cfg.moe.experts)):
        traced = trace_step(cfg, **step).saved_activations_bytes
    # all but the balancing loss's few (E,) bytes
    assert abs(est - traced) <= 8 * cfg.moe.experts * cfg.n_layer, (est, traced, step)


def test_a_capacity_drops_rows_and_bytes_as_the_skew_grows():
    cfg = get_config("tiny-moe")
    dropless = routing_bytes(cfg, batch_size=2, seq_len=32, shares=(None, 0.5))
    assert dropless[0].saved_bytes == dropless[1].saved_bytes  # N·k rows whatever the split
    capped = replace(cfg, moe=replace(cfg.moe, capacity_factor=1.0))
    b, s = routing_bytes(capped, batch_size=2, seq_len=32, shares=(None, 0.5))
    assert s.rows[0] == capped.moe.capacity(64) < 64 and sum(s.rows) < sum(b.rows)
    assert s.saved_bytes < b.saved_bytes and s.traced_saved_bytes < b.traced_saved_bytes
    for r in (b, s):
        assert abs(r.saved_bytes - r.traced_saved_bytes) <= 8 * 4 * cfg.n_layer
    with pytest.raises(MemlabError, match="share must be a number from 1/experts = 0.25"):
        skewed_routing(4, 2, 0.9)


def test_mixtral_at_full_size_saves_what_its_trace_saves():
    cfg = get_config("mixtral-8x7b")
    est = activation_bytes(moe_saved_tensors(cfg, batch_size=1, seq_len=2048,
                                             precision="bf16-mixed"), cfg.n_layer)
    traced = trace_step(cfg, batch_size=1, seq_len=2048, precision="bf16-mixed")
    assert est == pytest.approx(traced.saved_activations_bytes, rel=1e-6)
