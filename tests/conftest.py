"""Shared pytest fixtures."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Headless Chromium with nothing of its own going to the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(autouse=True)
def _no_report(monkeypatch):
    """No test appends to a learner's lab report, whatever the environment says."""
    from memlab.labs.grader import REPORT_ENV
    from memlab.results import CACHE_DIR_ENV

    monkeypatch.delenv(REPORT_ENV, raising=False)
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)  # tests compute, never reuse a kept result


def require_or_skip(reason: str) -> None:
    """Skip, or fail when MEMLAB_REQUIRE_HTML=1 (the `make test` path) demands the check."""
    if os.environ.get("MEMLAB_REQUIRE_HTML") == "1":
        pytest.fail(f"{reason} (MEMLAB_REQUIRE_HTML=1 forbids skipping)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(name="require_or_skip")
def _require_or_skip() -> object:
    """:func:`require_or_skip`, for tests in the part folders (which cannot import this file)."""
    return require_or_skip


@pytest.fixture(autouse=True)
def _close_figures():
    """Close the figures a test drew (only if it drew any)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(scope="session")
def built_html() -> Path:
    """The built book: _build/html, or the folder named by MEMLAB_HTML_DIR."""
    html = Path(os.environ.get("MEMLAB_HTML_DIR", REPO_ROOT / "_build" / "html")).resolve()
    if not (html / "index.html").is_file():
        require_or_skip(
            f"no built book at {html}/index.html; build it first with "
            "`.venv/bin/jupyter-book build . -n -W --keep-going`"
        )
    return html


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture(scope="session")
def html_server(built_html: Path) -> Iterator[str]:
    """Serve the built book on 127.0.0.1 (a free port); yields the base URL ending in '/'."""
    handler = functools.partial(_QuietHandler, directory=str(built_html))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[object]:
    """A headless Chromium (playwright), from MEMLAB_CHROMIUM, PATH or /usr/bin/chromium."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip("playwright is not installed (pip install playwright)")
    path = (os.environ.get("MEMLAB_CHROMIUM") or shutil.which("chromium")
            or shutil.which("chromium-browser") or "/usr/bin/chromium")
    if not os.access(path, os.X_OK):
        require_or_skip(
            f"Chromium not found ({path}); install it with `apt-get install chromium` "
            "(Debian/Ubuntu, as root), or set MEMLAB_CHROMIUM to a Chromium binary"
        )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def cli_error(capsys):
    """Run the memlab CLI and assert one line `memlab: error: ...`, exit code 2, with each needle."""
    from memlab.cli import main

    def check(argv, *needles):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("memlab: error: ") and err.count("\n") == 1, err
        for needle in needles:
            assert needle in err, err

    return check
