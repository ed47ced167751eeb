"""memlab.longcontext.optimizers: exact optimizer-state bytes, and the paired loss comparison."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from memlab.errors import MemlabError
from memlab.longcontext.optimizers import LOSS_SIZES, loss_comparison, state_bytes_table

FAST = replace(LOSS_SIZES["ci"]["config"], steps=12, warmup=2, eval_sequences=16)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_measured_states_are_the_estimated_bytes_exactly(precision):
    pytest.importorskip("bitsandbytes")
    table = state_bytes_table("tiny", precision)
    assert [r.optimizer for r in table.rows] == ["adamw", "adamw-8bit", "adamw-bf16-moments",
                                                 "adafactor"]
    for r in table.rows:
        assert r.measured_bytes == r.estimated_bytes, r
    per = {r.optimizer: r.bytes_per_parameter for r in table.rows}
    assert per["adafactor"] < per["adamw-8bit"] < per["adamw-bf16-moments"] <= per["adamw"]
    assert table.row("adamw-bf16-moments").estimated_bytes == 4 * table.parameters
    json.dumps(table.as_dict())
    assert "adafactor" in table.table("KiB")


def test_bf16_moments_save_nothing_when_the_parameters_are_bf16():
    table = state_bytes_table("tiny", "bf16", measure=False, optimizers=("adamw",
                                                                         "adamw-bf16-moments"))
    adamw, bf16 = (table.row(o).estimated_bytes for o in ("adamw", "adamw-bf16-moments"))
    assert 0 <= adamw - bf16 <= 4 * 64  # AdamW's fp32 step tensors only


def test_a_7_8b_table_is_estimated_without_allocating():
    table = state_bytes_table("llama3.1-8b", "bf16-mixed", measure=False, device="cuda")
    assert all(r.measured_bytes is None for r in table.rows)
    assert table.row("adamw").estimated_bytes == 8 * table.parameters
    assert table.row("adafactor").bytes_per_parameter < 0.01


@pytest.mark.parametrize("kw, words", [
    (dict(device="cuda"), "measured states are CPU tensors"),
    (dict(precision="fp8"), "unknown precision 'fp8'"),
    (dict(optimizers=("lion",)), "unknown optimizer 'lion'"),
    (dict(measure="yes"), "measure must be True or False"),
])
def test_bad_table_input_is_one_line(kw, words):
    with pytest.raises(MemlabError, match=words) as err:
        state_bytes_table("tiny", **kw)
    assert "\n" not in str(err.value)


def test_the_loss_comparison_pairs_each_seed_with_adamw():
    result = loss_comparison("ci", seeds=2, config=FAST,
                             optimizers=("adamw", "adamw-bf16-moments", "adafactor"))
    assert result.seeds == (0, 1)
    ref = result.run("adamw")
    assert ref.delta == 0 and ref.delta_se == 0
    for r in result.runs:
        diffs = [a - b for a, b in zip(r.held_out_losses, ref.held_out_losses, strict=True)]
        assert r.delta == pytest.approx(sum(diffs) / 2)
        assert r.delta_se == pytest.approx(abs(diffs[0] - diffs[1]) / 2)  # sd/sqrt(2), two seeds
        assert all(math.isfinite(x) for x in (*r.held_out_losses, *r.final_train_losses))
    bf16 = result.run("adamw-bf16-moments")
    assert bf16.bytes_per_parameter == pytest.approx(4.0)
    assert abs(bf16.delta) < 0.05  # rounding the moments barely moves 12 steps
    assert result.run("adafactor").bytes_per_parameter < 1
    assert "± " in result.run("adafactor").words()
    assert "adafactor" in result.table()
    json.dumps(result.as_dict())


def test_one_seed_has_no_standard_error():
    result = loss_comparison("ci", seeds=1, steps=4, config=FAST, optimizers=("adamw",))
    assert math.isnan(result.run("adamw").delta_se)


@pytest.mark.parametrize("kw, words", [
    (dict(optimizers=("adafactor", "adamw")), "optimizers must start with 'adamw'"),
    (dict(seeds=0), "seeds must be a positive integer"),
    (dict(adafactor_lr=-1.0), "adafactor_lr must be a positive number"),
    (dict(config="big"), "config must be an LMConfig"),
    (dict(scale="huge"), "unknown scale 'huge'"),
])
def test_bad_comparison_input_is_one_line(kw, words):
    with pytest.raises(MemlabError, match=words):
        loss_comparison(**{"scale": "ci", **kw})
