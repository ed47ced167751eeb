"""memlab plan on a mixture of experts: expert-parallel set-ups, their fit from estimate_moe, their
cost from the active FLOPs and the all-to-all, and one-line errors."""

from __future__ import annotations

import json

import pytest

from memlab.cli import main
from memlab.compute.flops import step_flops
from memlab.errors import MemlabError
from memlab.gpus import get_gpu
from memlab.model.config import get_config
from memlab.model.step import StepSpec
from memlab.moe.ep_run import all_to_all_step_bytes
from memlab.moe.estimate import estimate_moe
from memlab.moe.plan import expert_parallel_degrees, moe_step_cost, plan_moe


def _fits(cfg, row, seq_len, usable):
    def est(m):
        return estimate_moe(cfg, batch_size=m, seq_len=seq_len, precision=row.precision,
                            optimizer=row.optimizer, checkpointing=row.checkpointing,
                            expert_parallel=row.expert_parallel)
    assert row.per_gpu_peak_bytes == est(row.micro_batch).peak_bytes <= usable
    if row.grad_accum % 2 == 0:  # the next power of two does not fit
        assert est(2 * row.micro_batch).peak_bytes > usable


def test_mixtral_fits_an_h200_with_eight_expert_parallel_ranks():
    cfg = get_config("mixtral-8x7b")
    plan = plan_moe(cfg, "H200", global_batch=64, seq_len=4096)
    assert plan.rows and all(r.expert_parallel == 8 for r in plan.rows)
    for r in plan.rows:
        _fits(cfg, r, 4096, get_gpu("H200").usable_bytes)
    nothing = plan_moe(cfg, "H100", global_batch=64, seq_len=4096)
    assert not nothing.rows and nothing.smallest_peak_bytes > get_gpu("H100").usable_bytes
    assert "Nothing fits" in nothing.reading()


def test_rows_fit_as_estimate_moe_says_and_cost_the_active_flops():
    cfg = get_config("tiny-moe")
    plan = plan_moe(cfg, "T4", global_batch=16, seq_len=64, gpu_counts=(1, 2, 4, 8))
    assert {r.expert_parallel for r in plan.rows} == set(expert_parallel_degrees(4, 4))
    for r in plan.rows:
        _fits(cfg, r, 64, get_gpu("T4").usable_bytes)
        active = step_flops(StepSpec(cfg, batch_size=16, seq_len=64, precision=r.precision,
                                     checkpointing=r.checkpointing)).total
        assert r.flops_per_step == active < r.all_experts_flops_per_step
        sent = all_to_all_step_bytes(cfg, r.expert_parallel, tokens=r.micro_batch * 64,
                                     precision=r.precision, checkpointing=r.checkpointing,
                                     grad_accum_steps=r.grad_accum)
        assert r.all_to_all_bytes == sent and (r.all_to_all_s > 0) == (r.expert_parallel > 1)
    costs = [r.gpu_seconds for r in plan.rows]
    assert costs == sorted(costs)


def test_the_active_step_costs_less_than_all_the_experts():
    cfg = get_config("mixtral-8x7b")
    c = moe_step_cost(cfg, "H200", gpus=8, expert_parallel=8, checkpointing=True, micro_batch=1,
                      grad_accum=8, seq_len=4096)
    assert c["flops"] < c["all_experts_flops"]
    every = c["all_experts_flops"] / 8 / (get_gpu("H200").peak_ops("bf16") * 0.4)
    assert c["compute_s"] < every and c["all_to_all_s"] > 0 and c["grad_sync_s"] > 0


def test_bad_expert_parallel_degrees_are_refused_in_one_line():
    cfg = get_config("mixtral-8x7b")
    for kwargs, needle in ((dict(gpus=8, expert_parallel=3), "divide"),
                           (dict(gpus=4, expert_parallel=8), "divide the GPUs")):
        with pytest.raises(MemlabError) as exc:
            moe_step_cost(cfg, "H100", checkpointing=False, micro_batch=1, grad_accum=1,
                          seq_len=128, **kwargs)
        assert needle in str(exc.value) and "\n" not in str(exc.value)
    assert expert_parallel_degrees(60, 8) == [1, 2, 4]


def test_the_command_line_plans_an_moe_model(capsys):
    argv = ["plan", "--model", "tiny-moe", "--gpu", "T4", "--global-batch", "8", "--seq-len",
            "64", "--gpus", "1,2,4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "expert parallel" in out and "left out: lora, qlora" in out
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] and d["active_parameters"] == get_config("tiny-moe").active_parameters()


def test_adapters_alone_are_refused_for_experts(cli_error):
    cli_error(["plan", "--model", "tiny-moe", "--gpu", "T4", "--global-batch", "8", "--seq-len",
               "64", "--trains", "lora"], "'lora'", "accepted: full")
