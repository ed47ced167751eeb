"""A chapter and the claims appendix of one build show the same verdicts and evidence.

Each claim's evidence is computed once per build (``memlab.claims.claim_evidence`` keeps it in
``$MEMLAB_CACHE_DIR``), so the "Claims checked" table of the chapter that owns a claim and the
appendix's table must agree cell by cell. Reads the built HTML; skips without a built book,
unless MEMLAB_REQUIRE_HTML=1.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from memlab.book import import_rooms
from memlab.claims import CHECKS

CLAIM_ID = re.compile(r"^C\d\d$")


class _Rows(HTMLParser):
    """Every table row of a page as the text of its cells."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th") and self.rows:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def claim_rows(page: Path) -> dict[str, dict[str, str]]:
    """Each claim's row of the claims tables on ``page``: its cells by column name."""
    parser = _Rows()
    parser.feed(page.read_text(encoding="utf-8"))
    out, header = {}, []
    for row in parser.rows:
        if "claim" in row and "verdict" in row:
            header = row
        elif header and len(row) == len(header) and CLAIM_ID.match(row[header.index("claim")]):
            cells = dict(zip(header, row, strict=True))
            out[cells["claim"]] = {k: v for k, v in cells.items() if k and k != "chapter" and v}
    return out


def test_a_chapter_and_the_appendix_show_the_same_evidence(built_html: Path):
    import_rooms("claims")
    appendix = claim_rows(built_html / "appendix" / "claims.html")
    assert set(appendix) == set(CHECKS)
    chapters: dict[str, dict[str, list[str]]] = {}
    for claim, check in sorted(CHECKS.items()):
        page = built_html / f"{check.chapter}.html"
        rows = chapters.setdefault(check.chapter, claim_rows(page))
        assert claim in rows, f"{claim} is not in the claims table of {check.chapter}"
        assert rows[claim] == appendix[claim], (claim, rows[claim], appendix[claim])
