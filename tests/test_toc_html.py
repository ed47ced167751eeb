"""Every page the table of contents names has its HTML in the built book.

A page that fails to build can leave the rest of the book intact and the build green (``-n
--keep-going``); this test names each page of ``_toc.yml`` whose ``_build/html/<file>.html`` is
missing. The check over the built book skips without one, unless MEMLAB_REQUIRE_HTML=1 (the
`make test` path and the publishing workflow), where a missing build fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
TOC = REPO_ROOT / "_toc.yml"
SOURCE_SUFFIXES = (".ipynb", ".md", ".rst")


def _entries(node: object) -> Iterator[str]:
    """Every ``file`` (and the ``root``) under a node of a parsed ``_toc.yml``, in order."""
    if isinstance(node, dict):
        for key in ("root", "file"):
            if isinstance(node.get(key), str):
                yield node[key]
        for key in ("parts", "chapters", "sections", "subtrees", "entries"):
            yield from _entries(node.get(key))
    elif isinstance(node, list):
        for item in node:
            yield from _entries(item)


def toc_files(toc: Path) -> list[str]:
    """The pages ``toc`` names, as paths from the book's root without a suffix."""
    files = []
    for entry in _entries(yaml.safe_load(toc.read_text())):
        path = Path(entry)
        files.append(path.with_suffix("").as_posix() if path.suffix in SOURCE_SUFFIXES else entry)
    return files


def html_pages(toc: Path, html: Path) -> dict[str, Path]:
    """Each page of ``toc`` and the HTML file a build writes for it under ``html``."""
    return {f: html / f"{f}.html" for f in toc_files(toc)}


def missing_html(toc: Path, html: Path) -> list[str]:
    """The pages of ``toc`` whose HTML is not under ``html``, in the order of the contents."""
    return [f for f, page in html_pages(toc, html).items() if not page.is_file()]


def test_mapping_reads_every_kind_of_entry(tmp_path):
    toc = tmp_path / "_toc.yml"
    toc.write_text(
        "format: jb-book\n"
        "root: intro\n"
        "parts:\n"
        "  - caption: One\n"
        "    chapters:\n"
        "      - file: chapters/a\n"
        "        sections:\n"
        "          - file: chapters/a_more.md\n"
        "      - url: https://example.org\n"
        "        title: elsewhere\n"
        "  - caption: Labs\n"
        "    chapters:\n"
        "      - file: labs/student/lab00.ipynb\n"
    )
    html = tmp_path / "html"
    assert html_pages(toc, html) == {
        "intro": html / "intro.html",
        "chapters/a": html / "chapters/a.html",
        "chapters/a_more": html / "chapters/a_more.html",
        "labs/student/lab00": html / "labs/student/lab00.html",
    }
    for page in ("intro", "chapters/a"):
        (html / page).parent.mkdir(parents=True, exist_ok=True)
        (html / f"{page}.html").write_text("<html></html>")
    assert missing_html(toc, html) == ["chapters/a_more", "labs/student/lab00"]


def test_book_toc_names_the_published_pages():
    files = toc_files(TOC)
    assert files[0] == "intro" and len(files) == len(set(files))
    for f in files:
        sources = [REPO_ROOT / f"{f}{s}" for s in SOURCE_SUFFIXES]
        assert any(p.is_file() for p in sources), f"_toc.yml names {f}, which has no source file"
    labs = [f for f in files if f.startswith("labs/")]
    assert labs and all(f.startswith("labs/student/") for f in labs), labs  # student versions


def test_every_toc_page_has_html(built_html: Path):
    missing = missing_html(TOC, built_html)
    if missing:
        pytest.fail(f"the build wrote no HTML for {len(missing)} page(s) of _toc.yml: "
                    + ", ".join(f"{f} ({f}.html)" for f in missing), pytrace=False)
