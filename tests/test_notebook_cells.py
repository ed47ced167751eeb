"""What a reader sees in a notebook's code cells: nbval's markers are cell tags, not comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nbval.plugin import comment_markers, metadata_tags

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("labs/*.ipynb"),
                    *ROOT.glob("labs/student/*.ipynb"), *ROOT.glob("appendix/*.ipynb")])


def _code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "code"]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_nbval_markers_are_tags_the_page_hides(notebook):
    shown = [i for i, c in enumerate(_code_cells(notebook))
             if any(line.strip().lstrip("#").strip() in comment_markers
                    for line in "".join(c["source"]).splitlines())]
    assert not shown, f"{notebook.name}: code cells {shown} show an nbval comment; use a cell tag"
    tags = {t for c in _code_cells(notebook) for t in c["metadata"].get("tags", [])
            if t.startswith("nbval")}
    assert tags <= set(metadata_tags), tags - set(metadata_tags)


def test_the_book_checks_outputs_through_tags():
    tagged = sum("nbval-check-output" in c["metadata"].get("tags", [])
                 for nb in NOTEBOOKS for c in _code_cells(nb))
    assert tagged > len(NOTEBOOKS)
