"""Verdicts on claims: each one computed from a result, never typed in.

A verdict has one of four levels: *holds*, *holds with a caveat* (the caveat stated),
*wrong* (with the correct statement), or *not judged here* (with the reason and the command
that would judge it). One rule decides the level (STYLE.md, "The verdict rule"): the claim's
own words decide what is judged; a stated part that is false makes the claim wrong; a part the
book cannot measure makes it not judged here; a caveat is a condition about the claim's own
setting that the evidence finds and that other real evidence could turn off, never a
structural fact. :func:`judge_parts` applies it to a claim's stated parts; :func:`judge` takes
one computed truth value and, separately, whether the caveat applies.

A registered check is two functions: ``evidence(**setting)`` measures or computes the numbers
(a dict) in the claim's setting, and the decorated ``decide(ev)`` turns them into a verdict.
Each check also declares its :class:`Move` s: one physical change to the setting (another size,
another implementation) and the level the real evidence then gives; tests run them. Within a
build the evidence of the claim's own setting is computed once (:func:`verdicts` keeps it in
``$MEMLAB_CACHE_DIR``), so a chapter and the appendix show the same numbers.
:func:`sensitivity` says what a verdict would be with another threshold.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass, field

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


def not_judged(statement: str, evidence: str, reason: str, *, command: str,
               claim: str = "") -> Verdict:
    """A verdict of *not judged here*: why, and the command that would judge it (chapter: all).

    ``reason`` says what was not measured and why this build cannot; ``command`` is what a
    reader runs where it can be measured (e.g. ``memlab record --device cuda``).
    """
    if not reason:
        raise MemlabError("a claim not judged here must say why (reason is empty)")
    if not command:
        raise MemlabError("a claim not judged here must name the command that would judge it "
                          "(command is empty)")
    return Verdict(claim=claim, statement=statement, verdict=NOT_JUDGED, evidence=evidence,
                   note=f"{reason}; judged by `{command}`")


@dataclass(frozen=True)
class Part:
    """One stated part of a claim, in the claim's words, and what the evidence found for it.

    ``holds`` is True or False (computed), or None where this build cannot measure the part.
    ``found`` is the correct statement of a false part, or why an unmeasured part is not
    measured; a part that holds may leave it empty.
    """

    says: str
    holds: bool | None
    found: str = ""


def judge_parts(statement: str, parts: list[Part], evidence: str, *, claim: str = "",
                command: str = "", caveat: str | None = None,
                caveat_applies: bool | None = None, sensitivity: str = "") -> Verdict:
    """The verdict rule over a claim's stated parts (chapter: all).

    A false part makes the claim *wrong* (every false part named, with its correct statement),
    whatever the other parts; else a part this build cannot measure makes it *not judged here*
    (``command`` names what would judge it); else it holds, with ``caveat`` when
    ``caveat_applies`` (a condition of the claim's own setting, found by the evidence).
    """
    if not parts:
        raise MemlabError("judge_parts needs at least one stated part of the claim")
    for p in parts:
        if p.holds is not None:
            _check_bool(f"holds of part {p.says!r}", p.holds)
    false = [p for p in parts if p.holds is False]
    if false:
        return judge(statement, False, evidence, claim=claim, sensitivity=sensitivity,
                     correction="; ".join(f"{p.says}: {p.found}" if p.found else p.says
                                          for p in false))
    unmeasured = [p for p in parts if p.holds is None]
    if unmeasured:
        held = [p.says for p in parts if p.holds]
        reason = "; ".join(f"{p.says}: {p.found}" if p.found else p.says for p in unmeasured)
        if held:
            reason += "; what is measured holds (" + "; ".join(held) + ")"
        return not_judged(statement, evidence, reason, command=command, claim=claim)
    return judge(statement, True, evidence, claim=claim, caveat=caveat,
                 caveat_applies=caveat_applies, sensitivity=sensitivity)


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
class Move:
    """One physical change to a claim's setting, and the level its real evidence then gets.

    ``setting`` holds keyword arguments of the check's ``evidence`` (another model size,
    another implementation, another batch); ``change`` says the change in words.
    ``tests/test_claim_levels.py`` computes ``decide(evidence(**setting))`` and requires
    ``level``, a level other than the claim's own. ``slow`` marks a move that trains or
    launches processes.
    """

    change: str
    setting: dict = field(default_factory=dict)
    level: str = WRONG
    slow: bool = False


@dataclass(frozen=True)
class ClaimCheck:
    """A claim from the book's list, the function gathering its evidence and the one deciding it."""

    claim: str  # 'C01'
    chapter: str  # the page that shows the evidence, e.g. 'chapters/01_where_the_memory_goes'
    statement: str
    evidence: object  # (**setting) -> dict of measured or computed numbers
    decide: object  # (dict) -> Verdict
    moves: tuple = ()  # Move: a physical change of the setting and the level it gives

    def fn(self) -> Verdict:
        """The verdict on this page's evidence (chapter: all)."""
        return self.decide(self.evidence())


CHECKS: dict[str, ClaimCheck] = {}


def register(claim: str, chapter: str, statement: str, *, evidence, moves=()):
    """Decorator: register ``decide(ev) -> Verdict``, its ``evidence`` and its moves (chapter: all).

    Each :class:`Move`'s setting must name keyword arguments ``evidence`` accepts.
    """
    if not callable(evidence):
        raise MemlabError(f"evidence of claim {claim} must be a function returning a dict, "
                          f"got {evidence!r}")
    accepted = inspect.signature(evidence).parameters
    for m in moves:
        if not isinstance(m, Move):
            raise MemlabError(f"moves of claim {claim} must be claims.Move, got {m!r}")
        if m.level not in VERDICTS:
            raise MemlabError(f"move {m.change!r} of claim {claim}: level {m.level!r}; "
                              f"accepted: {', '.join(VERDICTS)}")
        unknown = [k for k in m.setting if k not in accepted]
        if unknown:
            raise MemlabError(f"move {m.change!r} of claim {claim} sets {unknown}, which "
                              f"{evidence.__name__}() does not take; it takes: "
                              f"{', '.join(accepted) or 'nothing'}")

    def wrap(decide):
        CHECKS[claim] = ClaimCheck(claim=claim, chapter=chapter, statement=statement,
                                   evidence=evidence, decide=decide, moves=tuple(moves))
        return decide

    return wrap


def claim_evidence(claim: str) -> dict:
    """The evidence of ``claim`` in its own setting, computed once per build (chapter: all).

    With ``$MEMLAB_CACHE_DIR`` set (the book build sets it) the dict is kept there, keyed by
    the library's source, so every page of one build shows the same numbers, timings included;
    without it, it is computed afresh.
    """
    from memlab.results import kept_on_disk

    return kept_on_disk(_evidence_of)(claim)


def _evidence_of(claim: str) -> dict:
    return CHECKS[claim].evidence()


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
                v = check.fn() if fresh else check.decide(claim_evidence(c))
                _COMPUTED[c] = Verdict(claim=c, statement=check.statement, verdict=v.verdict,
                                       evidence=v.evidence, note=v.note,
                                       sensitivity=v.sensitivity)
            out.append(_COMPUTED[c])
    return out
