"""Lab 8's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import itertools
import math

import pytest

from memlab.errors import MemlabError
from memlab.labs.grader import get_lab
from memlab.labs.lab08 import (
    ADAFACTOR_CASES,
    HEAD_CASES,
    LOSS_BUDGET_SHARE,
    LOSS_JOB,
    MAX_LOSS_CHUNKS,
    OFFLOAD_CASES,
    RING_CASES,
    RING_FORMULA_NAME,
    RING_WORLDS,
    TRACED_HEAD_CASE,
    adafactor_bytes_by_terms,
    adafactor_case_args,
    adafactor_slips,
    counted_ring_bytes,
    expected_head_bytes,
    expected_ring_bytes,
    fewest_loss_chunks,
    forward_peak,
    head_bytes_by_terms,
    head_case_args,
    head_slips,
    host_bytes_by_terms,
    loss_budget_bytes,
    loss_chunk_slips,
    loss_job_config,
    measured_adafactor_bytes,
    measured_host_bytes,
    measured_offload_step,
    offload_case_args,
    offload_slips,
    parameter_shapes,
    ring_bytes_by_terms,
    ring_case_args,
    ring_slips,
    traced_chunked_step,
    traced_head_backward,
    unchunked_step,
)
from memlab.memory.activations import head_peaks
from memlab.memory.context import kv_bytes_sent_per_step


def test_the_lab_has_its_exercises():
    assert get_lab("lab08").ids == ("8.1", "8.2", "8.3", "8.4", "8.5")


# ------------------------------------------------------------- 8.1 the logits' bytes


def head_bytes(cfg, batch_size, seq_len, precision):  # the lab's reference solution
    BTV = batch_size * seq_len * cfg.vocab_size
    compute = 4 if precision == "fp32" else 2
    copy = 4 * BTV if compute != 4 else 0
    return compute * BTV + copy, 2 * 4 * BTV


def test_the_head_cases_cover_the_precisions_and_the_chapters_presets():
    models = {c["model"] for c in HEAD_CASES.values()}
    assert {"llama3.1-8b", "qwen2.5-7b"} <= models
    assert {c["precision"] for c in HEAD_CASES.values()} >= {"fp32", "bf16-mixed", "bf16"}
    assert TRACED_HEAD_CASE in HEAD_CASES


def test_reference_is_head_peaks_and_the_trace():
    for case in HEAD_CASES:
        args = head_case_args(case)
        ref = head_peaks(args["cfg"], args["batch_size"], args["seq_len"], args["precision"])
        assert expected_head_bytes(case) == ref == head_bytes_by_terms(**args) == head_bytes(**args)
    # the traced backward pass holds exactly the two fp32 gradients as temporaries at its peak
    assert traced_head_backward() == expected_head_bytes(TRACED_HEAD_CASE)[1]


def test_head_correct(lab, capsys, printed):
    assert lab.check("8.1", head_bytes).ok
    assert printed() == "✅ 8.1 correct"
    assert lab.check("8.1", lambda *a: [float(v) for v in head_bytes(*a)]).ok
    assert not lab.check("8.1", lambda *a: tuple(v + 1 for v in head_bytes(*a))).ok
    capsys.readouterr()


@pytest.mark.parametrize(("index", "words"), [
    (0, "an fp32 copy"),
    (1, "the loss's gradients are fp32"),
    (2, "two fp32 (B, T, V) gradients at once"),
    (3, "no second copy"),
    (4, "take each model's own vocabulary"),
    (5, "return (forward, backward), in that order"),
])
def test_head_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = head_slips()[index]
    assert lab.check("8.1", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first " in line


def test_head_slips_differ_from_the_reference_and_each_other():
    fns = [fn for fn, _ in head_slips()]
    for fn in fns:
        assert any(fn(**head_case_args(c)) != head_bytes(**head_case_args(c)) for c in HEAD_CASES)
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**head_case_args(c)) != b(**head_case_args(c)) for c in HEAD_CASES)


def test_head_stub_and_bad_answers(lab, capsys):
    def stub(cfg, batch_size, seq_len, precision):
        return None

    assert lab.check("8.1", stub).status == "not attempted"
    assert lab.check("8.1", 3).status == "not yet"
    assert "answer the function head_bytes itself" in capsys.readouterr().out
    assert lab.check("8.1", lambda *a: 1 / 0).status == "not yet"
    assert "raised ZeroDivisionError" in capsys.readouterr().out
    assert lab.check("8.1", lambda *a: "many").status == "not yet"
    assert "return two numbers" in capsys.readouterr().out


def test_the_traced_case_is_named_when_only_it_is_wrong(lab, printed):
    def wrong_on_traced(cfg, batch_size, seq_len, precision):
        f, b = head_bytes(cfg, batch_size, seq_len, precision)
        return (f, b + 2) if cfg.name == head_case_args(TRACED_HEAD_CASE)["cfg"].name else (f, b)

    assert not lab.check("8.1", wrong_on_traced).ok
    line = printed()
    assert "1 of 4 cases not right" in line and "(its backward traced)" in line
    assert "its forward is right, its backward is slightly too large" in line


# ------------------------------------------------------------------ 8.2 loss chunks


def test_the_traced_steps_are_what_the_exercise_says():
    cfg = loss_job_config()
    assert cfg.vocab_size == LOSS_JOB["vocab_size"]
    assert loss_budget_bytes() == int(LOSS_BUDGET_SHARE * forward_peak(unchunked_step()))
    k = fewest_loss_chunks()
    assert k is not None and k & (k - 1), "the answer is not a power of two"
    assert forward_peak(traced_chunked_step(k)) <= loss_budget_bytes()
    assert forward_peak(traced_chunked_step(k - 1)) > loss_budget_bytes()


def test_loss_chunks_correct_and_wrong(lab, capsys, printed):
    k = fewest_loss_chunks()
    assert lab.check("8.2", k).ok
    assert printed() == "✅ 8.2 correct"
    assert lab.check("8.2", float(k)).ok
    capsys.readouterr()
    assert not lab.check("8.2", k - 1).ok
    line = printed()
    assert f"with {k - 1} chunks the traced forward peak is" in line and "more than the budget" in line
    assert not lab.check("8.2", k + 1).ok
    assert f"{k + 1} chunks fit, but fewer fit too" in printed()


def test_loss_chunk_mistakes_get_their_hint(lab, printed):
    slips = loss_chunk_slips()
    assert slips, "at least one slip gives an answer of its own"
    for value, hint in slips:
        if value < 1:
            continue
        assert not lab.check("8.2", int(value)).ok
        assert hint in printed()


def test_loss_chunk_slips_never_name_the_right_answer():
    assert all(v != fewest_loss_chunks() for v, _ in loss_chunk_slips())


def test_loss_chunk_other_answers(lab, capsys, printed):
    assert lab.check("8.2", None).status == "not attempted"
    capsys.readouterr()
    for bad, words in [("five", "answer a number of loss chunks"),
                       (2.5, "answer a whole number of chunks"),
                       (0, "answer a whole number of chunks"),
                       (MAX_LOSS_CHUNKS + 1, "answer a whole number of chunks")]:
        assert lab.check("8.2", bad).status == "not yet"
        assert words in printed()


def test_traced_chunked_step_refuses_bad_input():
    with pytest.raises(MemlabError, match="loss_chunks must be a whole number >= 1, got 0"):
        traced_chunked_step(0)


# ------------------------------------------------------------ 8.3 activation offloading


def offloaded_bytes(cfg, batch_size, seq_len, precision):  # the lab's reference solution
    residual = 2 if precision == "bf16" else 4
    return cfg.n_layer * batch_size * seq_len * cfg.d_model * residual


def test_the_offload_cases_cover_the_precisions_and_styles():
    assert {c["precision"] for c in OFFLOAD_CASES.values()} == {"fp32", "fp16-mixed",
                                                                 "bf16-mixed", "bf16"}
    assert {offload_case_args(c)["cfg"].style for c in OFFLOAD_CASES} == {"llama", "gpt2"}


def test_the_measurement_is_the_formula():
    for case in OFFLOAD_CASES:
        args = offload_case_args(case)
        m = measured_offload_step(case)
        assert m.offloaded["tensors"] == args["cfg"].n_layer  # one input per checkpointed block
        assert measured_host_bytes(case) == host_bytes_by_terms(**args) == offloaded_bytes(**args)


def test_offload_correct(lab, printed):
    assert lab.check("8.3", offloaded_bytes).ok
    assert printed() == "✅ 8.3 correct"


@pytest.mark.parametrize(("index", "words"), [
    (0, "under mixed precision the residual stream, a block's input, stays fp32"),
    (1, "in pure bf16 the residual stream is bf16"),
    (2, "count one input per checkpointed block"),
    (3, "every block is checkpointed, block 0 too"),
])
def test_offload_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = offload_slips()[index]
    assert lab.check("8.3", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first " in line


def test_offload_slips_differ_from_the_reference_and_each_other():
    fns = [fn for fn, _ in offload_slips()]
    for fn in fns:
        assert any(fn(**offload_case_args(c)) != offloaded_bytes(**offload_case_args(c))
                   for c in OFFLOAD_CASES)
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**offload_case_args(c)) != b(**offload_case_args(c)) for c in OFFLOAD_CASES)


def test_offload_stub_and_bad_answers(lab, capsys):
    assert lab.check("8.3", lambda *a: None).status == "not attempted"
    assert lab.check("8.3", "bytes").status == "not yet"
    assert "answer the function offloaded_bytes itself" in capsys.readouterr().out
    assert lab.check("8.3", lambda *a: "many").status == "not yet"
    assert "return a number of bytes" in capsys.readouterr().out
    assert lab.check("8.3", lambda *a: 8 * offloaded_bytes(*a)).status == "not yet"
    assert "8.0x too large" in capsys.readouterr().out


# --------------------------------------------------------------- 8.4 Adafactor's state


def adafactor_state_bytes(shapes, param_bytes):  # the lab's reference solution
    total = 0
    for shape in shapes:
        total += 4
        if len(shape) >= 2:
            total += param_bytes * (shape[-2] + shape[-1]) * math.prod(shape[:-2])
        else:
            total += param_bytes * shape[0]
    return total


def test_the_adafactor_cases_have_vectors_matrices_and_both_dtypes():
    for case in ADAFACTOR_CASES:
        shapes = adafactor_case_args(case)["shapes"]
        assert {len(s) for s in shapes} == {1, 2}
    assert {adafactor_case_args(c)["param_bytes"] for c in ADAFACTOR_CASES} == {2, 4}


def test_the_measured_state_is_the_formula():
    for case in ADAFACTOR_CASES:
        args = adafactor_case_args(case)
        assert (measured_adafactor_bytes(case) == adafactor_bytes_by_terms(**args)
                == adafactor_state_bytes(**args))


def test_adafactor_correct(lab, printed):
    assert lab.check("8.4", adafactor_state_bytes).ok
    assert printed() == "✅ 8.4 correct"


@pytest.mark.parametrize(("index", "words"), [
    (0, "also keeps a step tensor per parameter"),
    (1, "keeps only a row and a column of its second moment"),
    (2, "that is AdamW's two moments"),
    (3, "kept in the parameters' dtype, not fp32"),
    (4, "one step tensor per parameter, not one for the whole optimizer"),
])
def test_adafactor_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = adafactor_slips()[index]
    assert lab.check("8.4", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first " in line


def test_adafactor_slips_differ_from_the_reference_and_each_other():
    fns = [fn for fn, _ in adafactor_slips()]
    cases = list(ADAFACTOR_CASES)
    for fn in fns:
        assert any(fn(**adafactor_case_args(c)) != adafactor_state_bytes(**adafactor_case_args(c))
                   for c in cases)
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**adafactor_case_args(c)) != b(**adafactor_case_args(c)) for c in cases)


def test_adafactor_stub_and_bad_answers(lab, capsys):
    assert lab.check("8.4", lambda *a: None).status == "not attempted"
    assert lab.check("8.4", 12).status == "not yet"
    assert "answer the function adafactor_state_bytes itself" in capsys.readouterr().out
    assert lab.check("8.4", lambda shapes: 0).status == "not yet"
    assert "raised TypeError" in capsys.readouterr().out


def test_helpers_refuse_bad_input():
    with pytest.raises(MemlabError, match="precision"):
        parameter_shapes("tiny", "fp16")
    for fn in (head_case_args, offload_case_args, adafactor_case_args, measured_adafactor_bytes):
        with pytest.raises(MemlabError, match="case"):
            fn("no such case")


# ------------------------------------------------------------- 8.5 the ring's traffic

RING_ALL = (*RING_CASES, RING_FORMULA_NAME)


def ring_bytes_sent(batch, kv_heads, tokens_per_rank, head_dim, world, value_bytes):  # reference
    block = batch * kv_heads * tokens_per_rank * head_dim
    grad = max(value_bytes, 4)
    hops = world - 1
    forward = hops * 2 * block * value_bytes
    backward = hops * 2 * block * (value_bytes + grad) + (2 * block * grad if world > 1 else 0)
    return forward, backward


def test_the_ring_cases_cover_both_dtypes_and_several_worlds():
    assert {c["dtype"] for c in RING_CASES.values()} == {"fp32", "bf16"}
    assert len(set(RING_WORLDS.values())) == len(RING_CASES) and set(RING_WORLDS) == set(RING_CASES)


def test_the_counted_bytes_are_the_formula():
    for case in RING_ALL:
        a = ring_case_args(case)
        sent = kv_bytes_sent_per_step(a["batch"], a["kv_heads"], a["tokens_per_rank"] * a["world"],
                                      a["head_dim"], a["world"], a["value_bytes"])
        assert (expected_ring_bytes(case) == (sent["forward"], sent["backward"])
                == ring_bytes_by_terms(**a) == ring_bytes_sent(**a))
    for case in RING_CASES:
        assert counted_ring_bytes(case) == expected_ring_bytes(case)


def test_ring_correct(lab, printed):
    assert lab.check("8.5", ring_bytes_sent).ok
    assert printed() == "✅ 8.5 correct"


@pytest.mark.parametrize(("index", "words"), [
    (0, "a block makes N - 1 hops"),
    (1, "one more hop sends them to their owner"),
    (2, "the gradient accumulators that travel with K and V are fp32"),
    (3, "both K and V travel"),
])
def test_ring_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = ring_slips()[index]
    assert lab.check("8.5", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first " in line and "(counted)" in line


def test_ring_slips_differ_from_the_reference_and_each_other():
    fns = [fn for fn, _ in ring_slips()]
    for fn in fns:
        assert any(fn(**ring_case_args(c)) != ring_bytes_sent(**ring_case_args(c)) for c in RING_ALL)
    for a, b in itertools.combinations(fns, 2):
        assert any(a(**ring_case_args(c)) != b(**ring_case_args(c)) for c in RING_ALL)


def test_ring_stub_and_bad_answers(lab, capsys):
    assert lab.check("8.5", lambda *a: None).status == "not attempted"
    assert lab.check("8.5", 1).status == "not yet"
    assert "answer the function ring_bytes_sent itself" in capsys.readouterr().out
    assert lab.check("8.5", lambda *a: 3).status == "not yet"
    assert "return two numbers" in capsys.readouterr().out
    with pytest.raises(MemlabError, match="case"):
        ring_case_args("no such case")
    with pytest.raises(MemlabError, match="case"):
        counted_ring_bytes(RING_FORMULA_NAME)
