"""Bit viewers for chapter 2: type a number, see its bits in each format, flip bits, see the value.

:func:`bit_viewer` renders a self-contained HTML block (inline style, inline script, no external
resource) that runs in the browser with no kernel: in the built book, and in a live Jupyter,
Colab or VS Code output. Its script (``static/bitviewer.js``) holds only the algorithms; every
format's parameters are read here from :func:`memlab.precision.formats.spec` and torch's casts and passed
to it as JSON. :func:`bit_widget` is the ipywidgets version, computed by Python at every change.
:func:`test_vectors` lists inputs with the bits and values :mod:`memlab.precision.formats` gives them, for
checking the script against Python bit for bit.
"""

from __future__ import annotations

import html
import math
import uuid
from functools import cache

import numpy as np

from memlab.errors import MemlabError, check_choice, require
from memlab.interactive.page import mount_scripts
from memlab.precision.formats import (
    bits,
    decode,
    decode_many,
    parse_value,
    round_to,
    spec,
    value_kind,
)

VIEWER_FORMATS = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "int8", "int4")
DEFAULT_FORMATS = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2")
FIELD_LETTERS = {"sign": "S", "exponent": "E", "mantissa": "M", "integer": "I"}
# Okabe-Ito colours (safe for the common colour-vision deficiencies); dark text on all four.
FIELD_COLOURS = {"sign": "#E69F00", "exponent": "#56B4E9", "mantissa": "#009E73",
                 "integer": "#F0E442"}
FIELD_NAMES = {"sign": "sign", "exponent": "exponent", "mantissa": "mantissa (fraction)",
               "integer": "integer bits (two's complement)"}



# ---- pure helpers (shared by the HTML viewer's first render, the widget and the tests) -------

def _check_format(fmt) -> str:
    return check_choice("bit-viewer format", fmt, VIEWER_FORMATS)


def _value_text(value) -> str:
    """The text the value box starts with: the string as given, or the float's repr."""
    x = parse_value(value)
    return value.strip() if isinstance(value, str) else repr(x)


def _decode_bits(bit_string: str, fmt: str) -> float:
    """The value a bit string holds in one of the viewer's formats.

    What :func:`memlab.precision.formats.decode` gives it.
    """
    return decode(bit_string, _check_format(fmt))


def _pattern_note(bit_string: str, fmt: str) -> str:
    """What a bit pattern holds: 'zero', 'subnormal', 'normal', 'inf', 'NaN' ('integer' for ints)."""
    if spec(fmt).kind == "int":
        return "integer"
    return value_kind(_decode_bits(bit_string, fmt), fmt)


def _encode(x: float, fmt: str) -> tuple[str, float, str, bool]:
    """(bit string, stored value, note, valid) of ``x`` in ``fmt``, as the viewer stores it.

    Floats: :func:`memlab.precision.formats.bits`. Integers: :func:`memlab.precision.formats.round_to` (round half
    to even, saturate to the range); NaN has no integer value (valid False, empty bit string).
    """
    s = spec(fmt)
    if s.kind == "float":
        b = bits(x, fmt)
        return b.bit_string, b.value, b.note, True
    if math.isnan(x):
        return "", math.nan, f"NaN has no {fmt} value", False
    value = round_to(x, fmt) + 0.0  # no -0.0 in an integer
    if math.isinf(x) or value != round(x):
        note = "saturated"
    else:
        note = "exact" if value == x else "rounded"
    return bits(value, fmt).bit_string, value, note, True


def _note_text(note: str, fmt: str, exact: bool, edited: bool) -> str:
    """The note as the viewer shows it (the same text as the script's noteText)."""
    if edited:
        return f"bits edited: {note}"
    if spec(fmt).kind == "float" and note in ("normal", "subnormal", "zero"):
        note += ", exact" if exact else ", rounded"
    return note.replace("->", "\u2192")


def _error_texts(value: float, x: float) -> tuple[str, str]:
    """Absolute error (stored minus typed; 0 when equal) and relative error, as texts."""
    err = 0.0 if value == x else value - x
    abs_text = "0" if err == 0 else ("+" if err > 0 else "") + repr(err)
    if math.isnan(err):
        return abs_text, "nan"
    if err == 0:
        return abs_text, "0"
    if x == 0:
        return abs_text, "inf"
    r = abs(err) / abs(x)
    if math.isnan(r):
        return abs_text, "nan"
    return abs_text, "inf" if math.isinf(r) else f"{r:.2e}"


def _fields_text(bit_string: str, fmt: str) -> str:
    """One line reading the fields (the same text as the script's fieldsText)."""
    s = spec(fmt)
    if s.kind == "int":
        sw = 2 ** (s.bits - 1)
        sign = int(bit_string[0])
        rest = int(bit_string[1:], 2)
        value = _decode_bits(bit_string, fmt)
        return (f"two's complement: sign bit {sign} weighs -{sw}, bits {bit_string[1:]} = {rest}, "
                f"value " + (f"-{sw} + {rest} = " if sign else "") + f"{int(value)}")
    e, m = s.exponent_bits, s.mantissa_bits
    sign, eb, mb = bit_string[0], bit_string[1:1 + e], bit_string[1 + e:]
    exp, mant = int(eb, 2), int(mb, 2)
    out = f"sign {sign} ({'-' if sign == '1' else '+'}) | "
    if exp == 2 ** e - 1:
        if s.has_inf:
            if mant == 0:
                return out + f"exponent {eb} all ones, mantissa {mb} = 0: infinity"
            return out + f"exponent {eb} all ones, mantissa {mb} not 0: NaN"
        if s.has_nan and mant == 2 ** m - 1:
            return out + f"exponent {eb} and mantissa {mb} all ones: NaN"
    if exp == 0:
        return (out + f"exponent {eb}: subnormal, 2^(1 - bias {s.bias}) = 2^{1 - s.bias} | "
                f"mantissa 0.{mb} (binary) = {mant / 2 ** m!r}")
    return (out + f"exponent {eb} = {exp} - bias {s.bias} = {exp - s.bias} | "
            f"mantissa 1.{mb} (binary) = {(2 ** m + mant) / 2 ** m!r}")


def _field_of_bit(fmt: str, position: int) -> str:
    """'sign', 'exponent', 'mantissa' or 'integer' for bit ``position`` counted from the left."""
    s = spec(fmt)
    if position == 0:
        return "sign"
    if s.kind == "int":
        return "integer"
    return "exponent" if position <= s.exponent_bits else "mantissa"


def _describe(fmt: str) -> str:
    s = spec(fmt)
    if s.kind == "int":
        return (f"{s.bits} bits, two's complement, integers {int(s.min)} to {int(s.max)}, "
                "round half to even, saturates")
    specials = ("inf and NaN" if s.has_inf else "no inf, NaN only at all ones" if s.has_nan
                else "no inf or NaN")
    return (f"{s.bits} bits = 1 sign + {s.exponent_bits} exponent + {s.mantissa_bits} mantissa, "
            f"bias {s.bias}, max {s.max:g}, {specials}")


# ---- the HTML viewer ------------------------------------------------------------------------

def _overflow_rule(stored: float) -> str:
    """What torch's cast made of a value beyond the range: 'nan', 'inf' or 'saturate'."""
    if math.isnan(stored):
        return "nan"
    return "inf" if math.isinf(stored) else "saturate"


def format_config(fmt: str) -> dict:
    """The JSON-ready parameters the viewer's script needs for one format (chapter: 2).

    They come from the format's spec() and from torch.
    """
    return dict(_format_config(_check_format(fmt)))


@cache
def _format_config(fmt: str) -> dict:
    s = spec(fmt)
    cfg = dict(fmt=fmt, kind=s.kind, bits=s.bits, sign_bits=s.sign_bits,
               exponent_bits=s.exponent_bits, mantissa_bits=s.mantissa_bits, bias=s.bias,
               max=s.max, min=s.min, min_normal=s.min_normal, min_subnormal=s.min_subnormal,
               has_inf=s.has_inf, has_nan=s.has_nan)
    if s.kind == "float":
        cfg["nan_bits"] = bits(math.nan, fmt).bit_string
        cfg["overflow"] = _overflow_rule(round_to(s.max * 4, fmt))  # a finite value too large
        cfg["infinity"] = _overflow_rule(round_to(math.inf, fmt))  # an infinite one
    return cfg


_STYLE = """
.memlab-bv{--bv-line:rgba(127,127,127,.55);--bv-focus:#0072B2;color:inherit;
  border:1px solid var(--bv-line);border-radius:6px;padding:.6em .8em;margin:.6em 0;
  max-width:100%;overflow-x:auto;line-height:1.35;font-size:.95em}
html[data-theme="dark"] .memlab-bv,body[data-jp-theme-light="false"] .memlab-bv,
body.vscode-dark .memlab-bv,body.vscode-high-contrast .memlab-bv{--bv-focus:#56B4E9}
.memlab-bv [hidden]{display:none!important}
.memlab-bv .bv-controls{display:flex;flex-wrap:wrap;align-items:center;gap:.4em .8em}
.memlab-bv .bv-controls input{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
  font-size:1em;width:14em;padding:.15em .35em}
.memlab-bv .bv-controls select,.memlab-bv .bv-controls button{font-size:.95em}
.memlab-bv .bv-status{font-size:.9em;opacity:.85}
.memlab-bv .bv-legend{display:flex;flex-wrap:wrap;gap:.3em 1em;font-size:.85em;margin:.45em 0 .2em}
.memlab-bv .bv-sw{display:inline-block;min-width:1.3em;text-align:center;color:#111;
  border:1px solid rgba(0,0,0,.45);border-radius:3px;font-weight:700;margin-right:.3em;
  font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.memlab-bv .bv-row{padding:.45em 0 .35em;border-top:1px solid var(--bv-line)}
.memlab-bv .bv-head{font-size:.9em}
.memlab-bv .bv-name{font-weight:700;margin-right:.5em}
.memlab-bv .bv-desc{opacity:.8}
.memlab-bv .bv-bits{display:flex;flex-wrap:wrap;gap:.25em .45em;margin:.3em 0}
.memlab-bv .bv-field{display:inline-flex;flex-wrap:wrap;gap:1px}
.memlab-bv button.bv-bit{position:relative;display:inline-flex;flex-direction:column;align-items:center;
  justify-content:center;min-width:1.5em;margin:0;padding:.1em .05em .2em;color:#111;
  border:1px solid rgba(0,0,0,.5);border-radius:3px;cursor:pointer;line-height:1.05;
  font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em;
  text-transform:none;box-shadow:none}
.memlab-bv .bv-sr{position:absolute;width:1px;height:1px;overflow:hidden;clip-path:inset(50%);
white-space:nowrap}
.memlab-bv .bv-bit .bv-d{font-weight:700;font-size:1.05em}
.memlab-bv .bv-bit .bv-f{font-size:.62em;opacity:.85}
.memlab-bv [data-field="sign"]{background:#E69F00}
.memlab-bv [data-field="exponent"]{background:#56B4E9}
.memlab-bv [data-field="mantissa"]{background:#009E73}
.memlab-bv [data-field="integer"]{background:#F0E442}
.memlab-bv button.bv-bit[data-bit="1"]{box-shadow:inset 0 -3px 0 rgba(0,0,0,.6)}
.memlab-bv button.bv-bit:hover{filter:brightness(1.1)}
.memlab-bv button.bv-bit:focus-visible{outline:3px solid var(--bv-focus);outline-offset:1px}
.memlab-bv .bv-out{display:flex;flex-wrap:wrap;gap:.15em 1.3em;font-size:.9em}
.memlab-bv .bv-k{opacity:.8;margin-right:.35em}
.memlab-bv .bv-v{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-weight:600}
.memlab-bv .bv-fieldtext{font-size:.8em;opacity:.8;margin-top:.15em;
  font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.memlab-bv .bv-row[data-edited="true"] .bv-name::after{content:" (bits edited)";font-weight:400;
  font-style:italic}
"""


def _row_html(x: float, fmt: str) -> str:
    """One format's row, in the state the script also computes on load."""
    s = spec(fmt)
    e = html.escape
    bit_string, value, note, valid = _encode(x, fmt)
    groups: dict[str, list[str]] = {}
    for pos in range(s.bits):
        field = _field_of_bit(fmt, pos)
        idx = s.bits - 1 - pos
        bit = bit_string[pos] if valid else ""
        groups.setdefault(field, []).append(
            f'<button type="button" class="bv-bit" data-format="{e(fmt)}" data-bit-index="{idx}" '
            f'data-field="{field}" data-bit="{bit}" aria-pressed="{str(bit == "1").lower()}" '
            f'title="bit {idx}: {field}">'
            f'<span class="bv-sr">{e(fmt)} bit {idx}, {field}, {bit or "not set"}</span>'
            f'<span class="bv-d" aria-hidden="true">{bit or "&#8211;"}</span>'
            f'<span class="bv-f" aria-hidden="true">{FIELD_LETTERS[field]}</span></button>')
    fields_html = "".join(f'<span class="bv-field" data-group="{f}">{"".join(b)}</span>'
                          for f, b in groups.items())
    abs_text, rel_text = _error_texts(value, x) if valid else ("\u2013", "\u2013")
    out = [("stored value", "value", repr(value) if valid else "\u2013"),
           ("abs. error", "abs-error", abs_text),
           ("rel. error", "rel-error", rel_text),
           ("note", "note", _note_text(note, fmt, value == x, edited=False))]
    out_html = "".join(f'<span><span class="bv-k">{k}</span><span class="bv-v" '
                       f'data-role="{role}">{e(v)}</span></span>' for k, role, v in out)
    fields_text = _fields_text(bit_string, fmt) if valid else ""
    return (f'<div class="bv-row" data-role="row" data-format="{e(fmt)}" data-edited="false">'
            f'<div class="bv-head"><span class="bv-name">{e(fmt)}</span>'
            f'<span class="bv-desc">{e(_describe(fmt))}</span></div>'
            f'<div class="bv-bits" data-role="bits" data-bits="{bit_string}" role="group" '
            f'aria-label="{e(fmt)} bits, most significant first">{fields_html}</div>'
            f'<div class="bv-out">{out_html}</div>'
            f'<div class="bv-fieldtext" data-role="fields">{e(fields_text)}</div></div>')


def _viewer_html(value_text: str, formats: tuple[str, ...], side_by_side: bool) -> str:
    vid = f"memlab-bv-{uuid.uuid4().hex[:12]}"
    x = parse_value(value_text)
    e = html.escape
    mode = "all" if side_by_side or len(formats) == 1 else formats[0]
    options = [("all", "all formats, side by side")] + [(f, f"{f} only") for f in formats]
    options_html = "".join(f'<option value="{e(v)}"{" selected" if v == mode else ""}>{e(t)}'
                           f'</option>' for v, t in options)
    fields_used = []
    for f in formats:
        for pos in range(spec(f).bits):
            field = _field_of_bit(f, pos)
            if field not in fields_used:
                fields_used.append(field)
    legend = "".join(f'<span><span class="bv-sw" data-field="{f}">{FIELD_LETTERS[f]}</span>'
                     f'{FIELD_NAMES[f]}</span>' for f in fields_used)
    rows = "".join(_row_html(x, f) for f in formats)
    config = {"id": vid, "value": value_text, "mode": mode,
              "formats": [_format_config(f) for f in formats]}
    return (
        f'<div class="memlab-bv tex2jax_ignore mathjax_ignore" id="{vid}" data-memlab-bitviewer '
        f'data-mode="{e(mode)}">'
        f"<style>{_STYLE}</style>"
        f'<div class="bv-controls">'
        f'<label for="{vid}-input">value</label>'
        f'<input id="{vid}-input" type="text" data-role="input" value="{e(value_text)}" '
        f'inputmode="decimal" spellcheck="false" autocomplete="off" '
        f'aria-describedby="{vid}-status">'
        f'<label for="{vid}-mode">show</label>'
        f'<select id="{vid}-mode" data-role="mode">{options_html}</select>'
        f'<button type="button" data-role="reset">reset bits</button>'
        f'<span class="bv-status" id="{vid}-status" data-role="status" aria-live="polite">'
        f"</span></div>"
        f'<div class="bv-legend">{legend}<span>click a bit to flip it; the error stays '
        f"measured against the typed value</span></div>"
        f"{rows}"
        + mount_scripts(vid, config, script="bitviewer.js", module="memlabBitViewer",
                        role="config")
        + "</div>"
    )


class BitViewer:
    """A bit viewer for one value in several formats; displays as self-contained HTML (chapter: 2)."""

    def __init__(self, value_text: str, formats: tuple[str, ...], side_by_side: bool) -> None:
        self.value_text = value_text
        self.formats = formats
        self.side_by_side = side_by_side

    def html(self) -> str:
        """The HTML block: style, controls, one row per format, config and script (chapter: 2)."""
        return _viewer_html(self.value_text, self.formats, self.side_by_side)

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        x = parse_value(self.value_text)
        lines = [f"bit viewer for {self.value_text}"]
        for fmt in self.formats:
            bit_string, value, note, valid = _encode(x, fmt)
            lines.append(f"{fmt:<8}  {bit_string or '-'}  = {value!r}  ({note})")
        return "\n".join(lines)


def bit_viewer(value=math.pi, formats=DEFAULT_FORMATS, *, side_by_side: bool = True) -> BitViewer:
    """A browser-side viewer of ``value``'s bits in each format, with clickable bits (chapter: 2).

    It needs no kernel.

    ``value``: a real number or a string Python's float() reads; ``formats``: names from
    VIEWER_FORMATS (one name or a sequence); ``side_by_side=False`` starts with one format shown.
    """
    text = _value_text(value)
    if isinstance(formats, str):
        formats = (formats,)
    formats = tuple(formats)
    if not formats:
        raise MemlabError(f"bit_viewer needs at least one format; accepted: "
                          f"{', '.join(VIEWER_FORMATS)}")
    for fmt in formats:
        _check_format(fmt)
    return BitViewer(text, tuple(dict.fromkeys(formats)), bool(side_by_side))


# ---- the ipywidgets viewer --------------------------------------------------------------------

def _widget_html(x: float, fmt: str, bit_string: str, edited: bool) -> str:
    """The widget's read-out: coloured fields, stored value, errors, note, fields line."""
    e = html.escape
    if edited:
        value = _decode_bits(bit_string, fmt)
        note, valid = _pattern_note(bit_string, fmt), True
    else:
        bit_string, value, note, valid = _encode(x, fmt)
    parts = []
    if valid:
        for pos, ch in enumerate(bit_string):
            field = _field_of_bit(fmt, pos)
            gap = "margin-left:.35em;" if pos and field != _field_of_bit(fmt, pos - 1) else ""
            parts.append(f'<span data-field="{field}" style="{gap}background:'
                         f'{FIELD_COLOURS[field]};color:#111;padding:0 .12em;'
                         f'font-family:monospace">{ch}</span>')
    abs_text, rel_text = _error_texts(value, x) if valid else ("\u2013", "\u2013")
    rows = [("bits", "bits", "".join(parts) or "\u2013"),
            ("stored value", "value", e(repr(value) if valid else "\u2013")),
            ("abs. error", "abs-error", e(abs_text)), ("rel. error", "rel-error", e(rel_text)),
            ("note", "note", e(_note_text(note, fmt, value == x, edited))),
            ("fields", "fields", e(_fields_text(bit_string, fmt) if valid else ""))]
    body = "".join(f'<div><span style="opacity:.8">{k}:</span> '
                   f'<span data-role="{role}">{v}</span></div>' for k, role, v in rows)
    return f'<div class="memlab-bit-widget" data-format="{e(fmt)}">{body}</div>'


def bit_widget(value=math.pi, fmt: str = "fp16"):
    """An ipywidgets bit viewer computed by Python (chapter: 2).

    A value box, a format menu and one checkbox per bit.

    Returns a ``VBox`` with ``controls`` ({'value': Text, 'format': Dropdown}), ``checkboxes``
    (most significant bit first) and ``output`` (the HTML read-out).
    """
    widgets = require("ipywidgets", "bit_widget", extra="notebook")
    _check_format(fmt)
    text = _value_text(value)
    state = {"x": parse_value(text), "syncing": False}
    value_box = widgets.Text(value=text, description="value", continuous_update=False,
                             layout=widgets.Layout(width="260px"))
    # A Dropdown and Checkboxes: ToggleButtons draw icon fonts that a built page cannot fetch.
    fmt_box = widgets.Dropdown(options=VIEWER_FORMATS, value=fmt, description="format",
                               layout=widgets.Layout(width="200px"))
    output = widgets.HTML()
    bits_box = widgets.HBox(layout=widgets.Layout(flex_flow="row wrap"))
    box = widgets.VBox([widgets.HBox([value_box, fmt_box]), bits_box, output])
    box.controls = {"value": value_box, "format": fmt_box}
    box.output = output
    box.checkboxes = []

    def current_bits() -> str:
        return "".join("1" if cb.value else "0" for cb in box.checkboxes)

    def on_bit(change) -> None:
        if not state["syncing"]:
            output.value = _widget_html(state["x"], fmt_box.value, current_bits(), edited=True)

    def build_checkboxes(f: str) -> None:
        s = spec(f)
        boxes, groups = [], {}
        for pos in range(s.bits):
            field = _field_of_bit(f, pos)
            cb = widgets.Checkbox(value=False, indent=False, description=FIELD_LETTERS[field],
                                  tooltip=f"{f} bit {s.bits - 1 - pos}: {field}",
                                  layout=widgets.Layout(width="auto", margin="0 1px"),
                                  style={"background": FIELD_COLOURS[field]})
            cb.observe(on_bit, names="value")
            boxes.append(cb)
            groups.setdefault(field, []).append(cb)
        box.checkboxes = boxes
        bits_box.children = [widgets.HBox(g, layout=widgets.Layout(margin="0 .6em 0 0",
                                                                   flex_flow="row wrap"))
                             for g in groups.values()]

    def encode_value() -> None:
        f = fmt_box.value
        bit_string, _, _, valid = _encode(state["x"], f)
        state["syncing"] = True
        try:
            for cb, ch in zip(box.checkboxes, bit_string if valid else "0" * len(box.checkboxes),
                              strict=True):
                cb.value = ch == "1"
        finally:
            state["syncing"] = False
        output.value = _widget_html(state["x"], f, bit_string, edited=False)

    def on_value(change) -> None:
        try:
            state["x"] = parse_value(change["new"])
        except MemlabError as err:
            output.value = f"<div>memlab: error: {html.escape(str(err))}</div>"
            return
        encode_value()

    def on_format(change) -> None:
        build_checkboxes(change["new"])
        encode_value()

    value_box.observe(on_value, names="value")
    fmt_box.observe(on_format, names="value")
    build_checkboxes(fmt)
    encode_value()
    return box


# ---- vectors for checking the script against memlab.precision.formats ----------------------------------

def _edge_values(fmt: str) -> list[float]:
    s = spec(fmt)
    if s.kind == "int":
        lo, hi = s.min, s.max
        base = [0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994, 1.0, -1.0,
                hi, lo, hi + 0.5, lo - 0.5, hi - 0.5, lo + 0.5, hi + 0.4, hi + 1, lo - 1,
                1e9, -1e9, math.inf, -math.inf, math.pi, 0.1, 1 / 3, 5e-324]
        return base
    sub, mn, mx = s.min_subnormal, s.min_normal, s.max
    ulp_max = 2.0 ** (math.frexp(mx)[1] - 1) * s.eps
    vals = [0.0, sub, sub / 2, math.nextafter(sub / 2, math.inf), 1.5 * sub, 2.5 * sub,
            mn - sub, mn - sub / 2, mn, mn * (1 + s.eps / 2), mx, mx + ulp_max / 2,
            math.nextafter(mx + ulp_max / 2, 0.0), mx + ulp_max, mx * 2, 1.0,
            1 + s.eps / 2, 1 + 1.5 * s.eps, math.nextafter(1 + s.eps / 2, math.inf),
            math.nextafter(1 + s.eps / 2, 0.0), math.pi, 0.1, 1 / 3, 2 / 3, 65504.0, 65520.0,
            65519.99999999999, 448.0, 464.0, 465.0, 480.0, 57344.0, 61440.0, 61439.0, 1e-8,
            1e-30, 1e38, 3.4e38, 1e39, 5e-324, 2.2250738585072014e-308,
            1.7976931348623157e308, math.inf]
    return [v for x in vals for v in (x, -x)] + [math.nan]


def _tie_values(fmt: str, rng: np.random.Generator, n: int) -> list[float]:
    """Halfway points between neighbouring values, and the doubles just either side of them."""
    s = spec(fmt)
    if s.kind == "int":
        ks = rng.integers(int(s.min) - 2, int(s.max) + 2, n)
        return [v for k in ks.tolist() for v in (k + 0.5, math.nextafter(k + 0.5, math.inf),
                                        math.nextafter(k + 0.5, -math.inf))]
    top = int(bits(s.max, fmt).bit_string, 2)  # the pattern of max: the ones below are finite
    ps = rng.integers(0, top, n)
    lo = decode_many(ps.tolist(), fmt)
    hi = decode_many((ps + 1).tolist(), fmt)
    out = []
    for a, b, neg in zip(lo, hi, rng.random(n) < 0.5, strict=True):
        mid = (a + b) / 2  # exact: one more bit than the format has
        for v in (mid, math.nextafter(mid, math.inf), math.nextafter(mid, 0.0)):
            out.append(-v if neg else v)
    return out


def _random_values(fmt: str, rng: np.random.Generator, n: int) -> list[float]:
    s = spec(fmt)
    signs = rng.choice([-1.0, 1.0], n)
    if s.kind == "int":
        return (rng.uniform(s.min - 4, s.max + 4, n)).tolist()
    lo, hi = math.log2(s.min_subnormal) - 2, math.log2(s.max) + 1.5
    return (signs * np.exp2(rng.uniform(lo, hi, n))).tolist()


def _encode_vector(x: float, fmt: str) -> dict | None:
    bit_string, value, note, valid = _encode(x, fmt)
    if not valid:
        return None
    return {"op": "encode", "fmt": fmt, "input": x, "bit_string": bit_string, "value": value,
            "note": note}


def test_vectors(n_random: int = 300, seed: int = 0, *, n_patterns: int = 2000) -> list[dict]:
    """Inputs and patterns with their bits and values, to check a codec against (chapter: 2).

    The bits and values are those memlab.precision.formats gives them.

    Each item is a dict: ``op`` ('encode': ``input`` is a float, ``bit_string``, ``value`` and
    ``note`` are what the viewer must show; 'decode': ``bit_string`` in, ``value`` out).
    Encode: per format, edge values (zeros, subnormals, min normal, max, ties, overflow, inf,
    NaN, ...), ``n_random`` random values over the whole range, and ``n_random // 3`` halfway
    points between neighbours with the doubles either side. Decode: every pattern of fp8-e4m3,
    fp8-e5m2, int8 and int4, and ``n_patterns`` random patterns each of fp16, bf16 and fp32.
    """
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    for fmt in VIEWER_FORMATS:
        xs = (_edge_values(fmt) + _random_values(fmt, rng, n_random)
              + _tie_values(fmt, rng, max(n_random // 3, 1)))
        out.extend(v for v in (_encode_vector(x, fmt) for x in xs) if v is not None)
    for fmt in VIEWER_FORMATS:
        width = spec(fmt).bits
        if width <= 8:
            patterns = list(range(2 ** width))
        else:
            patterns = rng.integers(0, 2 ** width, n_patterns, dtype=np.int64).tolist()
        for p, v in zip(patterns, decode_many(patterns, fmt), strict=True):
            out.append({"op": "decode", "fmt": fmt, "input": None,
                        "bit_string": format(p, f"0{width}b"), "value": v, "note": None})
    return out


test_vectors.__test__ = False  # a generator of test data, not a pytest test
