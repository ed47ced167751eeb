/* memlab bit viewer (chapter 2, "Number formats").
 *
 * Encodes a number into a float or integer format and decodes a bit pattern back, in the
 * browser, with no kernel and no dependency but format.js (numbers as Python writes them).
 * This file holds only the algorithms: every format's parameters (widths, bias, range, NaN
 * pattern, what overflow becomes) come from Python (memlab.interactive.bitviewer, read from
 * memlab.precision.formats.spec and torch's casts) as JSON.
 *
 * Encoding rounds to nearest, ties to even, once, straight from the JS double: the double is
 * scaled by a power of two (exact) so that one unit is one step of the target format, and
 * that integer-plus-fraction is rounded. No intermediate float32, so no double rounding.
 *
 * Exposed as globalThis.memlabBitViewer (and module.exports under Node):
 *   parseValue(text)        -> number, or null when the text is not a number
 *   encode(x, cfg)          -> {pattern, bitString, value, note, exact, valid}
 *   decode(pattern, cfg)    -> number (pattern: integer, 0 <= pattern < 2^bits)
 *   patternNote(pattern, cfg), noteText(enc, cfg, edited), fieldsText(pattern, cfg),
 *   pyRepr(x), errorTexts(value, x)   the texts the viewer shows (the same as Python's)
 *   mount(rootElement, config)  binds one viewer rendered by memlab.interactive.bitviewer.bit_viewer
 *   mountById(id)               the same, finding the root and its JSON config by id
 */
(function (root, factory) {
  "use strict";
  var node = typeof module === "object" && module && module.exports && typeof require === "function";
  var api = factory(node ? require("./format.js") : root.memlabFormat);
  if (typeof module === "object" && module && module.exports) {
    module.exports = api;
  }
  if (root) {
    root.memlabBitViewer = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : typeof window !== "undefined" ? window : this, function (format) {
  "use strict";

  var VERSION = 1;
  var view = new DataView(new ArrayBuffer(8));

  /* 2^k, exact, for an integer k in [-1074, 1023]. */
  function pow2(k) {
    if (k < -1022) {
      return pow2(k + 64) * pow2(-64);
    }
    view.setUint32(0, (k + 1023) * 1048576);
    view.setUint32(4, 0);
    return view.getFloat64(0);
  }

  /* floor(log2(a)) of a finite a > 0, read from the double's exponent field. */
  function exponentOf(a) {
    view.setFloat64(0, a);
    var biased = (view.getUint32(0) >>> 20) & 0x7ff;
    if (biased === 0) {
      return exponentOf(a * pow2(64)) - 64; // a subnormal double
    }
    return biased - 1023;
  }

  /* Round y >= 0 (an integer plus a fraction, y < 2^53) to the nearest integer, ties to even. */
  function roundHalfEven(y) {
    var f = Math.floor(y);
    var r = y - f; // exact
    if (r > 0.5 || (r === 0.5 && f % 2 === 1)) {
      return f + 1;
    }
    return f;
  }

  function isNegative(x) {
    return x < 0 || (x === 0 && 1 / x < 0);
  }

  function bitString(pattern, width) {
    var s = pattern.toString(2);
    while (s.length < width) {
      s = "0" + s;
    }
    return s;
  }

  /* The text as Python's float() reads it: decimals, exponents, inf, infinity, nan. */
  function parseValue(text) {
    var s = String(text).trim().toLowerCase().replace(/(\d)_(?=\d)/g, "$1");
    var m = /^([+-]?)(inf|infinity|nan)$/.exec(s);
    if (m) {
      if (m[2] === "nan") {
        return NaN;
      }
      return m[1] === "-" ? -Infinity : Infinity;
    }
    if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/.test(s)) {
      return null;
    }
    return Number(s);
  }

  /* A double as Python's repr() writes it (format.js). */
  var pyRepr = format.floatRepr;

  /* ---- float formats ---------------------------------------------------------------- */

  function signWeight(c) {
    return pow2(c.bits - 1);
  }

  /* Sign bit, exponent field and mantissa field of a pattern. */
  function fields(pattern, c) {
    var sw = signWeight(c);
    var sign = pattern >= sw ? 1 : 0;
    var rest = pattern - sign * sw;
    var mw = pow2(c.mantissa_bits);
    var exp = Math.floor(rest / mw);
    return { sign: sign, exp: exp, mant: rest - exp * mw };
  }

  /* 'inf', 'nan' or null: what the exponent/mantissa fields say beyond ordinary numbers. */
  function special(f, c) {
    var top = pow2(c.exponent_bits) - 1;
    var mtop = pow2(c.mantissa_bits) - 1;
    if (f.exp !== top) {
      return null;
    }
    if (c.has_inf) {
      // IEEE 754: the all-ones exponent holds infinity (mantissa 0) and NaN (any other).
      return f.mant === 0 ? "inf" : "nan";
    }
    if (c.has_nan && f.mant === mtop) {
      return "nan"; // no infinity: only the all-ones pattern is NaN, the rest are numbers
    }
    return null;
  }

  function decodeFloat(pattern, c) {
    var f = fields(pattern, c);
    var s = special(f, c);
    var mag;
    if (s === "nan") {
      return NaN;
    }
    if (s === "inf") {
      mag = Infinity;
    } else if (f.exp === 0) {
      mag = f.mant * pow2(1 - c.bias - c.mantissa_bits);
    } else {
      mag = (pow2(c.mantissa_bits) + f.mant) * pow2(f.exp - c.bias - c.mantissa_bits);
    }
    return f.sign ? -mag : mag;
  }

  /* Pattern magnitude (no sign bit) and value of a finite a >= 0 rounded to the format,
     with no range limit on the exponent (the caller handles overflow). */
  function roundMagnitude(a, c) {
    if (a === 0) {
      return { mag: 0, value: 0 };
    }
    var m = c.mantissa_bits;
    var emin = 1 - c.bias;
    var e = Math.max(exponentOf(a), emin);
    var q = e - m; // one step of the format in this binade is 2^q
    var n = roundHalfEven(a * pow2(-q)); // exact scaling: a * 2^-q < 2^(m+1)
    // n counts steps: below 2^m it is a subnormal's mantissa; a carry to 2^(m+1) moves
    // into the next binade, which this sum encodes without a special case.
    return { mag: (e + c.bias - 1) * pow2(m) + n, value: n * pow2(q) };
  }

  function nanPattern(c) {
    return parseInt(c.nan_bits, 2);
  }

  /* What a value beyond the range becomes: 'inf', 'saturate' (+-max) or 'nan'. */
  function overflowTo(rule, negative, c) {
    var sw = signWeight(c);
    if (rule === "nan") {
      return { pattern: nanPattern(c), value: NaN };
    }
    if (rule === "inf") {
      var infMag = (pow2(c.exponent_bits) - 1) * pow2(c.mantissa_bits);
      return { pattern: (negative ? sw : 0) + infMag, value: negative ? -Infinity : Infinity };
    }
    var mx = roundMagnitude(c.max, c);
    return { pattern: (negative ? sw : 0) + mx.mag, value: negative ? -c.max : c.max };
  }

  /* The note memlab.precision.formats.bits gives for the input x stored as value. */
  function floatNote(value, x, c) {
    if (value !== value) {
      return x !== x ? "NaN" : "overflow -> NaN";
    }
    if (value === Infinity || value === -Infinity) {
      return x === Infinity || x === -Infinity ? "inf" : "overflow -> inf";
    }
    var ulpAtMax = pow2(exponentOf(c.max) - c.mantissa_bits);
    if (Math.abs(x) > c.max + ulpAtMax / 2) {
      return "saturated";
    }
    if (value === 0) {
      return x === 0 ? "zero" : "underflow -> 0";
    }
    return Math.abs(value) < c.min_normal ? "subnormal" : "normal";
  }

  function encodeFloat(x, c) {
    var out;
    if (x !== x) {
      out = { pattern: nanPattern(c), value: NaN };
    } else {
      var neg = isNegative(x);
      var a = Math.abs(x);
      if (a === Infinity) {
        out = overflowTo(c.infinity, neg, c);
      } else {
        var r = roundMagnitude(a, c);
        if (r.value > c.max) {
          out = overflowTo(c.overflow, neg, c);
        } else {
          out = { pattern: (neg ? signWeight(c) : 0) + r.mag, value: neg ? -r.value : r.value };
        }
      }
    }
    out.note = floatNote(out.value, x, c);
    return out;
  }

  /* ---- integer formats (two's complement) -------------------------------------------- */

  function decodeInt(pattern, c) {
    return pattern >= signWeight(c) ? pattern - pow2(c.bits) : pattern;
  }

  function encodeInt(x, c) {
    if (x !== x) {
      return { pattern: 0, value: NaN, note: "NaN has no " + c.fmt + " value", valid: false };
    }
    var n = isNegative(x) ? -roundHalfEven(-x) : roundHalfEven(x);
    var note = n === x ? "exact" : "rounded";
    if (n > c.max || n < c.min) { // infinities too
      n = Math.min(Math.max(n, c.min), c.max);
      note = "saturated";
    }
    if (n === 0) {
      n = 0; // no -0 in an integer
    }
    return { pattern: n < 0 ? n + pow2(c.bits) : n, value: n, note: note };
  }

  /* ---- both kinds --------------------------------------------------------------------- */

  function decode(pattern, c) {
    return c.kind === "int" ? decodeInt(pattern, c) : decodeFloat(pattern, c);
  }

  function encode(x, c) {
    var out = c.kind === "int" ? encodeInt(x, c) : encodeFloat(x, c);
    out.bitString = bitString(out.pattern, c.bits);
    out.exact = out.value === x;
    if (out.valid === undefined) {
      out.valid = true;
    }
    return out;
  }

  /* What kind of number a pattern holds: zero, subnormal, normal, inf, NaN (floats). */
  function patternNote(pattern, c) {
    if (c.kind === "int") {
      return "integer";
    }
    var v = decodeFloat(pattern, c);
    if (v !== v) {
      return "NaN";
    }
    if (v === Infinity || v === -Infinity) {
      return "inf";
    }
    if (v === 0) {
      return "zero";
    }
    return Math.abs(v) < c.min_normal ? "subnormal" : "normal";
  }

  /* The note as the viewer shows it, for a typed value or for edited bits. */
  function noteText(enc, c, edited) {
    if (edited) {
      return "bits edited: " + enc.note;
    }
    var note = enc.note;
    if (c.kind === "float" && (note === "normal" || note === "subnormal" || note === "zero")) {
      note += enc.exact ? ", exact" : ", rounded";
    }
    return note.replace("->", "\u2192");
  }

  /* Absolute error (stored minus typed, 0 when equal) and relative error, as texts. */
  function errorTexts(value, x) {
    var err = value === x ? 0 : value - x;
    var abs = err === 0 ? "0" : (err > 0 ? "+" : "") + pyRepr(err);
    var rel;
    if (err !== err) {
      rel = "nan";
    } else if (err === 0) {
      rel = "0";
    } else if (x === 0) {
      rel = "inf";
    } else {
      var r = Math.abs(err) / Math.abs(x);
      if (r !== r) {
        rel = "nan";
      } else if (r === Infinity) {
        rel = "inf";
      } else {
        var p = r.toExponential(2).split("e");
        var e = parseInt(p[1], 10);
        var es = String(Math.abs(e));
        rel = p[0] + "e" + (e < 0 ? "-" : "+") + (es.length < 2 ? "0" + es : es);
      }
    }
    return { abs: abs, rel: rel };
  }

  /* One line reading the fields: sign, exponent with its bias, mantissa with its leading bit. */
  function fieldsText(pattern, c) {
    var bs = bitString(pattern, c.bits);
    if (c.kind === "int") {
      var sw = signWeight(c);
      var s = pattern >= sw ? 1 : 0;
      var rest = pattern - s * sw;
      return ("two's complement: sign bit " + s + " weighs -" + sw + ", bits " + bs.slice(1) +
              " = " + rest + ", value " + (s ? "-" + sw + " + " + rest + " = " : "") +
              decodeInt(pattern, c));
    }
    var f = fields(pattern, c);
    var eb = bs.substr(1, c.exponent_bits);
    var mb = bs.substr(1 + c.exponent_bits);
    var out = "sign " + f.sign + " (" + (f.sign ? "-" : "+") + ") | ";
    var sp = special(f, c);
    if (sp === "inf") {
      return out + "exponent " + eb + " all ones, mantissa " + mb + " = 0: infinity";
    }
    if (sp === "nan") {
      if (c.has_inf) {
        return out + "exponent " + eb + " all ones, mantissa " + mb + " not 0: NaN";
      }
      return out + "exponent " + eb + " and mantissa " + mb + " all ones: NaN";
    }
    var scale = pow2(c.mantissa_bits);
    if (f.exp === 0) {
      return (out + "exponent " + eb + ": subnormal, 2^(1 - bias " + c.bias + ") = 2^" +
              (1 - c.bias) + " | mantissa 0." + mb + " (binary) = " + pyRepr(f.mant / scale));
    }
    return (out + "exponent " + eb + " = " + f.exp + " - bias " + c.bias + " = " +
            (f.exp - c.bias) + " | mantissa 1." + mb + " (binary) = " +
            pyRepr((scale + f.mant) / scale));
  }

  /* ---- the viewer ---------------------------------------------------------------------- */

  function q(el, role) {
    return el.querySelector('[data-role="' + role + '"]');
  }

  function mount(rootEl, config) {
    if (!rootEl || rootEl.getAttribute("data-mounted") === "1") {
      return null;
    }
    rootEl.setAttribute("data-mounted", "1");
    var input = q(rootEl, "input");
    var mode = q(rootEl, "mode");
    var reset = q(rootEl, "reset");
    var status = q(rootEl, "status");
    var typed = parseValue(config.value);
    var rows = {};

    config.formats.forEach(function (c) {
      var row = rootEl.querySelector('[data-role="row"][data-format="' + c.fmt + '"]');
      rows[c.fmt] = { cfg: c, el: row, pattern: 0, edited: false, enc: null };
    });

    function renderRow(r) {
      var c = r.cfg;
      var el = r.el;
      var bs = bitString(r.pattern, c.bits);
      var valid = r.edited || r.enc.valid;
      var value = r.edited ? decode(r.pattern, c) : r.enc.value;
      var shown = r.edited ? { note: patternNote(r.pattern, c) } : r.enc;
      q(el, "bits").setAttribute("data-bits", valid ? bs : "");
      var buttons = el.querySelectorAll("button[data-bit-index]");
      for (var i = 0; i < buttons.length; i++) {
        var b = buttons[i];
        var idx = parseInt(b.getAttribute("data-bit-index"), 10);
        var bit = valid ? bs.charAt(c.bits - 1 - idx) : "";
        b.setAttribute("data-bit", bit);
        b.setAttribute("aria-pressed", bit === "1" ? "true" : "false");
        // the button's name: its visible digit and letter are aria-hidden, this text says them
        b.querySelector(".bv-sr").textContent = c.fmt + " bit " + idx + ", " +
          b.getAttribute("data-field") + ", " + (bit || "not set");
        b.querySelector(".bv-d").textContent = bit || "\u2013";
      }
      var errs = valid ? errorTexts(value, typed) : { abs: "\u2013", rel: "\u2013" };
      q(el, "value").textContent = valid ? pyRepr(value) : "\u2013";
      q(el, "abs-error").textContent = errs.abs;
      q(el, "rel-error").textContent = errs.rel;
      q(el, "note").textContent = noteText(shown, c, r.edited);
      q(el, "fields").textContent = valid ? fieldsText(r.pattern, c) : "";
      el.setAttribute("data-edited", r.edited ? "true" : "false");
    }

    function encodeAll() {
      Object.keys(rows).forEach(function (k) {
        var r = rows[k];
        r.enc = encode(typed, r.cfg);
        r.pattern = r.enc.pattern;
        r.edited = false;
        renderRow(r);
      });
    }

    function showMode() {
      var m = mode ? mode.value : "all";
      Object.keys(rows).forEach(function (k) {
        rows[k].el.hidden = !(m === "all" || m === k);
      });
      rootEl.setAttribute("data-mode", m);
    }

    function onInput() {
      var x = parseValue(input.value);
      if (x === null) {
        input.setAttribute("aria-invalid", "true");
        status.textContent = "not a number: type a decimal such as 0.1, 6.5e-5, inf or nan";
        return;
      }
      input.removeAttribute("aria-invalid");
      status.textContent = "";
      typed = x;
      encodeAll();
    }

    rootEl.addEventListener("click", function (ev) {
      var b = ev.target.closest ? ev.target.closest("button[data-bit-index]") : null;
      if (!b || !rootEl.contains(b)) {
        return;
      }
      var r = rows[b.getAttribute("data-format")];
      if (!r) {
        return;
      }
      var w = pow2(parseInt(b.getAttribute("data-bit-index"), 10));
      var set = Math.floor(r.pattern / w) % 2 === 1;
      r.pattern += set ? -w : w;
      r.edited = true;
      renderRow(r);
      status.textContent = r.cfg.fmt + " bits " + bitString(r.pattern, r.cfg.bits) + " = " +
        pyRepr(decode(r.pattern, r.cfg));
    });
    if (input) {
      input.addEventListener("input", onInput);
      input.addEventListener("change", onInput);
    }
    if (mode) {
      mode.addEventListener("change", showMode);
    }
    if (reset) {
      reset.addEventListener("click", function () {
        input.value = config.value;
        onInput();
      });
    }
    if (typed === null) {
      typed = NaN;
    }
    encodeAll();
    showMode();
    rootEl.setAttribute("data-ready", "1");
    return { rows: rows, encodeAll: encodeAll };
  }

  /* Mount the viewer whose root has this id, from the config in its JSON script element;
     waits (briefly) for an output that is attached to the page after its script ran. */
  function mountById(id, tries) {
    var el = typeof document !== "undefined" ? document.getElementById(id) : null;
    if (!el) {
      if ((tries || 0) < 100 && typeof setTimeout === "function") {
        setTimeout(function () {
          mountById(id, (tries || 0) + 1);
        }, 50);
      }
      return;
    }
    var cfgEl = el.querySelector('script[data-role="config"]');
    mount(el, JSON.parse(cfgEl.textContent));
  }

  return {
    version: VERSION,
    parseValue: parseValue,
    pyRepr: pyRepr,
    encode: encode,
    decode: decode,
    patternNote: patternNote,
    noteText: noteText,
    errorTexts: errorTexts,
    fieldsText: fieldsText,
    bitString: bitString,
    mount: mount,
    mountById: mountById,
  };
});
