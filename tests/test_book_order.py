"""The book executes its pages in reading order (``_ext/memlab_sphinx.py``), the appendix last."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _extension():
    spec = importlib.util.spec_from_file_location("memlab_sphinx", ROOT / "_ext" / "memlab_sphinx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_chapter_is_read_before_the_claims_appendix():
    order = _extension().toc_order(yaml.safe_load((ROOT / "_toc.yml").read_text()))
    chapters = sorted(str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "chapters").glob("*.ipynb"))
    assert [d for d in order if d.startswith("chapters/")] == chapters
    assert order[0] == "intro"
    assert max(order.index(c) for c in chapters) < order.index("appendix/claims")


def test_pages_outside_the_toc_come_first_and_sections_follow_their_chapter():
    ext = _extension()
    toc = {"root": "intro", "parts": [{"chapters": [
        {"file": "b", "sections": [{"file": "b1.ipynb"}]}, {"file": "a"}]}]}
    assert ext.toc_order(toc) == ["intro", "b", "b1", "a"]

    class App:
        srcdir = str(ROOT)

    docnames = ["appendix/claims", "chapters/01_where_the_memory_goes", "zz_orphan",
                "chapters/00_toolkit"]
    ext._read_in_book_order(App(), None, docnames)
    assert docnames == ["zz_orphan", "chapters/00_toolkit", "chapters/01_where_the_memory_goes",
                        "appendix/claims"]
