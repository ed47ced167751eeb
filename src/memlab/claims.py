"""Verdicts on claims: each one computed from a result, never typed in.

A verdict has one of four levels: *holds*, *holds with a caveat* (the caveat stated),
*wrong* (with the correct statement), or *not judged here* (with the reason: the evidence
that would decide it was not measured on this page's device). Which level a claim gets is a
computed condition: :func:`judge` takes the truth of the claim in the setting it names
(``holds``) and, separately, whether the caveat applies (``caveat_applies``), both computed
from the evidence; a caveat's text alone never lowers a verdict.

A registered check is two functions: ``evidence()`` measures or computes the numbers (a
dict), and the decorated ``decide(ev)`` turns them into a verdict. Tests feed ``decide``
changed evidence to reach every level. :func:`sensitivity` says what a verdict would be with
another threshold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memlab.errors import MemlabError

HOLDS = "holds"
CAVEAT = "holds with a caveat"
WRONG = "wrong"
NOT_JUDGED = "not judged here"
VERDICTS = (HOLDS, CAVEAT, WRONG, NOT_JUDGED)
JUDGED = (HOLDS, CAVEAT, WRONG)  # the levels a claim with evidence can reach


@dataclass(frozen=True)
class Verdict:
    """A claim, what the book found, and the evidence (a measured or computed number)."""

    claim: str  # the claim's id in the claims list (e.g. 'C05'), or '' for the book's own checks
    statement: str
    verdict: str
    evidence: str
    note: str = ""  # the caveat, the correct statement, or why it is not judged here
    sensitivity: str = ""  # what the verdict would be with another threshold

    def as_dict(self) -> dict:
        """The verdict as a plain dict (chapter: all)."""
        return asdict(self)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise MemlabError(f"{name} must be True or False (computed), got {value!r}")


def level(holds: bool, caveat_applies: bool = False) -> str:
    """The level of a verdict from two computed truth values (chapter: all)."""
    _check_bool("holds", holds)
    _check_bool("caveat_applies", caveat_applies)
    if not holds:
        return WRONG
    return CAVEAT if caveat_applies else HOLDS


def judge(statement: str, holds: bool, evidence: str, *, claim: str = "",
          caveat: str | None = None, caveat_applies: bool | None = None,
          correction: str | None = None, sensitivity: str = "") -> Verdict:
    """Turn computed truth values into a verdict (chapter: all).

    ``holds`` must come from a measurement or computation. A claim with a caveat passes its
    text as ``caveat`` and, computed from the evidence, whether it applies
    (``caveat_applies``); a wrong one should pass ``correction``.
    """
    _check_bool("holds", holds)
    if caveat and caveat_applies is None:
        raise MemlabError("caveat_applies must be True or False (computed) when a caveat is "
                          f"given; got None for caveat {caveat[:40]!r}")
    applies = bool(caveat_applies)
    if caveat_applies is not None:
        _check_bool("caveat_applies", caveat_applies)
    if applies and not caveat:
        raise MemlabError("caveat_applies is True but no caveat text was given")
    verdict = level(holds, applies)
    note = {HOLDS: "", CAVEAT: caveat or "", WRONG: correction or ""}[verdict]
    return Verdict(claim=claim, statement=statement, verdict=verdict, evidence=evidence,
                   note=note, sensitivity=sensitivity)


def not_judged(statement: str, evidence: str, reason: str, *, claim: str = "") -> Verdict:
    """A verdict of *not judged here*: the deciding evidence was not measured, and why (chapter: all)."""
    if not reason:
        raise MemlabError("a claim not judged here must say why (reason is empty)")
    return Verdict(claim=claim, statement=statement, verdict=NOT_JUDGED, evidence=evidence,
                   note=reason)


def sensitivity(decide, ev: dict, key: str, values, describe) -> str:
    """What ``decide`` says with ``ev[key]`` set to each of ``values`` (chapter: all).

    Only values where that changes the level are kept.

    ``describe(value)`` names a threshold in words, e.g. ``lambda t: f"a tolerance of {t:.0%}"``.
    Returns e.g. "would be holds with a tolerance of 25% or 50%; the same with a tolerance of 5%".
    """
    here = decide(ev).verdict
    by_level: dict[str, list[str]] = {}
    for value in values:
        by_level.setdefault(decide({**ev, key: value}).verdict, []).append(describe(value))
    parts = [f"would be {lvl} with {' or '.join(ds)}" for lvl, ds in by_level.items()
             if lvl != here]
    if here in by_level:
        parts.append("the same with " + " or ".join(by_level[here]))
    return "; ".join(parts)


def with_sensitivity(decide, ev: dict, key: str, values, describe) -> Verdict:
    """``decide(ev)`` with its sensitivity to ``ev[key]`` stated (chapter: all).

    The sensitivity reads "<threshold> here; would be ...".
    """
    v = decide(ev)
    text = sensitivity(decide, ev, key, [x for x in values if x != ev[key]], describe)
    return Verdict(v.claim, v.statement, v.verdict, v.evidence, v.note,
                   f"{describe(ev[key])} here; {text}")


def table(verdicts: list[Verdict]):
    """The verdicts as a pandas DataFrame, or a list of dicts without pandas (chapter: all)."""
    rows = [v.as_dict() for v in verdicts]
    show_claim = any(v.claim for v in verdicts)
    show_note = any(v.note for v in verdicts)
    show_sens = any(v.sensitivity for v in verdicts)
    columns = ((["claim"] if show_claim else []) + ["statement", "verdict", "evidence"]
               + (["note"] if show_note else []) + (["sensitivity"] if show_sens else []))
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is in the notebook extra
        return [{c: r[c] for c in columns} for r in rows]
    return pd.DataFrame(rows, columns=columns)


# The registry: each part's claims.py registers the checks of the claims its chapter owns. ------
@dataclass(frozen=True)
class ClaimCheck:
    """A claim from the book's list, the function gathering its evidence and the one deciding it."""

    claim: str  # 'C01'
    chapter: str  # the page that shows the evidence, e.g. 'chapters/01_where_the_memory_goes'
    statement: str
    evidence: object  # () -> dict of measured or computed numbers
    decide: object  # (dict) -> Verdict

    def fn(self) -> Verdict:
        """The verdict on this page's evidence (chapter: all)."""
        return self.decide(self.evidence())


CHECKS: dict[str, ClaimCheck] = {}


def register(claim: str, chapter: str, statement: str, *, evidence):
    """Decorator: register ``decide(ev) -> Verdict`` and the ``evidence()`` it decides on (chapter: all)."""
    if not callable(evidence):
        raise MemlabError(f"evidence of claim {claim} must be a function returning a dict, "
                          f"got {evidence!r}")

    def wrap(decide):
        CHECKS[claim] = ClaimCheck(claim=claim, chapter=chapter, statement=statement,
                                   evidence=evidence, decide=decide)
        return decide

    return wrap


_COMPUTED: dict[str, Verdict] = {}  # claim -> verdict, computed once per process


def verdicts(claims: list[str] | None = None, chapter: str | None = None, *,
             fresh: bool = False) -> list[Verdict]:
    """The verdicts of registered claims, all or some, in claim order (chapter: all).

    Each is computed once per process.

    ``fresh=True`` computes them again (a test that changes a check's evidence uses it).
    """
    from memlab.book import import_rooms

    import_rooms("claims")
    chosen = sorted(CHECKS) if claims is None else list(claims)
    unknown = [c for c in chosen if c not in CHECKS]
    if unknown:
        raise MemlabError(f"unknown claim(s) {unknown}; accepted: {', '.join(sorted(CHECKS))}")
    out = []
    for c in chosen:
        check = CHECKS[c]
        if chapter is None or check.chapter == chapter:
            if fresh or c not in _COMPUTED:
                v = check.fn()
                _COMPUTED[c] = Verdict(claim=c, statement=check.statement, verdict=v.verdict,
                                       evidence=v.evidence, note=v.note,
                                       sensitivity=v.sensitivity)
            out.append(_COMPUTED[c])
    return out
