"""Verdicts on claims: each one computed from a result, never typed in.

A verdict is one of *holds*, *holds with a caveat* (the caveat stated), or *wrong* (with the
correct statement). Chapters build them from their own measurements with :func:`judge` and
show them with :func:`table`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memlab.errors import MemlabError

HOLDS = "holds"
CAVEAT = "holds with a caveat"
WRONG = "wrong"
VERDICTS = (HOLDS, CAVEAT, WRONG)


@dataclass(frozen=True)
class Verdict:
    """A claim, what the book found, and the evidence (a measured or computed number)."""

    claim: str  # the claim's id in the claims list (e.g. 'C05'), or '' for the book's own checks
    statement: str
    verdict: str
    evidence: str
    note: str = ""  # the caveat, or the correct statement when the claim is wrong

    def as_dict(self) -> dict:
        """The verdict as a plain dict (chapter: all)."""
        return asdict(self)


def judge(statement: str, holds: bool, evidence: str, *, claim: str = "",
          caveat: str | None = None, correction: str | None = None) -> Verdict:
    """Turn a computed truth value into a verdict (chapter: all).

    ``holds`` must come from a measurement or computation. A claim that holds only under a
    condition passes ``caveat``; a wrong one should pass ``correction``.
    """
    if not isinstance(holds, bool):
        raise MemlabError(f"holds must be True or False (computed), got {holds!r}")
    if holds:
        verdict, note = (CAVEAT, caveat) if caveat else (HOLDS, "")
    else:
        verdict, note = WRONG, correction or ""
    return Verdict(claim=claim, statement=statement, verdict=verdict, evidence=evidence,
                   note=note)


def table(verdicts: list[Verdict]):
    """The verdicts as a pandas DataFrame, or a list of dicts without pandas (chapter: all)."""
    rows = [v.as_dict() for v in verdicts]
    show_claim = any(v.claim for v in verdicts)
    show_note = any(v.note for v in verdicts)
    columns = (["claim"] if show_claim else []) + ["statement", "verdict", "evidence"] + (
        ["note"] if show_note else [])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is in the notebook extra
        return [{c: r[c] for c in columns} for r in rows]
    return pd.DataFrame(rows, columns=columns)


# The registry: each part's claims.py registers the checks of the claims its chapter owns. ------
@dataclass(frozen=True)
class ClaimCheck:
    """A claim from the book's list and the function that computes its verdict."""

    claim: str  # 'C01'
    chapter: str  # the page that shows the evidence, e.g. 'chapters/01_where_the_memory_goes'
    statement: str
    fn: object  # () -> Verdict


CHECKS: dict[str, ClaimCheck] = {}


def register(claim: str, chapter: str, statement: str):
    """Decorator: register the function computing a claim's verdict (chapter: all)."""

    def wrap(fn):
        CHECKS[claim] = ClaimCheck(claim=claim, chapter=chapter, statement=statement, fn=fn)
        return fn

    return wrap


_COMPUTED: dict[str, Verdict] = {}  # claim -> verdict, computed once per process


def verdicts(claims: list[str] | None = None, chapter: str | None = None, *,
             fresh: bool = False) -> list[Verdict]:
    """The verdicts of registered claims, all or some, in claim order; each computed once per process (chapter: all).

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
                                       evidence=v.evidence, note=v.note)
            out.append(_COMPUTED[c])
    return out
