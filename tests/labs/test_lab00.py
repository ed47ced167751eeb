"""Lab 0's checks: right answers pass, each typical wrong answer gets the hint of its own mistake."""

from __future__ import annotations

import pytest
import torch

from memlab.labs.grader import close_to, get_lab
from memlab.labs.lab00 import (
    ELEMENTS,
    EXPRESSIONS,
    SIZES,
    accumulation_slips,
    at_peak,
    batch_slips,
    expression_peaks,
    sgd_slips,
    short_shape,
    short_slips,
)
from memlab.measure.step import measure_step
from memlab.model.config import get_config

SIZE = SIZES["ci"]
B, T = SIZE["batch_size"], SIZE["seq_len"]


def _measure(**switches):
    setup = dict(batch_size=B, seq_len=T, precision="fp32", optimizer="adamw")
    setup.update(switches)
    return measure_step(get_config(SIZE["model"]), device="cpu", **setup)


@pytest.fixture(scope="module")
def steps():
    return {
        "step": _measure(),
        "step_2b": _measure(batch_size=2 * B),
        "step_accum": _measure(grad_accum_steps=2),
        "step_sgd": _measure(optimizer="sgd"),
        "step_short": _measure(**short_shape(SIZE)),
    }


@pytest.fixture(scope="module")
def peaks():
    return expression_peaks(device="cpu")


def _n():
    return get_config(SIZE["model"]).num_parameters()


# The notebook's reference answers.
def _answers(steps, x_bytes):
    step = steps["step"]
    cats = at_peak(step)
    fixed = cats["parameters"] + cats["gradients"] + cats["optimizer_states"]
    grows = cats["activations"] + cats["temporaries"] + cats["other"]
    return {
        "0.1": {"x * 2 + 1": 2 * x_bytes, "(x * 2).add_(1)": x_bytes},
        "0.2": fixed + 2 * grows,
        "0.3": step.peak_bytes + 4 * _n(),
        "0.4": step.peak_bytes - cats["optimizer_states"],
        "0.5": {"phase": "optimizer", "peak_bytes": (4 + 4 + 8 + 4) * _n()},
    }


def _context(ex, steps, peaks):
    peak_map, x_bytes = peaks
    return {
        "0.1": dict(peaks=peak_map, x_bytes=x_bytes),
        "0.2": dict(step=steps["step"], step_2b=steps["step_2b"]),
        "0.3": dict(step=steps["step"], step_accum=steps["step_accum"]),
        "0.4": dict(step=steps["step"], step_sgd=steps["step_sgd"]),
        "0.5": dict(step=steps["step"], step_short=steps["step_short"]),
    }[ex]


def test_the_lab_has_its_exercises():
    assert get_lab("lab00").ids == ("0.1", "0.2", "0.3", "0.4", "0.5")


def test_the_steps_behave_as_the_lab_says(steps):
    """What the exercises rest on: at this size the peak is in the backward pass with no gradient
    alive, and the short step's peak is in the optimizer step."""
    step = steps["step"]
    assert step.peak_phase == "backward" and at_peak(step)["gradients"] == 0
    assert steps["step_2b"].peak_phase == "backward"
    assert steps["step_short"].peak_phase == "optimizer"
    assert at_peak(steps["step_accum"])["gradients"] == 4 * _n()


@pytest.mark.parametrize("ex", ["0.1", "0.2", "0.3", "0.4", "0.5"])
def test_reference_answers_pass(lab, printed, steps, peaks, ex):
    answer = _answers(steps, peaks[1])[ex]
    assert lab.check(ex, answer, **_context(ex, steps, peaks)).ok
    assert printed() == f"✅ {ex} correct"


@pytest.mark.parametrize("ex", ["0.1", "0.2", "0.3", "0.4", "0.5"])
def test_stubs_are_not_attempted(lab, printed, steps, peaks, ex):
    stub = {"0.1": dict.fromkeys(EXPRESSIONS), "0.5": {"phase": None, "peak_bytes": None}}.get(ex)
    for answer in (None, stub):
        assert lab.check(ex, answer, **_context(ex, steps, peaks)).status == "not attempted"
        printed()


@pytest.mark.parametrize("ex", ["0.1", "0.2", "0.3", "0.4", "0.5"])
def test_wrong_types_are_not_yet_never_a_traceback(lab, printed, steps, peaks, ex):
    for answer in ("big", [1, 2], {"x": 1}):
        assert lab.check(ex, answer, **_context(ex, steps, peaks)).status == "not yet"
        printed()


def _distinct(values: list[float], expected: float, rtol: float) -> None:
    """No two slips, and no slip and the right answer, agree within the tolerance."""
    for i, v in enumerate(values):
        assert not close_to(v, expected, rtol), f"slip {i} would pass"
        for w in values[i + 1:]:
            assert not close_to(v, w, rtol) and not close_to(w, v, rtol)


@pytest.mark.parametrize(
    ("ex", "slips", "measured"),
    [
        ("0.2", batch_slips, "step_2b"),
        ("0.3", accumulation_slips, "step_accum"),
        ("0.4", sgd_slips, "step_sgd"),
    ],
)
def test_each_slip_gets_its_own_hint(lab, printed, steps, peaks, ex, slips, measured):
    listed = slips(steps["step"])
    rtol = lab.get(ex).rtol
    _distinct([v for v, _ in listed], steps[measured].peak_bytes, rtol)
    for value, hint in listed:
        assert lab.check(ex, value, **_context(ex, steps, peaks)).status == "not yet"
        line = printed()
        assert hint in line
        assert not any(other in line for _, other in listed if other != hint)
    # an answer no slip explains gets the generic hint, none of the named ones
    lab.check(ex, 0.5 * steps[measured].peak_bytes, **_context(ex, steps, peaks))
    line = printed()
    assert not any(h in line for _, h in listed)


def test_doubling_everything_is_the_review_case(lab, printed, steps, peaks):
    """Twice the peak is the usual wrong answer when the batch doubles: it names the model states."""
    lab.check("0.2", 2 * steps["step"].peak_bytes, **_context("0.2", steps, peaks))
    assert "do not depend on the batch" in printed()


def test_temporaries_hints(lab, printed, steps, peaks):
    peak_map, x_bytes = peaks
    ctx = _context("0.1", steps, peaks)
    cases = [
        ({"x * 2 + 1": x_bytes, "(x * 2).add_(1)": x_bytes}, "still alive while + 1 writes"),
        ({"x * 2 + 1": 3 * x_bytes, "(x * 2).add_(1)": x_bytes}, "x was allocated before the call"),
        ({"x * 2 + 1": 2 * x_bytes, "(x * 2).add_(1)": 2 * x_bytes}, "add_ writes into the tensor"),
        ({"x * 2 + 1": 2 * x_bytes, "(x * 2).add_(1)": 0}, "x * 2 still makes a new tensor"),
    ]
    named = [words for _, words in cases]
    for answer, words in cases:
        assert lab.check("0.1", answer, **ctx).status == "not yet"
        line = printed()
        assert words in line
        assert not any(other in line for other in named if other != words)
    assert x_bytes == ELEMENTS * torch.float32.itemsize
    assert set(peak_map) == set(EXPRESSIONS)


def test_short_step_hints(lab, printed, steps, peaks):
    ctx = _context("0.5", steps, peaks)
    n = _n()
    right = (4 + 4 + 8 + 4) * n
    lab.check("0.5", {"phase": "backward", "peak_bytes": right}, **ctx)
    line = printed()
    assert "the phase:" in line and "the peak bytes" not in line
    listed = short_slips(steps["step"])
    _distinct([v for v, _ in listed], steps["step_short"].peak_bytes, lab.get("0.5").rtol)
    for value, hint in listed:
        lab.check("0.5", {"phase": "optimizer", "peak_bytes": value}, **ctx)
        line = printed()
        assert hint in line and "the phase:" not in line
    lab.check("0.5", {"phase": "warmup", "peak_bytes": right}, **ctx)
    assert "the phase is one of 'forward', 'backward', 'optimizer'" in printed()
