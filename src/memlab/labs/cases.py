"""A learner's function held to every case of an exercise, with the slip that explains it.

Used by the labs whose answers are functions of a case's arguments (chapters 8 and 9).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memlab.labs.grader import (
    answer_number,
    answers_on_cases,
    best_slip,
    close_to,
    off_by,
    two_numbers,
)


def _same_pair(a, b) -> bool:
    return a is not None and all(close_to(x, y, 1e-12) for x, y in zip(a, b, strict=True))


def _same_number(a, b) -> bool:
    return close_to(a, b, 1e-12)


def _which_wrong(got, expected, names=("forward", "backward")) -> str:
    ok = [close_to(g, e, 1e-12) for g, e in zip(got, expected, strict=True)]
    off = [off_by(g, e) for g, e in zip(got, expected, strict=True)]
    a, b = names
    if ok[0] and not ok[1]:
        return f"its {a} is right, its {b} is {off[1]}"
    if ok[1] and not ok[0]:
        return f"its {b} is right, its {a} is {off[0]}"
    return f"its {a} is {off[0]}, its {b} {off[1]}"


def check_cases(answer, name: str, cases: Sequence[str], args_of: Callable, expected_of: Callable,
                slips: Callable, *, pair: bool, counted: Sequence[str], counted_word: str,
                show: Callable[[Any], str] = repr, quantity: str = "bytes",
                names: tuple[str, str] = ("forward", "backward")):
    """A learner's function held exactly to every case: True, or (False, what is wrong) (chapters: 8, 9).

    ``pair``: the function returns (forward, backward); else one number. ``counted`` names the
    cases whose expected value is traced, measured or counted (``counted_word`` says which), and
    ``slips()`` the typical wrong functions with their hints (:func:`best_slip`); ``quantity``
    names what the numbers count, ``names`` the pair's two numbers.
    """
    if not callable(answer):
        return False, f"answer the function {name} itself, got {type(answer).__name__}"
    results, verdict = answers_on_cases(answer, cases, args_of, name, show=show)
    if verdict is not ...:
        return verdict
    read, same = (two_numbers, _same_pair) if pair else (answer_number, _same_number)
    wrong = []
    for case, out in results.items():
        got = read(out)
        if got is None:
            want = (f"two numbers, ({', '.join(names)}) {quantity}" if pair
                    else f"a number of {quantity}")
            return False, f"{name} on {case!r} returned {type(out).__name__}: return {want}"
        if not same(got, expected_of(case)):
            wrong.append((case, got))
    if not wrong:
        return True
    first, got = wrong[0]
    hint = best_slip([(args_of(c), g) for c, g in wrong], slips(), same)
    how = (_which_wrong(got, expected_of(first), names) if pair
           else off_by(got, expected_of(first)))
    return False, (f"{len(wrong)} of {len(cases)} cases not right, the first {first!r}"
                   + (f" ({counted_word})" if first in counted else "") + f": {how}"
                   + (f"; {hint}" if hint else ""))
