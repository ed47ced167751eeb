"""Lab 9's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from memlab.labs.grader import get_lab
from memlab.labs.lab09 import (
    CAPACITY_STEP,
    COUNTED_DISPATCH_CASES,
    DISPATCH_CASES,
    PARAM_CASES,
    RANK_CASES,
    TRACED_RANK_CASES,
    capacity_slips,
    capacity_tokens,
    counted_dispatch_bytes,
    counted_parameters,
    dispatch_by_terms,
    dispatch_case_args,
    dispatch_slips,
    expected_dispatch_bytes,
    expected_rank_bytes,
    fewest_drops_factor,
    measured_drops,
    measured_rows,
    param_case_args,
    parameter_slips,
    parameters_by_terms,
    rank_bytes_by_terms,
    rank_case_args,
    rank_slips,
)
from memlab.model.config import get_config
from memlab.moe.ep_run import expert_parallel_bytes


def moe_parameters(cfg):  # the lab's reference solution
    m, C, L = cfg.moe, cfg.d_model, cfg.n_layer
    total = cfg.num_parameters()
    return total, total - L * (m.experts - m.top_k) * 3 * C * m.d_ff


def rank_parameter_bytes(cfg, ranks, param_bytes):
    m = cfg.moe
    experts = cfg.n_layer * m.experts * 3 * cfg.d_model * m.d_ff
    return param_bytes * (cfg.num_parameters() - experts + experts // ranks)


def dispatch_bytes(tokens, top_k, ranks, d_model, value_bytes):
    return tokens * top_k * (ranks - 1) // ranks * d_model * value_bytes


def test_the_lab_has_its_exercises():
    assert get_lab("lab09").ids == ("9.1", "9.2", "9.3", "9.4")


def test_half_the_checks_or_more_compare_with_a_count_a_trace_or_a_run():
    assert set(PARAM_CASES)  # 9.1: every case counted by PyTorch
    assert len(TRACED_RANK_CASES) >= 3 and len(COUNTED_DISPATCH_CASES) >= 3  # 9.2, 9.3
    assert measured_drops(fewest_drops_factor())[0] == 0  # 9.4: the block run


# ------------------------------------------------------------- 9.1 parameters


def test_counted_parameters_equal_the_config_and_the_reference():
    for case in PARAM_CASES:
        cfg = param_case_args(case)["cfg"]
        want = (cfg.num_parameters(), cfg.active_parameters())
        assert counted_parameters(case) == want == parameters_by_terms(cfg) == moe_parameters(cfg)


def test_parameters_correct(lab, printed):
    assert lab.check("9.1", moe_parameters).ok
    assert printed() == "✅ 9.1 correct"


@pytest.mark.parametrize(("index", "words"), [
    (0, "the experts replace only the MLP"),
    (1, "three matrices"),
    (2, "count the router"),
    (3, "top-k experts only"),
    (4, "shared expert"),
    (5, "return (total, active)"),
])
def test_parameter_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = parameter_slips()[index]
    assert lab.check("9.1", fn).status == "not yet"
    line = printed()
    assert words in line and "(counted by PyTorch)" in line
    assert "its total" in line or "its active" in line


def test_parameter_slips_differ_from_the_reference_and_each_other():
    fns = [fn for fn, _ in parameter_slips()]
    args = [param_case_args(c) for c in PARAM_CASES]
    for fn in fns:
        assert any(fn(**a) != moe_parameters(**a) for a in args)
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**x) != b(**x) for x in args)


def test_parameter_stub_and_bad_answers(lab, capsys):
    assert lab.check("9.1", lambda cfg: None).status == "not attempted"
    assert lab.check("9.1", 3).status == "not yet"
    assert "answer the function moe_parameters itself" in capsys.readouterr().out
    assert lab.check("9.1", lambda cfg: "many").status == "not yet"
    assert "return two numbers, (total, active) parameters" in capsys.readouterr().out


# ------------------------------------------------------------- 9.2 a rank's bytes


def test_rank_bytes_traced_equal_the_formula_and_the_reference():
    for case in RANK_CASES:
        a = rank_case_args(case)
        formula = expert_parallel_bytes(a["cfg"], a["ranks"], tokens=1,
                                        param_bytes=a["param_bytes"]).parameters_bytes
        assert expected_rank_bytes(case) == formula == rank_bytes_by_terms(**a)
        assert formula == rank_parameter_bytes(**a)


def test_rank_bytes_correct_and_slips(lab, printed):
    assert lab.check("9.2", rank_parameter_bytes).ok
    assert printed() == "✅ 9.2 correct"
    for fn, hint in rank_slips():
        assert lab.check("9.2", fn).status == "not yet"
        line = printed()
        assert hint in line and "(traced)" in line


def test_rank_slips_differ():
    fns = [fn for fn, _ in rank_slips()] + [rank_parameter_bytes]
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**rank_case_args(c)) != b(**rank_case_args(c)) for c in RANK_CASES)


# ------------------------------------------------------------- 9.3 the dispatch


def test_counted_dispatch_equals_the_formula_and_the_reference():
    for case in DISPATCH_CASES:
        a = dispatch_case_args(case)
        assert expected_dispatch_bytes(case) == dispatch_by_terms(**a) == dispatch_bytes(**a)
    assert all(counted_dispatch_bytes(c) > 0 for c in COUNTED_DISPATCH_CASES)


def test_dispatch_correct_and_slips(lab, printed):
    assert lab.check("9.3", dispatch_bytes).ok
    assert printed() == "✅ 9.3 correct"
    for fn, hint in dispatch_slips():
        assert lab.check("9.3", fn).status == "not yet"
        assert hint in printed()


def test_one_rank_sends_nothing():
    a = dict(dispatch_case_args(COUNTED_DISPATCH_CASES[0]), ranks=1)
    assert dispatch_by_terms(**a) == 0


# ------------------------------------------------------------- 9.4 the capacity factor


def test_the_fewest_drops_factor_is_measured_at_the_boundary():
    best = fewest_drops_factor()
    below = round(best - CAPACITY_STEP, 10)
    assert measured_drops(best)[0] == 0 < measured_drops(below)[0]
    m = get_config("tiny-moe").moe
    assert replace(m, capacity_factor=best).capacity(capacity_tokens()) >= max(measured_rows())
    assert 1 < best < m.experts / m.top_k  # the router skews, but not all the way


def test_capacity_correct_and_slips(lab, printed):
    assert lab.check("9.4", fewest_drops_factor()).ok
    assert printed() == "✅ 9.4 correct"
    slips = capacity_slips()
    assert len(slips) >= 2
    for c, hint in slips:
        assert lab.check("9.4", c).status == "not yet"
        assert hint in printed()


def test_capacity_bad_answers(lab, printed):
    best = fewest_drops_factor()
    assert not lab.check("9.4", round(best + CAPACITY_STEP, 10)).ok
    assert "drops no row, but a smaller factor" in printed()
    assert not lab.check("9.4", 0.33).ok
    assert "multiple of 0.05" in printed()
    assert not lab.check("9.4", "big").ok
    assert "answer a capacity factor" in printed()
    assert lab.check("9.4", None).status == "not attempted"
    printed()
    assert math.isclose(best * 1, best)
