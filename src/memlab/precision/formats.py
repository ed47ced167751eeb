"""Number formats: the one source of truth for their fields, ranges and bit patterns (chapter: 2).

Float formats (fp32, fp16, bf16, fp8-e4m3, fp8-e5m2) are described and rounded by torch itself:
``spec`` reads ``torch.finfo``, ``bits`` and ``round_to`` cast with torch (round to nearest, ties
to even) and read the bits back with ``Tensor.view``. A Python float is a float64; torch casts a
float64 to a narrow format through float32, which can round twice, so a float64 input is first
rounded to float32 *to odd* (correct for every target with at least two fewer mantissa bits), which
makes the result the correctly rounded one. Overflow is whatever torch's cast does: fp16, bf16 and
fp8-e5m2 overflow to inf; fp8-e4m3 (``float8_e4m3fn``, no inf) saturates to +-448 on this torch,
infinities included, and only NaN stays NaN.

Integer formats (int8, int4) round half to even. ``bits`` refuses a value outside the range,
``round_to`` clamps (saturates) to it; ``int8_cast`` is torch's cast instead, which truncates
toward zero and wraps. Code-book formats (nf4, fp4) store a 4-bit index into the
16-value table that bitsandbytes defines, for values already scaled into [-1, 1].
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import torch

from memlab.dtypes import FLOAT_DTYPES, FLOAT_FORMATS, dtype  # noqa: F401 (part of this module's API)
from memlab.errors import MemlabError, check_choice

FORMATS = ("fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "int8", "int4", "nf4", "fp4")

_INT_BITS = {"int8": torch.iinfo(torch.int8).bits, "int4": 4}
_VIEW_DTYPES = {32: torch.int32, 16: torch.int16, 8: torch.uint8}

# The code books as bitsandbytes 0.50 writes them in ``bitsandbytes.functional.get_4bit_type``,
# used only when bitsandbytes cannot be imported (the tests check both agree when it can).
# nf4: quantiles of N(0, 1), QLoRA (arXiv:2305.14314). fp4: 1 sign, 2 exponent, 1 mantissa bits,
# listed in bit-pattern order, then divided by their absmax (12).
_NF4_FALLBACK = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
_FP4_FALLBACK = (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0,
                 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)


@dataclass(frozen=True)
class FormatSpec:
    """The fields and range of one number format; None where a field does not apply (chapter: 2)."""

    fmt: str
    kind: str  # 'float' | 'int' | 'code'
    bits: int
    sign_bits: int | None
    exponent_bits: int | None
    mantissa_bits: int | None
    bias: int | None
    max: float
    min: float
    min_normal: float | None
    min_subnormal: float | None
    eps: float | None
    has_inf: bool
    has_nan: bool
    codebook: tuple[float, ...] | None = None


@dataclass(frozen=True)
class BitPattern:
    """How one value is stored in a format: bit fields, stored value and rounding error (chapter: 2)."""

    fmt: str
    sign: str
    exponent: str
    mantissa: str
    bit_string: str
    value: float
    input: float
    error: float
    note: str

    def as_dict(self) -> dict:
        """The fields as a JSON-ready dict; inf and NaN become the strings 'inf', '-inf', 'nan' (chapter: 2)."""
        d = dict(fmt=self.fmt, sign=self.sign, exponent=self.exponent, mantissa=self.mantissa,
                 bit_string=self.bit_string, value=self.value, input=self.input,
                 error=self.error, note=self.note)
        for key in ("value", "input", "error"):
            if not math.isfinite(d[key]):
                d[key] = repr(d[key])
        return d

    def line(self) -> str:
        """One readable line: ``fmt  sign | exponent | mantissa = value (error, note)`` (chapter: 2)."""
        if self.exponent or self.mantissa:
            fields = " | ".join(f for f in (self.sign, self.exponent, self.mantissa) if f)
        else:  # two's complement integers and code indices: the bits as one field
            fields = self.bit_string
        return (f"{self.fmt:<8}  {fields}  = {self.value!r}  "
                f"(error {self.error:+.6g}, {self.note})")


def _check_format(fmt) -> str:
    return check_choice("format", fmt, FORMATS)


def parse_value(x) -> float:
    """A real number, or a string Python's ``float()`` reads, as a float (chapter: 2).

    Such as '0.1', '6e-5', 'inf', 'nan'.
    """
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x.strip())
        except ValueError:
            pass
    raise MemlabError(f"not a number: {x!r}; accepted: a real number or a string such as '0.1', "
                      "'6.5e-5', 'inf', 'nan'")


def bitsandbytes_functional():
    """``bitsandbytes.functional``, or None if bitsandbytes cannot be imported here."""
    import logging
    import warnings

    log = logging.getLogger("bitsandbytes")
    level = log.level
    log.setLevel(logging.ERROR)  # its CPU backend warns about optional kernels on import
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import bitsandbytes.functional as bnbf
    except (ImportError, RuntimeError, OSError):
        return None
    finally:
        log.setLevel(level)
    return bnbf


def _fallback_codebook(fmt: str) -> tuple[float, ...]:
    """The documented copy of bitsandbytes' code book, in float32 as bitsandbytes stores it."""
    data = torch.tensor(_NF4_FALLBACK if fmt == "nf4" else _FP4_FALLBACK, dtype=torch.float32)
    return tuple((data / data.abs().max()).tolist())


@functools.cache
def codebook(fmt: str) -> tuple[float, ...]:
    """The 16 values of nf4 or fp4, index order, from bitsandbytes when importable (chapter: 2)."""
    check_choice("code-book format", fmt, ("nf4", "fp4"))
    bnbf = bitsandbytes_functional()
    if bnbf is None:
        return _fallback_codebook(fmt)
    return tuple(bnbf.get_4bit_type(fmt, device="cpu").float().tolist())


def _bits_as_value(pattern: int, dtype: torch.dtype) -> float:
    """The value of the bit pattern ``pattern`` in a float dtype."""
    width = torch.finfo(dtype).bits
    return torch.tensor(pattern, dtype=_VIEW_DTYPES[width]).view(dtype).item()


@functools.cache
def spec(fmt: str) -> FormatSpec:
    """The fields, bias and range of a format, read from torch (and bitsandbytes) (chapter: 2)."""
    _check_format(fmt)
    if fmt in FLOAT_DTYPES:
        dtype = FLOAT_DTYPES[fmt]
        fi = torch.finfo(dtype)
        m = round(-math.log2(fi.eps))  # eps = 2^-m
        e = fi.bits - 1 - m
        bias = 1 - round(math.log2(fi.smallest_normal))  # min normal = 2^(1 - bias)
        special = torch.tensor([math.inf, math.nan]).to(dtype).float()
        return FormatSpec(fmt=fmt, kind="float", bits=fi.bits, sign_bits=1, exponent_bits=e,
                          mantissa_bits=m, bias=bias, max=fi.max, min=fi.min,
                          min_normal=fi.smallest_normal, min_subnormal=_bits_as_value(1, dtype),
                          eps=fi.eps, has_inf=bool(torch.isinf(special[0])),
                          has_nan=bool(torch.isnan(special[1])))
    if fmt in _INT_BITS:
        n = _INT_BITS[fmt]
        lo, hi = -(2 ** (n - 1)), 2 ** (n - 1) - 1
        return FormatSpec(fmt=fmt, kind="int", bits=n, sign_bits=1, exponent_bits=None,
                          mantissa_bits=None, bias=None, max=float(hi), min=float(lo),
                          min_normal=None, min_subnormal=None, eps=None, has_inf=False,
                          has_nan=False)
    book = codebook(fmt)
    return FormatSpec(fmt=fmt, kind="code", bits=int(math.log2(len(book))), sign_bits=None,
                      exponent_bits=None, mantissa_bits=None, bias=None, max=max(book),
                      min=min(book), min_normal=None, min_subnormal=None, eps=None,
                      has_inf=False, has_nan=False, codebook=book)


def _to_float_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast to a float dtype with one correct rounding (float64 goes through float32 rounded to odd)."""
    if t.dtype != torch.float64 or dtype in (torch.float32, torch.float64):
        return t.to(dtype)
    r = t.to(torch.float32)
    inexact = torch.isfinite(t) & (r.double() != t)
    # Round to odd: truncate toward zero, then set the last bit if anything was dropped.
    toward_zero = torch.where(r.double().abs() > t.abs(), torch.nextafter(r, torch.zeros_like(r)), r)
    odd = (toward_zero.view(torch.int32) | 1).view(torch.float32)
    return torch.where(inexact, odd, r).to(dtype)


def _round_half_even(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t)  # torch.round rounds half to even


def _nearest_code(t: torch.Tensor, fmt: str) -> torch.Tensor:
    """Index of the nearest code (the lower index on a tie), same shape as ``t``."""
    book = torch.tensor(codebook(fmt), dtype=torch.float64)
    return (t.double().unsqueeze(-1) - book).abs().argmin(dim=-1)  # first minimum on ties


def round_to(x, fmt: str):
    """The value of ``x`` after a round trip through ``fmt``; a tensor in gives a tensor out (chapter: 2).

    Floats round to nearest even and overflow as torch's cast does (inf, or for fp8-e4m3 +-448).
    int8/int4 round half to even and saturate to their range; nf4/fp4 clamp to [-1, 1] and take
    the nearest code (the lower index on a tie). NaN has no integer or code value: MemlabError.
    A tensor comes back as float32, or float64 if it was float64.
    """
    _check_format(fmt)
    if isinstance(x, torch.Tensor):
        out_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        t = x.to(torch.float64) if not x.is_floating_point() else x
    else:
        out_dtype = None
        t = torch.tensor(parse_value(x), dtype=torch.float64)
    s = spec(fmt)
    if s.kind == "float":
        r = _to_float_dtype(t, FLOAT_DTYPES[fmt]).to(torch.float64)
    else:
        if torch.isnan(t).any():
            raise MemlabError(f"NaN has no {fmt} value; {fmt} holds numbers in [{s.min:g}, {s.max:g}]")
        if s.kind == "int":
            r = _round_half_even(t.double()).clamp(s.min, s.max)
        else:
            idx = _nearest_code(t.clamp(s.min, s.max), fmt)
            r = torch.tensor(s.codebook, dtype=torch.float64)[idx]
    return r.to(out_dtype) if out_dtype is not None else r.item()


def _float_note(value: float, x: float, s: FormatSpec) -> str:
    if math.isnan(value):
        return "NaN" if math.isnan(x) else "overflow -> NaN"
    if math.isinf(value):
        return "inf" if math.isinf(x) else "overflow -> inf"
    ulp_at_max = 2.0 ** (math.frexp(s.max)[1] - 1) * s.eps
    if abs(x) > s.max + ulp_at_max / 2:
        return "saturated"
    if value == 0:
        return "zero" if x == 0 else "underflow -> 0"
    return "subnormal" if abs(value) < s.min_normal else "normal"


def _error(value: float, x: float) -> float:
    """Stored minus requested; 0 when they are equal, infinities included."""
    return 0.0 if value == x else value - x


def _float_bits(x: float, fmt: str, s: FormatSpec) -> BitPattern:
    stored = _to_float_dtype(torch.tensor(x, dtype=torch.float64), FLOAT_DTYPES[fmt])
    pattern = int(stored.view(_VIEW_DTYPES[s.bits]).item()) & ((1 << s.bits) - 1)
    b = format(pattern, f"0{s.bits}b")
    value = stored.item()
    return BitPattern(fmt=fmt, sign=b[:1], exponent=b[1:1 + s.exponent_bits],
                      mantissa=b[1 + s.exponent_bits:], bit_string=b, value=value, input=x,
                      error=_error(value, x), note=_float_note(value, x, s))


def bits(x, fmt: str) -> BitPattern:
    """The bit pattern and stored value of ``x`` in ``fmt``, with the rounding error (chapter: 2).

    Integer formats hold two's complement and refuse a value whose rounded value is out of range;
    nf4/fp4 take a value already scaled into [-1, 1] and store the index of the nearest code
    (the lower index on a tie) as ``bit_string``, with no sign, exponent or mantissa fields.
    """
    _check_format(fmt)
    x = parse_value(x)
    s = spec(fmt)
    if s.kind == "float":
        return _float_bits(x, fmt, s)
    if s.kind == "int":
        rng = f"[{int(s.min)}, {int(s.max)}]"
        if not math.isfinite(x):
            raise MemlabError(f"{x!r} is not representable in {fmt}; it holds integers in {rng}")
        value = round(x)  # Python's round is half to even
        if not s.min <= value <= s.max:
            raise MemlabError(f"{x!r} is out of range for {fmt}: {rng}")
        b = format(value & ((1 << s.bits) - 1), f"0{s.bits}b")
        return BitPattern(fmt=fmt, sign=b[0], exponent="", mantissa="", bit_string=b,
                          value=float(value), input=x, error=value - x,
                          note="exact" if value == x else "rounded")
    if not (s.min <= x <= s.max):  # False for NaN too
        raise MemlabError(f"{x!r} is out of range for {fmt}: [{s.min:g}, {s.max:g}] "
                          "(scale a block by its absmax first)")
    idx = int(_nearest_code(torch.tensor(x, dtype=torch.float64), fmt))
    value = s.codebook[idx]
    return BitPattern(fmt=fmt, sign="", exponent="", mantissa="",
                      bit_string=format(idx, f"0{s.bits}b"), value=value, input=x,
                      error=value - x, note=f"code {idx}")


# Ranges, errors and storage, for the chapter's tables and figures (chapter 2) -----------------
PATTERN_FORMATS = tuple(f for f in FORMATS if f not in ("nf4", "fp4"))  # stored as a bit pattern
_SIGNED_VIEW = {32: torch.int32, 16: torch.int16, 8: torch.int8}


def decode_many(patterns, fmt: str) -> list[float]:
    """Values of bit patterns (unsigned integers) in a float or integer format (chapter: 2).

    Read by torch's views.
    """
    check_choice("bit-pattern format", fmt, PATTERN_FORMATS)
    s = spec(fmt)
    p = torch.tensor(list(patterns), dtype=torch.int64)
    signed = torch.where(p >= 2 ** (s.bits - 1), p - 2**s.bits, p)  # two's complement
    if s.kind == "float":
        return signed.to(_SIGNED_VIEW[s.bits]).view(dtype(fmt)).double().tolist()
    return signed.double().tolist()  # int8 and int4 (no torch dtype): the signed integer


def decode(bit_string: str, fmt: str) -> float:
    """The value a bit string (most significant bit first) holds in ``fmt`` (chapter: 2)."""
    check_choice("bit-pattern format", fmt, PATTERN_FORMATS)
    width = spec(fmt).bits
    if (not isinstance(bit_string, str) or len(bit_string) != width
            or set(bit_string) - {"0", "1"}):
        raise MemlabError(f"a {fmt} bit string is {width} characters, each '0' or '1'; "
                          f"got {bit_string!r}")
    return decode_many([int(bit_string, 2)], fmt)[0]


def value_kind(value: float, fmt: str) -> str:
    """Which case of a float format's formula a value is (chapter: 2).

    'zero', 'subnormal', 'normal', 'inf' or 'NaN'.
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "zero"
    return "subnormal" if abs(value) < spec(fmt).min_normal else "normal"


def storage_bytes(fmt: str, n: int = 4096) -> float:
    """Measured bytes per value: an n-value tensor's storage over n (chapter: 2).

    4-bit formats use bitsandbytes' packing.
    """
    _check_format(fmt)
    if fmt in FLOAT_DTYPES or fmt == "int8":
        dt = FLOAT_DTYPES.get(fmt, torch.int8)
        return torch.empty(n, dtype=dt).untyped_storage().nbytes() / n
    bnbf = bitsandbytes_functional()
    if bnbf is None:
        raise MemlabError(f"measuring {fmt} storage needs bitsandbytes (pip install "
                          "'memlab[quant]')")
    # int4 has no torch storage of its own; it packs two codes per byte exactly as nf4/fp4 do.
    packed, _state = bnbf.quantize_4bit(torch.randn(n), quant_type="fp4" if fmt == "fp4" else "nf4")
    return packed.untyped_storage().nbytes() / n


@dataclass(frozen=True)
class Thresholds:
    """Where a float format stops representing magnitudes faithfully, all in the value's units."""

    fmt: str
    flush_to_zero_below: float  # |x| at or below this rounds to 0 (half the smallest subnormal)
    min_subnormal: float
    min_normal: float  # below this, precision drops bit by bit (subnormals)
    max: float
    overflow_from: float  # the smallest |x| that becomes inf (or saturates, for fp8-e4m3)
    overflow_to: float  # what it becomes there: inf, or the saturated max
    eps: float  # spacing just above 1: the relative precision of normal numbers is eps/2
    largest_exact_integer: int  # every integer up to this is stored exactly; the next is not


def _first_changed(lo: float, hi: float, fmt: str, changed) -> float:
    """Bisect float64 bit patterns in [lo, hi] for the smallest x with changed(round_to(x))."""
    a = torch.tensor(lo, dtype=torch.float64).view(torch.int64).item()
    b = torch.tensor(hi, dtype=torch.float64).view(torch.int64).item()
    while b - a > 1:  # invariant: changed at b, not at a (positive floats order as integers)
        mid = (a + b) // 2
        x = torch.tensor(mid, dtype=torch.int64).view(torch.float64).item()
        a, b = (a, mid) if changed(round_to(x, fmt)) else (mid, b)
    return torch.tensor(b, dtype=torch.int64).view(torch.float64).item()


@functools.cache
def thresholds(fmt: str) -> Thresholds:
    """Underflow and overflow thresholds of a float format, found by rounding with torch (chapter: 2)."""
    dtype(fmt)  # a float format, or a one-line error naming them
    s = spec(fmt)
    if s.has_inf:  # the smallest x above max whose stored value is no longer max
        overflow_from = _first_changed(s.max, s.max * 2, fmt, lambda v: v != s.max)
    else:  # saturates: where a format with an infinity would have left max behind
        half_ulp = 2.0 ** (math.frexp(s.max)[1] - 1) * s.eps / 2
        max_is_even = bits(s.max, fmt).mantissa.endswith("0")  # a tie goes to the even one
        overflow_from = s.max + half_ulp
        overflow_from = math.nextafter(overflow_from, math.inf) if max_is_even else overflow_from
    overflow_to = round_to(overflow_from, fmt)
    # Underflow: the largest x that still rounds to 0 is half the smallest subnormal (a tie, to even).
    first_nonzero = _first_changed(0.0, s.min_subnormal, fmt, lambda v: v != 0)
    flush = math.nextafter(first_nonzero, 0.0)
    # Integers: 2^(m+1) is exact, 2^(m+1) + 1 is not.
    n = 2 ** (s.mantissa_bits + 1)
    return Thresholds(fmt=fmt, flush_to_zero_below=flush, min_subnormal=s.min_subnormal,
                      min_normal=s.min_normal, max=s.max, overflow_from=overflow_from,
                      overflow_to=overflow_to, eps=s.eps, largest_exact_integer=n)


def thresholds_table(formats=FLOAT_FORMATS):
    """A pandas DataFrame of :func:`thresholds`, one row per float format (chapter: 2)."""
    pd = _pandas("thresholds_table")
    rows = {f: {k: v for k, v in thresholds(f).__dict__.items() if k != "fmt"} for f in formats}
    return pd.DataFrame.from_dict(rows, orient="index")


def _pandas(what: str):
    from memlab.errors import require

    return require("pandas", what, extra="notebook")


def relative_error(xs, fmt: str) -> torch.Tensor:
    """|round_to(x) - x| / |x| for a tensor of non-zero values, as float64 (chapter: 2)."""
    t = torch.as_tensor(xs, dtype=torch.float64)
    if (t == 0).any():
        raise MemlabError("relative_error needs non-zero values")
    with torch.no_grad():
        r = round_to(t, fmt).to(torch.float64)
    return ((r - t).abs() / t.abs()).where(torch.isfinite(r), torch.tensor(math.inf, dtype=torch.float64))


def representable(fmt: str, positive: bool = True) -> torch.Tensor:
    """Every finite value of an 8- or 16-bit float format (or int/code format), sorted (chapter: 2)."""
    s = spec(fmt)
    if s.kind == "code":
        vals = torch.tensor(sorted(set(s.codebook)), dtype=torch.float64)
    elif s.kind == "int":
        vals = torch.arange(int(s.min), int(s.max) + 1, dtype=torch.float64)
    else:
        if s.bits > 16:
            raise MemlabError(f"{fmt} has 2^{s.bits} values, too many to list; accepted: "
                              + ", ".join(f for f in FORMATS if spec(f).bits <= 16))
        patterns = torch.arange(2 ** s.bits, dtype=torch.int32).to(_VIEW_DTYPES[s.bits])
        vals = patterns.view(FLOAT_DTYPES[fmt]).to(torch.float64)
        vals = torch.unique(vals[torch.isfinite(vals)])
    return vals[vals > 0] if positive else vals


def int8_cast(x) -> torch.Tensor:
    """What torch's cast ``x.to(torch.int8)`` stores, as float64 (chapter: 2).

    Truncated toward zero, wrapped when out of range.

    A cast is not rounding: 2.7 becomes 2, and a value outside int8's range comes back as
    another integer (C++ leaves it undefined; x86 and ARM keep the low 8 bits of the int32).
    Compare :func:`round_to`, which rounds to nearest and saturates.
    """
    t = x if isinstance(x, torch.Tensor) else torch.tensor(parse_value(x), dtype=torch.float64)
    return t.to(torch.int8).to(torch.float64)


def same_number(x, absmax_blocks=(None, 10.0)):
    """A pandas DataFrame: ``x`` stored in each float format and in int8 (chapter: 2).

    In int8 by a cast, by rounding, and by absmax.

    Rows ``int8, cast`` (torch's ``.to(torch.int8)``: truncates toward zero, wraps out of range)
    and ``int8, round and clamp`` (:func:`round_to`); ``absmax_blocks`` gives the largest
    magnitude of the block ``x`` is quantized with (None: a block whose largest value is ``x``).
    """
    from memlab.quant.functional import absmax_quantize, dequantize

    pd = _pandas("same_number")
    x = parse_value(x)
    rows = []
    for fmt in FLOAT_FORMATS:
        b = bits(x, fmt)
        rows.append({"format": fmt, "bits": b.bit_string, "stored": b.value, "error": b.error,
                     "note": b.note})
    lo, hi = spec("int8").min, spec("int8").max
    inside = lo <= x <= hi
    if math.isfinite(x):
        cast = int8_cast(x).item()
        rows.append({"format": "int8, cast", "bits": bits(cast, "int8").bit_string,
                     "stored": cast, "error": cast - x,
                     "note": "truncated toward zero" + ("" if inside else ", wrapped")})
    rounded = round_to(x, "int8")
    rows.append({"format": "int8, round and clamp", "bits": bits(rounded, "int8").bit_string,
                 "stored": rounded, "error": rounded - x,
                 "note": "rounded to the nearest integer" if inside else f"clamped to {rounded:g}"})
    for block_max in absmax_blocks:
        top = abs(x) if block_max is None else float(block_max)
        q, state = absmax_quantize(torch.tensor([x, top], dtype=torch.float32))
        value = dequantize(q, state)[0].item()
        rows.append({"format": f"int8, absmax {top:g}", "bits": bits(int(q[0]), "int8").bit_string,
                     "stored": value, "error": value - x,
                     "note": f"code {int(q[0])} x {top:g}/{state.qmax}"})
    df = pd.DataFrame(rows).set_index("format")
    df["relative error"] = (df["error"].abs() / abs(x)) if x else float("nan")
    return df


# What this machine can do with each format: measured by trying -------------------------------
def _try(fn, *args) -> bool:
    try:
        fn(*args)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _scaled_mm(a: torch.Tensor) -> torch.Tensor:
    one = torch.ones((), device=a.device)
    return torch._scaled_mm(a, a.t().contiguous().t(), scale_a=one, scale_b=one,
                            out_dtype=torch.bfloat16)


def _probe_one(fmt: str, dev: torch.device) -> dict:
    dt = FLOAT_DTYPES[fmt]
    a = torch.randn(32, 32, device=dev).to(dt)
    return {
        "store (cast)": _try(lambda t: t.to(dt).float(), torch.randn(8, device=dev)),
        "add": _try(torch.add, a, a),
        "matmul": _try(torch.matmul, a, a),
        "_scaled_mm": _try(_scaled_mm, a) if fmt.startswith("fp8") else None,
    }


def probe_formats(device=None, formats=FLOAT_FORMATS):
    """A pandas DataFrame: can this device store, add, and matmul each format (chapter: 2).

    Tried, not looked up.
    """
    from memlab.device import pick_device

    pd = _pandas("probe_formats")
    dev = pick_device(device)
    rows = {fmt: _probe_one(check_choice("float format", fmt, FLOAT_FORMATS), dev)
            for fmt in formats}
    return pd.DataFrame.from_dict(rows, orient="index")
