"""The built book's files, read without a browser: links, anchors, what each page loads.

* every ``href`` (and ``src``) to a local file reaches one under _build/html, and its
  ``#anchor`` is an id (or an ``<a name>``) in the target page; external links are not checked
  here (no network in tests);
* a page that shows no widget loads no widget manager and carries no widget state;
* no source map (``*.map``) is published.

Marked ``browser`` as the other checks of the built book are (it needs the build, not Chromium).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.browser

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_JS = ("embed-amd.js", "require.js", "widgets-offline.js")


class _Page(HTMLParser):
    """The ids, links, script sources and script types of one HTML file."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.scripts: list[str] = []
        self.script_types: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag in ("a", "link") and a.get("href"):
            self.links.append(a["href"])
        if tag in ("img", "iframe") and a.get("src"):
            self.links.append(a["src"])
        if tag == "script":
            if a.get("src"):
                self.scripts.append(a["src"])
            self.script_types.append(a.get("type", ""))


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html")
                  if not {"_static", "_sources"} & set(p.relative_to(html).parts)
                  and not any(part.startswith(".") for part in p.relative_to(html).parts))


@pytest.fixture(scope="module")
def parsed(built_html: Path) -> dict[Path, _Page]:
    out = {}
    for page in _pages(built_html):
        p = _Page()
        p.feed(page.read_text(encoding="utf-8", errors="replace"))
        out[page] = p
    return out


def _target(html: Path, page: Path, href: str) -> tuple[Path, str] | None:
    """The local file and fragment a link points at; None for an external or non-file link."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:", "data:")):
        return None
    path = unquote(parts.path)
    target = page if not path else (page.parent / path).resolve()
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_every_internal_link_and_anchor_exists(built_html: Path, parsed) -> None:
    problems = []
    for page, p in parsed.items():
        rel = page.relative_to(built_html).as_posix()
        for href in dict.fromkeys(p.links):
            found = _target(built_html, page, href)
            if found is None:
                continue
            target, fragment = found
            if not target.is_relative_to(built_html):
                problems.append(f"{rel}: {href!r} leaves the book")
            elif not target.is_file():
                problems.append(f"{rel}: {href!r}: no file {target.relative_to(built_html)}")
            elif fragment and target.suffix == ".html" and fragment not in parsed.get(
                    target, _Page()).ids:
                problems.append(f"{rel}: {href!r}: no id {fragment!r} in "
                                f"{target.relative_to(built_html).as_posix()}")
    assert parsed, f"no pages under {built_html}"
    assert not problems, f"{len(problems)} broken link(s):\n  " + "\n  ".join(problems)


def test_a_page_without_widgets_loads_no_widget_manager(built_html: Path, parsed) -> None:
    shown, problems = 0, []
    for page, p in parsed.items():
        rel = page.relative_to(built_html).as_posix()
        if WIDGET_VIEW in p.script_types:
            shown += 1
            continue
        loads = [s for s in p.scripts if s.split("?")[0].endswith(WIDGET_JS)]
        if loads or WIDGET_STATE in p.script_types:
            problems.append(f"{rel}: no widget on the page, yet it loads {loads or 'widget state'}")
    assert shown, "no page shows a widget: the widget pages' check has nothing to hold"
    assert not problems, "\n  ".join(problems)


def test_no_source_maps_are_published(built_html: Path) -> None:
    maps = sorted(p.relative_to(built_html).as_posix() for p in built_html.rglob("*.map"))
    assert not maps, f"{len(maps)} source map(s) published: {maps[:5]}"
