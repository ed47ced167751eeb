"""The built book as readers meet it: on a phone, on a tablet, and through assistive technology.

In headless Chromium, with no network (tests/conftest.py's ``html_server`` serves _build/html):

* axe-core (vendored in tests/_vendor/axe-core by scripts/vendor_assets.sh) finds no serious or
  critical violation on each kind of page: the introduction, a chapter (chapter 2, with its bit
  viewers), a lab's student page and the claims appendix;
* the menu button opens the table of contents at phone (390 px) and tablet (800 px) widths, and
  a link in it is followed;
* at 390 px no output table is taller than its scroll area's limit, and no numeric cell wraps.

Screenshots at 390 px are written to _build/browser/phone/. Skips without a built book or without
Chromium, unless MEMLAB_REQUIRE_HTML=1.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

AXE = Path(__file__).parent / "_vendor" / "axe-core" / "axe.min.js"
BLOCKING = ("serious", "critical")
PHONE = {"width": 390, "height": 844}
TABLET = {"width": 800, "height": 1000}
TABLE_MAX_PX = 0.75 * PHONE["height"] + 1  # memlab-pages.css: max-height min(36rem, 75vh)
NUMERIC_CELL_CHARS = 24  # _ext/memlab_pages.py: a short cell with a digit is a number


def _one(built_html: Path, pattern: str) -> str:
    found = sorted(built_html.glob(pattern))
    assert found, f"no page {pattern} in {built_html}"
    return found[0].relative_to(built_html).as_posix()


@pytest.fixture(scope="module")
def pages(built_html: Path) -> dict[str, str]:
    """One page of each kind, as paths relative to the book's root."""
    return {"intro": _one(built_html, "intro.html"),
            "chapter": _one(built_html, "chapters/02_*.html"),
            "lab": _one(built_html, "labs/student/lab01_*.html"),
            "appendix": _one(built_html, "appendix/claims.html")}


@pytest.fixture
def open_page(chromium_browser, html_server):
    """Opens a page of the book at a viewport size in a fresh context; nothing leaves the server."""
    contexts = []

    def open_(rel: str, viewport: dict):
        context = chromium_browser.new_context(viewport=viewport, service_workers="block")
        contexts.append(context)
        context.route(re.compile("^(?!" + re.escape(html_server) + ")"), lambda r: r.abort())
        page = context.new_page()
        page.goto(html_server + rel, wait_until="load", timeout=30_000)
        return page

    yield open_
    for context in contexts:
        context.close()


JS_AXE = """async () => {
  const r = await axe.run(document, {resultTypes: ["violations"]});
  return r.violations.map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.length,
                                   first: v.nodes[0].html.slice(0, 160)}));
}"""


@pytest.mark.parametrize("kind", ["intro", "chapter", "lab", "appendix"])
def test_no_serious_accessibility_violation(open_page, pages, kind: str) -> None:
    page = open_page(pages[kind], {"width": 1280, "height": 900})
    page.add_script_tag(path=str(AXE))
    violations = page.evaluate(JS_AXE)
    counts = Counter()
    for v in violations:
        counts[v["impact"]] += v["nodes"]
    print(f"axe {pages[kind]}: {dict(counts) or 'no violations'}")
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    stale = any('class="bv-bit"' in v["first"] and "aria-label=" in v["first"] for v in blocking)
    assert not blocking, "\n  ".join(
        [f"{v['impact']} {v['id']} x{v['nodes']}: {v['first']}" for v in blocking]
        + ["(the page's bit viewers predate their named buttons: execute the chapter again)"]
        * stale)


@pytest.mark.parametrize("viewport", [PHONE, TABLET], ids=["phone", "tablet"])
def test_the_menu_button_opens_the_table_of_contents(open_page, pages, viewport) -> None:
    page = open_page(pages["intro"], viewport)
    toggle = page.locator(".primary-toggle:visible")
    assert toggle.count() >= 1, "no menu button on screen"
    toggle.first.click()
    dialog = page.locator("#pst-primary-sidebar-modal")
    dialog.wait_for(state="visible", timeout=5_000)
    link = dialog.locator("nav.bd-docs-nav a.reference.internal", has_text="Number formats")
    if link.count() == 0:
        link = dialog.locator("nav.bd-docs-nav a.reference.internal")
    assert link.first.is_visible(), "the table of contents is not on screen"
    href = link.first.get_attribute("href")
    link.first.click()
    page.wait_for_url(re.compile(re.escape(href.split("#")[0]) + "$"), timeout=10_000)


JS_TABLES = """(maxChars) => {
  const outputs = [...document.querySelectorAll(".cell_output .output.text_html")]
    .filter((o) => o.querySelector("table"));
  const tall = outputs.map((o) => o.getBoundingClientRect().height)
    .filter((h) => h > 0);
  const wrapped = [];
  for (const cell of document.querySelectorAll(".bd-content table td, .bd-content table th")) {
    const text = cell.textContent.trim();
    if (!text || text.length > maxChars || !/[0-9]/.test(text) || cell.children.length) continue;
    const range = document.createRange();
    range.selectNodeContents(cell);
    const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
    if (lines.size > 1) wrapped.push(text);
  }
  return {heights: tall, wrapped: wrapped.slice(0, 10), count: outputs.length};
}"""


@pytest.mark.parametrize("kind", ["chapter", "appendix"])
def test_tables_keep_to_a_height_and_numbers_do_not_wrap_on_a_phone(
        open_page, pages, built_html: Path, kind: str) -> None:
    page = open_page(pages[kind], PHONE)
    found = page.evaluate(JS_TABLES, NUMERIC_CELL_CHARS)
    shots = built_html.parent / "browser" / "phone"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / (Path(pages[kind]).stem + ".png")))
    assert found["count"], f"no table output on {pages[kind]}"
    too_tall = [round(h) for h in found["heights"] if h > TABLE_MAX_PX]
    assert not too_tall, f"table outputs taller than {TABLE_MAX_PX:.0f} px: {too_tall}"
    assert not found["wrapped"], f"numeric cells wrapped at 390 px: {found['wrapped']}"
