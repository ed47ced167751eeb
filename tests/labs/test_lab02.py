"""Lab 2's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from memlab.errors import MemlabError
from memlab.labs import lab02
from memlab.labs.grader import get_lab
from memlab.labs.lab02 import (
    ALL_PATTERN_FORMATS,
    CASES,
    GRAD_FORMAT,
    GRADIENTS,
    PATTERNS,
    RULES,
    all_patterns,
    flushed_share,
    grad_scaler_defaults,
    grad_scaler_scales,
    gradients,
    largest_safe_exponent,
    rounding_note,
    scale_window,
)
from memlab.precision import formats
from memlab.precision.formats import bits, round_to, spec


@pytest.fixture(scope="module")
def grads():
    return gradients(**GRADIENTS)


def decode(bit_string, sign_bits, exponent_bits, mantissa_bits, bias, has_inf=True):
    """The lab's reference solution of exercise 2.1."""
    sign = -1.0 if int(bit_string[:sign_bits], 2) else 1.0
    e_field = int(bit_string[sign_bits : sign_bits + exponent_bits], 2)
    m_field = int(bit_string[sign_bits + exponent_bits :], 2)
    all_ones = 2**exponent_bits - 1
    if e_field == all_ones and has_inf:
        return sign * math.inf if m_field == 0 else math.nan
    if e_field == all_ones and m_field == 2**mantissa_bits - 1:
        return math.nan
    if e_field == 0:
        return sign * 2.0 ** (1 - bias) * (m_field / 2**mantissa_bits)
    return sign * 2.0 ** (e_field - bias) * (1 + m_field / 2**mantissa_bits)


def test_the_lab_has_its_exercises():
    assert get_lab("lab02").ids == ("2.1", "2.2", "2.3a", "2.3b", "2.4")


# ---------------------------------------------------------------- the helpers


@pytest.mark.parametrize("fmt", ALL_PATTERN_FORMATS)
def test_pattern_value_agrees_with_bits(fmt):
    for b in all_patterns(fmt):
        value = formats.decode(b, fmt)
        if not math.isnan(value):
            assert bits(value, fmt).bit_string == b


def test_given_patterns_are_what_formats_stores():
    for fmt, b in PATTERNS.values():
        value = formats.decode(b, fmt)
        assert not math.isnan(value)
        assert bits(value, fmt).bit_string == b


def test_decode_refuses_bad_patterns():
    with pytest.raises(MemlabError, match="a fp8-e4m3 bit string is 8 characters"):
        formats.decode("0101", "fp8-e4m3")
    with pytest.raises(MemlabError, match="each '0' or '1'"):
        formats.decode("0000000x", "fp8-e5m2")
    with pytest.raises(MemlabError, match="unknown bit-pattern format 'nf4'"):
        formats.decode("0000", "nf4")


def test_rounding_notes_name_each_rule():
    notes = {key: rounding_note(x, fmt) for key, (x, fmt) in CASES.items()}
    assert notes["2049 in fp16"] == notes["1 + 2**-8 in bf16"] == "tie -> even"
    assert notes["65519 in fp16"] == "rounded to nearest"
    assert notes["65520 in fp16"] == "overflow -> inf"
    assert notes["1e-8 in fp16"] == "underflow -> 0"
    assert notes["300 in int8"] == "saturated at the max"
    assert rounding_note(1.5, "fp16") == "exact"


def test_gradients_are_seeded_and_log_uniform(grads):
    again = gradients(**GRADIENTS)
    assert torch.equal(grads, again) and grads.dtype == torch.float32
    assert grads.numel() == GRADIENTS["n"]
    mags = grads.abs()
    assert mags.min() >= GRADIENTS["low"] * (1 - 1e-6) and mags.max() <= GRADIENTS["high"]
    assert 0.4 < (grads > 0).double().mean() < 0.6


def test_flushed_share_matches_a_direct_cast(grads):
    direct = (grads.half() == 0).double().mean().item()
    assert flushed_share(grads) == direct
    assert flushed_share(grads, 2.0**-3) == (grads.double().mul(2.0**-3).half() == 0).double().mean()


def test_scale_window(grads):
    lo, hi = scale_window(grads)
    top = largest_safe_exponent(grads)
    assert hi == top
    max_fp16 = spec(GRAD_FORMAT).max
    assert grads.abs().max().item() * 2.0**top <= max_fp16 < grads.abs().max().item() * 2.0 ** (top + 1)
    assert flushed_share(grads, 2.0 ** (lo - 1)) > flushed_share(grads, 2.0**lo)


def test_grad_scaler_defaults_are_torchs():
    scaler = torch.amp.GradScaler("cpu")
    defaults = grad_scaler_defaults()
    assert defaults["init_scale"] == scaler.get_scale()
    assert defaults["growth_factor"] == scaler.get_growth_factor()
    assert defaults["backoff_factor"] == scaler.get_backoff_factor()
    assert defaults["growth_interval"] == scaler.get_growth_interval()


def test_grad_scaler_schedule_matches_torch():
    """The replayed schedule is what torch.amp.GradScaler does when fp16 gradients overflow."""
    g_max, steps = 3.0, 40
    schedule = dict(init_scale=2.0**12, growth_interval=3)
    scaler = torch.amp.GradScaler("cpu", **schedule)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    scales, skipped = [], 0
    for _ in range(steps):
        scales.append(scaler.get_scale())
        scaler.scale(torch.ones(()))
        p.grad = torch.tensor([g_max * scaler.get_scale()]).half().float()  # inf on overflow
        before = p.detach().clone()
        scaler.step(opt)
        scaler.update()
        skipped += bool(torch.equal(before, p.detach()))
    assert grad_scaler_scales(g_max, steps, **schedule) == (scales, skipped)
    assert skipped > 0


# ------------------------------------------------------------------ 2.1 decode


def test_decode_correct(lab, printed):
    assert lab.check("2.1", decode).ok
    assert printed() == "✅ 2.1 correct"


def test_decode_stub_is_not_attempted(lab, printed):
    def stub(bit_string, sign_bits, exponent_bits, mantissa_bits, bias, has_inf=True):
        pass

    assert lab.check("2.1", stub).status == "not attempted"
    assert "not attempted" in printed()
    assert lab.check("2.1", None).status == "not attempted"


def test_decode_wrong_subnormals(lab, printed):
    def no_subnormals(b, sign_bits, exponent_bits, mantissa_bits, bias, has_inf=True):
        if int(b[sign_bits : sign_bits + exponent_bits], 2) == 0:  # the implicit 1 kept
            m_field = int(b[sign_bits + exponent_bits :], 2)
            return 2.0 ** (1 - bias) * (1 + m_field / 2**mantissa_bits) if m_field else 0.0
        return decode(b, sign_bits, exponent_bits, mantissa_bits, bias, has_inf)

    assert lab.check("2.1", no_subnormals).status == "not yet"
    line = printed()
    assert "fp8-e4m3 C (a subnormal value)" in line
    assert str(formats.decode(*PATTERNS["fp8-e4m3 C"][::-1])) not in line


def test_decode_ignoring_has_inf(lab, printed):
    def always_inf(b, sign_bits, exponent_bits, mantissa_bits, bias, has_inf=True):
        return decode(b, sign_bits, exponent_bits, mantissa_bits, bias)

    assert lab.check("2.1", always_inf).status == "not yet"
    assert "fp8-e4m3 D (a normal value)" in printed()


def test_decode_wrong_only_beyond_the_given_patterns(lab, printed):
    def no_nan(b, sign_bits, exponent_bits, mantissa_bits, bias, has_inf=True):
        value = decode(b, sign_bits, exponent_bits, mantissa_bits, bias, has_inf)
        return math.copysign(math.inf, value) if math.isnan(value) and has_inf else value

    assert lab.check("2.1", no_nan).status == "not yet"
    line = printed()
    nans = sum(math.isnan(formats.decode(b, "fp8-e5m2")) for b in all_patterns("fp8-e5m2"))
    assert f"wrong on {nans} of {2 ** spec('fp8-e5m2').bits} fp8-e5m2 patterns" in line
    assert "(a NaN value)" in line and "fp8-e4m3 patterns" not in line


def test_decode_errors_and_wrong_types(lab, printed):
    def broken(*args, **kwargs):
        raise IndexError("oops")

    assert lab.check("2.1", broken).status == "not yet"
    assert "raised IndexError: oops" in printed()
    assert lab.check("2.1", 3.0).status == "not yet"
    assert "answer the function decode itself" in printed()
    assert lab.check("2.1", lambda *a, **k: "x").status == "not yet"
    printed()


# ------------------------------------------------------------- 2.2 round trips


def _predictions():
    return {key: round_to(x, fmt) for key, (x, fmt) in CASES.items()}


def test_predictions_correct(lab, printed):
    assert lab.check("2.2", _predictions()).ok
    assert printed() == "✅ 2.2 correct"
    numpy = pytest.importorskip("numpy")
    assert lab.check("2.2", {k: numpy.float64(v) for k, v in _predictions().items()}).ok
    printed()


@pytest.mark.parametrize("key", list(CASES))
def test_a_wrong_prediction_gets_its_rule(lab, printed, key):
    answer = _predictions()
    answer[key] = 2 * answer[key] + 1 if math.isfinite(answer[key]) else 1.0
    assert lab.check("2.2", answer).status == "not yet"
    line = printed()
    assert f"1 of {len(CASES)} not right" in line and RULES[key] in line
    assert all(RULES[other] not in line for other in CASES if other != key)


def test_rules_do_not_give_the_value():
    for key, (x, fmt) in CASES.items():
        assert repr(round_to(x, fmt)) not in RULES[key]
    assert set(RULES) == set(CASES)


def test_predictions_stub_partial_and_bad_keys(lab, capsys):
    assert lab.check("2.2", None).status == "not attempted"
    assert lab.check("2.2", dict.fromkeys(CASES)).status == "not attempted"
    partial = {**dict.fromkeys(CASES), "2049 in fp16": 2048.0}
    assert lab.check("2.2", partial).status == "not yet"
    assert lab.check("2.2", {"2049 in fp16": 2048.0}).status == "not yet"
    assert lab.check("2.2", [1, 2]).status == "not yet"
    lines = capsys.readouterr().out.splitlines()
    assert "fill in '65519 in fp16'" in lines[2]
    assert "missing keys" in lines[3] and "answer a dict" in lines[4]


# ------------------------------------------------------ 2.3 the smallest gradient


def test_smallest_values(lab, capsys):
    s = spec(GRAD_FORMAT)
    assert lab.check("2.3a", {"min_subnormal": s.min_subnormal, "min_normal": s.min_normal}).ok
    swapped = {"min_subnormal": s.min_normal, "min_normal": s.min_subnormal}
    assert lab.check("2.3a", swapped).status == "not yet"
    assert "swapped" in lab.check("2.3a", swapped).message
    assert lab.check("2.3a", {"min_subnormal": None, "min_normal": None}).status == "not attempted"
    lines = capsys.readouterr().out.splitlines()
    assert "min_subnormal" in lines[1] and "bias" not in lines[1]  # never the recipe


def test_flushed_share_check(lab, grads, capsys):
    assert lab.check("2.3b", (grads.half() == 0).double().mean().item(), grads=grads).ok
    low, high = math.log10(GRADIENTS["low"]), math.log10(GRADIENTS["high"])
    threshold = spec(GRAD_FORMAT).min_subnormal / 2
    from_the_distribution = (math.log10(threshold) - low) / (high - low)
    assert lab.check("2.3b", from_the_distribution, grads=grads).ok
    assert lab.check("2.3b", None, grads=grads).status == "not attempted"
    capsys.readouterr()


def _share_below(grads, threshold):
    return (grads.abs() < threshold).double().mean().item()


@pytest.mark.parametrize(
    ("which", "names"),
    [
        ("min_subnormal", "that counts the values below the smallest subnormal"),
        ("min_normal", "that counts the values below the smallest normal"),
        ("percent", "a share is a fraction between 0 and 1, not a percentage"),
        ("other", "half the smallest subnormal"),
    ],
)
def test_flushed_share_hints_name_the_mistake(lab, grads, printed, which, names):
    """Each typical wrong share gets the hint of its own mistake, and never a unit hint."""
    s = spec(GRAD_FORMAT)
    answer = {
        "min_subnormal": _share_below(grads, s.min_subnormal),
        "min_normal": _share_below(grads, s.min_normal),
        "percent": 100 * flushed_share(grads),
        "other": 0.9 * flushed_share(grads),
    }[which]
    assert lab.check("2.3b", answer, grads=grads).status == "not yet"
    line = printed()
    assert names in line
    assert "units" not in line and "MiB" not in line
    others = {"that counts the values below the smallest subnormal",
              "that counts the values below the smallest normal",
              "a share is a fraction between 0 and 1, not a percentage"} - {names}
    assert not any(other in line for other in others)


def test_below_min_subnormal_is_the_coincidental_unit_ratio(grads):
    """The review's case: this wrong share is 2^20/10^6 times the right one within the tolerance,
    which a unit heuristic would blame on MiB and MB."""
    wrong = _share_below(grads, spec(GRAD_FORMAT).min_subnormal)
    assert math.isclose(wrong / flushed_share(grads), 2**20 / 10**6, rel_tol=0.02)


# ----------------------------------------------------------- 2.4 the loss scale


def test_loss_scale_window_is_accepted(lab, grads, capsys):
    lo, hi = scale_window(grads)
    for k in (lo, hi):
        assert lab.check("2.4", 2.0**k, grads=grads).ok
    assert lab.check("2.4", torch.tensor(2.0**hi), grads=grads).ok
    assert lab.check("2.4", 2**hi, grads=grads).ok
    capsys.readouterr()


def test_loss_scale_wrong_answers(lab, grads, printed):
    lo, hi = scale_window(grads)
    assert lab.check("2.4", 2.0 ** (hi + 1), grads=grads).status == "not yet"
    assert "overflows to inf" in printed()
    assert lab.check("2.4", 2.0 ** (lo - 1), grads=grads).status == "not yet"
    assert "still flush to zero" in printed()
    assert lab.check("2.4", 3 * 2.0**lo, grads=grads).status == "not yet"
    assert "not a power of two" in printed()
    for bad in (0.0, -(2.0**lo), math.inf, "big"):
        assert lab.check("2.4", bad, grads=grads).status == "not yet"
        printed()
    assert lab.check("2.4", None, grads=grads).status == "not attempted"
    printed()


def test_checks_use_the_library(monkeypatch, lab, grads):
    """The expected values come from memlab.precision.formats at check time: change it, they follow."""
    real = lab02.spec

    def narrower(fmt):
        s = real(fmt)
        return s if fmt != GRAD_FORMAT else dataclasses.replace(s, max=s.max / 4)

    _, hi = scale_window(grads)
    monkeypatch.setattr(lab02, "spec", narrower)
    assert not lab.check("2.4", 2.0**hi, grads=grads).ok
    assert lab.check("2.4", 2.0 ** (hi - 2), grads=grads).ok
