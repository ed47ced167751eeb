import json
import math

import numpy as np
import pytest
import torch

from memlab import MemlabError
from memlab.cli import main
from memlab.precision.formats import FORMATS, _fallback_codebook, bits, codebook, round_to, spec

FLOATS = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2")
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
         "fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}


def _np_dtype(fmt):
    """The independent reference dtype: numpy for fp32/fp16, ml_dtypes for the others."""
    if fmt in ("fp32", "fp16"):
        return {"fp32": np.float32, "fp16": np.float16}[fmt]
    ml = pytest.importorskip("ml_dtypes")
    return {"bf16": ml.bfloat16, "fp8-e4m3": ml.float8_e4m3fn, "fp8-e5m2": ml.float8_e5m2}[fmt]


def _uint(fmt):
    return {32: np.uint32, 16: np.uint16, 8: np.uint8}[spec(fmt).bits]


def _reference(xs, fmt):
    """Stored values and bit patterns of ``xs`` in ``fmt`` by numpy / ml_dtypes."""
    with np.errstate(over="ignore", invalid="ignore"):
        stored = np.asarray(xs).astype(_np_dtype(fmt))
    return stored.astype(np.float64), stored.view(_uint(fmt)).astype(np.int64)


def _random(n, lo, hi, dtype, seed):
    rng = np.random.default_rng(seed)
    mag = np.exp2(rng.uniform(lo, hi, n)) * rng.choice([-1.0, 1.0], n)
    return mag.astype(dtype)


def _edges(fmt):
    s = spec(fmt)
    sub, mn, mx = s.min_subnormal, s.min_normal, s.max
    vals = [0.0, -0.0, sub, mn - sub, mn, mx, mx * 1.0001, math.inf, math.nan, 1.0,
            sub / 2, 1.5 * sub, 1 + s.eps / 2, 1 + 1.5 * s.eps, mn * (1 + s.eps / 2), math.pi]
    return [v for x in vals for v in (x, -x)]


def _same(a, b):
    return (a == b) | (np.isnan(a) & np.isnan(b))


def _check_against_reference(xs, fmt):
    want_value, want_bits = _reference(xs, fmt)
    got = round_to(torch.from_numpy(np.asarray(xs, dtype=np.float64)), fmt).numpy()
    assert _same(got, want_value).all(), np.asarray(xs)[~_same(got, want_value)][:5]
    for x, value, pattern in zip(np.asarray(xs)[::7], want_value[::7], want_bits[::7], strict=True):
        b = bits(float(x), fmt)
        assert _same(np.float64(b.value), value), (x, b)
        if not math.isnan(value):  # NaN payloads and signs may differ
            assert int(b.bit_string, 2) == pattern, (x, b)
        assert b.bit_string == b.sign + b.exponent + b.mantissa


# --- spec ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FLOATS)
def test_float_spec_matches_torch_and_reference(fmt):
    s, fi = spec(fmt), torch.finfo(TORCH[fmt])
    assert (s.kind, s.bits, s.max, s.min, s.min_normal, s.eps) == (
        "float", fi.bits, fi.max, fi.min, fi.smallest_normal, fi.eps)
    ref = np.finfo(_np_dtype(fmt)) if fmt in ("fp32", "fp16") else \
        pytest.importorskip("ml_dtypes").finfo(_np_dtype(fmt))
    assert (s.mantissa_bits, s.exponent_bits) == (ref.nmant, ref.nexp)
    assert s.min_subnormal == float(ref.smallest_subnormal)
    assert s.sign_bits + s.exponent_bits + s.mantissa_bits == s.bits
    assert s.min_normal == 2.0 ** (1 - s.bias)
    assert s.has_nan and s.has_inf == (fmt != "fp8-e4m3")


def test_integer_and_code_specs():
    i8 = spec("int8")
    assert (i8.bits, i8.min, i8.max) == (8, torch.iinfo(torch.int8).min, torch.iinfo(torch.int8).max)
    assert (spec("int4").min, spec("int4").max) == (-8, 7)
    for fmt in ("nf4", "fp4"):
        s = spec(fmt)
        assert (s.kind, s.bits, len(s.codebook), s.min, s.max) == ("code", 4, 16, -1.0, 1.0)
    assert {spec(f).kind for f in FORMATS} == {"float", "int", "code"}


def test_codebooks_are_bitsandbytes():
    bnbf = pytest.importorskip("bitsandbytes.functional")
    for fmt in ("nf4", "fp4"):
        want = bnbf.get_4bit_type(fmt, device="cpu").tolist()
        assert list(codebook(fmt)) == want
        assert list(_fallback_codebook(fmt)) == want


# --- float formats against numpy / ml_dtypes ----------------------------------------------------

@pytest.mark.parametrize("fmt", FLOATS)
def test_edges_match_reference(fmt):
    xs = [x for x in _edges(fmt) if not (fmt == "fp8-e4m3" and abs(x) > 464)]
    if fmt in ("fp32", "fp16"):
        _check_against_reference(np.array(xs, dtype=np.float64), fmt)
    else:  # ml_dtypes casts float64 through float32 (double rounding): give it float32
        _check_against_reference(np.array(xs, dtype=np.float32), fmt)


def test_fp16_random_float64_matches_numpy():
    xs = _random(4000, -26, 17, np.float64, seed=1)
    _check_against_reference(xs, "fp16")


def test_fp32_random_float64_matches_numpy():
    _check_against_reference(_random(4000, -150, 128, np.float64, seed=2), "fp32")


@pytest.mark.parametrize("fmt,lo,hi", [("bf16", -135, 128), ("fp8-e4m3", -11, 8.85),
                                       ("fp8-e5m2", -18, 17)])
def test_narrow_random_float32_matches_ml_dtypes(fmt, lo, hi):
    # fp8-e4m3 stops below 464: past it ml_dtypes gives NaN, torch saturates (tested below).
    _check_against_reference(_random(4000, lo, hi, np.float32, seed=3), fmt)


@pytest.mark.parametrize("fmt", ("fp16", "bf16", "fp8-e4m3", "fp8-e5m2"))
def test_no_double_rounding_from_float64(fmt):
    eps = float(np.finfo(_np_dtype(fmt)).eps) if fmt == "fp16" else \
        float(pytest.importorskip("ml_dtypes").finfo(_np_dtype(fmt)).eps)
    assert round_to(1 + eps / 2, fmt) == 1.0  # a tie goes to the even mantissa
    assert round_to(1 + eps / 2 + 2.0**-40, fmt) == 1 + eps  # just above the tie
    assert round_to(-(1 + 1.5 * eps), fmt) == -(1 + 2 * eps)


@pytest.mark.parametrize("fmt", FLOATS)
def test_pi(fmt):
    want, _ = _reference(np.array([np.float32(math.pi)]), fmt)
    assert bits(math.pi, fmt).value == round_to(np.float32(math.pi), fmt) == want[0]


def test_fp8_e4m3_saturates_like_torch():
    xs = [465.0, 480.0, 1e6, 3e38, math.inf]
    for x in xs + [-x for x in xs]:
        b = bits(x, "fp8-e4m3")
        torch_value = torch.tensor(x).to(torch.float8_e4m3fn).item()
        assert b.value == torch_value == math.copysign(448.0, x)
        assert b.note == "saturated" and b.bit_string[1:] == "1111110"
    assert bits(450.0, "fp8-e4m3").note == "normal"  # rounding, not saturation
    assert bits(math.nan, "fp8-e4m3").note == "NaN"


def test_overflow_to_inf_and_notes():
    for fmt in ("fp16", "bf16", "fp8-e5m2"):
        b = bits(spec(fmt).max * 2, fmt)
        assert b.value == math.inf and b.note == "overflow -> inf" and b.error == math.inf
        assert bits(-math.inf, fmt).note == "inf" and bits(-math.inf, fmt).error == 0
    assert bits(spec("fp16").min_subnormal, "fp16").note == "subnormal"
    assert bits(1e-9, "fp16").note == "underflow -> 0"
    assert bits("-0.0", "fp16").bit_string == "1" + "0" * 15
    assert bits("3.14159265", "fp16").value == 3.140625


def test_round_to_tensor_keeps_shape_and_dtype():
    t = torch.linspace(-3, 3, 12, dtype=torch.float32).reshape(3, 4)
    for fmt in FORMATS:
        out = round_to(t.clamp(-1, 1) if spec(fmt).kind == "code" else t, fmt)
        assert out.shape == t.shape and out.dtype == torch.float32
    assert round_to(t.double(), "fp16").dtype == torch.float64
    assert round_to(torch.arange(5), "int4").dtype == torch.float32


# --- integer formats ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ("int8", "int4"))
def test_integers_round_half_even_twos_complement(fmt):
    s = spec(fmt)
    xs = np.random.default_rng(4).uniform(s.min - 0.49, s.max + 0.49, 2000)
    xs = np.concatenate([xs, np.arange(s.min, s.max + 1) + 0.5, [-0.5, 0.5, 2.5, -2.5]])
    xs = xs[(xs >= s.min - 0.5) & (xs <= s.max + 0.5)]
    want = np.clip(np.round(xs), s.min, s.max)  # numpy rounds half to even
    assert (round_to(torch.from_numpy(xs), fmt).numpy() == want).all()
    for x, w in zip(xs[::5], want[::5], strict=True):
        if not s.min <= np.round(x) <= s.max:  # bits refuses what round_to saturates
            with pytest.raises(MemlabError, match="out of range"):
                bits(float(x), fmt)
            continue
        b = bits(float(x), fmt)
        assert b.value == w
        assert b.bit_string == format(int(np.int8(w).view(np.uint8)), "08b")[-s.bits:]


def test_integer_range_errors_and_saturation():
    with pytest.raises(MemlabError, match=r"200.0 is out of range for int8: \[-128, 127\]"):
        bits(200, "int8")
    with pytest.raises(MemlabError, match=r"\[-8, 7\]"):
        bits(-9, "int4")
    with pytest.raises(MemlabError, match="not representable"):
        bits("inf", "int8")
    assert bits(-128.5, "int8").bit_string == "10000000"  # half to even: -128
    with pytest.raises(MemlabError, match="127.5 is out of range"):
        bits(127.5, "int8")
    assert round_to(1e9, "int8") == 127 and round_to(-math.inf, "int4") == -8
    with pytest.raises(MemlabError, match="NaN"):
        round_to(math.nan, "int8")


# --- code-book formats --------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ("nf4", "fp4"))
def test_codes_nearest_lower_index_on_ties(fmt):
    book = np.array(codebook(fmt))
    xs = np.random.default_rng(5).uniform(-1, 1, 2000)
    dist = np.abs(xs[:, None] - book[None, :])
    want = book[dist.argmin(axis=1)]  # numpy's argmin also takes the first minimum
    assert (round_to(torch.from_numpy(xs), fmt).numpy() == want).all()
    for x in xs[::20]:
        b = bits(float(x), fmt)
        assert b.value == book[int(b.bit_string, 2)] == want[list(xs).index(x)]
        assert (b.sign, b.exponent, b.mantissa) == ("", "", "")
    order = np.argsort(book, kind="stable")
    for lo, hi in zip(order[:-1], order[1:], strict=True):
        if book[lo] != book[hi]:
            tied = np.flatnonzero((book == book[lo]) | (book == book[hi]))
            assert int(bits((book[lo] + book[hi]) / 2, fmt).bit_string, 2) == tied.min()
    assert bits(-0.0, fmt).value == 0.0 and int(bits(0.0, fmt).bit_string, 2) == list(book).index(0)
    with pytest.raises(MemlabError, match=r"out of range for .*\[-1, 1\]"):
        bits(1.5, fmt)
    assert round_to(5.0, fmt) == 1.0


# --- input checking -----------------------------------------------------------------------------

def test_bad_input_is_one_line():
    with pytest.raises(MemlabError, match="not a number: 'abc'"):
        bits("abc", "fp16")
    with pytest.raises(MemlabError, match="not a number: True"):
        round_to(True, "fp16")
    with pytest.raises(MemlabError, match="unknown format 'fp7'; accepted: " + ", ".join(FORMATS)):
        spec("fp7")
    for text in ("3.14", " inf", "nan", "-0.0", "1e-3"):
        assert _same(np.float64(bits(text, "fp32").input), np.float64(float(text)))


# --- command line -------------------------------------------------------------------------------

def test_cli_fp16_pi(capsys):
    assert main(["bits", "3.14159265", "--format", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "0 | 10000 | 1001001000" in out and "3.140625" in out
    assert main(["bits", "3.14159265", "--format", "fp16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"fmt", "sign", "exponent", "mantissa", "bit_string", "value", "input", "error",
            "note"} <= set(d)
    assert (d["sign"], d["exponent"], d["mantissa"], d["value"]) == ("0", "10000", "1001001000",
                                                                     3.140625)


def test_cli_negative_values_and_all_formats(capsys):
    for argv in (["bits", "-1.5", "--format", "bf16", "--json"],
                 ["bits", "--format", "bf16", "--json", "--", "-1.5"]):
        assert main(argv) == 0
        assert json.loads(capsys.readouterr().out)["value"] == -1.5
    assert main(["bits", "-inf", "--format", "fp8-e4m3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == -448.0
    assert main(["bits", "-1e-3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(FORMATS)
    assert main(["bits", "300", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["fmt"] for r in rows] == list(FORMATS)
    assert rows[5]["value"] is None and "[-128, 127]" in rows[5]["note"]


def test_cli_errors(capsys, cli_error):
    cli_error(["bits", "3", "--format", "fp7"], "'fp7'", ", ".join(FORMATS))
    cli_error(["bits", "abc", "--format", "fp16"], "not a number: 'abc'")
    cli_error(["bits", "abc"], "not a number: 'abc'")
    cli_error(["bits", "200", "--format", "int8"], "[-128, 127]")
    cli_error(["bits", "2", "--format", "nf4"], "[-1, 1]")
    cli_error(["bits"], "value")


def test_codebook_fallback_without_bitsandbytes(monkeypatch):
    import memlab.precision.formats as formats

    monkeypatch.setattr(formats, "bitsandbytes_functional", lambda: None)
    codebook.cache_clear()
    try:
        assert codebook("nf4") == _fallback_codebook("nf4") and len(codebook("fp4")) == 16
    finally:
        codebook.cache_clear()


# Thresholds, representable values, storage and the chapter's claims ---------------------------
@pytest.mark.parametrize("fmt", FLOATS)
def test_thresholds_against_the_reference(fmt):
    from memlab.precision.formats import thresholds

    t = thresholds(fmt)
    ref = _np_dtype(fmt)
    with np.errstate(over="ignore", invalid="ignore"):

        def stored(x):
            return float(np.float64(x).astype(ref)) if fmt != "fp32" else float(np.float32(x))

        # Flush to zero: at the threshold a value becomes 0, just above it the smallest subnormal.
        assert stored(t.flush_to_zero_below) == 0.0
        # (a float32 neighbour: ml_dtypes converts a float64 through float32, rounding twice)
        above = float(np.nextafter(np.float32(t.flush_to_zero_below), np.float32(1)))
        assert stored(above) == t.min_subnormal == round_to(above, fmt)
        # The float32 neighbours on either side of the overflow threshold, for the same reason.
        up = np.float32(t.overflow_from)
        up = up if float(up) >= t.overflow_from else np.nextafter(up, np.float32(np.inf))
        below = float(np.nextafter(up, np.float32(0)))
        assert stored(below) == t.max == round_to(below, fmt)
        assert round_to(float(up), fmt) == t.overflow_to
        if fmt == "fp8-e4m3":  # ml_dtypes makes NaN where torch saturates
            assert math.isnan(float(np.float64(up).astype(ref)))
            assert t.overflow_to == t.max == 448
        else:
            assert math.isinf(stored(float(up))) and t.overflow_to == math.inf
    n = t.largest_exact_integer
    assert stored(n) == n and stored(n + 1) != n + 1
    assert all(stored(k) == k for k in range(1, min(n, 4096) + 1))


def test_representable_values_match_the_reference():
    from memlab.precision.formats import representable

    for fmt in ("fp16", "bf16", "fp8-e4m3", "fp8-e5m2"):
        patterns = np.arange(2 ** spec(fmt).bits, dtype=np.int64).astype(_uint(fmt))
        with np.errstate(invalid="ignore"):  # the NaN patterns, dropped on the next line
            ref = patterns.view(_np_dtype(fmt)).astype(np.float64)
        ref = np.unique(ref[np.isfinite(ref) & (ref > 0)])
        assert np.array_equal(representable(fmt).numpy(), ref)
    assert representable("int4", positive=False).tolist() == list(range(-8, 8))
    assert len(representable("nf4", positive=False)) == 16
    with pytest.raises(MemlabError, match="too many"):
        representable("fp32")


def test_relative_error_is_half_an_ulp_at_most():
    from memlab.precision.formats import relative_error

    xs = torch.logspace(-4, 4, 10_001, dtype=torch.float64)
    for fmt in ("fp16", "bf16"):
        err = relative_error(xs, fmt)
        normal = xs >= spec(fmt).min_normal
        assert err[normal].max().item() <= spec(fmt).eps / 2 + 1e-15
    assert math.isinf(relative_error([1e6], "fp16").item())
    with pytest.raises(MemlabError):
        relative_error([0.0], "fp16")


def test_storage_bytes_are_measured():
    from memlab.precision.formats import storage_bytes

    assert storage_bytes("fp32") == 4 and storage_bytes("bf16") == 2
    assert storage_bytes("fp8-e5m2") == 1 and storage_bytes("int8") == 1
    pytest.importorskip("bitsandbytes")
    assert storage_bytes("nf4") == 0.5 and storage_bytes("int4") == 0.5


def test_same_number_table_for_pi():
    from memlab.precision.formats import same_number

    t = same_number(math.pi)
    assert t.loc["fp16", "stored"] == 3.140625 == t.loc["bf16", "stored"]
    assert t.loc["int8, cast", "stored"] == 3.0 == t.loc["int8, round and clamp", "stored"]
    assert t.loc["int8, cast", "bits"] == "00000011"
    absmax_own = t.loc[f"int8, absmax {math.pi:g}", "stored"]
    assert absmax_own == pytest.approx(math.pi, rel=1e-6)
    assert t.loc["int8, absmax 10", "stored"] == pytest.approx(40 * 10 / 127, rel=1e-6)
    assert (t["relative error"] >= 0).all()


def test_a_cast_to_int8_truncates_and_wraps_where_rounding_rounds_and_saturates():
    from memlab.precision.formats import int8_cast, round_to, same_number

    x = torch.tensor([2.7, -2.7, 300.0, -300.0, 0.5, -0.5])
    assert int8_cast(x).tolist() == x.to(torch.int8).tolist() == [2, -2, 44, -44, 0, 0]
    assert round_to(x, "int8").tolist() == [3, -3, 127, -128, 0, -0.0]  # half to even
    assert int8_cast(2.7).item() == 2.0 and int8_cast(x).dtype == torch.float64
    t = same_number(2.7)
    assert (t.loc["int8, cast", "stored"], t.loc["int8, round and clamp", "stored"]) == (2, 3)
    t = same_number(-300.0)
    assert t.loc["int8, cast", "stored"] == -44 and "wrapped" in t.loc["int8, cast", "note"]
    assert t.loc["int8, round and clamp", "note"] == "clamped to -128"


def test_probe_formats_on_cpu():
    from memlab.precision.formats import probe_formats

    table = probe_formats("cpu")
    assert table["store (cast)"].all()
    assert table.loc["fp32", "matmul"] and table.loc["bf16", "add"]
    assert table.loc["fp16", "_scaled_mm"] is None
    with pytest.raises(MemlabError, match="accepted"):
        probe_formats("cpu", ("int8",))


def test_absmax_round_trip():
    from memlab.quant.functional import absmax_quantize, dequantize

    x = torch.tensor([-2.0, 0.5, 1.0, 4.0])
    q, state = absmax_quantize(x)
    assert q.dtype == torch.int8 and q.tolist() == [-64, 16, 32, 127]  # round(127 x / 4), half to even
    assert torch.allclose(dequantize(q, state), x, atol=4 / 127 / 2)
    q0, s0 = absmax_quantize(torch.zeros(3))
    assert dequantize(q0, s0).eq(0).all()
    with pytest.raises(MemlabError, match="bits"):
        absmax_quantize(x, bits=9)
    with pytest.raises(MemlabError, match="finite"):
        absmax_quantize(torch.tensor([1.0, math.inf]))


def test_chapter_two_claims_are_computed():
    from memlab.claims import VERDICTS, WRONG, verdicts

    vs = {v.claim: v for v in verdicts([f"C{i:02d}" for i in range(6, 14)])}
    assert all(v.verdict in VERDICTS and v.evidence for v in vs.values())
    assert vs["C10"].verdict == WRONG and "3.140625" in vs["C10"].evidence
    assert "65,504" in vs["C08"].evidence
    # C07: the same normal range, but fp32's largest values overflow when converted to bf16
    assert vs["C07"].verdict == WRONG and "converts to inf" in vs["C07"].evidence
    assert vs["C07"].note.startswith("which prevents overflow") and "32,768" in vs["C07"].note


def test_chapter_two_claims_move_with_their_setting():
    """The setting changed, the real evidence moves the level: the format, rounding, value."""
    import memlab.precision.claims  # noqa: F401 (registers chapter 2's checks)
    from memlab.claims import CAVEAT, CHECKS, HOLDS, WRONG

    def level(claim, **setting):
        check = CHECKS[claim]
        return check.decide(check.evidence(**setting)).verdict

    assert level("C07", rounding="toward_zero") == HOLDS  # truncation cannot overflow
    assert level("C07", source="bf16", target="fp32") == HOLDS  # the other way is exact
    assert level("C07", target="fp16") == WRONG
    assert (level("C08"), level("C08", fmt="bf16")) == (HOLDS, WRONG)
    assert (level("C09"), level("C09", fmt="bf16"), level("C09", fmt="fp16")) == (HOLDS, HOLDS,
                                                                                  WRONG)
    assert (level("C10"), level("C10", value=1 / 3)) == (WRONG, HOLDS)
    assert level("C11", value=2.7) == WRONG  # the cast truncates it to 2
    assert level("C06", blocksize=64) == CAVEAT
    assert level("C13", gpu="L4") == HOLDS and level("C13", gpu="T4") == WRONG
    with pytest.raises(MemlabError, match="converts to bf16 only"):
        CHECKS["C07"].evidence(target="fp16", rounding="toward_zero")
