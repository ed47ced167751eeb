"""The chapters' prose reads its numbers from the cells (memlab.book.glue, myst-nb's glue roles)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from memlab.book import glue

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`]+)`")


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _read_and_glued(path: Path) -> tuple[set[str], list[str]]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    read = {m.split("::")[-1].rsplit(":", 1)[0]
            for c in cells if c["cell_type"] == "markdown" for m in ROLE.findall(_source(c))}
    glued = [o["metadata"]["scrapbook"]["name"] for c in cells if c["cell_type"] == "code"
             for o in c.get("outputs", []) if "scrapbook" in o.get("metadata", {})]
    return read, glued


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_glued_name_is_glued_once_and_read(path):
    read, names = _read_and_glued(path)
    glued = set(names)
    assert len(glued) == len(names), f"a name is glued twice: {sorted(names)}"
    assert read <= glued, f"the prose reads names no cell glued: {sorted(read - glued)}"
    assert glued <= read, f"cells glue names the prose never reads: {sorted(glued - read)}"


def test_glue_writes_myst_nbs_hidden_output(monkeypatch):
    pytest.importorskip("myst_nb")
    shown = []
    monkeypatch.setattr("myst_nb.ext.glue.ipy_display",
                        lambda *objs, **kw: shown.append((objs, kw)))
    glue("bytes_per_token", 1_026_048)
    ((data,), kw), = shown
    assert data == {"application/papermill.record/text/plain": "1026048"}
    assert kw["metadata"]["scrapbook"]["name"] == "bytes_per_token"


def test_glue_does_nothing_without_myst_nb(monkeypatch):
    monkeypatch.setitem(sys.modules, "myst_nb", None)  # Colab, Binder
    assert glue("bytes_per_token", 1) is None
