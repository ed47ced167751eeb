"""An MoE step's estimate with full checkpointing, accumulation and expert parallelism, held to
its trace within 3%: one process (trace_step) and one rank of N (trace_expert_parallel)."""

from __future__ import annotations

import random

import pytest

from memlab.errors import MemlabError
from memlab.measure.step import trace_step
from memlab.model.config import ModelConfig, MoEConfig, get_config
from memlab.model.moe import Routing
from memlab.moe.ep_run import hot_shares, trace_expert_parallel
from memlab.moe.estimate import estimate_moe

PHASES = ("forward", "backward", "optimizer")


def _config(rng, seed: int, ranks: int) -> ModelConfig:
    E = rng.choice([e for e in range(1, 9) if e % ranks == 0])
    shared = rng.choice([0, 16, 40])
    moe = MoEConfig(experts=E, top_k=rng.randrange(1, E + 1), d_ff=rng.choice([8, 24, 32]),
                    shared_d_ff=shared, shared_gate=bool(shared) and rng.random() < 0.5,
                    norm_topk_prob=rng.random() < 0.5,
                    aux_loss_coef=rng.choice([0.0, 0.01]),
                    capacity_factor=None if ranks > 1 else rng.choice([None, 1.0, 1.25]))
    return ModelConfig(name=f"moe{seed}", style="llama", n_layer=rng.randrange(1, 3), n_head=4,
                       n_kv_head=rng.choice([1, 2, 4]), d_model=32, d_ff=64,
                       vocab_size=rng.randrange(500, 2000), max_seq_len=256, moe=moe)


def _held(cfg, step, ranks=1, share=None):
    traced = (trace_step(cfg, **step) if ranks == 1
              else trace_expert_parallel(cfg, ranks, share=share, **step))
    routing = None if share is None else Routing(hot_shares(cfg.moe.experts, ranks, share))
    est = estimate_moe(cfg, device="cpu", expert_parallel=ranks, routing=routing, **step)
    for phase in PHASES:
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03), (phase, step, ranks)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)
    assert (est.parameters_bytes, est.gradients_bytes, est.optimizer_states_bytes) == (
        traced.parameters_bytes, traced.gradients_bytes, traced.optimizer_states_bytes)
    return est, traced


@pytest.mark.parametrize("lever", ["checkpointing", "accumulation", "expert parallelism",
                                   "expert parallelism, accumulating",
                                   "expert parallelism, checkpointing"])
@pytest.mark.parametrize("seed", range(12))
def test_random_moe_levers_are_held_to_their_traces(lever, seed):
    rng = random.Random(seed)
    ranks = rng.choice([2, 4]) if lever.startswith("expert") else 1
    cfg = _config(rng, seed, ranks)
    step = dict(batch_size=rng.randrange(1, 3), seq_len=rng.randrange(16, 100),
                precision=rng.choice(["fp32", "bf16-mixed", "bf16"]))
    if lever.endswith("checkpointing"):
        step["checkpointing"] = True
    if "accumulat" in lever:
        step["grad_accum_steps"] = rng.randrange(2, 4)
    _held(cfg, step, ranks)


@pytest.mark.parametrize("seed", range(4))
def test_a_hot_rank_is_held_to_its_trace(seed):
    """Every rank sends a share of its rows to rank 0's experts: the routing is honoured."""
    rng = random.Random(100 + seed)
    ranks = rng.choice([2, 4])
    cfg = _config(rng, seed, ranks)
    step = dict(batch_size=rng.randrange(1, 3), seq_len=rng.randrange(16, 100),
                precision=rng.choice(["fp32", "bf16-mixed", "bf16"]))
    share = 1.0 if cfg.moe.experts == ranks else rng.choice([0.5, 0.75, 1.0])
    est, traced = _held(cfg, step, ranks, share)
    balanced = estimate_moe(cfg, device="cpu", expert_parallel=ranks, **step)
    if share * ranks > 1:  # more rows than balanced: more saved bytes on the hot rank
        assert est.saved_activations_bytes > balanced.saved_activations_bytes


def test_a_rank_holds_its_share_of_the_experts():
    cfg = get_config("mixtral-8x7b")
    one = estimate_moe(cfg, batch_size=1, seq_len=1024, precision="bf16-mixed")
    eight = estimate_moe(cfg, batch_size=1, seq_len=1024, precision="bf16-mixed",
                         expert_parallel=8)
    m = cfg.moe
    moved = cfg.n_layer * (m.experts - 1) * 3 * cfg.d_model * m.d_ff
    assert one.parameters - eight.parameters == moved
    assert eight.setup["experts_per_rank"] == 1 and eight.setup["expert_parallel"] == 8


def test_bad_levers_are_refused_in_one_line():
    cfg = get_config("tiny-moe")
    for kwargs, needle in ((dict(checkpointing="selective"), "full"),
                           (dict(expert_parallel=3), "divide"),
                           (dict(grad_accum_steps=0), "grad_accum_steps")):
        with pytest.raises(MemlabError) as exc:
            estimate_moe(cfg, batch_size=1, seq_len=16, **kwargs)
        assert needle in str(exc.value) and "\n" not in str(exc.value), exc.value
    with pytest.raises(MemlabError, match="dense"):
        estimate_moe("gpt2", batch_size=1, seq_len=16)


@pytest.mark.parametrize("ranks,checkpointing", [(1, True), (8, False), (8, True)])
def test_mixtral_at_full_size_with_its_levers(ranks, checkpointing):
    _held(get_config("mixtral-8x7b"), dict(batch_size=1, seq_len=2048, precision="bf16-mixed",
                                           checkpointing=checkpointing), ranks)
