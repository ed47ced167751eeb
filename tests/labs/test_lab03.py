"""Lab 3's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.labs import lab03
from memlab.labs.grader import get_lab
from memlab.labs.lab03 import (
    BITS_CASES,
    LAB_SCHEMES,
    MODEL,
    QLORA,
    ZEROPOINT_CASES,
    activations,
    best_scheme,
    budget_bytes,
    heavy_tailed_weight,
    int8_errors,
    int8_weight,
    model_weights_gb,
    probabilities,
    quantized_parameters,
    scheme_table,
    tensor,
)
from memlab.model.config import PRESETS
from memlab.quant.functional import LLM_INT8_THRESHOLD, bits_per_parameter, zeropoint_quantize


@pytest.fixture(scope="module")
def acts():
    return activations()


@pytest.fixture(scope="module")
def weight():
    return int8_weight()


@pytest.fixture(scope="module")
def table():
    return scheme_table()


# The lab's reference solutions of exercise 3.1, and typical mistakes.
def absmax_int8(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def zeropoint_uint8(x, bits=8):
    levels = 2**bits - 1
    lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
    scale = (hi - lo) / levels
    zero = torch.round(-lo / scale)
    return (torch.round(x / scale) + zero).clamp(0, levels).to(torch.uint8), scale, zero


def _zp_parts(x, bits, *, levels=None, include_zero=True):
    levels = 2**bits - 1 if levels is None else levels
    lo, hi = (x.min().clamp(max=0), x.max().clamp(min=0)) if include_zero else (x.min(), x.max())
    scale = (hi - lo) / levels
    return lo, scale, torch.round(-lo / scale)


def test_the_lab_has_its_exercises():
    assert get_lab("lab03").ids == ("3.1a", "3.1b", "3.2a", "3.2b", "3.3a", "3.3b", "3.4")


# ---------------------------------------------------------------- the helpers


def test_tensor_is_seeded_and_negatively_skewed():
    x = tensor()
    assert torch.equal(x, tensor()) and x.dtype == torch.float32
    assert -x.min() == x.abs().max() and -x.min() > 1.5 * x.max() > 0
    p = probabilities()
    assert (p > 0).all() and torch.allclose(p.sum(-1), torch.ones(p.shape[0]))


def _tie_margin(v: torch.Tensor) -> float:
    return (v - torch.floor(v) - 0.5).abs().min().item()


def test_no_code_sits_near_a_rounding_tie():
    """Equivalent ways to compute scale (x / s vs x * (1/s), fp32 vs fp64) give the same codes."""
    x = tensor()
    assert _tie_margin(x.double() * 127 / x.abs().max().double()) > 1e-3
    for _, which, bits in ZEROPOINT_CASES:
        t = (tensor() if which == "x" else probabilities()).double()
        lo, scale, _ = _zp_parts(t, bits)
        assert _tie_margin(t / scale) > 1e-3
        if lo != 0:
            assert _tie_margin(-lo / scale) > 1e-3


def test_activations_have_the_injected_outliers(acts):
    assert torch.equal(acts, activations())
    cols = lab03.outlier_columns(acts, LLM_INT8_THRESHOLD).tolist()
    assert len(cols) == 3
    col_max = acts.abs().amax(dim=0)
    assert (acts.abs() - LLM_INT8_THRESHOLD).abs().min() > 1e-3  # >= and > give the same answer
    near = col_max.argsort(descending=True)[3]
    assert 4.5 < col_max[near] < LLM_INT8_THRESHOLD  # the near miss
    negative_only = [c for c in cols if (acts[:, c] <= -LLM_INT8_THRESHOLD).any() and
                     not (acts[:, c] >= LLM_INT8_THRESHOLD).any()]
    assert negative_only, "one outlier feature has only negative outliers"
    counts = sorted(int((acts[:, c].abs() >= LLM_INT8_THRESHOLD).sum()) for c in cols)
    assert counts[0] == 1 and counts[-1] == acts.shape[0]


def test_llm_int8_beats_plain_int8(acts, weight):
    errors = int8_errors(acts, weight)
    assert errors["int8"] > 2 * errors["LLM.int8()"] > 0


def test_model_counts():
    cfg = PRESETS[MODEL]
    kept = cfg.num_parameters() - quantized_parameters(cfg)
    C, V, L = cfg.d_model, cfg.vocab_size, cfg.n_layer
    assert kept == 2 * V * C + (2 * L + 1) * C  # embedding, lm_head, two norms per block, final norm
    assert model_weights_gb(bits=16) == pytest.approx(2 * cfg.num_parameters() / 1e9)
    assert 3.5 < model_weights_gb() < 4.0


def test_scheme_table_bytes_follow_the_formula(table):
    w = heavy_tailed_weight()
    assert torch.equal(w, heavy_tailed_weight())
    by = {row.scheme: row for row in table}
    assert list(by) == list(LAB_SCHEMES)
    formula = {
        "bf16": bits_per_parameter("bf16"),
        "int8": bits_per_parameter("int8", blocksize=w.shape[1]),
        "nf4": bits_per_parameter("nf4", blocksize=64),
        "nf4-dq": bits_per_parameter("nf4", blocksize=64, double_quant=True),
        "fp4": bits_per_parameter("fp4", blocksize=64),
        "int4-zp": bits_per_parameter("int4-zp", blocksize=64),
        "int3-zp": bits_per_parameter("int3-zp", blocksize=64),
    }
    for scheme, bits in formula.items():
        # double quantization also stores the fp32 mean of the absmax values: 4 bytes
        assert 0 <= by[scheme].stored_bytes - w.numel() * bits / 8 <= 4, scheme
    errors = [by[s].relative_error for s in ("bf16", "int8", "nf4", "int3-zp")]
    assert errors == sorted(errors)


def test_the_budget_is_not_won_by_the_largest_scheme_that_fits(table):
    """The designed lesson of 3.4, checked on the measured table: the answer is not the largest."""
    budget = budget_bytes()
    fitting = [row for row in table if row.stored_bytes <= budget]
    largest = max(fitting, key=lambda row: row.stored_bytes)
    best = best_scheme(table, budget)
    assert best != largest.scheme
    errors = sorted(row.relative_error for row in fitting)
    assert errors[1] > 1.03 * errors[0]  # a clear winner, not a coin toss


def test_best_scheme_names_an_impossible_budget(table):
    with pytest.raises(MemlabError, match=r"no scheme fits in 1,000 bytes; the smallest, int3-zp"):
        best_scheme(table, 1000)


# --------------------------------------------------------------- 3.1a absmax


def test_absmax_correct(lab, capsys, printed):
    assert lab.check("3.1a", absmax_int8).ok
    assert printed() == "✅ 3.1a correct"

    def times_inverse(x):  # x * (127 / max|x|), as memlab.quant.functional computes it, with a float scale
        amax = x.abs().max().item()
        return torch.round(x * (127 / amax)).to(torch.int8), amax / 127

    assert lab.check("3.1a", times_inverse).ok
    capsys.readouterr()


def test_absmax_stub_is_not_attempted(lab, capsys):
    def stub(x):
        pass

    assert lab.check("3.1a", stub).status == "not attempted"
    assert lab.check("3.1a", None).status == "not attempted"
    capsys.readouterr()


def _absmax_variant(kind):
    def f(x):
        amax = x.abs().max()
        scale = {"128": amax / 128, "max": x.max() / 127}.get(kind, amax / 127)
        v = x / scale
        if kind == "trunc":
            return v.to(torch.int8), scale
        if kind == "float":
            return v, scale
        if kind == "floor":
            return torch.floor(v).to(torch.int8), scale
        codes = torch.round(v).clamp(-128, 127)
        if kind == "uint8":
            return codes.to(torch.int16).to(torch.uint8), scale
        if kind == "int16":
            return codes.to(torch.int16), scale
        if kind == "inverse":
            return codes.to(torch.int8), 1 / scale
        if kind == "one-off":
            codes = codes.clone()
            codes[0, 0] += 1
        return codes.to(torch.int8), scale

    return f


@pytest.mark.parametrize(("kind", "words"), [
    ("trunc", "truncated toward zero, which is what .to(torch.int8) does"),
    ("float", "not integers"),
    ("floor", "floor rounds down"),
    ("128", "the largest code is 127, not 128"),
    ("max", "on the negative side"),
    ("inverse", "the step between two codes"),
    ("uint8", "wrapped around"),
    ("int16", "store them as torch.int8"),
    ("one-off", "1 of 32 codes differ"),
])
def test_absmax_mistakes_get_their_hint(lab, printed, kind, words):
    assert lab.check("3.1a", _absmax_variant(kind)).status == "not yet"
    assert words in printed()


def test_absmax_bad_answers(lab, printed):
    def broken(x):
        raise IndexError("oops")

    assert lab.check("3.1a", broken).status == "not yet"
    assert "absmax_int8(x) raised IndexError: oops" in printed()
    assert lab.check("3.1a", 3.0).status == "not yet"
    assert "answer the function absmax_int8 itself" in printed()
    assert lab.check("3.1a", lambda x: x).status == "not yet"
    assert "return two values" in printed()
    assert lab.check("3.1a", lambda x: (x[0], 1.0)).status == "not yet"
    assert "shape" in printed()
    assert lab.check("3.1a", lambda x: (x, "big")).status == "not yet"
    assert "one number" in printed()


# ----------------------------------------------------------- 3.1b zero-point


def test_zeropoint_correct(lab, capsys, printed):
    assert lab.check("3.1b", zeropoint_uint8).ok
    assert printed() == "✅ 3.1b correct"

    def python_numbers(x, bits=8):  # Python floats, ints and min/max: the same codes
        levels = 2**bits - 1
        lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
        scale = (hi - lo) / levels
        zero = round(-lo / scale)
        codes = (torch.round(x / scale) + zero).clamp(0, levels).to(torch.uint8)
        return codes, scale, zero

    assert lab.check("3.1b", python_numbers).ok
    capsys.readouterr()


def test_zeropoint_stub_is_not_attempted(lab, capsys):
    def stub(x, bits=8):
        pass

    assert lab.check("3.1b", stub).status == "not attempted"
    capsys.readouterr()


def _zp_variant(kind):
    def f(x, bits=8):
        levels = 2**bits - 1
        lo, scale, zero = _zp_parts(x, bits, levels=2**bits if kind == "levels" else None,
                                    include_zero=kind != "no-zero")
        if kind == "symmetric":
            scale = 2 * x.abs().max() / levels
        if kind == "8-bit":
            scale = (x.max().clamp(min=0) - x.min().clamp(max=0)) / 255
        if kind == "unrounded-zero":
            zero = -lo / scale
        if kind == "zero-sign":
            zero = torch.round(lo / scale)
        if kind == "inverse":
            scale = 1 / scale
        v = x / scale
        if kind == "trunc":
            codes = v.to(torch.int32) + zero
        elif kind == "cast":  # x / scale + zero cast without rounding: floor for these values
            codes = (v + zero).to(torch.uint8)
        elif kind == "float":
            codes = v + zero
        elif kind == "min-anchored":
            codes = torch.round((x - lo) / scale)
        else:
            codes = torch.round(v) + zero
        top = 127 if kind == "clamp-127" else levels
        codes = codes.clamp(0, top)
        if kind == "float":
            return codes, scale, zero
        return codes.to(torch.int16 if kind == "int16" else torch.uint8), scale, zero

    return f


@pytest.mark.parametrize(("kind", "words"), [
    ("levels", "2^bits - 1 steps"),
    ("no-zero", "the range must include 0"),
    ("symmetric", "not over [-max|x|, max|x|]"),
    ("8-bit", "use bits"),
    ("inverse", "the step between two codes"),
    ("unrounded-zero", "the zero-point is a code, an integer"),
    ("zero-sign", "not round(min / scale)"),
    ("trunc", "truncated toward zero, which is what .to(torch.uint8) does"),
    ("cast", "truncated toward zero, which is what .to(torch.uint8) does"),
    ("float", "not integers"),
    ("min-anchored", "round x / scale first"),
    ("clamp-127", "codes above 127 are clamped"),
    ("int16", "store them as torch.uint8"),
])
def test_zeropoint_mistakes_get_their_hint(lab, printed, kind, words):
    assert lab.check("3.1b", _zp_variant(kind)).status == "not yet"
    assert words in printed()


def test_zeropoint_names_the_case(lab, printed):
    """A function right on x but wrong on the positive tensor p is told so."""
    assert lab.check("3.1b", _zp_variant("no-zero")).status == "not yet"
    assert "on p with bits=8" in printed()
    assert lab.check("3.1b", _zp_variant("8-bit")).status == "not yet"
    assert "on x with bits=4" in printed()


def test_zeropoint_bad_answers(lab, printed):
    assert lab.check("3.1b", lambda x, bits=8: (x, 1.0)).status == "not yet"
    assert "return three values" in printed()
    assert lab.check("3.1b", lambda x: zeropoint_uint8(x)).status == "not yet"
    assert "raised TypeError" in printed()
    assert lab.check("3.1b", "zeropoint").status == "not yet"
    printed()


# ------------------------------------------------------ 3.2 bits per parameter


def _bits():
    return {key: bits_per_parameter(**case) for key, case in BITS_CASES.items()}


def test_bits_correct(lab, capsys):
    assert lab.check("3.2a", _bits()).ok
    rounded = {key: round(v, 3) for key, v in _bits().items()}
    assert lab.check("3.2a", rounded).ok
    capsys.readouterr()


@pytest.mark.parametrize(("key", "value", "words"), [
    ("nf4, blocks of 64", 4.0, "the code alone"),
    ("nf4 + double quant, blocks of 64", 4.5, "without double quantization"),
    ("nf4 + double quant, blocks of 64", 4 + 8 / 64, "second level"),
    ("int8 absmax, one scale per row of 4096", 8.0, "the code alone"),
    ("int4 zero-point, groups of 128", 4 + 16 / 128, "add the zero-point"),
    ("int4 zero-point, groups of 128", 4 + 36 / 128, "not fp32"),
    ("int4 zero-point, groups of 128", 4 + 24 / 128, "not as a byte"),
    ("int4 zero-point, groups of 128", 4.3, "code bits + (scale bits + zero bits)"),
])
def test_bits_mistakes_get_their_hint(lab, printed, key, value, words):
    answer = {**_bits(), key: value}
    assert lab.check("3.2a", answer).status == "not yet"
    line = printed()
    assert f"1 of {len(BITS_CASES)} not right: {key!r}" in line and words in line


def test_bits_stub_partial_and_bad_keys(lab, capsys):
    assert lab.check("3.2a", None).status == "not attempted"
    assert lab.check("3.2a", dict.fromkeys(BITS_CASES)).status == "not attempted"
    partial = {**dict.fromkeys(BITS_CASES), "nf4, blocks of 64": 4.5}
    assert lab.check("3.2a", partial).status == "not yet"
    assert lab.check("3.2a", {"nf4, blocks of 64": 4.5}).status == "not yet"
    assert lab.check("3.2a", [4.5]).status == "not yet"
    lines = capsys.readouterr().out.splitlines()
    assert "fill in 'nf4 + double quant" in lines[2]
    assert "missing keys" in lines[3] and "answer a dict" in lines[4]


def test_model_gb(lab, capsys, printed):
    assert lab.check("3.2b", model_weights_gb()).ok
    assert lab.check("3.2b", torch.tensor(model_weights_gb())).ok
    capsys.readouterr()
    cfg = PRESETS[MODEL]
    wrong = {
        model_weights_gb(bits=4.0): "4 bits per quantized weight",
        model_weights_gb(bits=4.5): "without double quantization",
        cfg.num_parameters() * bits_per_parameter(**QLORA) / 8e9: "stay in bf16",
        model_weights_gb() * 1e9 / 2**30: "GiB and GB",
        2 * cfg.num_parameters() / 1e9: "the whole model in bf16",
        3.0: "(Linear weights * bits per weight",
    }
    for value, words in wrong.items():
        assert lab.check("3.2b", value).status == "not yet"
        assert words in printed()
    assert lab.check("3.2b", "4 GB").status == "not yet"
    assert "answer a number of GB" in printed()
    assert lab.check("3.2b", None).status == "not attempted"
    printed()


# -------------------------------------------------------- 3.3 outlier features


def test_outliers_correct_in_any_container(lab, capsys, acts):
    cols = lab03.outlier_columns(acts, LLM_INT8_THRESHOLD)
    for answer in (cols, cols.tolist(), set(cols.tolist()), tuple(reversed(cols.tolist())),
                   cols.numpy()):
        assert lab.check("3.3a", answer, x=acts).ok
    capsys.readouterr()


def test_outlier_mistakes(lab, printed, acts):
    big = acts.abs() >= LLM_INT8_THRESHOLD
    rows = torch.nonzero(big.any(dim=1)).flatten().tolist()
    assert lab.check("3.3a", rows, x=acts).status == "not yet"
    assert "token (row) indices" in printed()
    positive = torch.nonzero((acts >= LLM_INT8_THRESHOLD).any(dim=0)).flatten().tolist()
    assert lab.check("3.3a", positive, x=acts).status == "not yet"
    assert "compare magnitudes |x|" in printed()
    near = int(acts.abs().amax(dim=0).argsort(descending=True)[3])
    cols = lab03.outlier_columns(acts, LLM_INT8_THRESHOLD).tolist()
    assert lab.check("3.3a", cols + [near], x=acts).status == "not yet"
    assert "1 of your columns hold no value with |x| >= 6" in printed()
    assert lab.check("3.3a", cols[:1], x=acts).status == "not yet"
    assert "2 outlier column(s) missing" in printed()
    assert lab.check("3.3a", big.any(dim=0), x=acts).status == "not yet"
    assert "not a boolean mask" in printed()
    assert lab.check("3.3a", 3.5, x=acts).status == "not yet"
    printed()
    assert lab.check("3.3a", None, x=acts).status == "not attempted"
    printed()


def test_error_ratio(lab, capsys, printed, acts, weight):
    y_ref = acts.double() @ weight.double().T
    err = {}
    for t in (0.0, LLM_INT8_THRESHOLD):
        y = lab03.llm_int8_matmul(acts, weight, threshold=t).double()
        err[t] = ((y - y_ref).norm() / y_ref.norm()).item()
    assert lab.check("3.3b", err[0.0] / err[LLM_INT8_THRESHOLD], x=acts, weight=weight).ok
    y32 = acts @ weight.T  # an fp32 reference is close enough
    e32 = {t: ((lab03.llm_int8_matmul(acts, weight, threshold=t) - y32).norm() / y32.norm()).item()
           for t in (0.0, LLM_INT8_THRESHOLD)}
    assert lab.check("3.3b", e32[0.0] / e32[LLM_INT8_THRESHOLD], x=acts, weight=weight).ok
    capsys.readouterr()
    assert lab.check("3.3b", err[LLM_INT8_THRESHOLD] / err[0.0], x=acts, weight=weight).status == "not yet"
    assert "divide the other way" in printed()
    assert lab.check("3.3b", 1.0, x=acts, weight=weight).status == "not yet"
    line = printed()  # no slip explains it: it is wrong, and the recipe is not given
    assert line.endswith("not yet: that is not the expected answer") and "threshold" not in line
    assert lab.check("3.3b", None, x=acts, weight=weight).status == "not attempted"
    assert lab.check("3.3b", 2.0, x=None, weight=weight).status == "not attempted"
    capsys.readouterr()


# ------------------------------------------------------------- 3.4 the budget


def test_scheme_correct(lab, capsys, table):
    best = best_scheme(table, budget_bytes())
    assert lab.check("3.4", best).ok
    assert lab.check("3.4", f" {best} ").ok
    capsys.readouterr()


def test_scheme_mistakes(lab, printed, table):
    budget = budget_bytes()
    fitting = [row for row in table if row.stored_bytes <= budget]
    largest = max(fitting, key=lambda row: row.stored_bytes).scheme
    assert lab.check("3.4", largest).status == "not yet"
    assert "largest scheme that fits" in printed()
    too_big = min((row for row in table if row.stored_bytes > budget),
                  key=lambda row: row.stored_bytes)
    assert lab.check("3.4", too_big.scheme).status == "not yet"
    assert f"{too_big.stored_bytes:,} bytes, more than the budget of {budget:,}" in printed()
    worst = max(fitting, key=lambda row: row.relative_error).scheme
    assert lab.check("3.4", worst).status == "not yet"
    assert "another scheme that fits has a smaller output error" in printed()
    assert lab.check("3.4", "int4").status == "not yet"
    assert "unknown scheme 'int4'; accepted: bf16" in printed()
    assert lab.check("3.4", 4).status == "not yet"
    assert "answer a scheme name" in printed()
    assert lab.check("3.4", None).status == "not attempted"
    printed()


# ------------------------------------------------------ the checks use memlab


def test_checks_use_the_library(monkeypatch, lab, acts, table):
    """The expected values come from memlab.quant.functional at check time: change it, they follow."""
    real_bits = lab03.bits_per_parameter

    def fp16_absmax(scheme, **kw):  # as if NF4 stored an fp16 absmax
        return 4 + 16 / kw.get("blocksize", 64) if scheme == "nf4" and not kw.get(
            "double_quant") else real_bits(scheme, **kw)

    answer = _bits()
    monkeypatch.setattr(lab03, "bits_per_parameter", fp16_absmax)
    assert not lab.check("3.2a", answer).ok
    assert lab.check("3.2a", {**answer, "nf4, blocks of 64": 4.25}).ok

    real_outliers = lab03.outlier_columns
    cols = real_outliers(acts, LLM_INT8_THRESHOLD).tolist()
    monkeypatch.setattr(lab03, "outlier_columns", lambda x, t: real_outliers(x, t)[:1])
    assert not lab.check("3.3a", cols, x=acts).ok
    assert lab.check("3.3a", cols[:1], x=acts).ok

    best = best_scheme(table, budget_bytes())
    real_stored = lab03.stored_bytes
    monkeypatch.setattr(lab03, "stored_bytes", lambda q, s: real_stored(q, s) // 2)
    assert not lab.check("3.4", best).ok
    assert lab.check("3.4", "int8").ok  # every quantized scheme halved: int8 fits too

    real_zp = lab03.zeropoint_quantize
    monkeypatch.setattr(lab03, "zeropoint_quantize",
                        lambda t, bits, **kw: real_zp(t, bits, scale_dtype=torch.float16))
    assert not lab.check("3.1b", zeropoint_uint8).ok


def test_zeropoint_reference_is_memlab_quant():
    for _, which, bits in ZEROPOINT_CASES:
        t = tensor() if which == "x" else probabilities()
        codes, scale, zero = zeropoint_uint8(t, bits)
        q, state = zeropoint_quantize(t, bits)
        assert torch.equal(codes, q) and scale == state.scale and zero == state.zero


# ------------------------------------------------------- casts and mark-scheme numbers


def test_cast_truncates_and_wraps_while_quantization_rounds_and_clamps():
    out = lab03.cast_vs_round((2.7, -2.7, 300.0, -300.0))
    cast, rounded = out["x.to(torch.int8)"], out["x.round().clamp(-127, 127).to(torch.int8)"]
    assert cast[:2] == [2, -2]  # toward zero, not to the nearest
    assert rounded == [3, -3, 127, -127]
    # past int8's range the cast is not a clamp (on x86 it keeps the low 8 bits: 44, -44)
    assert cast[2] != 127 and cast[3] != -127


def test_truncation_hint_fires_only_on_truncated_codes(lab, printed):
    for kind in ("floor", "128", "max", "one-off"):
        lab.check("3.1a", _absmax_variant(kind))
        assert ".to(torch.int8) does" not in printed()
    for kind in ("min-anchored", "float", "levels"):
        lab.check("3.1b", _zp_variant(kind))
        assert ".to(torch.uint8) does" not in printed()


def test_mark_scheme_numbers_come_from_the_library():
    saving = lab03.double_quant_saving()
    one = bits_per_parameter("nf4", blocksize=64)
    two = bits_per_parameter(**QLORA)
    assert saving["bits per weight"] == pytest.approx(one - two)
    assert saving["GB"] == pytest.approx(model_weights_gb(bits=one) - model_weights_gb(bits=two))
    kept = lab03.kept_share()
    cfg = PRESETS[MODEL]
    assert kept["parameters"] == pytest.approx(1 - quantized_parameters(cfg) / cfg.num_parameters())
    assert 0 < kept["parameters"] < kept["bytes"] < 1
