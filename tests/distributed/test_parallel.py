"""Tensor and pipeline parallelism on two ranks against one process; GPipe's bubble formula."""

import pytest
import torch

from memlab.distributed.parallel import (
    PP_GRAD_ATOL,
    PP_RTOL,
    SIZES,
    TP_ATOL,
    gpipe_bubble,
    local_config,
    parallelism,
    split_stages,
    tp_plan,
)
from memlab.errors import MemlabError
from memlab.model.config import ModelConfig, get_config
from memlab.model.transformer import Block, build_model

SPLIT_LINEARS = {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"}


# No launch -------------------------------------------------------------------------------
def test_gpipe_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    assert gpipe_bubble(2, 4) == 1 / 5
    assert gpipe_bubble(2, 8) == 1 / 9
    assert gpipe_bubble(4, 8) == 3 / 11
    assert gpipe_bubble(1, 7) == 0.0  # one stage never waits
    assert gpipe_bubble(8, 1) == 7 / 8  # one micro-batch: the stages take turns
    for bad in (0, -1, True, 2.0):
        with pytest.raises(MemlabError, match="must be a positive integer"):
            gpipe_bubble(2, bad)


def test_the_plan_names_the_blocks_linears_and_the_local_config_keeps_the_head_size():
    cfg = get_config("tiny")
    block = Block(cfg)
    plan = tp_plan(block)
    names = dict(block.named_modules())
    assert set(plan) == SPLIT_LINEARS | {"attn", "mlp"}
    assert all(k in names for k in plan)
    local = local_config(cfg, 2)
    assert (local.n_head, local.kv_heads, local.head_dim) == (2, 1, cfg.head_dim)
    with pytest.raises(MemlabError, match="n_kv_head \\(2\\) must be divisible"):
        local_config(cfg, 4)


def test_the_stages_chained_in_one_process_are_the_model():
    model = build_model(SIZES["ci"]["pp"]["model"], seed=0)
    idx = torch.randint(512, (2, 16), generator=torch.Generator().manual_seed(0))
    x = idx
    with torch.no_grad():
        for stage in split_stages(model, 2):
            x = stage(x)
        assert torch.equal(x, model(idx))
    assert [len(s.blocks) for s in split_stages(model, 3)] == [1, 2, 1]
    with pytest.raises(MemlabError, match="5 pipeline stages for 4 blocks"):
        split_stages(model, 5)
    with pytest.raises(MemlabError, match="tied embedding"):
        split_stages(build_model("tiny-gpt2"), 2)


def test_an_unknown_scale_is_refused_before_any_process_starts():
    with pytest.raises(MemlabError, match="unknown scale 'huge'; accepted: ci, full"):
        parallelism("huge")


# One launch of two ranks for the rest: ~10 s, most of it process start-up --------------
@pytest.fixture(scope="module")
def result():
    return parallelism("ci")


def test_the_sharded_block_computes_what_one_process_does(result):
    assert result.world_size == 2
    assert result.tp_max_error < TP_ATOL
    for r in result.tp_ranks:
        assert r.input_grad_error < TP_ATOL
        assert r.weight_grad_error < 10 * TP_ATOL  # sums over B x T tokens, in another order


def test_each_rank_holds_half_of_every_split_linear_and_all_of_the_norms(result):
    cfg = ModelConfig(**result.tp_config)
    for r in result.tp_ranks:
        assert {n.rsplit(".", 1)[0] for n in r.linear_bytes} == SPLIT_LINEARS
        for local, full in r.linear_bytes.values():
            assert 2 * local == full
        assert 2 * r.sharded_local_bytes == r.sharded_full_bytes
        assert r.replicated_bytes == 2 * cfg.d_model * 4  # two RMSNorm weights, fp32
        assert r.local_weight_bytes == r.sharded_full_bytes // 2 + r.replicated_bytes
        assert r.full_weight_bytes == sum(p.numel() * 4 for p in Block(cfg).parameters())


def test_the_block_all_reduces_twice_forward_and_twice_backward(result):
    B, T = result.tp_batch
    activation = B * T * result.tp_config["d_model"] * 4  # (B, T, C) fp32
    for r in result.tp_ranks:  # Megatron-LM: after o and down; the inputs' gradients
        assert r.forward_comm == {"all-reduce": dict(calls=2, bytes=2 * activation,
                                                     sent_bytes=2 * activation)}
        assert r.backward_comm["all-reduce"]["calls"] == 2
        assert r.backward_comm["all-reduce"]["bytes"] == 2 * activation


def test_the_pipeline_computes_what_one_process_does(result):
    assert [r.microbatches for r in result.pp_runs] == list(SIZES["ci"]["pp"]["microbatches"])
    for r in result.pp_runs:
        assert r.loss_diff <= PP_RTOL
        assert r.grad_error <= PP_GRAD_ATOL
        assert r.matches_one_process


def test_the_measured_bubble_is_a_share_of_each_stages_step(result):
    # Timing on two shared cores is noisy: this checks the measurement, not the speed.
    for r in result.pp_runs:
        assert r.formula == gpipe_bubble(2, r.microbatches)
        for bubble, busy, step in zip(r.bubble, r.busy_s, r.step_s, strict=True):
            assert 0 < bubble < 1
            assert 0 < busy < step


def test_the_schedule_is_built_from_the_stage_times_measured_alone(result):
    for r in result.pp_runs:
        assert len(r.forward_s) == len(r.backward_s) == r.stages == 2
        assert all(t > 0 for t in (*r.forward_s, *r.backward_s, *r.forward_in_schedule_s,
                                   *r.backward_in_schedule_s))
        assert r.transfer_s > 0
        tl = r.schedule()
        assert tl.microbatches == r.microbatches and tl.transfer_s == 0
        assert tl.busy_s == pytest.approx(tuple(r.microbatches * (f + b) for f, b in
                                                zip(r.forward_s, r.backward_s, strict=True)))
        assert 0 < r.schedule_bubble < 1
        assert r.schedule(transfers=True).mean_bubble >= r.schedule_bubble  # more idle, not less
        assert all(c > 0 for c in r.contention)
    rows = result.bubble_rows()
    assert [row["m"] for row in rows] == [r.microbatches for r in result.pp_runs]
    assert rows[0]["schedule_over_formula"] == pytest.approx(rows[0]["schedule"]
                                                             / rows[0]["formula"])
    words = result.bubble_findings()
    assert "times the formula" in words and "Inside the schedule" in words


def test_the_table_and_the_lookup(result):
    text = result.table()
    assert "all-reduce x2" in text and "GPipe" in text
    assert result.pp_run(4).microbatches == 4
    with pytest.raises(MemlabError, match="no pipeline run with 3 micro-batches; accepted: 4, 8"):
        result.pp_run(3)
