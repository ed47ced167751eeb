"""Open every page of the built book in headless Chromium, with no network.

For each page under _build/html (except _static, _sources, genindex and search):

* no console error and no uncaught exception;
* no request leaves the local test server: any other URL is aborted and reported,
  so a page that needs a CDN fails here, not in a reader's offline browser;
* every local resource answers with a status below 400;
* every <img> loads and decodes, and every inline SVG output has a size;
* math is typeset by the MathJax served from the book (an mjx-container in every
  math element, no TeX error);
* saved ipywidgets render through the vendored widget manager;
* every internal <a href> reaches an existing file that the server returns with 200,
  and its #anchor exists in the target; external links are not fetched.

All problems are collected and reported together. A screenshot of each page is
written to _build/browser/ (next to the html folder).

    .venv/bin/pytest -m browser tests/test_browser.py

The labs' pages, read from the built files (no browser): each is the executed student version
(every check "not attempted"), holds no line of the instructor version's solutions or hidden
tests and no passage of its mark schemes, and its launch buttons (Colab, Binder, the .ipynb
download) open labs/student/; each chapter links its lab's published page.

Skips without a built book or without Chromium, unless MEMLAB_REQUIRE_HTML=1.
MEMLAB_HTML_DIR points it at another build; MEMLAB_CHROMIUM at another browser binary.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

pytestmark = pytest.mark.browser

SKIP_DIRS = {"_static", "_sources", "_images", "_downloads"}
SKIP_PAGES = {"genindex.html", "search.html", "py-modindex.html"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
RENDER_TIMEOUT_MS = 15_000

# Loads every <img> now (lazy ones too) and reports the ones that did not decode.
JS_IMAGES = """async () => {
  const imgs = [...document.images];
  imgs.forEach((img) => { img.loading = "eager"; });
  const settle = (img) => Promise.race([
    img.decode().then(() => true, () => false),
    new Promise((r) => setTimeout(() => r(false), 10000)),
  ]);
  const decoded = await Promise.all(imgs.map(settle));
  return imgs.map((img, i) => ({
    src: img.currentSrc || img.getAttribute("src") || "",
    complete: img.complete, width: img.naturalWidth, decoded: decoded[i],
  })).filter((r) => !(r.complete && r.decoded && r.width > 0));
}"""

# Inline SVG notebook outputs that are displayed but have no drawable size.
JS_EMPTY_SVG = """() => [...document.querySelectorAll(".cell_output svg, .output svg")]
  .filter((svg) => !svg.parentElement.closest("svg"))
  .filter((svg) => svg.getClientRects().length > 0)
  .filter((svg) => { const r = svg.getBoundingClientRect();
                     return svg.childElementCount === 0 || r.width === 0 || r.height === 0; })
  .map((svg) => (svg.id ? "#" + svg.id : "") + " " + svg.outerHTML.slice(0, 80))"""

# Waits for MathJax's first typeset, then reports what it did.
JS_MATH = """async (timeout) => {
  const nodes = [...document.querySelectorAll("span.math, div.math")];
  const script = [...document.scripts].find((s) => /mathjax/i.test(s.src));
  const out = { nodes: nodes.length, script: script ? script.src : null,
                loaded: false, untypeset: 0, errors: [] };
  const mj = window.MathJax;
  if (!mj || !mj.startup || !mj.startup.promise) return out;
  out.loaded = await Promise.race([
    mj.startup.promise.then(() => true, () => false),
    new Promise((r) => setTimeout(() => r(false), timeout)),
  ]);
  out.untypeset = nodes.filter((n) => !n.querySelector("mjx-container")).length;
  out.errors = [...document.querySelectorAll("mjx-merror")].map(
    (e) => e.getAttribute("data-mjx-error") || e.textContent);
  return out;
}"""

JS_WIDGETS_RENDERED = """(type) => [...document.querySelectorAll(`script[type="${type}"]`)]
  .every((s) => { const p = s.previousElementSibling;
                  return p && p.classList.contains("widget-subarea") && p.childElementCount > 0; })"""

JS_LINKS = """() => [...document.querySelectorAll("a[href]")]
  .map((a) => [a.getAttribute("href"), a.href])"""


def _book_pages(html: Path) -> list[Path]:
    pages = []
    for page in sorted(html.rglob("*.html")):
        rel = page.relative_to(html)
        if (
            rel.parts[0] in SKIP_DIRS
            or rel.as_posix() in SKIP_PAGES
            or any(part.startswith(".") for part in rel.parts)  # strays such as .pytest_cache/
        ):
            continue
        pages.append(page)
    return pages


class _PageScan(HTMLParser):
    """Collects the ids/names of one HTML file and a meta-refresh target if any."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refresh: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if a.get(key):
                self.ids.add(a[key])
        if tag == "meta" and (a.get("http-equiv") or "").lower() == "refresh":
            content = a.get("content") or ""
            if "url=" in content.lower():
                self.refresh = content[content.lower().index("url=") + 4 :].strip()


class LinkChecker:
    """Resolves internal links against the built folder and the server, with caches."""

    def __init__(self, html: Path, base_url: str) -> None:
        self.html = html
        self.base = urlsplit(base_url)
        self.origin = f"{self.base.scheme}://{self.base.netloc}/"
        self._status: dict[str, int | str] = {}
        self._scans: dict[Path, _PageScan] = {}

    def scan(self, path: Path) -> _PageScan:
        if path not in self._scans:
            scan = _PageScan()
            scan.feed(path.read_text(encoding="utf-8", errors="replace"))
            self._scans[path] = scan
        return self._scans[path]

    def is_local(self, url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and parts.netloc == self.base.netloc

    def _http_status(self, url: str) -> int | str:
        if url not in self._status:
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, method="HEAD"), timeout=10
                ) as r:
                    self._status[url] = r.status
            except urllib.error.HTTPError as err:
                self._status[url] = err.code
            except OSError as err:
                self._status[url] = f"{type(err).__name__}: {err}"
        return self._status[url]

    def check(self, raw: str, absolute: str) -> str | None:
        """None when the link is fine or not ours to check, else what is wrong with it."""
        if not self.is_local(absolute):
            return None  # external, mailto:, javascript: ... not fetched
        parts = urlsplit(absolute)
        target = (self.html / unquote(parts.path).lstrip("/")).resolve()
        if parts.path.endswith("/") or target.is_dir():
            target = target / "index.html"
        if not target.is_relative_to(self.html):
            return f"link {raw!r} leaves the book ({parts.path})"
        if not target.is_file():
            return f"link {raw!r}: no file {target.relative_to(self.html).as_posix()}"
        status = self._http_status(absolute.split("#", 1)[0])
        if status != 200:
            return f"link {raw!r}: server answered {status}"
        fragment = unquote(parts.fragment)
        if fragment and target.suffix == ".html" and fragment not in self.scan(target).ids:
            return f"link {raw!r}: no id {fragment!r} in {target.relative_to(self.html).as_posix()}"
        return None


def _notebook_figures(html_root: Path, rel: str) -> int | None:
    """Figures (PNG/JPEG/SVG outputs) stored in the notebook a page was built from, if any.

    A lab's page is built from its student version, committed without outputs: its figures are
    counted in the instructor version's outputs (the same cells draw them)."""
    source = html_root.parent.parent / (rel[: -len(".html")] + ".ipynb").replace("labs/student/",
                                                                                "labs/")
    if not source.is_file():
        return None
    cells = json.loads(source.read_text()).get("cells", [])
    return sum(
        any(k in out.get("data", {}) for k in ("image/png", "image/jpeg", "image/svg+xml"))
        for cell in cells for out in cell.get("outputs", [])
    )


def _check_page(browser, url: str, rel: str, links: LinkChecker, shots: Path,
                figures: int | None = None) -> list[str]:
    """Everything wrong with one page, as a first-time visitor sees it (fresh context)."""
    problems: list[str] = []
    offsite: list[str] = []  # requests aimed anywhere but the local server

    def block(route) -> None:
        offsite.append(route.request.url)
        route.abort()

    def on_console(msg) -> None:
        if msg.type == "error":
            loc = msg.location.get("url") or ""
            if loc and not links.is_local(loc) and "net::ERR_FAILED" in msg.text:
                return  # a blocked off-site request: reported once, below
            problems.append(f"console error: {msg.text}" + (f" [{loc}]" if loc else ""))

    http_errors: set[str] = set()

    def on_response(resp) -> None:
        if resp.status >= 400 and links.is_local(resp.url):
            http_errors.add(resp.url)
            problems.append(f"HTTP {resp.status} for {resp.url}")

    def on_request_failed(req) -> None:
        if links.is_local(req.url) and req.url not in http_errors:
            problems.append(f"request failed: {req.url} ({req.failure})")

    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    # Only URLs outside the local server are intercepted (local ones never reach Python).
    context.route(re.compile("^(?!" + re.escape(links.origin) + ")"), block)
    page = context.new_page()
    page.on("console", on_console)
    page.on("pageerror", lambda err: problems.append(f"uncaught exception: {err}"))
    page.on("response", on_response)
    page.on("requestfailed", on_request_failed)
    try:
        page.goto(url, wait_until="load", timeout=30_000)

        for bad in page.evaluate(JS_IMAGES):
            problems.append(
                f"image did not render: {bad['src'] or '(no src)'} "
                f"(complete={bad['complete']}, naturalWidth={bad['width']})"
            )
        if figures is not None:  # every figure the notebook made is on the page
            shown = page.locator('img[src*="_images/"]').count()
            if shown < figures:
                problems.append(f"{figures} figure(s) in the notebook, {shown} on the page")
        for svg in page.evaluate(JS_EMPTY_SVG):
            problems.append(f"inline SVG output has no size: {svg}")

        math = page.evaluate(JS_MATH, RENDER_TIMEOUT_MS)
        if math["nodes"]:
            if math["script"] is None:
                problems.append(f"{math['nodes']} math element(s) but no MathJax script")
            elif not links.is_local(math["script"]):
                problems.append(f"MathJax is not served by the book: {math['script']}")
            elif not math["loaded"]:
                problems.append(f"MathJax did not start ({math['script']})")
            elif math["untypeset"]:
                problems.append(
                    f"{math['untypeset']} of {math['nodes']} math element(s) not typeset"
                )
            problems.extend(f"TeX error: {e}" for e in math["errors"])

        views = page.locator(f'script[type="{WIDGET_VIEW}"]').count()
        if views:
            try:
                page.wait_for_function(
                    JS_WIDGETS_RENDERED, arg=WIDGET_VIEW, timeout=RENDER_TIMEOUT_MS
                )
            except Exception:  # playwright TimeoutError
                problems.append(f"ipywidgets: {views} saved widget view(s) did not render")

        try:
            page.wait_for_load_state("networkidle", timeout=RENDER_TIMEOUT_MS)
        except Exception:
            problems.append("network never went idle")

        seen: set[str] = set()
        for raw, absolute in page.evaluate(JS_LINKS):
            if absolute not in seen:
                seen.add(absolute)
                if issue := links.check(raw, absolute):
                    problems.append(issue)

        page.screenshot(path=str(shots / (rel.replace("/", "__")[:-5] + ".png")), full_page=True)
    except Exception as err:  # a page that cannot even load is one more problem
        problems.append(f"{type(err).__name__}: {err}")
    finally:
        context.close()
    problems += [f"request to a non-local host (blocked): {u}" for u in offsite]
    return problems


def test_book_pages_render_offline(built_html: Path, html_server: str, chromium_browser) -> None:
    pages = _book_pages(built_html)
    assert pages, f"no pages found under {built_html}"
    links = LinkChecker(built_html, html_server)
    shots = built_html.parent / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    for old in shots.glob("*.png"):
        old.unlink()

    report: list[str] = []
    loaded = 0
    start = time.perf_counter()
    for page_path in pages:
        rel = page_path.relative_to(built_html).as_posix()
        scan = links.scan(page_path)
        if scan.refresh is not None:  # Jupyter Book's index.html redirect: check its target
            issue = links.check(scan.refresh, urljoin(html_server + rel, scan.refresh))
            if issue:
                report.append(f"{rel}: redirect {issue}")
            continue
        problems = _check_page(chromium_browser, html_server + rel, rel, links, shots,
                               _notebook_figures(built_html, rel))
        report.extend(f"{rel}: {p}" for p in problems)
        loaded += 1
    elapsed = time.perf_counter() - start
    print(f"browser: {loaded} page(s) checked in {elapsed:.1f}s; screenshots in {shots}")

    assert not report, f"{len(report)} problem(s) in the built book:\n  " + "\n  ".join(report)


# ------------------------------------------------------------------ the published labs

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("lab*.ipynb"))
CHAPTERS = sorted((ROOT / "chapters").glob("0*.ipynb"))
SCHEME_WORDS = 8  # a run of this many words of a mark scheme on a page is a leak
REGIONS = {"### BEGIN SOLUTION": "### END SOLUTION", "### BEGIN HIDDEN TESTS": "### END HIDDEN TESTS",
           "=== BEGIN MARK SCHEME ===": "=== END MARK SCHEME ==="}


class _Text(HTMLParser):
    """A page's text as a reader sees it (code highlighting's spans joined), its <pre> blocks
    one by one, and every link."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self.pres: list[str] = []
        self.hrefs: list[str] = []
        self._pre = 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            self._pre += 1
            if self._pre == 1:
                self.pres.append("")
        if tag == "a" and dict(attrs).get("href"):
            self.hrefs.append(dict(attrs)["href"])

    def handle_endtag(self, tag):
        if tag == "pre" and self._pre:
            self._pre -= 1

    def handle_data(self, data):
        self.chunks.append(data)
        if self._pre:
            self.pres[-1] += data


def _read_html(path: Path) -> _Text:
    parsed = _Text()
    parsed.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parsed


def _regions(notebook: Path, begin: str) -> list[str]:
    """The text of every ``begin`` .. end region of a notebook's cells."""
    found = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        inside = None
        for line in "".join(cell["source"]).splitlines():
            if line.strip() == begin:
                inside = []
            elif line.strip() == REGIONS[begin] and inside is not None:
                found.append("\n".join(inside))
                inside = None
            elif inside is not None:
                inside.append(line)
    return found


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def _runs(words: list[str], n: int = SCHEME_WORDS) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def answer_leaks(instructor: Path, student: Path, text: str) -> list[str]:
    """What of the instructor version's answers ``text`` (a page, a file) shows: each solution or
    hidden-test line, and each run of a mark scheme's words, that the student version lacks."""
    kept = student.read_text(encoding="utf-8")
    sources = "\n".join("".join(c["source"]) for c in json.loads(kept)["cells"])
    leaks = [f"marker {m!r}" for m in (*REGIONS, *REGIONS.values()) if m in text]
    for begin, what in (("### BEGIN SOLUTION", "solution"), ("### BEGIN HIDDEN TESTS", "hidden test")):
        for region in _regions(instructor, begin):
            for line in sorted({ln.strip() for ln in region.splitlines()}):
                if len(line) >= 12 and line not in sources and line in text:
                    leaks.append(f"{what} line {line!r}")
    shown, own = _runs(_words(text)), _runs(_words(sources))
    for scheme in _regions(instructor, "=== BEGIN MARK SCHEME ==="):
        for run in sorted(_runs(_words(scheme)) & shown - own)[:3]:
            leaks.append(f"mark scheme words {' '.join(run)!r}")
    return leaks


def _file_text(path: Path) -> str:
    """A built file's text; a notebook's cells and outputs as text (its JSON escapes quotes)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    cells = json.loads(text)["cells"]
    return text + "\n".join("".join(c["source"]) + json.dumps(c.get("outputs", []))
                            for c in cells)


def _lab_files(built_html: Path, lab: Path) -> list[Path]:
    """Every built file of a lab: its page, its .ipynb download, anything else named after it."""
    return sorted(p for p in built_html.rglob(f"{lab.stem}*") if p.is_file())


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_a_lab_page_is_its_executed_student_version(built_html: Path, lab: Path) -> None:
    from memlab.labs.grader import get_lab, parse_check_line

    page = built_html / "labs" / "student" / f"{lab.stem}.html"
    assert page.is_file(), f"no published page {page.relative_to(built_html)}"
    assert not (built_html / "labs" / f"{lab.stem}.html").exists(), "the instructor version is built"
    student = ROOT / "labs" / "student" / lab.name
    problems = [f"{f.relative_to(built_html)}: {leak}" for f in _lab_files(built_html, lab)
                for leak in answer_leaks(lab, student, _file_text(f))]
    parsed = _read_html(page)
    problems += [f"{page.name}: {leak}"
                 for leak in answer_leaks(lab, student, "".join(parsed.chunks))]
    assert not problems, "answers on the published lab:\n  " + "\n  ".join(problems)

    checks = [parse_check_line(line) for pre in parsed.pres for line in pre.splitlines()]
    checks = [c for c in checks if c]
    assert [ex for ex, _ in checks] == list(get_lab(lab.stem.split("_")[0]).ids)
    assert {status for _, status in checks} == {"not attempted"}, checks


@pytest.mark.parametrize("lab", LABS, ids=[p.stem for p in LABS])
def test_a_lab_page_launches_the_student_version(built_html: Path, lab: Path) -> None:
    page = built_html / "labs" / "student" / f"{lab.stem}.html"
    launches = [h for h in _read_html(page).hrefs
                if "colab.research" in h or "mybinder" in h or h.endswith(".ipynb")]
    wanted = f"labs/student/{lab.name}"
    assert [h for h in launches if not h.endswith(wanted)] == []
    kinds = {"colab": "colab.research.google.com/github/", "binder": "mybinder.org/v2/gh/",
             "download": "_sources/"}
    missing = [k for k, where in kinds.items() if not any(where in h for h in launches)]
    assert not missing, f"no {missing} button on {page.name}: {launches}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_a_chapter_links_its_published_lab(built_html: Path, chapter: Path) -> None:
    page = built_html / "chapters" / f"{chapter.stem}.html"
    assert page.is_file(), f"no built chapter {page.relative_to(built_html)}"
    lab = next(p for p in LABS if p.name.startswith(f"lab{chapter.name[:2]}_"))
    hrefs = _read_html(page).hrefs
    assert f"../labs/student/{lab.stem}.html" in hrefs, "the chapter does not link its lab"
    assert not [h for h in hrefs if f"labs/{lab.stem}" in h], "it links the instructor version"
