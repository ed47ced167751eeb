"""An MoE step's estimate, by phase, is held to its trace within 3%, Mixtral 8x7B included."""

from __future__ import annotations

import random

import pytest

from memlab.measure.step import trace_step
from memlab.model.config import get_config
from memlab.model.moe import Routing, trace_routing
from memlab.moe.estimate import estimate_moe

PHASES = ("forward", "backward", "optimizer")


def _held(cfg, step, routing=None):
    with trace_routing(routing or Routing.balanced(cfg.moe.experts)):
        traced = trace_step(cfg, **step)
    est = estimate_moe(cfg, device="cpu", routing=routing, **step)
    for phase in PHASES:
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03), (phase, step)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)


@pytest.mark.parametrize("seed", range(12))
def test_random_moe_steps_are_held_to_their_traces(seed, random_moe):
    rng = random.Random(seed)
    cfg = random_moe(rng, seed)
    step = dict(batch_size=rng.randrange(1, 3), seq_len=rng.randrange(8, 100),
                precision=rng.choice(["fp32", "bf16-mixed", "bf16"]))
    routing = None if seed % 2 else Routing([rng.choice([0, 1, 3, 9])
                                             for _ in range(cfg.moe.experts - 1)] + [1])
    _held(cfg, step, routing)


def test_mixtral_at_full_size_is_held_to_its_trace():
    _held(get_config("mixtral-8x7b"), dict(batch_size=1, seq_len=2048, precision="bf16-mixed"))
