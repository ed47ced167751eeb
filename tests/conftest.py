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
def _close_figures(monkeypatch):
    """Close the figures a test drew (only if it drew any), each plot function's checked first.

    A figure a :mod:`memlab.plot` function drew must say what it shows and fit the column
    (:func:`memlab.plot.alt.figure_problems`), whichever test drew it and however it closes it.
    """
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        close = plt.close

        def checked_close(fig=None):
            alt = sys.modules.get("memlab.plot.alt")
            figs = [] if alt is None else [plt.figure(n) for n in plt.get_fignums()] \
                if fig is None or isinstance(fig, str) else [fig] if hasattr(fig, "get_axes") else []
            problems = [p for f in figs if hasattr(f, alt.ALT_ATTR) for p in alt.figure_problems(f)]
            close(fig)
            assert not problems, "; ".join(problems)

        monkeypatch.setattr(plt, "close", checked_close)
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


@pytest.fixture
def random_step():
    """``case(seed, **switches) -> (config, step)``: a small model and step drawn at random.

    Not chosen in advance: style, heads (GQA or not), width, depth, vocabulary, batch, length
    and precision come from ``seed``; ``switches`` maps a step switch to the values to draw from.
    """
    import random

    from memlab.model.config import ModelConfig

    def case(seed: int, **switches) -> tuple[ModelConfig, dict]:
        rng = random.Random(seed)
        style = rng.choice(["llama", "llama", "gpt2"])
        n_head = rng.choice([2, 4])
        cfg = ModelConfig(name=f"case{seed}", style=style, vocab_size=rng.randrange(500, 6000),
                          n_layer=rng.randrange(1, 5), n_head=n_head,
                          n_kv_head=rng.choice([None, n_head // 2]) if style == "llama" else None,
                          d_model=16 * n_head * rng.randrange(1, 3), max_seq_len=512)
        B, T = rng.randrange(1, 4), rng.randrange(16, 200)
        step = dict(batch_size=B, seq_len=T, precision=rng.choice(["fp32", "bf16-mixed", "bf16"]))
        for name, values in switches.items():
            step[name] = values(B * T, rng) if callable(values) else rng.choice(values)
        return cfg, step

    return case


@pytest.fixture
def held_to_trace():
    """``check(config, step)``: the estimate of a step within 3% of its trace, every phase."""
    from memlab.measure.step import trace_step
    from memlab.memory.estimator import estimate

    def check(cfg, step) -> None:
        traced = trace_step(cfg, **step)
        est = estimate(cfg, device="cpu", **step)
        for phase in ("forward", "backward", "optimizer"):
            assert est.phase_peak_bytes[phase] == pytest.approx(
                traced.phase_peak_bytes[phase], rel=0.03), (phase, step)
        assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes,
                                                            rel=0.03)

    return check
