"""Expert parallelism (memlab.moe.expert_parallel, memlab.moe.ep_run): the layer, the formulas,
and real runs on 2 and 4 gloo processes held to one process and to the formulas."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from memlab.errors import MemlabError
from memlab.model.config import get_config
from memlab.model.moe import MoE
from memlab.moe.ep_run import (
    all_to_all_bytes,
    expert_parallel_bytes,
    received_rows,
    skewed_choice,
)
from memlab.moe.expert_parallel import ExpertParallelMoE, check_expert_parallel


@contextlib.contextmanager
def _alone():
    """A gloo process group of one, in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def test_ranks_must_divide_the_experts_in_one_line():
    assert check_expert_parallel(8, 4) == 2
    with pytest.raises(MemlabError) as exc:
        check_expert_parallel(8, 3)
    assert "3" in str(exc.value) and "8" in str(exc.value) and "\n" not in str(exc.value)


def test_one_rank_equals_the_whole_layer_and_its_gradients():
    cfg = get_config("tiny-moe")
    torch.manual_seed(0)
    whole = MoE(cfg.d_model, cfg.moe)
    x = torch.randn(2, 8, cfg.d_model)
    with _alone():
        ep = ExpertParallelMoE(whole)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya = ep(xa)
        ya.square().sum().backward()
    grads_ep = {n: p.grad.clone() for n, p in whole.named_parameters()}
    whole.zero_grad()
    yb = whole(xb)
    yb.square().sum().backward()
    assert torch.allclose(ya, yb, atol=1e-6)
    assert torch.allclose(xa.grad, xb.grad, atol=1e-6)
    for n, p in whole.named_parameters():
        assert torch.allclose(grads_ep[n], p.grad, atol=1e-6), n
    assert ep.stats["dispatch_forward"] == 0  # one rank sends nothing away


def test_one_rank_holds_the_whole_model():
    cfg = get_config("tiny-moe")
    b = expert_parallel_bytes(cfg, 1, tokens=64)
    assert b.parameters_bytes == 4 * cfg.num_parameters() == b.gradients_bytes
    four = expert_parallel_bytes(cfg, 4, tokens=64)
    moved = cfg.n_layer * cfg.moe.experts * 3 * cfg.d_model * cfg.moe.d_ff * 3 // 4
    assert b.parameters_bytes - four.parameters_bytes == 4 * moved


def test_zero_shards_the_replicated_part():
    cfg = get_config("mixtral-8x7b")
    z = [expert_parallel_bytes(cfg, 8, tokens=4096, param_bytes=4, dense_zero_stage=s)
         for s in range(4)]
    assert z[0].optimizer_states_bytes > z[1].optimizer_states_bytes
    assert z[1].gradients_bytes > z[2].gradients_bytes
    assert z[2].parameters_bytes > z[3].parameters_bytes


def test_the_payload_formula_when_every_rank_routes_evenly():
    W, E, n = 4, 8, 64
    counts = [[n // E] * E for _ in range(W)]
    sent = all_to_all_bytes(counts, d_model=16, dtype_bytes=2, rank=1)
    remote = n * (W - 1) // W
    assert sent == dict.fromkeys(sent, remote * 16 * 2)


def test_a_skewed_router_sends_its_share_to_the_hot_rank():
    choice = skewed_choice(48, 2, 4, 2, 0.75)
    hot = (choice < 2).sum().item()
    assert hot == 72 and choice.shape == (48, 2)
    assert received_rows(48, 2, 2, 0.75) == 2 * 72
    assert received_rows(48, 2, 2, 0.75, hot=False) == 2 * 24


def _workers(mark: str) -> int:
    n = 0
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            n += mark.encode() in environ.read_bytes()
    return n


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_the_run_matches_one_process_and_the_formulas(world):
    from memlab.moe.ep_run import expert_parallel_run

    mark = uuid.uuid4().hex
    run = expert_parallel_run(world, env={"MEMLAB_TEST_EP": mark})
    assert _workers(mark) == 0  # no rank left behind
    assert run.backend == "gloo" and len(run.ranks) == world
    assert run.within_tolerance, run.as_dict()
    for r in run.ranks:
        assert {k: r["state_bytes"][k] for k in r["formula"]} == r["formula"]
        assert r["sent"] == r["sent_formula"]
        assert r["rows_received"] == r["rows_formula"]
        assert r["expert_saved_bytes"] == r["expert_saved_formula"]
        for case in r["imbalance"]:
            m = case["measured"]
            assert m["rows_received"] == case["rows_formula"]
            assert m["expert_saved_bytes"] == case["saved_formula"]
            assert m["buffer_bytes"] == case["buffer_formula"]
            assert sum(m["sent"].values()) == case["sent_formula"]
    hot = [c["measured"]["rows_received"] for c in run.ranks[0]["imbalance"]]
    assert hot == sorted(hot) and hot[-1] > hot[0]  # a larger share, more rows on rank 0


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_traced_rank_holds_what_the_formula_says(ranks):
    from memlab.moe.ep_run import trace_expert_parallel

    traced = trace_expert_parallel("tiny-moe", ranks, seq_len=32)
    f = expert_parallel_bytes("tiny-moe", ranks, tokens=32)
    assert (traced.parameters_bytes, traced.gradients_bytes, traced.optimizer_states_bytes) == (
        f.parameters_bytes, f.gradients_bytes, f.optimizer_states_bytes)


@pytest.mark.slow
def test_mixtral_over_eight_ranks_traced_against_the_formula():
    from memlab.moe.ep_run import trace_expert_parallel

    traced = trace_expert_parallel("mixtral-8x7b", 8, seq_len=256, precision="bf16-mixed")
    f = expert_parallel_bytes("mixtral-8x7b", 8, tokens=256)
    assert traced.parameters_bytes == f.parameters_bytes  # 1 expert per block + the rest
    assert traced.optimizer_states_bytes == f.optimizer_states_bytes


def test_the_full_size_table_and_the_payload():
    from memlab.moe.ep_run import DEEPSEEK_V3_LIKE, expert_parallel_table

    rows = expert_parallel_table()
    ds = [r for r in rows if r["model"] == DEEPSEEK_V3_LIKE.name]
    assert [r["ranks"] for r in ds] == [8, 16, 32, 64]
    states = [r["model_states_bytes"] for r in ds]
    assert states == sorted(states, reverse=True)  # more ranks, fewer experts each
    # balanced: every rank receives N·k rows whatever N; the payload grows as (N - 1) / N
    assert len({r["rows_received"] for r in ds}) == 1
    sent = [r["all_to_all_sent_bytes"] for r in ds]
    nk = 4096 * 8 * DEEPSEEK_V3_LIKE.d_model * 4 * DEEPSEEK_V3_LIKE.n_layer
    assert sent == [4 * nk * (n - 1) // n for n in (8, 16, 32, 64)]


def test_an_imbalanced_router_grows_the_hot_ranks_saved_bytes_as_the_formula_says():
    from memlab.moe.ep_run import trace_expert_parallel

    base = trace_expert_parallel("tiny-moe", 2, seq_len=32)
    hot = trace_expert_parallel("tiny-moe", 2, seq_len=32, share=0.75)
    f0, f1 = (expert_parallel_bytes("tiny-moe", 2, tokens=32, share=s) for s in (None, 0.75))
    assert f1.rows_received == 3 * f0.rows_received // 2  # 2 ranks · 75% against 2 · 50%
    grown = (f1.expert_activation_bytes + f1.regroup_index_bytes
             - f0.expert_activation_bytes - f0.regroup_index_bytes)
    assert hot.saved_activations_bytes - base.saved_activations_bytes == grown
