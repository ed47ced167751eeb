/* memlab number formatting, shared by the kernel-free pieces (estimator.js, bitviewer.js).
 *
 * Numbers and values written exactly as Python writes them, so that a page's script shows the
 * same text as the Python that rendered it first: format(x, ",.Nf") with its round-half-even on
 * the double's exact value, repr() of a float (shortest round trip), repr() of a JSON value.
 * Embedded before each piece's script by memlab.interactive.page.mount_scripts.
 *
 * Exposed as globalThis.memlabFormat (and module.exports under Node):
 *   pyFixed(x, digits)     format(x, ",.<digits>f")
 *   groupThousands(text)   "1234567" -> "1,234,567"
 *   intText(n)             format(n, ",") of an integer
 *   floatRepr(x)           repr(x) of a float
 *   pyRepr(v)              repr() of a parsed JSON value (integral numbers as ints)
 */
(function (root, factory) {
  "use strict";
  var api = factory();
  if (typeof module === "object" && module && module.exports) {
    module.exports = api;
  }
  if (root) {
    root.memlabFormat = api;
  }
})(typeof globalThis !== "undefined" ? globalThis : typeof window !== "undefined" ? window : this, function () {
  "use strict";

  var view = new DataView(new ArrayBuffer(8));

  /* "1234567" -> "1,234,567" (Python's "," format). */
  function groupThousands(digitsText) {
    var out = "";
    for (var i = 0; i < digitsText.length; i++) {
      if (i > 0 && (digitsText.length - i) % 3 === 0) {
        out += ",";
      }
      out += digitsText.charAt(i);
    }
    return out;
  }

  function intText(n) {
    return groupThousands(String(n));
  }

  /* format(x, ",.<digits>f") of a finite double: its exact value, rounded half to even. */
  function pyFixed(x, digits) {
    var negative = x < 0 || (x === 0 && 1 / x < 0);
    view.setFloat64(0, Math.abs(x));
    var hi = view.getUint32(0);
    var lo = view.getUint32(4);
    var biased = (hi >>> 20) & 0x7ff;
    var two = BigInt(2);
    var ten = BigInt(10);
    var m = BigInt(hi & 0xfffff) * two ** BigInt(32) + BigInt(lo); // fraction bits
    var e;
    if (biased === 0) {
      e = -1074; // subnormal (or zero)
    } else {
      m += two ** BigInt(52);
      e = biased - 1075;
    }
    var scale = ten ** BigInt(digits);
    var q;
    if (e >= 0) {
      q = m * two ** BigInt(e) * scale;
    } else {
      var den = two ** BigInt(-e);
      var num = m * scale;
      q = num / den;
      var r2 = (num % den) * two;
      if (r2 > den || (r2 === den && q % two === BigInt(1))) {
        q += BigInt(1);
      }
    }
    var s = q.toString();
    while (s.length <= digits) {
      s = "0" + s;
    }
    var whole = s.slice(0, s.length - digits);
    var frac = s.slice(s.length - digits);
    return (negative ? "-" : "") + groupThousands(whole) + (digits > 0 ? "." + frac : "");
  }

  /* A float as Python's repr() writes it: shortest round trip, 'e' below 1e-4 and from 1e16. */
  function floatRepr(x) {
    if (x !== x) {
      return "nan";
    }
    if (x === Infinity || x === -Infinity) {
      return x > 0 ? "inf" : "-inf";
    }
    if (x === 0) {
      return 1 / x < 0 ? "-0.0" : "0.0";
    }
    var sign = x < 0 ? "-" : "";
    var parts = Math.abs(x).toExponential().split("e"); // shortest digits
    var digits = parts[0].replace(".", "");
    var exp = parseInt(parts[1], 10);
    if (exp < -4 || exp >= 16) {
      var mant = digits.charAt(0) + (digits.length > 1 ? "." + digits.slice(1) : "");
      var es = String(Math.abs(exp));
      return sign + mant + "e" + (exp < 0 ? "-" : "+") + (es.length < 2 ? "0" + es : es);
    }
    if (exp < 0) {
      return sign + "0." + new Array(-exp).join("0") + digits;
    }
    if (digits.length <= exp + 1) {
      return sign + digits + new Array(exp + 2 - digits.length).join("0") + ".0";
    }
    return sign + digits.slice(0, exp + 1) + "." + digits.slice(exp + 1);
  }

  /* A string as Python's repr() writes it: single quotes unless it holds one and no double. */
  function strRepr(v) {
    var quote = v.indexOf("'") >= 0 && v.indexOf('"') < 0 ? '"' : "'";
    var out = "";
    for (var i = 0; i < v.length; i++) {
      var ch = v.charAt(i);
      var code = v.charCodeAt(i);
      if (ch === "\\" || ch === quote) {
        out += "\\" + ch;
      } else if (ch === "\n") {
        out += "\\n";
      } else if (ch === "\r") {
        out += "\\r";
      } else if (ch === "\t") {
        out += "\\t";
      } else if (code < 0x20 || code === 0x7f) {
        out += "\\x" + (code < 0x10 ? "0" : "") + code.toString(16);
      } else {
        out += ch;
      }
    }
    return quote + out + quote;
  }

  /* A parsed JSON value as Python's repr() writes it (integral numbers as ints). */
  function pyRepr(v) {
    if (v === null || v === undefined) {
      return "None";
    }
    if (v === true || v === false) {
      return v ? "True" : "False";
    }
    if (typeof v === "number") {
      return Number.isInteger(v) && Math.abs(v) < Number.MAX_SAFE_INTEGER ? String(v) : floatRepr(v);
    }
    if (typeof v === "string") {
      return strRepr(v);
    }
    if (Array.isArray(v)) {
      return "[" + v.map(pyRepr).join(", ") + "]";
    }
    return "{" + Object.keys(v).map(function (k) {
      return pyRepr(k) + ": " + pyRepr(v[k]);
    }).join(", ") + "}";
  }

  return {
    pyFixed: pyFixed,
    groupThousands: groupThousands,
    intText: intText,
    floatRepr: floatRepr,
    pyRepr: pyRepr,
  };
});
