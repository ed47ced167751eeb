"""The bit viewers of chapter 2: Python helpers, the ipywidgets version, and the browser script.

The script (memlab/interactive/static/bitviewer.js) is checked in headless Chromium against memlab.precision.formats,
bit for bit, over memlab.interactive.bitviewer.test_vectors(); the browser tests are marked ``browser`` and
skip without Chromium or playwright (unless MEMLAB_REQUIRE_HTML=1). ``check_viewer_on_page``
checks the first viewer of a built page; the last test runs it on the built chapter 2.
"""

from __future__ import annotations

import json
import math
import re
import struct
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.interactive import bitviewer as bv
from memlab.interactive.page import static_script
from memlab.precision.formats import bits, round_to, spec

REPO_ROOT = Path(__file__).resolve().parents[2]

CHAPTER_PAGE = "chapters/02_number_formats.html"
FLOATS = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2")


def _same(a: float, b: float) -> bool:
    """Equal bit for bit as doubles (-0.0 is not 0.0), or both NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack(">d", a) == struct.pack(">d", b)


class _Roles(HTMLParser):
    """Texts of the data-role elements and data-bits of each row, from the viewer's raw HTML."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: dict[str, dict[str, str]] = {}
        self.ids: list[str] = []
        self.urls: list[str] = []
        self._row: str | None = None
        self._role: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        for key in ("src", "href", "action", "poster"):
            if a.get(key):
                self.urls.append(a[key])
        if a.get("data-role") == "row":
            self._row = a["data-format"]
            self.rows[self._row] = {}
        elif a.get("data-role") == "bits" and self._row:
            self.rows[self._row]["bits"] = a["data-bits"]
        elif a.get("data-role") in ("value", "abs-error", "rel-error", "note", "fields"):
            self._role = a["data-role"]
            self.rows[self._row][self._role] = ""

    def handle_endtag(self, tag):
        self._role = None

    def handle_data(self, data):
        if self._role and self._row:
            self.rows[self._row][self._role] += data


def _roles(html: str) -> _Roles:
    p = _Roles()
    p.feed(html)
    return p


# ---- pure Python --------------------------------------------------------------------------

def test_decode_bits_reads_known_patterns():
    assert bv._decode_bits("0100001001001000", "fp16") == 3.140625
    assert bv._decode_bits("0100001001001001", "fp16") == 3.142578125  # mantissa LSB flipped
    assert bv._decode_bits("1100001001001000", "fp16") == -3.140625
    assert bv._decode_bits("0111110000000000", "fp16") == math.inf
    assert math.isnan(bv._decode_bits("0111110000000001", "fp16"))
    assert bv._decode_bits("0000000000000001", "fp16") == 2.0 ** -24
    assert _same(bv._decode_bits("1000000000000000", "fp16"), -0.0)
    assert bv._decode_bits("01111110", "fp8-e4m3") == 448.0
    assert math.isnan(bv._decode_bits("11111111", "fp8-e4m3"))
    assert bv._decode_bits("01111000", "fp8-e4m3") == 256.0  # all-ones exponent: a number
    assert bv._decode_bits("01111100", "fp8-e5m2") == math.inf
    assert bv._decode_bits("01111011", "fp8-e5m2") == 57344.0
    assert bv._decode_bits("0" + "1" * 7 + "0" + "1" * 7, "bf16") == spec("bf16").max
    assert bv._decode_bits("01000000010010010000111111011011", "fp32") == round_to(math.pi, "fp32")
    assert bv._decode_bits("11111111", "int8") == -1.0
    assert bv._decode_bits("10000000", "int8") == -128.0
    assert bv._decode_bits("1000", "int4") == -8.0
    assert bv._decode_bits("0111", "int4") == 7.0


@pytest.mark.parametrize("fmt", bv.VIEWER_FORMATS)
def test_decode_bits_inverts_formats_bits(fmt):
    s = spec(fmt)
    xs = [0.0, 1.0, -1.0, 3.0, s.max, s.min, 0.1, -2.5, 100.0, -7.0]
    if s.kind == "float":
        xs += [math.pi, s.min_subnormal, -s.min_normal, math.inf, math.nan, 1e30]
    for x in xs:
        b = bits(round_to(x, fmt), fmt)
        assert _same(bv._decode_bits(b.bit_string, fmt), b.value), (fmt, x, b)


def test_decode_bits_rejects_bad_input():
    with pytest.raises(MemlabError, match=r"a fp16 bit string is 16 characters, each '0' or '1'"):
        bv._decode_bits("0101", "fp16")
    with pytest.raises(MemlabError, match="each '0' or '1'"):
        bv._decode_bits("01x00000", "int8")
    with pytest.raises(MemlabError, match="unknown bit-viewer format 'nf4'; accepted: fp32, "):
        bv._decode_bits("0000", "nf4")


@pytest.mark.parametrize("call, needles", [
    (lambda: bv.bit_viewer(1.0, ("fp16", "fp64")),
     ["unknown bit-viewer format 'fp64'", "accepted: fp32, fp16, bf16, fp8-e4m3, fp8-e5m2, "
                                          "int8, int4"]),
    (lambda: bv.bit_viewer(1.0, "nf4"), ["unknown bit-viewer format 'nf4'"]),
    (lambda: bv.bit_viewer("abc"), ["not a number", "'inf', 'nan'", "'abc'"]),
    (lambda: bv.bit_viewer(None), ["not a number", "None"]),
    (lambda: bv.bit_viewer(True), ["not a number", "True"]),
    (lambda: bv.bit_viewer(1.0, ()), ["at least one format", "accepted: fp32"]),
    (lambda: bv.bit_widget(1.0, "fp64"), ["unknown bit-viewer format 'fp64'", "accepted:"]),
    (lambda: bv.bit_widget([1.0]), ["not a number"]),
])
def test_bad_input_is_one_line_naming_accepted_values(call, needles):
    pytest.importorskip("ipywidgets")
    with pytest.raises(MemlabError) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, msg


def test_format_config_comes_from_spec_and_torch():
    for fmt in bv.VIEWER_FORMATS:
        s, cfg = spec(fmt), bv.format_config(fmt)
        for key in ("bits", "exponent_bits", "mantissa_bits", "bias", "max", "min",
                    "min_normal", "min_subnormal", "has_inf", "has_nan"):
            assert cfg[key] == getattr(s, key), (fmt, key)
        if s.kind == "float":
            assert cfg["nan_bits"] == bits(math.nan, fmt).bit_string
            inf_stored = round_to(math.inf, fmt)
            assert cfg["infinity"] == ("inf" if math.isinf(inf_stored) else "saturate")
    # on this torch fp8-e4m3 (float8_e4m3fn) saturates: no inf to overflow to
    assert bv.format_config("fp8-e4m3")["overflow"] == ("saturate" if round_to(1e6, "fp8-e4m3")
                                                        == 448.0 else "nan")
    assert bv.format_config("fp16")["overflow"] == "inf"


def test_script_ships_as_package_data():
    script = resources.files("memlab.interactive") / "static" / "bitviewer.js"
    assert script.is_file()
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    package_data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^memlab = \[.*"interactive/static/\*\.js"', package_data, re.M), package_data
    text = script.read_text(encoding="utf-8")
    assert "memlabBitViewer" in text and "</script" not in text.lower()
    # parameters come from Python: no format's width, bias or maximum written into the script
    for literal in ("65504", "448", "57344", "127", "float8", "e4m3", "bf16"):
        assert literal not in text, literal


def test_viewer_html_is_self_contained_with_unique_ids():
    a, b = bv.bit_viewer().html(), bv.bit_viewer().html()
    for page in (a, b):
        assert "<style>" in page and "<script>" in page
        assert static_script("bitviewer.js") in page
        p = _roles(page)
        assert p.urls == []  # no src/href at all: nothing to fetch
        assert not re.search(r"https?://|url\(|@import|//cdn", page, re.I)
        assert len(p.ids) == len(set(p.ids))
    ids_a, ids_b = set(_roles(a).ids), set(_roles(b).ids)
    assert ids_a and not ids_a & ids_b
    config = json.loads(re.search(r'data-role="config">(.*?)</script>', a).group(1))
    assert config["value"] == repr(math.pi)
    assert [c["fmt"] for c in config["formats"]] == list(bv.DEFAULT_FORMATS)
    assert config["formats"][0] == bv.format_config("fp32")


@pytest.mark.parametrize("value", [math.pi, "0.1", 65520.0, 1e-8, "nan", -0.0, 300, "464"])
def test_first_render_is_what_memlab_formats_says(value):
    viewer = bv.bit_viewer(value, bv.VIEWER_FORMATS)
    x = float(value)
    rows = _roles(viewer._repr_html_()).rows
    assert list(rows) == list(bv.VIEWER_FORMATS)
    for fmt, row in rows.items():
        if spec(fmt).kind == "int" and math.isnan(x):
            assert row["bits"] == "" and row["note"] == f"NaN has no {fmt} value"
            continue
        want = bits(round_to(x, fmt), fmt) if spec(fmt).kind == "int" else bits(x, fmt)
        assert row["bits"] == want.bit_string, fmt
        assert row["value"] == repr(want.value), fmt
    assert "fp16" in repr(viewer) and "\n" in repr(viewer)


def test_side_by_side_false_starts_with_one_format():
    html = bv.bit_viewer(1.0, ("fp16", "bf16"), side_by_side=False).html()
    assert 'data-mode="fp16"' in html and '<option value="fp16" selected>' in html
    assert 'data-mode="all"' in bv.bit_viewer(1.0, ("fp16", "bf16")).html()


def test_test_vectors_cover_edges_and_every_small_pattern():
    vecs = bv.test_vectors(n_random=30, seed=1, n_patterns=100)
    dec = [v for v in vecs if v["op"] == "decode"]
    for fmt, n in (("fp8-e4m3", 256), ("fp8-e5m2", 256), ("int8", 256), ("int4", 16),
                   ("fp16", 100), ("bf16", 100), ("fp32", 100)):
        got = [v for v in dec if v["fmt"] == fmt]
        assert len(got) == n, fmt
        if n == 2 ** spec(fmt).bits:
            assert sorted(v["bit_string"] for v in got) == [format(i, f"0{spec(fmt).bits}b")
                                                             for i in range(n)]
    enc = [v for v in vecs if v["op"] == "encode"]
    for fmt in FLOATS:
        inputs = [v["input"] for v in enc if v["fmt"] == fmt]
        for must in (0.0, -0.0, spec(fmt).min_subnormal, spec(fmt).max, math.inf, 65520.0,
                     448.0, 464.0, 57344.0, math.pi, 0.1):
            assert any(_same(x, must) for x in inputs), (fmt, must)
        assert any(math.isnan(x) for x in inputs)
    for v in enc:
        if spec(v["fmt"]).kind == "float":
            b = bits(v["input"], v["fmt"])
            assert (v["bit_string"], v["note"]) == (b.bit_string, b.note)
            assert _same(v["value"], b.value)
    assert repr(bv.test_vectors(n_random=5, seed=2)) == repr(bv.test_vectors(n_random=5, seed=2))


# ---- the ipywidgets viewer ----------------------------------------------------------------

def _widget_text(box, role: str) -> str:
    m = re.search(rf'data-role="{role}">(.*?)</span></div>', box.output.value)
    return m.group(1) if m else ""


def test_widget_flipping_a_checkbox_recomputes_from_the_bits():
    pytest.importorskip("ipywidgets")
    box = bv.bit_widget(math.pi, "fp16")
    cbs = box.checkboxes
    assert len(cbs) == 16 and all(cb.indent is False for cb in cbs)
    assert "".join("1" if cb.value else "0" for cb in cbs) == bits(math.pi, "fp16").bit_string
    assert _widget_text(box, "value") == "3.140625"
    assert _widget_text(box, "note") == "normal, rounded"
    cbs[-1].value = not cbs[-1].value  # the mantissa's least significant bit
    assert _widget_text(box, "value") == "3.142578125"
    assert _widget_text(box, "abs-error") == f"+{3.142578125 - math.pi!r}"
    assert _widget_text(box, "note") == "bits edited: normal"
    cbs[0].value = True  # the sign
    assert _widget_text(box, "value") == "-3.142578125"
    for cb in cbs[1:6]:
        cb.value = True
    assert _widget_text(box, "value") == "nan"
    assert box.controls["value"].value == repr(math.pi)  # the typed value stays


def test_widget_value_and_format_changes_re_encode():
    pytest.importorskip("ipywidgets")
    box = bv.bit_widget("0.1", "bf16")
    box.controls["value"].value = "65520"
    box.controls["format"].value = "fp16"
    assert len(box.checkboxes) == 16
    assert "".join("1" if cb.value else "0" for cb in box.checkboxes) == "0111110000000000"
    assert _widget_text(box, "value") == "inf"
    assert _widget_text(box, "note") == "overflow \u2192 inf"
    box.controls["format"].value = "fp8-e4m3"
    assert len(box.checkboxes) == 8 and _widget_text(box, "value") == "448.0"
    box.controls["format"].value = "int4"
    assert _widget_text(box, "note") == "saturated" and _widget_text(box, "value") == "7.0"
    box.controls["value"].value = "-2.5"
    assert "".join("1" if cb.value else "0" for cb in box.checkboxes) == "1110"
    assert _widget_text(box, "value") == "-2.0" and _widget_text(box, "note") == "rounded"
    box.controls["value"].value = "two"
    assert box.output.value.startswith("<div>memlab: error: not a number")
    box.controls["value"].value = "nan"
    assert _widget_text(box, "note") == "NaN has no int4 value"


def test_widget_html_and_helpers_are_pure():
    html = bv._widget_html(0.1, "fp32", "", edited=False)
    assert 'data-field="sign"' in html and "0.10000000149011612" in html
    assert bv._fields_text("0100001001001000", "fp16") == (
        "sign 0 (+) | exponent 10000 = 16 - bias 15 = 1 | mantissa 1.1001001000 (binary) = 1.5703125")
    assert bv._fields_text("0000000000000001", "fp16").startswith(
        "sign 0 (+) | exponent 00000: subnormal, 2^(1 - bias 15) = 2^-14")
    assert bv._fields_text("11111101", "int8") == (
        "two's complement: sign bit 1 weighs -128, bits 1111101 = 125, value -128 + 125 = -3")
    assert bv._error_texts(3.140625, math.pi) == (f"{3.140625 - math.pi!r}", "3.08e-04")
    assert bv._error_texts(math.inf, math.inf) == ("0", "0")
    assert bv._error_texts(5.0, 0.0) == ("+5.0", "inf")
    assert bv._pattern_note("0000000000000001", "fp16") == "subnormal"


# ---- in the browser -----------------------------------------------------------------------

JS_CODEC = """(vecs) => {
  const bv = window.memlabBitViewer;
  const cfg = {};
  for (const el of document.querySelectorAll('script[data-role="config"]')) {
    for (const c of JSON.parse(el.textContent).formats) cfg[c.fmt] = c;
  }
  const dv = new DataView(new ArrayBuffer(8));
  const hex = (v) => { dv.setFloat64(0, v);
    return [0, 4].map((i) => dv.getUint32(i).toString(16).padStart(8, "0")).join(""); };
  return vecs.map(([op, fmt, text, bitString]) => {
    const c = cfg[fmt];
    if (op === "encode") {
      const e = bv.encode(bv.parseValue(text), c);
      return [e.bitString, hex(e.value), bv.pyRepr(e.value), e.note];
    }
    const v = bv.decode(parseInt(bitString, 2), c);
    return [bitString, hex(v), bv.pyRepr(v), null];
  });
}"""

JS_ROWS = """(root) => Object.fromEntries([...root.querySelectorAll('[data-role="row"]')].map(
  (row) => [row.dataset.format, {
    bits: row.querySelector('[data-role="bits"]').dataset.bits,
    value: row.querySelector('[data-role="value"]').textContent,
    "abs-error": row.querySelector('[data-role="abs-error"]').textContent,
    "rel-error": row.querySelector('[data-role="rel-error"]').textContent,
    note: row.querySelector('[data-role="note"]').textContent,
    fields: row.querySelector('[data-role="fields"]').textContent,
    hidden: row.hidden, edited: row.dataset.edited }]))"""


class _Watch:
    """Console errors, uncaught exceptions and network requests of one page."""

    def __init__(self, page, local_origin: str | None = None) -> None:
        self.problems: list[str] = []
        self.requests: list[str] = []

        def route(r):
            self.requests.append(r.request.url)
            r.abort()

        pattern = (re.compile("^(?!" + re.escape(local_origin) + ")") if local_origin
                   else re.compile(".*"))
        page.context.route(pattern, route)
        page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"console error: {m.text}"))
        page.on("pageerror", lambda err: self.problems.append(f"uncaught exception: {err}"))

    def check(self) -> None:
        assert not self.problems, self.problems
        assert not self.requests, f"requests left the page: {self.requests}"


@pytest.fixture
def open_viewer(chromium_browser):
    """Opens HTML (one or more viewers) in a fresh offline page; checks for errors afterwards."""
    contexts, watches = [], []

    def open_(html: str, *, javascript: bool = True, dark: bool = False):
        context = chromium_browser.new_context(java_script_enabled=javascript,
                                               viewport={"width": 1100, "height": 900})
        contexts.append(context)
        page = context.new_page()
        watches.append(_Watch(page))
        theme = ' data-theme="dark" style="background:#121212;color:#ced6dd"' if dark else ""
        page.set_content(f"<!DOCTYPE html><html{theme}><head><meta charset='utf-8'></head>"
                         f"<body>{html}</body></html>")
        if javascript:
            page.wait_for_selector("[data-memlab-bitviewer][data-ready='1']", state="attached")
        return page

    yield open_
    try:
        for w in watches:
            w.check()
    finally:
        for c in contexts:
            c.close()


def _vector_rows(vecs) -> list[list]:
    return [[v["op"], v["fmt"], None if v["input"] is None else repr(v["input"]),
             v["bit_string"]] for v in vecs]


@pytest.mark.browser
def test_js_codec_matches_memlab_formats_bit_for_bit(open_viewer):
    page = open_viewer(bv.bit_viewer(1.0, bv.VIEWER_FORMATS).html())
    vecs = bv.test_vectors()
    got = page.evaluate(JS_CODEC, _vector_rows(vecs))
    bad = []
    for v, (bit_string, value_hex, value_repr, note) in zip(vecs, got, strict=True):
        value = struct.unpack(">d", bytes.fromhex(value_hex))[0]
        ok = (bit_string == v["bit_string"] and _same(value, v["value"])
              and value_repr == repr(v["value"]) and note == v["note"])
        if not ok:
            bad.append((v, (bit_string, value, value_repr, note)))
    assert not bad, f"{len(bad)} of {len(vecs)} vectors differ, e.g. {bad[:5]}"


def _click(page, fmt: str, index: int, nth: int = 0) -> None:
    root = page.locator("[data-memlab-bitviewer]").nth(nth)
    root.locator(f'button[data-format="{fmt}"][data-bit-index="{index}"]').click()


@pytest.mark.browser
def test_clicking_bits_flips_them_and_decodes_like_torch(open_viewer):
    page = open_viewer(bv.bit_viewer(math.pi).html() + bv.bit_viewer(448.0, "fp8-e4m3").html())
    first, second = page.locator("[data-memlab-bitviewer]").all()
    assert first.get_attribute("id") != second.get_attribute("id")
    rows = first.evaluate(JS_ROWS)
    assert rows["fp16"]["value"] == "3.140625"

    _click(page, "fp16", 0)  # mantissa LSB
    rows = first.evaluate(JS_ROWS)
    assert rows["fp16"]["bits"] == "0100001001001001"
    assert rows["fp16"]["value"] == "3.142578125" == repr(bv._decode_bits(rows["fp16"]["bits"],
                                                                         "fp16"))
    assert rows["fp16"]["abs-error"] == f"+{3.142578125 - math.pi!r}"
    assert rows["fp16"]["note"] == "bits edited: normal" and rows["fp16"]["edited"] == "true"
    assert page.locator('input[data-role="input"]').first.input_value() == repr(math.pi)
    button = first.locator('button[data-format="fp16"][data-bit-index="0"]')
    assert button.get_attribute("aria-pressed") == "true"
    assert first.get_by_role("button", name="fp16 bit 0, mantissa, 1", exact=True).count() == 1
    assert button.get_attribute("aria-label") is None  # its name contains its visible digit

    _click(page, "fp16", 15)  # the sign
    assert first.evaluate(JS_ROWS)["fp16"]["value"] == "-3.142578125"

    for fmt, index in (("fp32", 31), ("fp32", 22), ("bf16", 14), ("fp8-e5m2", 0)):
        _click(page, fmt, index)
        row = first.evaluate(JS_ROWS)[fmt]
        want = bv._decode_bits(row["bits"], fmt)
        assert row["value"] == repr(want), (fmt, row)
        assert row["note"] == f"bits edited: {bv._pattern_note(row['bits'], fmt)}"

    # the keyboard flips a focused bit too
    first.locator('button[data-format="fp8-e4m3"][data-bit-index="6"]').focus()
    page.keyboard.press("Enter")
    row = first.evaluate(JS_ROWS)["fp8-e4m3"]
    assert row["value"] == repr(bv._decode_bits(row["bits"], "fp8-e4m3"))

    # the second viewer did not move; its mantissa LSB turns 448 into the NaN pattern
    assert second.evaluate(JS_ROWS)["fp8-e4m3"]["bits"] == "01111110"
    _click(page, "fp8-e4m3", 0, nth=1)
    row = second.evaluate(JS_ROWS)["fp8-e4m3"]
    assert row["bits"] == "01111111" and row["value"] == "nan"
    assert row["note"] == "bits edited: NaN"

    first.locator('button[data-role="reset"]').click()
    assert first.evaluate(JS_ROWS)["fp16"]["bits"] == bits(math.pi, "fp16").bit_string


@pytest.mark.browser
def test_typing_a_value_re_encodes_every_format(open_viewer):
    page = open_viewer(bv.bit_viewer(1.0, bv.VIEWER_FORMATS).html())
    root = page.locator("[data-memlab-bitviewer]")
    box = root.locator('input[data-role="input"]')
    for text in ("0.1", "65520", "1e-8", "-inf", "nan", "464", "-0", "1e39", "-2.5",
                 "6.103515625e-05", "1_000"):
        box.fill(text)
        x = float(text)
        rows = root.evaluate(JS_ROWS)
        for fmt in bv.VIEWER_FORMATS:
            row = rows[fmt]
            if spec(fmt).kind == "int" and math.isnan(x):
                assert row["bits"] == "" and row["value"] == "\u2013"
                continue
            want = bits(round_to(x, fmt) + 0.0, fmt) if spec(fmt).kind == "int" else bits(x, fmt)
            assert row["bits"] == want.bit_string, (text, fmt)
            assert row["value"] == repr(want.value), (text, fmt)
            assert row["edited"] == "false"
            if spec(fmt).kind == "float":
                assert row["note"].startswith(want.note.replace("->", "\u2192")), (text, fmt)
    before = root.evaluate(JS_ROWS)
    box.fill("three")
    assert box.get_attribute("aria-invalid") == "true"
    assert "not a number" in root.locator('[data-role="status"]').text_content()
    assert root.evaluate(JS_ROWS) == before


@pytest.mark.browser
def test_script_keeps_the_first_render_and_the_selector_shows_one_format(open_viewer):
    values = (math.pi, 0.1, 65520.0, 1e-8, math.nan, -0.0, 300.0, 464.0, 2.0 ** -140, 1e39)
    html = "".join(bv.bit_viewer(v, bv.VIEWER_FORMATS).html() for v in values)
    static, live = open_viewer(html, javascript=False), open_viewer(html)
    root = "[data-memlab-bitviewer]"
    assert live.locator(f"{root}[data-ready='1']").count() == len(values)
    for i, value in enumerate(values):  # the script's texts are Python's, to the character
        assert (static.locator(root).nth(i).evaluate(JS_ROWS)
                == live.locator(root).nth(i).evaluate(JS_ROWS)), value
    live = open_viewer(bv.bit_viewer(math.pi, bv.VIEWER_FORMATS).html())
    rows = live.locator(root).evaluate(JS_ROWS)
    assert not any(r["hidden"] for r in rows.values())
    live.locator('select[data-role="mode"]').select_option("bf16")
    rows = live.locator(root).evaluate(JS_ROWS)
    assert [f for f, r in rows.items() if not r["hidden"]] == ["bf16"]
    live.locator('select[data-role="mode"]').select_option("all")
    assert not any(r["hidden"] for r in live.locator(root).evaluate(JS_ROWS).values())
    one = open_viewer(bv.bit_viewer(1.0, ("fp16", "bf16"), side_by_side=False).html())
    rows = one.locator(root).evaluate(JS_ROWS)
    assert [f for f, r in rows.items() if not r["hidden"]] == ["fp16"]


# How notebook front ends show a text/html output: innerHTML (scripts inert), then each
# script replaced by a fresh copy so that it runs, in a host that may be attached only later.
JS_AS_A_NOTEBOOK_OUTPUT = """([html, attachFirst]) => {
  const host = document.createElement("div");
  if (attachFirst) document.body.appendChild(host);
  host.innerHTML = html;
  for (const old of host.querySelectorAll("script")) {
    const s = document.createElement("script");
    for (const a of old.attributes) s.setAttribute(a.name, a.value);
    s.textContent = old.textContent;
    old.parentNode.replaceChild(s, old);
  }
  if (!attachFirst) document.body.appendChild(host);
}"""


@pytest.mark.browser
def test_runs_as_a_live_notebook_output(open_viewer):
    page = open_viewer(bv.bit_viewer(0.5, "fp16").html())  # one viewer already on the page
    for attach_first in (True, False):
        page.evaluate(JS_AS_A_NOTEBOOK_OUTPUT, [bv.bit_viewer(2.5, "bf16").html(), attach_first])
    page.wait_for_function(
        "() => document.querySelectorAll('[data-memlab-bitviewer][data-ready=\"1\"]').length === 3")
    roots = page.locator("[data-memlab-bitviewer]")
    for i in (1, 2):
        roots.nth(i).locator('button[data-bit-index="0"]').click()
        row = roots.nth(i).evaluate(JS_ROWS)["bf16"]
        assert row["bits"] == "0100000000100001" and row["value"] == repr(2.515625)
    assert roots.nth(0).evaluate(JS_ROWS)["fp16"]["bits"] == bits(0.5, "fp16").bit_string


@pytest.mark.browser
def test_readable_in_dark_mode(open_viewer):
    page = open_viewer(bv.bit_viewer().html(), dark=True)
    cell = page.locator('button[data-bit-index="0"][data-format="fp16"]')
    colour, background = cell.evaluate(
        "(b) => [getComputedStyle(b).color, getComputedStyle(b).backgroundColor]")
    assert colour == "rgb(17, 17, 17)" and background == "rgb(0, 158, 115)"
    text = page.locator('[data-role="value"]').first.evaluate("(e) => getComputedStyle(e).color")
    assert text == "rgb(206, 214, 221)"  # the page's own text colour, not a fixed dark one


# ---- the built chapter ------------------------------------------------------------------

def check_viewer_on_page(page) -> dict:
    """Checks the page's first bit viewer: its bits are memlab.precision.formats', a click decodes like torch.

    Clicks the mantissa LSB (or bit 0) of the first format shown, compares the displayed bits
    and value with memlab.precision.formats and ``_decode_bits``, clicks it back. Returns what it read.
    """
    root = page.locator("[data-memlab-bitviewer]").first
    root.wait_for(state="attached", timeout=15_000)
    page.wait_for_function(
        "() => document.querySelector('[data-memlab-bitviewer]').dataset.ready === '1'",
        timeout=15_000)
    x = float(root.locator('input[data-role="input"]').input_value())
    row = root.locator('[data-role="row"]:not([hidden])').first
    fmt = row.get_attribute("data-format")
    rows = root.evaluate(JS_ROWS)
    for f, r in rows.items():
        if spec(f).kind == "float" or not math.isnan(x):
            want = bits(x, f) if spec(f).kind == "float" else bits(round_to(x, f) + 0.0, f)
            assert (r["bits"], r["value"]) == (want.bit_string, repr(want.value)), (f, r)
    row.locator('button[data-bit-index="0"]').click()
    after = root.evaluate(JS_ROWS)[fmt]
    assert after["bits"] != rows[fmt]["bits"] and after["bits"][:-1] == rows[fmt]["bits"][:-1]
    want = bv._decode_bits(after["bits"], fmt)
    assert after["value"] == repr(want), (fmt, after, want)
    row.locator('button[data-bit-index="0"]').click()
    assert root.evaluate(JS_ROWS)[fmt]["bits"] == rows[fmt]["bits"]
    return {"format": fmt, "typed": x, "bits": rows[fmt]["bits"], "flipped": after["bits"],
            "flipped_value": want}


@pytest.mark.browser
def test_bit_viewer_on_the_built_chapter(built_html: Path, html_server: str, chromium_browser,
                                         require_or_skip):
    if not (built_html / CHAPTER_PAGE).is_file():
        require_or_skip(f"{CHAPTER_PAGE} is not in the build at {built_html}")
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900},
                                           service_workers="block")
    try:
        page = context.new_page()
        watch = _Watch(page, local_origin=html_server)
        page.goto(html_server + CHAPTER_PAGE, wait_until="load", timeout=30_000)
        assert page.locator("[data-memlab-bitviewer]").count() >= 1, "no bit viewer on the page"
        check_viewer_on_page(page)
        watch.check()
    finally:
        context.close()


@pytest.mark.slow
def test_bit_widget_builds_with_colabs_ipywidgets_7(tmp_path):
    """Colab ships ipywidgets 7.7.1 and renders it natively; the widget must build with it too."""
    import subprocess
    import sys

    got = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                          str(tmp_path), "ipywidgets==7.7.1", "ipython_genutils"],
                         capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(f"ipywidgets 7.7.1 could not be downloaded here: {got.stderr.strip()[-200:]}")
    code = ("import ipywidgets; from memlab.interactive.bitviewer import bit_widget; "
            "w = bit_widget(0.1, 'fp16'); w.controls['format'].value = 'bf16'; "
            "w.checkboxes[-1].value = not w.checkboxes[-1].value; print(ipywidgets.__version__, "
            "len(w.checkboxes), 'bits edited' in w.output.value)")
    import os

    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(tmp_path)), timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["7.7.1", "16", "True"]


@pytest.mark.browser
def test_axe_finds_no_serious_violation_in_the_viewer(open_viewer):
    from pathlib import Path

    page = open_viewer(bv.bit_viewer(math.pi, bv.VIEWER_FORMATS).html())
    page.add_script_tag(path=str(Path(__file__).parents[1] / "_vendor" / "axe-core" / "axe.min.js"))
    found = page.evaluate("""async () => (await axe.run("[data-memlab-bitviewer]",
                                                     {resultTypes: ["violations"]}))
      .violations.filter((v) => ["serious", "critical"].includes(v.impact))
      .map((v) => v.id + " x" + v.nodes.length + ": " + v.nodes[0].html.slice(0, 120))""")
    assert not found, found
