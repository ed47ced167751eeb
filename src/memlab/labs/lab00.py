"""Lab 0, "Measure the memory of a training step": predict how the peak moves, then measure it.

The notebook measures one steady-state step and prints its breakdown; each exercise changes one
thing (the batch, the optimizer, gradients kept alive, a short sequence) and asks for the new
peak, reasoned from that breakdown. Every expected value is a measurement the notebook made
(passed in as context), never typed in, and every hint names the mistake whose answer it
matches: the wrong answers are computed from the same measurements.
"""

from __future__ import annotations

import torch

from memlab.device import pick_device
from memlab.labs.grader import (
    answer_keys_problem,
    answer_number,
    check_each_key,
    close_to,
    define_lab,
    named_slip,
    number_problem,
)
from memlab.measure.peak import measure_peak
from memlab.measure.step import StepMemory
from memlab.model.step import PHASES

# The model and batch the lab measures, per scale.
SIZES = {
    "ci": dict(model="tiny", batch_size=4, seq_len=64),
    "full": dict(model="gpt2", batch_size=2, seq_len=512),
}
# Exercise 0.1: elements of the fp32 tensor x, and the two expressions whose peaks are measured.
ELEMENTS = 2**20
EXPRESSIONS = {
    "x * 2 + 1": lambda x: x * 2 + 1,
    "(x * 2).add_(1)": lambda x: (x * 2).add_(1),
}
# Exercise 0.5: the short step, batch 1 and the sequence divided by this.
SHORT_SEQ_DIVISOR = 4
# Tolerances: the step's "other" bytes (token ids) and a peak's few bytes of small results.
PEAK_RTOL = 0.01
BATCH_RTOL = 0.02

STATES = ("parameters", "gradients", "optimizer_states")
GROWING = ("activations", "temporaries")


def short_shape(size: dict) -> dict:
    """Batch and sequence of exercise 0.5: batch 1, the sequence divided by SHORT_SEQ_DIVISOR (chapter: 0)."""
    return dict(batch_size=1, seq_len=max(1, size["seq_len"] // SHORT_SEQ_DIVISOR))


def expression_peaks(device=None) -> tuple[dict[str, int], int]:
    """Measured peak bytes of each of :data:`EXPRESSIONS` on an fp32 x, and x's bytes (chapter: 0)."""
    dev = pick_device(device)
    x = torch.ones(ELEMENTS, dtype=torch.float32, device=dev)
    peaks = {}
    for label, fn in EXPRESSIONS.items():
        _, peak = measure_peak(fn, x, device=dev)
        peaks[label] = peak.peak_allocated_bytes
    return peaks, x.nbytes


def at_peak(step: StepMemory) -> dict[str, int]:
    """Bytes by category at the step's peak, in the phase that holds it (chapter: 0)."""
    return step.phase_breakdown[step.peak_phase]


def _bytes_answer(answer) -> tuple[float | None, str]:
    got = answer_number(answer)
    if got is None:
        return None, f"answer a number of bytes, got {type(answer).__name__}"
    return got, ""


def _judge_bytes(answer, expected: float, rtol: float, slips, fallback: str):
    got, why = _bytes_answer(answer)
    if got is None:
        return False, why
    if close_to(got, expected, rtol):
        return True
    return False, named_slip(got, slips, rtol) or fallback


# ----------------------------------------------------------------------------- checks


def check_temporaries(answer, peaks: dict[str, int], x_bytes: int, rtol: float = PEAK_RTOL):
    """Check the predicted peaks of ``x * 2 + 1`` and ``(x * 2).add_(1)`` (chapter: 0).

    They are held to measure_peak.
    """
    slips = {
        "x * 2 + 1": [
            (x_bytes, "x * 2 is a temporary that is still alive while + 1 writes its result: "
                      "two tensors as large as x at once"),
            (3 * x_bytes, "x was allocated before the call: measure_peak counts from the bytes "
                          "allocated when the call starts"),
        ],
        "(x * 2).add_(1)": [
            (2 * x_bytes, "add_ writes into the tensor x * 2 made: an in-place operation "
                          "allocates nothing new"),
            (0, "x * 2 still makes a new tensor as large as x; only add_ is in place"),
        ],
    }
    return check_each_key(answer, EXPRESSIONS, "EXPRESSIONS", lambda key, value: number_problem(
        value, peaks[key], rtol=rtol, slips=slips.get(key, ()),
        ask=f"a number of bytes, got {type(value).__name__}",
        fallback="count the tensors alive at the same moment"), counted=False)


def batch_slips(step: StepMemory) -> list[tuple[float, str]]:
    """Typical wrong predictions of the peak at twice the batch, each with its hint (chapter: 0)."""
    cats = at_peak(step)
    return [
        (2 * step.peak_bytes, "the parameters and AdamW's states do not depend on the batch: "
                              "only what has a batch dimension doubles"),
        (step.peak_bytes, "activations have a batch dimension: they double with the batch"),
        (step.peak_bytes + cats["activations"], "the temporaries at the peak (the backward "
                                                "pass's gradients of activations) have a batch "
                                                "dimension too"),
    ]


def check_batch(answer, step: StepMemory, step_2b: StepMemory, rtol: float = BATCH_RTOL):
    """Check the predicted peak at twice the batch against the measured one (chapter: 0)."""
    return _judge_bytes(answer, step_2b.peak_bytes, rtol, batch_slips(step),
                        "keep what does not grow with the batch, double what does")


def accumulation_slips(step: StepMemory) -> list[tuple[float, str]]:
    """Typical wrong predictions of the peak when gradients stay alive, each with its hint (chapter: 0)."""
    grads = step.phase_breakdown["optimizer"]["gradients"]
    return [
        (step.peak_bytes, "at this step's peak no gradient is alive (set_to_none=True frees "
                          "them after each step); in the second micro-batch the first one's are"),
        (2 * step.peak_bytes, "the micro-batches run one after the other: the first one's "
                              "activations are freed by its backward pass"),
        (step.peak_bytes + 2 * grads, "the gradients are accumulated in place: one gradient per "
                                      "parameter, however many micro-batches"),
    ]


def check_accumulation(answer, step: StepMemory, step_accum: StepMemory, rtol: float = PEAK_RTOL):
    """Check the predicted peak of a step with gradient accumulation against the measured one (chapter: 0)."""
    return _judge_bytes(answer, step_accum.peak_bytes, rtol, accumulation_slips(step),
                        "what is alive at the peak now that was not before?")


def sgd_slips(step: StepMemory) -> list[tuple[float, str]]:
    """Typical wrong predictions of the peak with plain SGD, each with its hint (chapter: 0)."""
    cats = at_peak(step)
    params = cats["parameters"]
    return [
        (step.peak_bytes, "AdamW's m and v are alive the whole time, also at the backward "
                          "pass's peak; plain SGD keeps no state"),
        (step.peak_bytes - cats["optimizer_states"] - params, "SGD still has parameters; "
                                                               "only the optimizer states go"),
        (step.peak_bytes - cats["optimizer_states"] / 2, "plain SGD keeps no state at all "
                                                          "(SGD with momentum keeps one buffer)"),
    ]


def check_sgd(answer, step: StepMemory, step_sgd: StepMemory, rtol: float = PEAK_RTOL):
    """Check the predicted peak of a plain-SGD step against the measured one (chapter: 0)."""
    return _judge_bytes(answer, step_sgd.peak_bytes, rtol, sgd_slips(step),
                        "which of the categories at the peak does the optimizer own?")


def short_slips(step: StepMemory) -> list[tuple[float, str]]:
    """Typical wrong predictions of the short step's peak bytes, each with its hint (chapter: 0)."""
    at_step = step.phase_breakdown["optimizer"]
    states = sum(at_step[c] for c in STATES)
    return [
        (states, "foreach AdamW also allocates a scratch list as large as the parameters while "
                 "it updates them (chapter 0)"),
        (states - at_step["gradients"], "the gradients are still alive during the optimizer step: "
                                         "it reads them"),
    ]


def check_short(answer, step: StepMemory, step_short: StepMemory, rtol: float = PEAK_RTOL):
    """Check the predicted phase and peak bytes of a batch-1 short-sequence step (chapter: 0)."""
    problem = answer_keys_problem(answer, ("phase", "peak_bytes"), "{'phase', 'peak_bytes'}")
    if problem:
        return False, problem
    phase = answer["phase"]
    if not isinstance(phase, str) or phase.strip() not in PHASES:
        return False, f"the phase is one of {', '.join(map(repr, PHASES))}, got {phase!r}"
    phase_ok = phase.strip() == step_short.peak_phase
    verdict = _judge_bytes(answer["peak_bytes"], step_short.peak_bytes, rtol, short_slips(step),
                           "add up what is alive in the phase that holds the peak")
    if phase_ok and verdict is True:
        return True
    parts = []
    if not phase_ok:
        parts.append("the phase: with a batch of 1 and a short sequence the activations are "
                     "small; compare them with the model states and the optimizer step's scratch")
    if verdict is not True:
        parts.append(f"the peak bytes: {verdict[1]}")
    return False, "; ".join(parts)


lab = define_lab("lab00", "Measure the memory of a training step")

lab.exercise(
    "0.1",
    f"peak bytes of x * 2 + 1 and of (x * 2).add_(1), predicted (within {PEAK_RTOL:.0%})",
    check=check_temporaries,
    rtol=PEAK_RTOL,
    hint="",
)
lab.exercise(
    "0.2",
    f"peak bytes of the step at batch 2B, predicted from its breakdown at B (within {BATCH_RTOL:.0%})",
    check=check_batch,
    rtol=BATCH_RTOL,
    hint="",
)
lab.exercise(
    "0.3",
    f"peak bytes of the step with two micro-batches of gradient accumulation (within {PEAK_RTOL:.0%})",
    check=check_accumulation,
    rtol=PEAK_RTOL,
    hint="",
)
lab.exercise(
    "0.4",
    f"peak bytes of the same step with plain SGD instead of AdamW (within {PEAK_RTOL:.0%})",
    check=check_sgd,
    rtol=PEAK_RTOL,
    hint="",
)
lab.exercise(
    "0.5",
    f"phase and peak bytes of the step at batch 1 and a short sequence (within {PEAK_RTOL:.0%})",
    check=check_short,
    rtol=PEAK_RTOL,
    hint="",
)
