"""GPipe's schedule built from stage times: when each stage computes and when it idles (chapter 6).

GPipe (Huang et al. 2019) runs all the forwards of m micro-batches through p stages, then all
the backwards. A stage starts a micro-batch's forward when it has finished the previous one
and the stage before it has handed over the activations; the last stage starts the backwards
once its forwards are done, and each earlier stage starts a micro-batch's backward when it
has finished the previous one and the stage after it has handed back the gradient. PyTorch's
``ScheduleGPipe`` runs the backwards in the forwards' order, micro-batch 0 first; so does
:func:`gpipe_timeline`.

Given each stage's seconds per micro-batch, :func:`gpipe_timeline` places every forward and
backward at the earliest moment those rules allow. A stage's *bubble* is its idle share of the
step, 1 - busy / step, the step ending when the last stage does. With equal stages and no
transfer time it is exactly GPipe's (p - 1) / (m + p - 1) (:func:`gpipe_bubble`); unequal
stages and transfers make it larger. This is the schedule itself, free of what else shares the
machine: fed with stage times measured one stage at a time, it gives the bubble the schedule
would have on hardware where the stages do not compete.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import MemlabError, check_positive_int

KINDS = ("forward", "backward")


def gpipe_bubble(stages: int, microbatches: int) -> float:
    """GPipe's idle share of a step, (p - 1) / (m + p - 1), for p stages and m micro-batches (chapter: 6)."""
    p = check_positive_int("stages", stages)
    m = check_positive_int("microbatches", microbatches)
    return (p - 1) / (m + p - 1)


@dataclass(frozen=True)
class Slot:
    """One stage computing one micro-batch's forward or backward, seconds from the step's start."""

    stage: int
    kind: str  # 'forward' (the last stage's loss included) or 'backward'
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class GPipeTimeline:
    """Every forward and backward of one GPipe step, placed by the schedule's rules (chapter: 6)."""

    stages: int
    microbatches: int
    transfer_s: float  # seconds to hand activations or gradients to the next stage
    slots: tuple[Slot, ...]

    @property
    def step_s(self) -> float:
        """Seconds from the first forward's start to the last backward's end (chapter: 6)."""
        return max(s.end_s for s in self.slots)

    @property
    def busy_s(self) -> tuple[float, ...]:
        """Seconds each stage computes in the step (chapter: 6)."""
        busy = [0.0] * self.stages
        for s in self.slots:
            busy[s.stage] += s.end_s - s.start_s
        return tuple(busy)

    @property
    def bubble(self) -> tuple[float, ...]:
        """Each stage's idle share of the step, 1 - busy / step (chapter: 6)."""
        return tuple(1 - b / self.step_s for b in self.busy_s)

    @property
    def mean_bubble(self) -> float:
        """The pipeline's idle share: idle stage-seconds over p x step (chapter: 6)."""
        return 1 - sum(self.busy_s) / (self.stages * self.step_s)


def _per_microbatch(what: str, times, stages: int, m: int) -> list[list[float]]:
    """``times[s]``: one number for every micro-batch of stage s, or m numbers."""
    if len(times) != stages:
        raise MemlabError(f"{what} has {len(times)} stages, the other times {stages}; accepted: "
                          "one entry per stage")
    out = []
    for s, t in enumerate(times):
        row = [t] * m if isinstance(t, int | float) else list(t)
        if len(row) != m or any(isinstance(x, bool) or not isinstance(x, int | float) or x < 0
                                for x in row):
            raise MemlabError(f"{what} of stage {s} must be a non-negative number or {m} of them "
                              f"(one per micro-batch), got {t!r}")
        out.append([float(x) for x in row])
    return out


def gpipe_timeline(forward_s, backward_s, microbatches: int, *,
                   transfer_s: float = 0.0) -> GPipeTimeline:
    """GPipe's step from each stage's seconds per micro-batch; every slot at its earliest (chapter: 6).

    ``forward_s[s]`` and ``backward_s[s]`` are stage s's seconds per micro-batch: one number
    for all of them, or one per micro-batch (the last stage's forward includes its loss).
    ``transfer_s`` is added each time activations or gradients pass to the next stage (0: the
    formula's assumption).
    """
    m = check_positive_int("microbatches", microbatches)
    if not forward_s:
        raise MemlabError("forward_s is empty; accepted: one entry per stage")
    p = len(forward_s)
    fwd = _per_microbatch("forward_s", forward_s, p, m)
    bwd = _per_microbatch("backward_s", backward_s, p, m)
    if isinstance(transfer_s, bool) or not isinstance(transfer_s, int | float) or transfer_s < 0:
        raise MemlabError(f"transfer_s must be a non-negative number of seconds, got "
                          f"{transfer_s!r}")
    t = float(transfer_s)
    f_end = [[0.0] * m for _ in range(p)]
    b_end = [[0.0] * m for _ in range(p)]
    slots = []
    for s in range(p):  # forwards: after this stage's previous one and the previous stage's
        for i in range(m):
            start = max(f_end[s][i - 1] if i else 0.0, f_end[s - 1][i] + t if s else 0.0)
            f_end[s][i] = start + fwd[s][i]
            slots.append(Slot(s, "forward", i, start, f_end[s][i]))
    for s in reversed(range(p)):  # backwards: after this stage's forwards, its previous
        for i in range(m):        # backward, and the next stage's backward of this micro-batch
            start = max(b_end[s][i - 1] if i else f_end[s][m - 1],
                        b_end[s + 1][i] + t if s < p - 1 else 0.0)
            b_end[s][i] = start + bwd[s][i]
            slots.append(Slot(s, "backward", i, start, b_end[s][i]))
    slots.sort(key=lambda x: (x.stage, x.start_s))
    return GPipeTimeline(stages=p, microbatches=m, transfer_s=t, slots=tuple(slots))
