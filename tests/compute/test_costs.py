"""Checkpointing's curve (estimated, counted) and costs (measured) on this device."""

import pytest

from memlab.compute.checkpointing import checkpointing_costs, checkpointing_curve, curve_plans
from memlab.compute.flops import step_flops
from memlab.errors import MemlabError
from memlab.model.checkpoint import Checkpointing
from memlab.model.step import StepSpec


@pytest.fixture(scope="module")
def curve():
    return checkpointing_curve("gpt2", batch_size=2, seq_len=512, precision="bf16-mixed",
                               attention="eager")


def test_the_curve_has_every_plan_and_marks_chen(curve):
    names = [r.plan for r in curve.rows]
    assert names[:3] == ["none", "selective", "full"]
    assert curve.sqrt_plan == "segments-3" and curve.sqrt_plan in names  # round(sqrt(12))
    assert curve_plans(12) == tuple(dict.fromkeys(curve_plans(12)))  # no plan twice
    assert Checkpointing("every", 1) not in curve_plans(12)[3:]  # every-1 is full, listed once


def test_the_curve_trades_bytes_for_flops(curve):
    none, full = curve.row("none"), curve.row("full")
    assert none.recompute_share == 0 and curve.saving("none") == 0
    assert 0 < full.recompute_share < full.recompute_share_whole <= 1 / 3
    every = [curve.row(f"every-{k}") for k in (2, 3, 4, 6, 8)]
    assert [r.saved_bytes for r in every] == sorted(r.saved_bytes for r in every)
    assert [r.flops for r in every] == sorted((r.flops for r in every), reverse=True)
    # Longer segments keep fewer inputs but hold more recomputed blocks in the backward pass.
    segs = [curve.row(f"segments-{k}") for k in (2, 4, 12)]
    assert segs[0].saved_bytes > segs[-1].saved_bytes
    assert segs[0].backward_peak_bytes < segs[-1].backward_peak_bytes
    with pytest.raises(MemlabError, match="no row for plan 'every-5'"):
        curve.row("every-5")


def test_costs_are_measured_beside_the_estimate_and_the_count():
    costs = checkpointing_costs("ci", "cpu", plans=("none", "full"))
    assert [p.plan for p in costs.plans] == ["none", "full"]
    for p in costs.plans:
        assert abs(p.estimated_saved_bytes / p.saved_bytes - 1) < 0.03
        assert p.step_ms > 0 and len(p.times_ms) == costs.setup["repeats"]
    none, full = costs.plan("none"), costs.plan("full")
    assert full.saved_bytes < none.saved_bytes / 4
    assert full.flops > none.flops  # the recomputed forward, counted on the real step
    assert costs.flops_ratio("full", whole=True) > costs.flops_ratio("full")
    assert costs.time_ratio("none") == 1.0
    with pytest.raises(MemlabError, match="include it in plans"):
        checkpointing_costs("ci", "cpu", plans=("full",))
    with pytest.raises(MemlabError, match="no measured plan 'every-2'"):
        costs.plan("every-2")


def test_flops_ratio_of_the_costs_matches_the_formula():
    from memlab.compute.checkpointing import CKPT_CI, COST_SIZES

    size = COST_SIZES["ci"]
    spec = StepSpec(CKPT_CI, batch_size=size["batch_size"], seq_len=size["seq_len"],
                    checkpointing=True)
    none = StepSpec(CKPT_CI, batch_size=size["batch_size"], seq_len=size["seq_len"])
    assert step_flops(spec).total > step_flops(none).total
