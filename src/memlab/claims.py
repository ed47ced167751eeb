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
