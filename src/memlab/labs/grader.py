"""Labs: autograded exercises, checked in the notebook.

The student versions are in :mod:`memlab.labs.student`.

An instructor defines a lab's exercises here in the library, never in the notebook, so
that every expected value is computed by memlab at check time::

    lab = define_lab("lab00", "Measure one training step")
    lab.exercise("1.1", "bytes of the fp32 parameters",
                 expected=lambda: 4 * get_config("tiny").num_parameters())

A notebook then does::

    lab = memlab.labs.grader.get_lab("lab00")
    answer = None
    ### BEGIN SOLUTION
    answer = 4 * cfg.num_parameters()
    ### END SOLUTION
    lab.check("1.1", answer)

and the check prints one line: ``correct``, ``not yet`` or ``not attempted``. A ``not yet``
says what is wrong: the hint of the slip the answer matches (:func:`named_slip`, computed from
the numbers the check compares with), else how far off it is (:func:`off_by`), never the
exercise's recipe. A cell after a check that shows the checked numbers runs under
:meth:`Lab.reveal`, so that it shows them only once the check has passed.

:func:`strip_solutions` turns an instructor notebook into the student version: the code
between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``# YOUR CODE HERE``
(nbgrader's markers), so the student version still runs to the end and every check in it
says ``not attempted``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import numbers
import os
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memlab.errors import MemlabError

REPORT_ENV = "MEMLAB_LAB_REPORT"
LAB_PACKAGE = (
    "memlab.labs"  # a module memlab.labs.<name> that defines lab <name> is found by get_lab
)

CORRECT = "correct"
NOT_YET = "not yet"
NOT_ATTEMPTED = "not attempted"
STATUSES = (CORRECT, NOT_YET, NOT_ATTEMPTED)
_MARKS = {CORRECT: "✅", NOT_YET: "❌", NOT_ATTEMPTED: "⏳"}


# Factors that turn a right answer into a wrong one when units are mixed up.
_UNIT_FACTORS = (
    (8, "8: bits and bytes are different units"),
    (2**10, "1024: check your units (bytes, KiB, MiB, GiB)"),
    (2**20, "2^20: check your units (bytes, KiB, MiB, GiB)"),
    (2**30, "2^30: check your units (bytes, KiB, MiB, GiB)"),
    (10**3, "1000: check your units (k, M, G)"),
    (10**6, "10^6: check your units (k, M, G)"),
    (10**9, "10^9: check your units (k, M, G)"),
    (2**30 / 10**9, "2^30/10^9: GiB and GB are different units"),
    (2**20 / 10**6, "2^20/10^6: MiB and MB are different units"),
)


# --------------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Exercise:
    """One autograded exercise of a lab.

    ``expected`` is called at check time (with the context arguments it names), so the
    expected value is computed by memlab, never typed in. The answer is compared with it
    exactly, or within the relative tolerance ``rtol``. ``check``, when given, replaces that
    comparison: it is called as ``check(answer, **context)`` (plus ``expected=`` when
    ``expected`` is set, if it takes that argument) and returns ``(ok, hint)``, ``ok``, what is
    wrong with the answer as a string ('' when nothing: :func:`number_problem`,
    :func:`fit_problem`), or ``None`` when the answer is still a stub; a check that takes
    ``rtol`` gets the exercise's.
    ``dimensionless``: the answer is a ratio or a share, so a wrong one is never blamed on
    units (bytes, GiB, GB): a factor such as 2^20/10^6 = 1.049 would only be a coincidence.
    ``hint``: the instructor's note on how the exercise is solved. A check never prints it: a
    wrong answer gets the hint of the slip it made (from ``check``), or what is wrong with it.
    """

    id: str
    summary: str
    expected: Callable[..., Any] | None = None
    rtol: float = 0.0
    check: Callable[..., Any] | None = None
    hint: str = ""
    dimensionless: bool = False

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id.strip():
            raise MemlabError(f"exercise id must be a non-empty string, got {self.id!r}")
        if self.expected is None and self.check is None:
            raise MemlabError(f"exercise {self.id!r} needs expected= or check=, got neither")
        for name in ("expected", "check"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise MemlabError(
                    f"exercise {self.id!r}: {name}= must be a callable (e.g. a lambda), got {value!r}"
                )
        if (
            isinstance(self.rtol, bool)
            or not isinstance(self.rtol, numbers.Real)
            or not self.rtol >= 0
        ):
            raise MemlabError(
                f"exercise {self.id!r}: rtol must be a number >= 0, got {self.rtol!r}"
            )
        if not isinstance(self.dimensionless, bool):
            raise MemlabError(
                f"exercise {self.id!r}: dimensionless must be True or False, got {self.dimensionless!r}"
            )


@dataclass(frozen=True)
class CheckResult:
    """What one check said: ``status`` is ``'correct'``, ``'not yet'`` or ``'not attempted'``."""

    lab: str
    exercise: str
    status: str
    message: str

    @property
    def ok(self) -> bool:
        """True when the status is ``'correct'`` (chapter: labs)."""
        return self.status == CORRECT

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self):
        # The check has already printed its one line; showing the object too would repeat it.
        return None


@dataclass(frozen=True)
class LabSummary:
    """Counts of a lab's exercises by the status of their latest check."""

    lab: str
    correct: int
    not_yet: int
    not_attempted: int
    total: int
    message: str

    def __str__(self) -> str:
        return self.message

    def _ipython_display_(self):
        return None


class Lab:
    """A named set of exercises with :meth:`check` and :meth:`summary` (chapter: labs)."""

    def __init__(self, name: str, title: str = "", exercises: Iterable[Exercise] = ()):
        if not isinstance(name, str) or not name.strip():
            raise MemlabError(f"lab name must be a non-empty string, got {name!r}")
        self.name = name
        self.title = title
        self._exercises: dict[str, Exercise] = {}
        self.results: dict[str, CheckResult] = {}
        for ex in exercises:
            self.add(ex)

    def __repr__(self) -> str:
        return f"Lab({self.name!r}, exercises: {', '.join(self.ids) or 'none'})"

    @property
    def ids(self) -> tuple[str, ...]:
        """The exercise ids, in the order they were added (chapter: labs)."""
        return tuple(self._exercises)

    @property
    def exercises(self) -> tuple[Exercise, ...]:
        """The exercises, in the order they were added (chapter: labs)."""
        return tuple(self._exercises.values())

    def add(self, exercise: Exercise) -> Exercise:
        """Add an :class:`Exercise`; a second one with the same id is an error (chapter: labs)."""
        if not isinstance(exercise, Exercise):
            raise MemlabError(f"lab {self.name!r}: expected an Exercise, got {exercise!r}")
        if exercise.id in self._exercises:
            raise MemlabError(f"lab {self.name!r} already has an exercise {exercise.id!r}")
        self._exercises[exercise.id] = exercise
        return exercise

    def exercise(
        self,
        id: str,
        summary: str,
        *,
        expected: Callable[..., Any] | None = None,
        rtol: float = 0.0,
        check: Callable[..., Any] | None = None,
        hint: str = "",
        dimensionless: bool = False,
    ) -> Exercise:
        """Define and add one exercise; see :class:`Exercise` for the arguments (chapter: labs)."""
        return self.add(Exercise(id, summary, expected=expected, rtol=rtol, check=check, hint=hint,
                                 dimensionless=dimensionless))

    def get(self, exercise_id: str) -> Exercise:
        """The exercise with this id, or a one-line error naming the accepted ids (chapter: labs)."""
        try:
            return self._exercises[exercise_id]
        except (KeyError, TypeError):
            accepted = ", ".join(self.ids) or "none defined"
            raise MemlabError(
                f"unknown exercise {exercise_id!r} in lab {self.name!r}; accepted: {accepted}"
            ) from None

    def describe(self) -> str:
        """One line per exercise: its id and summary (chapter: labs)."""
        return "\n".join(f"{ex.id}  {ex.summary}" for ex in self.exercises)

    def passed(self, exercise_id: str) -> bool:
        """True when the latest check of the exercise said ``correct``: the autograder's test (chapter: labs)."""
        self.get(exercise_id)  # an unknown id is a one-line error
        result = self.results.get(exercise_id)
        return result is not None and result.ok

    def reveal(self, exercise_id: str) -> bool:
        """True once the exercise's check has passed; else print that what follows waits (chapter: labs).

        A cell after a check that shows the numbers the check compares with runs under
        ``if lab.reveal(id):``, so that it never shows the answer before the learner has found it.
        """
        if self.passed(exercise_id):
            return True
        print(locked_line(exercise_id))
        return False

    def check(self, exercise_id: str, answer: Any, **context: Any) -> CheckResult:
        """Check an answer, print one line (correct / not yet / not attempted) and return it (chapter: labs)."""
        ex = self.get(exercise_id)
        status, detail = _judge(ex, answer, context)
        if status == CORRECT:
            message = f"{_MARKS[CORRECT]} {ex.id} correct"
        elif status == NOT_ATTEMPTED:
            message = f"{_MARKS[NOT_ATTEMPTED]} {ex.id} not attempted ({detail})"
        else:
            message = f"{_MARKS[NOT_YET]} {ex.id} not yet: {detail}"
        result = CheckResult(self.name, ex.id, status, one_line(message))
        self.results[ex.id] = result
        print(result.message)
        _append_report(result)
        return result

    def summary(self) -> LabSummary:
        """Print the score line, e.g. ``3/4 correct, 1 not attempted``, and return the counts (chapter: labs)."""
        statuses = {
            ex_id: (self.results[ex_id].status if ex_id in self.results else NOT_ATTEMPTED)
            for ex_id in self.ids
        }
        by_status = {s: [i for i, st in statuses.items() if st == s] for s in STATUSES}
        total = len(statuses)
        parts = [f"{len(by_status[CORRECT])}/{total} correct"]
        for s in (NOT_YET, NOT_ATTEMPTED):
            if by_status[s]:
                parts.append(f"{len(by_status[s])} {s} ({', '.join(by_status[s])})")
        message = f"{self.name}: " + ", ".join(parts)
        print(message)
        return LabSummary(
            lab=self.name,
            correct=len(by_status[CORRECT]),
            not_yet=len(by_status[NOT_YET]),
            not_attempted=len(by_status[NOT_ATTEMPTED]),
            total=total,
            message=message,
        )

    def reset(self) -> None:
        """Forget the results of earlier checks (chapter: labs)."""
        self.results.clear()


_REVEAL = re.compile(r"""\blab\.reveal\(\s*["']([^"']+)["']\s*\)""")


def locked_line(exercise_id: str) -> str:
    """The line :meth:`Lab.reveal` prints while ``exercise_id``'s check has not passed (chapter: labs)."""
    return f"🔒 shown once {exercise_id} is correct"


def revealed_ids(source: str) -> tuple[str, ...]:
    """The exercise ids a cell's source passes to ``lab.reveal(...)``, in order (chapter: labs).

    A published student version never passes a check, so such a cell prints exactly
    :func:`locked_line` for each id there; its revealed outputs are checked against the
    instructor version's own run instead.
    """
    return tuple(_REVEAL.findall(source))


def parse_check_line(line: str) -> tuple[str, str] | None:
    """``(exercise, status)`` from a line a check printed, or ``None`` for any other line (chapter: labs).

    The inverse of :meth:`Lab.check`'s message: the tests read an executed lab's results with it.
    """
    for status, mark in _MARKS.items():
        head = f"{mark} "
        if line.startswith(head):
            rest = line[len(head):]
            exercise, _, tail = rest.partition(" ")
            if tail == status or tail.startswith((f"{status} (", f"{status}:")):
                return exercise, status
    return None


def one_line(text) -> str:
    """``text`` (or an exception) on one line, runs of white space made one space (chapter: all)."""
    return " ".join(str(text).split())


def call_learner(fn: Callable, args: Mapping, name: str,
                 show: Callable[[Any], str] = repr) -> tuple[Any, str]:
    """``fn`` called with ``args``' values in order, and '' (chapter: all).

    Or None and a one-line message saying what it raised.
    """
    try:
        return fn(*args.values()), ""
    except Exception as exc:
        shown = ", ".join(f"{k}={show(v)}" for k, v in args.items())
        return None, f"{name}({shown}) raised {type(exc).__name__}: {one_line(exc)}"


def _append_report(result: CheckResult) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    record = {
        "lab": result.lab,
        "exercise": result.exercise,
        "status": result.status,
        "message": result.message,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _is_blank(value: Any) -> bool:
    """True for ``None``/``...`` and for containers holding only those (a stub answer)."""
    if value is None or value is Ellipsis:
        return True
    if isinstance(value, (list, tuple)) and value:
        return all(_is_blank(v) for v in value)
    if isinstance(value, Mapping) and value:
        return all(_is_blank(v) for v in value.values())
    return False


def _call_with_context(fn: Callable[..., Any], args: tuple, context: Mapping[str, Any]) -> Any:
    """Call ``fn(*args, **kw)`` with the context entries ``fn`` accepts."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn(*args, **context)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn(*args, **context)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return fn(*args, **{k: v for k, v in context.items() if k in names})


def _judge(ex: Exercise, answer: Any, context: Mapping[str, Any]) -> tuple[str, str]:
    """The status of an answer and what is wrong with it; the exercise's ``hint`` is never shown."""
    if _is_blank(answer):
        return NOT_ATTEMPTED, "replace None with your answer"
    blank = [k for k, v in context.items() if _is_blank(v)]
    if blank:
        return NOT_ATTEMPTED, f"{', '.join(blank)} is None: fill in the cell that sets it"
    expected = _call_with_context(ex.expected, (), context) if ex.expected is not None else None
    if ex.check is not None:
        extra = {"rtol": ex.rtol, **context}
        if ex.expected is not None:
            extra["expected"] = expected
        # A student's answer of an unexpected kind must give "not yet", never a traceback.
        try:
            verdict = _call_with_context(ex.check, (answer,), extra)
        except Exception as exc:
            return NOT_YET, (f"could not check an answer of type {type(answer).__name__} "
                             f"({type(exc).__name__}: {one_line(exc)})")
        if verdict is None:
            return NOT_ATTEMPTED, "replace None with your answer"
        if isinstance(verdict, str):  # what is wrong with the answer, '' when nothing
            verdict = (not verdict, verdict)
        ok, why = verdict if isinstance(verdict, tuple) else (verdict, "")
        return (CORRECT, "") if ok else (NOT_YET, _join(one_line(why or "")))
    ok, why = _compare(answer, expected, float(ex.rtol), units=not ex.dimensionless)
    return (CORRECT, "") if ok else (NOT_YET, _join(why))


def _join(*parts: str) -> str:
    text = "; ".join(p for p in parts if p)
    return text or "that is not the expected answer"


def off_by(got: float, expected: float) -> str:
    """How far a wrong number is from the right one, without giving it (chapter: labs).

    ``'3.2x too large'``, ``'12% too small'``, ``'slightly too large'``; a wrong sign or a zero
    is named as such.
    """
    if not (math.isfinite(got) and math.isfinite(expected)):
        return "that is not a finite number" if not math.isfinite(got) else ""
    if expected == 0:
        return "too large" if got > 0 else "too small"
    if got == 0:
        return "that is zero"
    if (got < 0) != (expected < 0):
        return "the sign is wrong"
    ratio = got / expected
    word = "large" if abs(got) > abs(expected) else "small"
    factor = max(ratio, 1 / ratio)
    if factor >= 2:
        return f"{factor:.1f}x too {word}"
    share = abs(ratio - 1) if word == "large" else 1 - ratio
    pct = round(100 * share)
    return f"{pct}% too {word}" if pct >= 1 else f"slightly too {word}"


def _plain(value: Any) -> Any:
    """NumPy/torch scalars and arrays as Python numbers and lists."""
    if isinstance(value, (str, bytes, bool, int, float, list, tuple, dict)) or value is None:
        return value
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except Exception:
            return value
    return value


def answer_number(value: Any) -> float | None:
    """A learner's answer as a float, else None (chapters: 2, 3).

    It takes Python, numpy and torch real scalars, and 1-element tensors.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    item = getattr(value, "item", None)  # numpy and torch scalars; a larger tensor raises
    if callable(item):
        try:
            out = item()
        except Exception:
            return None
        return float(out) if isinstance(out, numbers.Real) and not isinstance(out, bool) else None
    return None


def answer_keys_problem(answer: Any, keys: Iterable[str], name: str) -> str | None:
    """Why a dict answer does not have exactly the keys ``keys``, all filled in (chapters: 2, 3).

    The answer is named ``name``. None if it does.
    """
    keys = list(keys)
    if not isinstance(answer, Mapping):
        return f"answer a dict with the keys of {name}, got {type(answer).__name__}"
    missing = [k for k in keys if k not in answer]
    extra = [str(k) for k in answer if k not in keys]
    if missing or extra:
        return f"missing keys {missing}" if missing else f"unknown keys {extra}"
    blank = [k for k in keys if answer[k] is None or answer[k] is Ellipsis]
    if blank:
        return f"fill in {', '.join(repr(k) for k in blank)}"
    return None


def check_each_key(answer: Any, keys: Iterable[str], name: str,
                   problem: Callable[[str, Any], str], *, counted: bool = True):
    """Check a dict answer key by key (chapter: labs).

    ``True``, or ``(False, why)`` with one ``'key': why`` per wrong key.

    The answer must have exactly the keys ``keys`` (named ``name`` in the message), all filled
    in (:func:`answer_keys_problem`); then ``problem(key, answer[key])`` says why that value is
    not right, or '' when it is. The wrong keys' lines are joined by '; ', after
    ``"N of M not right: "`` when ``counted``.
    """
    keys = list(keys)
    why = answer_keys_problem(answer, keys, name)
    if why:
        return False, why
    wrong = [f"{key!r}: {text}" for key in keys if (text := problem(key, answer[key]))]
    if not wrong:
        return True
    return False, (f"{len(wrong)} of {len(keys)} not right: " if counted else "") + "; ".join(wrong)


def number_problem(value: Any, expected: float, *, fallback: str | None = None,
                   ask: str = "a number",
                   rtol: float | None = None, slips: Iterable | Callable[[], Iterable] = (),
                   slip_rtol: float | None = None) -> str:
    """Why a numeric answer is not ``expected``, or '' when it is (chapter: labs).

    Right is equal to ``expected`` when ``rtol`` is None, else within ``rtol`` of it
    (:func:`close_to`). A value that is not a number gets ``"answer " + ask`` and its type; a
    wrong one the hint of the slip it matches (:func:`named_slip`, within ``slip_rtol``, by
    default ``rtol`` or 0), else ``fallback``, by default how far off it is (:func:`off_by`).
    ``slips`` may be a function, called only for a wrong answer.
    """
    got = answer_number(value)
    if got is None:
        return f"answer {ask}, got {type(value).__name__}"
    if got == expected if rtol is None else close_to(got, expected, rtol):
        return ""
    slips = slips() if callable(slips) else slips
    return (named_slip(got, slips, (rtol or 0.0) if slip_rtol is None else slip_rtol)
            or (off_by(got, expected) if fallback is None else fallback))


def fit_problem(count: int, expected: int, *, budget: int, peak: Callable[[int], int],
                slips: Callable[[], Iterable] = tuple, over: str, under: str) -> str:
    """Why a count is not the one whose traced peak just fits ``budget``, else '' (chapter: labs).

    A predict-then-trace check: the learner names the smallest (or largest) count, e.g. ranks or
    sequences per micro-batch, whose peak fits. A wrong count is traced (``peak(count)``) and the
    answer says which side it is on: ``over`` when its own peak is over the budget, ``under`` when
    it fits but is not the extreme one; then the hint of the slip it matches (:func:`named_slip`).
    ``over`` may use ``{count}``, ``{peak}`` and ``{budget}``; ``under`` ``{count}``.
    """
    if count == expected:
        return ""
    hint = named_slip(float(count), slips(), 1e-12)
    traced = peak(count)
    why = (over.format(count=count, peak=traced, budget=budget) if traced > budget
           else under.format(count=count))
    return why + (f": {hint}" if hint else "")


def answers_on_cases(answer: Callable, cases: Iterable[str], args_of: Callable[[str], Mapping],
                     name: str, show: Callable[[Any], str] = repr) -> tuple[dict, Any]:
    """A learner's function called on every case: its outputs and ``...`` (chapters: 7, 8).

    Or ``({}, verdict)`` when it raised on one (``(False, what it raised)``), or ``({}, None)``
    when it returned None everywhere (not attempted).
    """
    results = {}
    for case in cases:
        out, raised = call_learner(answer, args_of(case), name, show=show)
        if raised:
            return {}, (False, raised)
        results[case] = out
    if all(r is None for r in results.values()):
        return {}, None
    return results, ...


def two_numbers(value: Any) -> tuple[float, float] | None:
    """Two real numbers from a 2-sequence, else None (chapters: 7, 8)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or len(value) != 2:
        return None
    out = tuple(answer_number(v) for v in value)
    return None if any(v is None for v in out) else out


def best_slip(wrong: Sequence[tuple[Mapping, Any]], slips: Iterable[tuple[Callable, str]],
              same: Callable[[Any, Any], bool]) -> str:
    """The hint of the slip that gives every wrong case's answer, else the first's (chapters: 7, 8).

    ``wrong`` holds (the case's arguments, the learner's answer); ``slips`` (a wrong function,
    its hint); ``same`` says whether two answers agree.
    """
    slips = list(slips)
    for fn, hint in slips:
        if all(same(got, fn(**args)) for args, got in wrong):
            return hint
    args, got = wrong[0]
    return next((hint for fn, hint in slips if same(got, fn(**args))), "")


def answer_tensor(value: Any):
    """An answer as a torch tensor, or None if it is not numbers (chapter: labs).

    float64 unless it is a tensor already.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value, dtype=torch.float64)
    except Exception:
        return None


def merged_slips(slips: Iterable[tuple[float, str]]) -> list[tuple[float, str]]:
    """Slips whose values coincide become one, their hints joined (chapter: labs)."""
    out: list[tuple[float, str]] = []
    for value, hint in slips:
        same = next((i for i, (v, _) in enumerate(out) if close_to(value, v, 1e-12)), None)
        if same is None:
            out.append((value, hint))
        elif hint not in out[same][1]:
            out[same] = (out[same][0], f"{out[same][1]}; or {hint}")
    return out


def close_to(a: float, b: float, rtol: float) -> bool:
    """True when two finite numbers agree within the relative tolerance ``rtol`` of ``b`` (chapters: labs)."""
    return (math.isfinite(a) and math.isfinite(b)
            and abs(a - b) <= max(rtol, 1e-12) * abs(b) + 1e-300)


def named_slip(answer: float, slips: Iterable[tuple[float, str]], rtol: float) -> str:
    """The hint of the first typical wrong answer ``answer`` matches, else '' (chapters: labs).

    It matches within ``rtol``.

    ``slips`` holds (the value a misconception gives, the hint that names it, and optionally a
    short label), each value computed from what the check compares with, so a hint fires only on
    the answer its mistake produces.
    """
    return next((hint for value, hint, *_ in slips if close_to(answer, value, rtol)), "")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _compare(answer: Any, expected: Any, rtol: float, units: bool = True) -> tuple[bool, str]:
    answer, expected = _plain(answer), _plain(expected)
    if isinstance(expected, bool):
        if isinstance(answer, bool):
            return answer == expected, ""
        return False, f"expected True or False, got {type(answer).__name__} {_show(answer)}"
    if _is_number(expected):
        if not _is_number(answer):
            return False, f"expected a number, got {type(answer).__name__} {_show(answer)}"
        if answer == expected:
            return True, ""
        if not (isinstance(answer, numbers.Real) and isinstance(expected, numbers.Real)):
            return False, ""
        try:
            a, e = float(answer), float(expected)
        except (TypeError, ValueError, OverflowError):
            return False, ""
        if rtol > 0 and abs(a - e) <= rtol * abs(e):
            return True, ""
        return False, (_unit_hint(a, e, rtol) if units else "") or off_by(a, e)
    if isinstance(expected, str):
        if not isinstance(answer, str):
            return False, f"expected a string, got {type(answer).__name__} {_show(answer)}"
        return answer.strip().casefold() == expected.strip().casefold(), ""
    if isinstance(expected, (list, tuple)):
        if not isinstance(answer, (list, tuple)):
            return (
                False,
                f"expected a list of {len(expected)} values, got {type(answer).__name__} {_show(answer)}",
            )
        if len(answer) != len(expected):
            return False, f"expected {len(expected)} values, got {len(answer)}"
        for i, (a, e) in enumerate(zip(answer, expected, strict=True)):
            ok, why = _compare(a, e, rtol, units)
            if not ok:
                return False, f"value {i} is not right" + (f" ({why})" if why else "")
        return True, ""
    if isinstance(expected, Mapping):
        if not isinstance(answer, Mapping):
            return False, f"expected a dict, got {type(answer).__name__} {_show(answer)}"
        if set(answer) != set(expected):
            return (
                False,
                f"expected the keys {sorted(map(str, expected))}, got {sorted(map(str, answer))}",
            )
        for key, e in expected.items():
            ok, why = _compare(answer[key], e, rtol, units)
            if not ok:
                return False, f"the value for {key!r} is not right" + (f" ({why})" if why else "")
        return True, ""
    try:
        return bool(answer == expected), ""
    except Exception:
        return False, f"could not compare {type(answer).__name__} with {type(expected).__name__}"


def _unit_hint(a: float, e: float, rtol: float) -> str:
    if a == 0 or e == 0 or not (math.isfinite(a) and math.isfinite(e)):
        return ""
    ratio = abs(a / e)
    tol = max(rtol, 1e-6)
    for factor, text in _UNIT_FACTORS:
        if math.isclose(ratio, factor, rel_tol=tol) or math.isclose(ratio, 1 / factor, rel_tol=tol):
            return f"off by a factor of {text}"
    return ""


# ------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Lab] = {}


def register_lab(lab: Lab) -> Lab:
    """Register a lab under its name, replacing an older one of that name (chapter: labs)."""
    if not isinstance(lab, Lab):
        raise MemlabError(f"register_lab needs a Lab, got {lab!r}")
    _REGISTRY[lab.name] = lab
    return lab


def define_lab(name: str, title: str = "", exercises: Iterable[Exercise] = ()) -> Lab:
    """Create a lab, register it (replacing an older one of that name) and return it (chapter: labs)."""
    return register_lab(Lab(name, title, exercises))


def lab_names() -> tuple[str, ...]:
    """Names of the registered labs and of the lab modules in ``memlab.labs`` (chapter: labs)."""
    names = set(_REGISTRY)
    try:
        package = importlib.import_module(LAB_PACKAGE)
    except ImportError:
        package = None
    if package is not None and hasattr(package, "__path__"):
        names.update(
            m.name for m in pkgutil.iter_modules(package.__path__) if re.fullmatch(r"lab\d\d", m.name)
        )
    return tuple(sorted(names))


def get_lab(name: str) -> Lab:
    """The lab called ``name``; imports ``memlab.labs.<name>`` on first use (chapter: labs)."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if isinstance(name, str) and name.isidentifier():
        module = f"{LAB_PACKAGE}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name not in (module, LAB_PACKAGE):
                raise
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise MemlabError(f"unknown lab {name!r}; accepted: {', '.join(lab_names()) or 'none defined'}")
