"""Lab 1's checks: right answers pass, each typical wrong answer gets the hint of its own mistake."""

from __future__ import annotations

import pytest

from memlab.gpus import CATALOGUE, fits, get_gpu
from memlab.labs.grader import close_to, get_lab
from memlab.labs.lab01 import (
    BLOCK,
    BLOCK_RTOL,
    JOBS,
    NONE,
    SETUPS,
    USABLE_LABEL,
    block_config,
    block_slips,
    bpp_slips,
    bytes_per_parameter,
    gpus_by_memory,
    job_peak_bytes,
    job_table,
    one_block_bytes,
    ratio_slips,
    smallest_gpu,
    trace_blocks,
)
from memlab.measure.step import measure_step
from memlab.memory.activations import saved_tensors

B, T = BLOCK["batch_size"], BLOCK["seq_len"]


@pytest.fixture(scope="module")
def steps():
    cfg = block_config()
    return {name: measure_step(cfg, batch_size=B, seq_len=T, device="cpu", **setup)
            for name, setup in SETUPS.items()}


@pytest.fixture(scope="module")
def blocks():
    return trace_blocks("sdpa", T, B)


@pytest.fixture(scope="module")
def ratios(blocks):
    at_t = {"sdpa": blocks, "eager": trace_blocks("eager", T, B)}
    at_2t = {attention: trace_blocks(attention, 2 * T) for attention in at_t}
    return at_t, at_2t


def _distinct(values, expected, rtol):
    for i, v in enumerate(values):
        assert not close_to(v, expected, rtol), f"slip {i} would pass"
        for w in values[i + 1:]:
            assert not close_to(v, w, rtol) and not close_to(w, v, rtol)


def test_the_lab_has_its_exercises():
    assert get_lab("lab01").ids == ("1.1", "1.2", "1.3", "1.4")


# ------------------------------------------------------------ 1.1 bytes per parameter

RIGHT_BPP = {"fp32 AdamW": 16, "bf16-mixed AdamW": 16, "bf16 AdamW": 8,
             "fp32 SGD with momentum": 12}


def test_bytes_per_parameter_correct(lab, printed, steps):
    assert lab.check("1.1", RIGHT_BPP, steps=steps).ok
    assert printed() == "✅ 1.1 correct"


@pytest.mark.parametrize("setup", list(SETUPS))
def test_each_bpp_slip_gets_its_hint(lab, printed, steps, setup):
    measured = bytes_per_parameter(steps[setup])
    listed = bpp_slips(setup, measured)
    assert listed, f"no typical wrong answers listed for {setup}"
    _distinct([v for v, _ in listed], measured, lab.get("1.1").rtol)
    for value, hint in listed:
        answer = {**RIGHT_BPP, setup: round(value)}
        assert lab.check("1.1", answer, steps=steps).status == "not yet"
        line = printed()
        assert "1 of 4 not right" in line and f"{setup!r}: {hint}" in line
        assert not any(other in line for _, other in listed if other != hint)


def test_the_18_byte_convention_is_named(lab, printed, steps):
    """Other books' 18 bytes for mixed-precision AdamW get a hint that explains this book's 16."""
    lab.check("1.1", {**RIGHT_BPP, "bf16-mixed AdamW": 18}, steps=steps)
    line = printed()
    assert "18 bytes is the convention of other books" in line
    assert "master copy" in line and "weight-cast cache" in line


def test_bpp_wrong_shape_of_answer(lab, printed, steps):
    lab.check("1.1", {"fp32 AdamW": 16}, steps=steps)
    assert "missing keys" in printed()
    lab.check("1.1", {**RIGHT_BPP, "bf16 AdamW": "eight"}, steps=steps)
    assert "answer a number of bytes" in printed()
    assert lab.check("1.1", dict.fromkeys(SETUPS), steps=steps).status == "not attempted"
    printed()


# -------------------------------------------------------------- 1.2 one block


def _formula(cfg) -> int:
    C, F, nh = cfg.d_model, cfg.ffn_dim, cfg.n_head
    return 4 * B * T * (11 * C + 4 * F + 2 + nh)


def test_block_trace_matches_the_formula_and_the_estimator(blocks):
    cfg = block_config()
    traced = one_block_bytes(blocks)
    listed = sum(t.bytes for t in saved_tensors(cfg, batch_size=B, seq_len=T, device="cpu")
                 if t.scope == "layer")
    assert traced == _formula(cfg) == listed
    assert cfg.kv_heads < cfg.n_head  # k and v's repetition is a slip of its own


def test_block_correct(lab, printed, blocks):
    assert lab.check("1.2", _formula(block_config()), blocks=blocks).ok
    printed()


def test_missing_kv_repetition_fails_with_its_hint(lab, printed, blocks):
    """The review's case: k and v left at n_kv_head heads must fail, and say why."""
    cfg = block_config()
    C, F, nh, nkv, hs = cfg.d_model, cfg.ffn_dim, cfg.n_head, cfg.kv_heads, cfg.head_dim
    per_token = (3 * C + 1) + C + 2 * nkv * hs + C + nh + C + (3 * C + 1) + 4 * F
    assert lab.check("1.2", 4 * B * T * per_token, blocks=blocks).status == "not yet"
    line = printed()
    assert "repeated to all nh heads" in line
    assert "head merge" not in line and "merged back" not in line


def test_each_block_slip_gets_its_hint(lab, printed, blocks):
    traced = one_block_bytes(blocks)
    listed = block_slips(block_config(), B, T, traced)
    _distinct([v for v, *_ in listed], traced, BLOCK_RTOL)
    for value, hint, _label in listed:
        assert lab.check("1.2", value, blocks=blocks).status == "not yet"
        line = printed()
        assert hint in line
        assert not any(other in line for _, other, _ in listed if other != hint)
        assert "units" not in line


def test_leaving_out_per_token_scalars_passes(lab, blocks):
    cfg = block_config()
    assert lab.check("1.2", _formula(cfg) - 4 * B * T * (2 + cfg.n_head), blocks=blocks).ok


# ------------------------------------------------------------ 1.3 double the sequence


def _expected_ratios(ratios):
    at_t, at_2t = ratios
    return {a: one_block_bytes(at_2t[a]) / one_block_bytes(at_t[a]) for a in at_t}


def test_ratios_correct(lab, printed, ratios):
    at_t, at_2t = ratios
    expected = _expected_ratios(ratios)
    assert expected["sdpa"] == 2.0 and 2.0 < expected["eager"] < 4.0
    assert lab.check("1.3", expected, at_t=at_t, at_2t=at_2t).ok
    printed()


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_each_ratio_slip_gets_its_hint(lab, printed, ratios, attention):
    at_t, at_2t = ratios
    expected = _expected_ratios(ratios)
    listed = ratio_slips(attention, expected[attention])
    _distinct([v for v, _ in listed], expected[attention], lab.get("1.3").rtol)
    for value, hint in listed:
        lab.check("1.3", {**expected, attention: value}, at_t=at_t, at_2t=at_2t)
        line = printed()
        assert f"{attention!r}: {hint}" in line
        assert not any(other in line for _, other in listed if other != hint)


def test_ratios_are_dimensionless(lab, printed, ratios):
    """A ratio is never blamed on units, however its error happens to look."""
    at_t, at_2t = ratios
    expected = _expected_ratios(ratios)
    lab.check("1.3", {**expected, "eager": expected["eager"] * 2**20 / 10**6}, at_t=at_t, at_2t=at_2t)
    line = printed()
    assert "units" not in line and "MiB" not in line
    assert lab.get("1.3").dimensionless


# -------------------------------------------------------------------- 1.4 GPUs


def test_gpus_correct(lab, printed):
    right = {name: smallest_gpu(job_peak_bytes(job)) for name, job in JOBS.items()}
    assert lab.check("1.4", right, jobs=JOBS).ok
    printed()


def test_gpu_hints(lab, printed):
    right = {name: smallest_gpu(job_peak_bytes(job)) for name, job in JOBS.items()}
    order = [g.name for g in gpus_by_memory()]
    for name, job in JOBS.items():
        expected = right[name]
        smaller = order[: order.index(expected)] if expected != NONE else order
        if smaller:
            lab.check("1.4", {**right, name: smaller[-1]}, jobs=JOBS)
            assert "does not fit" in printed()
        if expected != NONE:
            lab.check("1.4", {**right, name: NONE}, jobs=JOBS)
            assert "a GPU of the catalogue holds it" in printed()
            bigger = [g for g in order[order.index(expected) + 1:]
                      if get_gpu(g).usable_bytes > get_gpu(expected).usable_bytes]
            if bigger:
                lab.check("1.4", {**right, name: bigger[0]}, jobs=JOBS)
                line = printed()
                assert "a smaller GPU holds it" in line
                assert ("GiB and GB" in line) == (job["optimizer"] == "adamw-8bit")
    lab.check("1.4", {**right, next(iter(JOBS)): "V100"}, jobs=JOBS)
    assert "answer a GPU name" in printed()


def test_job_table_agrees_with_the_check():
    rows = job_table()
    assert [r.job for r in rows] == list(JOBS)
    for r, job in zip(rows, JOBS.values(), strict=True):
        assert r.peak_bytes == job_peak_bytes(job)
        assert r.gpu == smallest_gpu(r.peak_bytes)
        if r.gpu == NONE:
            assert not any(fits(r.peak_bytes, g) for g in CATALOGUE)
        else:
            assert r.spare_bytes == get_gpu(r.gpu).usable_bytes - r.peak_bytes >= 0
        assert r.model_states_bytes <= r.peak_bytes


def test_usable_is_labelled_as_the_catalogue_defines_it():
    assert "nvidia-smi total minus the stated reserve" in USABLE_LABEL
    for gpu in CATALOGUE:
        assert gpu.usable_bytes < gpu.total_bytes
