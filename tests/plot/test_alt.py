"""Every figure says what it shows (alt text from its data) and fits the column; tables show — (all chapters).

Every figure a test anywhere draws with a plot function is checked as it closes
(tests/conftest.py, :func:`memlab.plot.alt.figure_problems`); here: the text itself, the PNG a
notebook shows (output metadata and the PNG's own Description), the built pages' ``<img alt>``
and the tables' missing values.
"""

from __future__ import annotations

import base64
import io
import os
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.display import MISSING, frame_html  # noqa: E402
from memlab.plot.alt import describe, figure_alt, figure_problems  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_a_line_chart_names_its_axes_their_ranges_and_its_series():
    fig, ax = plt.subplots()
    ax.plot([512, 32768], [0.02, 0.41], "o-", label="llama2-7b")
    ax.plot([512, 32768], [0.01, 0.2], "o-", label="gpt2")
    ax.axhline(1.0, label="all")  # in axes units along x: no x range from it
    ax.set_xscale("log", base=2)
    ax.set(xlabel="sequence length T", ylabel="attention's share", title="Attention's share")
    ax.legend()
    alt = figure_alt(fig)
    assert alt.startswith("A line chart titled 'Attention's share'")
    assert "attention's share (0.01 to 1) against sequence length T (512 to 32,768, log scale)" \
        in alt
    assert "series: llama2-7b; gpt2; all" in alt
    assert figure_problems(fig) == []


def test_a_figure_s_own_sentence_comes_first_and_ends_with_a_stop():
    fig, ax = plt.subplots()
    ax.bar(["fp32", "bf16"], [16, 8])
    describe(fig, "bf16 halves the bytes: 8 against 16")
    alt = figure_alt(fig)
    assert alt.startswith("bf16 halves the bytes: 8 against 16. A bar chart")
    assert "fp32, bf16" in alt


def test_figure_problems_flags_a_wide_multi_panel_figure_and_a_file_name():
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax in axes:
        ax.plot([0, 1], [0, 1])
    assert any("2 panels in a figure 10.00 in wide" in p for p in figure_problems(fig))
    one, ax = plt.subplots(figsize=(10, 4))
    ax.axis("off")
    one._memlab_alt = ""
    one.get_axes()[0].set_visible(False)
    assert figure_problems(one) == ["alt text is not a sentence: 'A diagram.'"]
    delattr(one, "_memlab_alt")  # drawn wrong on purpose: not a plot function's figure
    plt.close(fig)


def test_the_diagrams_say_what_they_draw_with_computed_numbers():
    lora = figure_alt(mplot.lora_diagram(1024, 512, r=4))
    assert lora.startswith("Diagram of LoRA: the frozen weight W, 512 x 1,024 (524,288 weights)")
    assert f"{4 * (1024 + 512):,} trainable weights" in lora
    zero = figure_alt(mplot.who_holds_what(4))
    assert "bytes per parameter on one GPU: stage 0 16, stage 1 " in zero
    flops = figure_alt(mplot.flops_over_seq_len(("gpt2",), (256, 1024)))
    assert re.match(r"Counted training FLOPs over 6ND, batch 1: gpt2 \d\.\d\d at 256 tokens to "
                    r"\d\.\d\d at 1,024\. A line chart", flops)


def test_the_wide_figures_are_stacked_to_the_column_width():
    for fig in (mplot.who_holds_what(2), mplot.tiling(T=128, block=32)):
        assert figure_problems(fig) == []
    assert mplot.MAX_FIGURE_WIDTH_IN <= 7.5


# The PNG a notebook shows ---------------------------------------------------------------------


def _png_description(png: bytes) -> str:
    from PIL import Image

    return Image.open(io.BytesIO(png)).info.get("Description", "")


def test_a_notebook_s_figure_and_table_carry_alt_text_and_dashes(monkeypatch):
    """Executed by a kernel with the inline backend, as the book's build executes a chapter."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import memlab\nimport memlab.plot as mplot\nimport pandas as pd"),
        nbformat.v4.new_code_cell("fig = mplot.lora_diagram(256, 128, r=2)"),
        nbformat.v4.new_code_cell("pd.DataFrame({'x': [1.5, None], 'ok': [True, None]})"),
    ])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(  # the kernel imports this tree's memlab
        [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    shown = [o for o in nb.cells[1].outputs if "image/png" in o.get("data", {})]
    assert len(shown) == 1, nb.cells[1].outputs
    alt = shown[0]["metadata"]["image/png"]["alt"]
    assert alt.startswith("Diagram of LoRA: the frozen weight W, 128 x 256 (32,768 weights)")
    assert _png_description(base64.b64decode(shown[0]["data"]["image/png"])) == alt
    html = nb.cells[2].outputs[0]["data"]["text/html"]
    assert html.count(f"<td>{MISSING}</td>") == 2
    assert "None" not in html and "NaN" not in html


# Tables -----------------------------------------------------------------------------------------


def test_a_frame_s_missing_values_are_dashes_and_the_rest_is_pandas_own():
    frame = pd.DataFrame({"ratio": [1.1, np.nan, 1.0], "ok": [True, None, False],
                          "name": ["a", None, "c"]})
    html = frame_html(frame)
    assert html.count(f"<td>{MISSING}</td>") == 3
    assert "None" not in html and "NaN" not in html
    assert "None" in repr(frame)  # the plain text stays pandas' own
    nullable = pd.DataFrame({"n": pd.array([1, None], dtype="Int64"),
                             "when": pd.to_datetime(["2026-01-01", None])})
    assert frame_html(nullable).count(f"<td>{MISSING}</td>") == 2
    index = pd.MultiIndex.from_tuples([("full", 2048), ("full", 8192), ("LoRA", 2048)],
                                      names=["setup", "seq_len"])
    for full in (pd.DataFrame({"ratio": [1.1, 2.25, 3.0], "n": [1, 2, 3]}),
                 pd.DataFrame({"GiB": [80.0, 1 / 3, 2e9], "ok": [True, False, True]},
                              index=index)):
        assert frame_html(full) == full._repr_html_()  # nothing missing: pandas' own HTML


def test_a_chapter_s_table_shows_dashes_where_a_format_was_not_tried():
    from memlab.precision.formats import probe_formats

    table = probe_formats("cpu")
    html = frame_html(table)
    assert "None" not in html and "NaN" not in html
    assert html.count(f"<td>{MISSING}</td>") == int(table.isna().sum().sum())


# The built pages ---------------------------------------------------------------------------------


def test_every_image_of_a_chapter_page_has_alt_text_that_is_not_a_path(built_html,
                                                                        require_or_skip):
    pages = sorted((built_html / "chapters").glob("*.html"))
    if not pages:
        require_or_skip(f"no chapter pages under {built_html}/chapters")
    bad = []
    for page in pages:
        for img in re.findall(r"<img\b[^>]*>", page.read_text(encoding="utf-8")):
            if "_images/" not in img:  # the theme's logos: not the page's figures
                continue
            alt = re.search(r'\balt="([^"]*)"', img)
            text = alt.group(1) if alt else ""
            if len(text.split()) < 4 or re.fullmatch(r"\S+\.(png|jpe?g|svg|gif)", text.strip()):
                bad.append(f"{page.name}: {img[:120]}")
    assert not bad, f"{len(bad)} images without alt text: " + "; ".join(bad[:5])



def test_the_chapter_2_and_3_figures_without_a_result_say_what_they_show():
    import torch

    from memlab.precision import formats as F

    figs = [
        mplot.representable_values({f: F.representable(f) for f in ("fp8-e4m3", "fp8-e5m2")}),
        mplot.format_ranges({f: F.thresholds(f) for f in F.FLOAT_FORMATS}),
        mplot.quant_levels(torch.linspace(-1, 1, 9), {
            "3 levels": (torch.tensor([-1.0, 0.0, 1.0]), torch.linspace(-1, 1, 9).round()),
            "5 levels": (torch.linspace(-1, 1, 5), (torch.linspace(-1, 1, 9) * 2).round() / 2)}),
    ]
    for fig in figs:
        assert figure_problems(fig) == []
    assert "fp8-e4m3" in figure_alt(figs[0]) and "fp8-e5m2" in figure_alt(figs[0])
    assert figure_alt(figs[2]).startswith("2 panels, top to bottom.") or \
        figure_alt(figs[2]).startswith("Figure 'What a scheme can store'. 2 panels")


def test_the_estimated_figures_of_chapters_1_2_and_8_say_what_they_show():
    import torch

    from memlab.longcontext.where import length_table
    from memlab.precision import formats as F

    xs = torch.logspace(-8, 4, 1201, dtype=torch.float64)
    curves = {f: (xs, F.relative_error(xs, f)) for f in ("fp16", "bf16")}
    figs = {
        "long_context_pieces": mplot.long_context_pieces(length_table("llama3.1-8b")),
        "relative_error_curves": mplot.relative_error_curves(
            curves, eps={f: F.spec(f).eps for f in curves}),
        "error_histogram": mplot.error_histogram([0.01, -0.02, 0.005, 0.0]),
    }
    for name, fig in figs.items():
        assert figure_problems(fig) == [], name
    pieces = figure_alt(figs["long_context_pieces"])
    assert pieces.startswith("Figure 'llama3.1-8b")
    assert "2 panels, top to bottom" in pieces and "sequence length T (tokens)" in pieces
    assert figs["long_context_pieces"].get_figwidth() <= mplot.MAX_FIGURE_WIDTH_IN


def test_the_book_build_reads_the_alt_text_out_of_the_png(tmp_path):
    """What _ext/memlab_alt.py puts into a page's <img alt>: the PNG's Description."""
    sys.path.insert(0, str(REPO / "_ext"))
    try:
        from memlab_alt import png_description
    finally:
        sys.path.remove(str(REPO / "_ext"))
    from memlab.plot.alt import _png_with_alt

    fig = mplot.lora_diagram(64, 32, r=2)

    def printer(f, **kw):
        out = io.BytesIO()
        f.savefig(out, format="png", **kw)
        return out.getvalue()

    png, metadata = _png_with_alt(printer)(fig)
    (tmp_path / "f.png").write_bytes(png)
    assert png_description(tmp_path / "f.png") == metadata["alt"] == figure_alt(fig)
    (tmp_path / "g.png").write_bytes(b"not a png")
    assert png_description(tmp_path / "g.png") == ""


@pytest.mark.parametrize("page", ["intro", "chapters/01_where_the_memory_goes"])
@pytest.mark.parametrize("collected", [True, False], ids=["after-collector", "myst-nb-uri"])
def test_a_pages_image_gets_the_alt_of_the_png_its_uri_names(tmp_path, page, collected):
    """The hook finds myst-nb's output file from a page in a folder too, before or after Sphinx's
    image collector rewrote the uri relative to the source folder."""
    from types import SimpleNamespace

    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    sys.path.insert(0, str(REPO / "_ext"))
    try:
        from memlab_alt import _alt_from_png
    finally:
        sys.path.remove(str(REPO / "_ext"))
    png = tmp_path / "_build" / "jupyter_execute" / "abc.png"
    png.parent.mkdir(parents=True)
    info = PngInfo()
    info.add_text("Description", "A line chart of bytes against tokens.")
    Image.new("RGB", (2, 2)).save(png, pnginfo=info)
    rel = "_build/jupyter_execute/abc.png"
    image = (nodes.image(uri=rel, candidates={"*": rel}) if collected
             else nodes.image(uri="/" + rel))
    doctree = new_document("page", get_default_settings(Parser))
    doctree += image
    app = SimpleNamespace(srcdir=str(tmp_path), env=SimpleNamespace(docname=page))
    _alt_from_png(app, doctree)
    assert image["alt"] == "A line chart of bytes against tokens."
