"""Recomputation from a memory budget (memlab.longcontext.budget): PyTorch's partitioner at each
budget, held to what its compiled step saves and to chapter 7's plans of the same model."""

from __future__ import annotations

import json
import math

import pytest

from memlab.errors import MemlabError
from memlab.longcontext.budget import (
    BUDGET_SIZES,
    BUDGETS,
    budget_table,
    check_budget,
    check_budgets,
    partition_step,
)

CI = BUDGET_SIZES["ci"]


@pytest.fixture(scope="module")
def table():
    return budget_table(CI["model"], batch_size=CI["batch_size"], seq_len=CI["seq_len"],
                        budgets=BUDGETS, plans=CI["plans"], precision=CI["precision"])


def test_budget_one_saves_at_least_what_budget_zero_saves(table):
    parts = table.partitions
    assert parts.at(1.0).saved_bytes >= parts.at(0.0).saved_bytes
    assert parts.at(0.0).saved_bytes == 0  # budget 0 keeps the graph's inputs only
    assert set(parts.at(0.2).saved_by_op) == {"mm"}  # a low budget keeps matmul outputs only


def test_saved_bytes_fall_and_flops_rise_as_the_budget_falls(table):
    parts = table.partitions.partitions
    assert [p.budget for p in parts] == sorted(BUDGETS, reverse=True)
    for high, low in zip(parts, parts[1:], strict=False):
        assert low.saved_bytes <= high.saved_bytes, (high, low)
        assert low.flops >= high.flops, (high, low)
        assert low.recomputed_matmuls >= high.recomputed_matmuls
    assert parts[0].saved_bytes > parts[-1].saved_bytes
    assert parts[-1].flops > parts[0].flops


def test_flops_bracket_the_eager_step(table):
    none, parts = table.row("none"), table.partitions
    # Budget 1.0 recomputes no matrix multiply: the eager step's FLOPs, exactly.
    assert parts.at(1.0).recomputed_matmuls == 0
    assert parts.at(1.0).flops == none.flops
    # Budget 0.0 keeps nothing but the inputs: the whole forward runs a second time.
    assert parts.at(0.0).flops == none.flops + parts.at(0.0).forward_flops
    for p in parts.partitions:
        assert p.forward_flops == parts.at(1.0).forward_flops


def test_partitioners_account_is_what_runs(table):
    parts = table.partitions
    for p in parts.partitions:  # meta sizes against the storages of the forward run for real
        assert p.saved_bytes == p.accounted_bytes, p
        assert sum(p.saved_by_op.values()) == p.accounted_bytes
    compiled = parts.at(parts.compiled_budget)
    ratio = parts.compiled_saved_bytes / compiled.accounted_bytes
    print(f"compiled step's saved bytes (saved_tensors_hooks) / partitioner's: {ratio:.4f}")
    assert ratio == 1.0


def test_budget_one_saves_less_than_the_eager_step(table):
    # The partitioner's runtime-first choice already recomputes cheap elementwise work.
    ratio = table.eager_ratio
    print(f"partitioner at budget 1.0 / eager step's measured saved bytes: {ratio:.3f}")
    assert 0.5 <= ratio <= 1.0


def test_hand_written_plans_are_chapter_7s(table):
    rows = {r.plan: r for r in table.rows if r.source == "hand-written"}
    assert list(rows) == ["none", "selective", "every-2", "full"]
    assert rows["none"].recompute_share == 0
    assert rows["full"].saved_bytes < rows["every-2"].saved_bytes < rows["none"].saved_bytes
    assert rows["none"].flops < rows["selective"].flops < rows["every-2"].flops \
        < rows["full"].flops


def test_a_budget_repartitioned_is_the_budget_compiled(table):
    # The joint graph does not depend on the budget: compiling under 0.4 gives what the
    # partitioner makes of the graph compiled under 1.0.
    own = partition_step(CI["model"], batch_size=CI["batch_size"], seq_len=CI["seq_len"],
                         budgets=(0.4,), precision=CI["precision"])
    assert own.compiled_budget == 0.4
    assert own.at(0.4) == table.partitions.at(0.4)
    assert own.compiled_saved_bytes == own.at(0.4).saved_bytes


def test_table_and_dict(table):
    text = table.table()
    assert "budget 0.6" in text and "selective" in text
    d = json.loads(json.dumps(table.as_dict()))
    assert len(d["rows"]) == len(BUDGETS) + len(CI["plans"])
    assert d["partitions"]["partitions"][0]["flops"] == table.partitions.partitions[0].flops
    with pytest.raises(MemlabError, match="no row"):
        table.row("budget 0.5")


@pytest.mark.parametrize("bad", [1.5, -0.1, "0.5", None, True, math.nan, math.inf, [0.5]])
def test_bad_budget_is_one_line(bad):
    with pytest.raises(MemlabError) as err:
        check_budget(bad)
    assert "\n" not in str(err.value) and "0 to 1" in str(err.value)
    assert repr(bad) in str(err.value)


@pytest.mark.parametrize("bad", [(1.0, 1.2), (), "0.5", 0.5, (0.5, "x")])
def test_bad_budgets_are_refused_before_compiling(bad):
    with pytest.raises(MemlabError) as err:
        partition_step(CI["model"], batch_size=1, seq_len=8, budgets=bad)
    assert "\n" not in str(err.value)


def test_budgets_are_sorted_and_distinct():
    assert check_budgets([0, 0.5, 1, 0.5]) == (1.0, 0.5, 0.0)


@pytest.mark.parametrize("kwargs", [dict(precision="fp64"), dict(batch_size=0),
                                    dict(seq_len=10_000), dict(model="no-such-model")])
def test_bad_step_is_one_line(kwargs):
    args = dict(model=CI["model"], batch_size=1, seq_len=8) | kwargs
    with pytest.raises(MemlabError) as err:
        partition_step(args.pop("model"), **args)
    assert "\n" not in str(err.value)
