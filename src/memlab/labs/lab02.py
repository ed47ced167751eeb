"""Lab 2, "Number formats": decode, round, and scale gradients into fp16 by hand.

Every expected value is computed at check time from :mod:`memlab.precision.formats` (which reads torch's
own formats and casts), or from the gradient tensor the notebook passes in as context, never
typed in. Everything runs on the CPU in a few seconds.
"""

from __future__ import annotations

import inspect
import math

import torch

from memlab.labs.grader import (
    answer_number,
    check_each_key,
    close_to,
    define_lab,
    named_slip,
    number_problem,
)
from memlab.precision.formats import decode, round_to, spec, value_kind

# Exercise 2.1: bit patterns to decode by hand, as (format, bit string).
PATTERNS = {
    "fp16 A": ("fp16", "0011010101010101"),
    "bf16 B": ("bf16", "0100000001001001"),
    "fp8-e4m3 C": ("fp8-e4m3", "10000011"),
    "fp8-e4m3 D": ("fp8-e4m3", "01111110"),
    "fp8-e5m2 E": ("fp8-e5m2", "01111100"),
}
# ... and every pattern of these formats.
ALL_PATTERN_FORMATS = ("fp8-e4m3", "fp8-e5m2")

# Exercise 2.2: values whose round trip through a format the student predicts.
CASES = {
    "2049 in fp16": (2049, "fp16"),
    "65519 in fp16": (65519, "fp16"),
    "65520 in fp16": (65520, "fp16"),
    "0.1 in bf16": (0.1, "bf16"),
    "1 + 2**-8 in bf16": (1 + 2**-8, "bf16"),
    "500 in fp8-e4m3": (500, "fp8-e4m3"),
    "1e-8 in fp16": (1e-8, "fp16"),
    "300 in int8": (300, "int8"),
}
# The rule each case turns on, named without its value: the hint for a wrong prediction.
RULES = {
    "2049 in fp16": "ties to even: it lies exactly halfway between two fp16 neighbours, and a "
    "tie goes to the one whose last mantissa bit is 0",
    "65519 in fp16": "round to nearest near the top: a value above fp16's max by less than half "
    "the spacing there is not an overflow",
    "65520 in fp16": "overflow: a value at least half the spacing at fp16's max above the max "
    "has no nearer fp16 value",
    "0.1 in bf16": "round to nearest: 0.1 has no finite binary expansion; keep bf16's mantissa "
    "bits (spec('bf16').mantissa_bits) and round the rest",
    "1 + 2**-8 in bf16": "ties to even: compare with bf16's spacing above 1 (spec('bf16').eps); "
    "a tie goes to the neighbour whose last mantissa bit is 0",
    "500 in fp8-e4m3": "saturation: float8_e4m3fn has no inf, and torch's cast clamps a value "
    "past the range",
    "1e-8 in fp16": "underflow: compare with half of fp16's smallest subnormal "
    "(spec('fp16').min_subnormal)",
    "300 in int8": "saturation: round_to clamps an integer format to its range "
    "(spec('int8').min, spec('int8').max)",
}

# Exercises 2.3 and 2.4: a gradient tensor with log-uniform magnitudes and random signs.
GRADIENTS = dict(n=100_000, low=1e-14, high=1e-1, seed=0)

# Exercise 2.3: the format gradients are cast to.
GRAD_FORMAT = "fp16"


# ------------------------------------------------------------------------- helpers


def all_patterns(fmt: str) -> list[str]:
    """Every bit pattern of a format, as bit strings in increasing order (chapter: 2)."""
    n = spec(fmt).bits
    return [format(p, f"0{n}b") for p in range(2**n)]


def fields(bit_string: str, fmt: str) -> str:
    """A bit pattern split into its sign, exponent and mantissa fields (chapter: 2)."""
    s = spec(fmt)
    e_end = s.sign_bits + s.exponent_bits
    return " | ".join((bit_string[: s.sign_bits], bit_string[s.sign_bits : e_end],
                       bit_string[e_end:]))


def rounding_note(x: float, fmt: str) -> str:
    """Which rule decided the round trip of ``x`` through ``fmt`` (chapter: 2)."""
    s = spec(fmt)
    r = round_to(x, fmt)
    if r == x:
        return "exact"
    if math.isinf(r):
        return "overflow -> inf"
    if r == 0:
        return "underflow -> 0"
    step_at_max = 1.0 if s.kind == "int" else 2.0 ** (math.frexp(s.max)[1] - 1) * s.eps
    if abs(r) == s.max and abs(x) >= s.max + step_at_max / 2:
        return "saturated at the max"
    other = 2 * x - r  # the neighbour on the other side, if x was halfway between the two
    if math.isfinite(other) and round_to(other, fmt) == other:
        return "tie -> even"
    return "rounded to nearest"


def gradients(n: int, low: float, high: float, seed: int) -> torch.Tensor:
    """fp32 values with log-uniform magnitudes in [low, high) and random signs, seeded (chapter: 2)."""
    g = torch.Generator().manual_seed(seed)
    exponent = math.log10(low) + (math.log10(high) - math.log10(low)) * torch.rand(
        n, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    return (sign * 10.0**exponent).float()


def _scaled(grads: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * grads``, exactly: in fp32 when that is exact (a power of two is), else in fp64."""
    scaled = grads.double() * scale
    narrow = scaled.float()
    return narrow if torch.equal(narrow.double(), scaled) else scaled  # fp32 casts fast


def flushed_share(grads: torch.Tensor, scale: float = 1.0, fmt: str = GRAD_FORMAT) -> float:
    """Share of the nonzero gradients that ``scale * g`` cast to ``fmt`` turns into 0 (chapter: 2)."""
    nonzero = grads != 0
    stored = round_to(_scaled(grads, scale), fmt)
    return ((stored == 0) & nonzero).sum().item() / max(1, nonzero.sum().item())


def subnormal_share(grads: torch.Tensor, scale: float = 1.0, fmt: str = GRAD_FORMAT) -> float:
    """Share of the nonzero gradients that land among ``fmt``'s subnormals after scaling (chapter: 2)."""
    nonzero = grads != 0
    stored = round_to(_scaled(grads, scale), fmt)
    sub = (stored != 0) & (stored.abs() < spec(fmt).min_normal)
    return (sub & nonzero).sum().item() / max(1, nonzero.sum().item())


def overflows(grads: torch.Tensor, scale: float, fmt: str = GRAD_FORMAT) -> bool:
    """True when max|g| * scale is above ``fmt``'s max (chapter: 2)."""
    return grads.abs().max().item() * scale > spec(fmt).max


def largest_safe_exponent(grads: torch.Tensor, fmt: str = GRAD_FORMAT) -> int:
    """The largest k for which the loss scale 2**k does not overflow ``fmt`` (chapter: 2)."""
    k = math.floor(math.log2(spec(fmt).max / grads.abs().max().item()))
    while overflows(grads, 2.0**k, fmt):  # guard against log2 landing on the wrong side
        k -= 1
    while not overflows(grads, 2.0 ** (k + 1), fmt):
        k += 1
    return k


def safe_scales(grads: torch.Tensor, fmt: str = GRAD_FORMAT, span: int = 40) -> dict[int, float]:
    """{k: flushed share at scale 2**k} for the ``span`` + 1 largest k that do not overflow (chapter: 2)."""
    top = largest_safe_exponent(grads, fmt)
    return {k: flushed_share(grads, 2.0**k, fmt) for k in range(top - span, top + 1)}


def scale_window(grads: torch.Tensor, fmt: str = GRAD_FORMAT) -> tuple[int, int]:
    """(smallest, largest) k whose loss scale 2**k overflows nothing and flushes the fewest (chapter: 2)."""
    shares = safe_scales(grads, fmt)
    best = min(shares.values())
    ks = [k for k, share in shares.items() if share == best]
    return min(ks), max(ks)


def grad_scaler_defaults() -> dict:
    """The defaults of torch.amp.GradScaler's scale schedule, read from its signature (chapter: 2)."""
    params = inspect.signature(torch.amp.GradScaler.__init__).parameters
    names = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
    return {name: params[name].default for name in names}


def grad_scaler_scales(max_abs_grad: float, steps: int, fmt: str = GRAD_FORMAT,
                       **schedule) -> tuple[list[float], int]:
    """The scale GradScaler uses at each step when every step's largest gradient is ``max_abs_grad``,
    and how many steps it skips (chapter: 2).

    The schedule is GradScaler's (``grad_scaler_defaults()``, overridden by ``schedule``): a step
    whose scaled gradient overflows ``fmt`` is skipped and the scale is multiplied by
    ``backoff_factor``; after ``growth_interval`` steps in a row without one, it is multiplied by
    ``growth_factor``.
    """
    cfg = {**grad_scaler_defaults(), **schedule}
    scale, good, skipped, scales = float(cfg["init_scale"]), 0, 0, []
    overflow: dict[float, bool] = {}
    for _ in range(steps):
        scales.append(scale)
        if scale not in overflow:
            overflow[scale] = not math.isfinite(round_to(max_abs_grad * scale, fmt))
        if overflow[scale]:
            skipped += 1
            scale *= cfg["backoff_factor"]
            good = 0
        else:
            good += 1
            if good == cfg["growth_interval"]:
                scale *= cfg["growth_factor"]
                good = 0
    return scales, skipped


# -------------------------------------------------------------------------- checks


def _same(answer: float, expected: float) -> bool:
    if math.isnan(expected):
        return math.isnan(answer)
    if answer == expected:
        return True
    return math.isfinite(expected) and math.isclose(answer, expected, rel_tol=1e-12, abs_tol=0.0)


def _decode_cases() -> list[tuple[str, str, str]]:
    """(label, format, bit string): the given patterns, then every pattern of the fp8 formats."""
    cases = [(name, fmt, b) for name, (fmt, b) in PATTERNS.items()]
    for fmt in ALL_PATTERN_FORMATS:
        cases += [(fmt, fmt, b) for b in all_patterns(fmt)]
    return cases


def check_decode(answer):
    """Check a decode function on the given patterns and every fp8 pattern (chapter: 2)."""
    if not callable(answer):
        return False, f"answer the function decode itself, got {type(answer).__name__}"
    cases = _decode_cases()
    got = []
    for _, fmt, b in cases:
        s = spec(fmt)
        try:
            value = answer(b, s.sign_bits, s.exponent_bits, s.mantissa_bits, s.bias,
                           has_inf=s.has_inf)
        except Exception as exc:
            return False, (f"decode({b!r}, ...) for {fmt} raised {type(exc).__name__}: "
                           f"{' '.join(str(exc).split())}")
        got.append(value)
    if all(v is None for v in got):
        return None  # the stub: the function body is still empty
    wrong: dict[str, list[tuple[str, str]]] = {}
    for (label, fmt, b), value in zip(cases, got, strict=True):
        expected = decode(b, fmt)
        number = answer_number(value)
        if number is None or not _same(number, expected):
            wrong.setdefault(label, []).append((b, value_kind(expected, fmt)))
    if not wrong:
        return True
    given = [label for label in PATTERNS if label in wrong]
    if given:
        return False, "wrong on the given pattern(s) " + ", ".join(
            f"{label} (a {wrong[label][0][1]} value)" for label in given)
    parts = []
    for fmt in ALL_PATTERN_FORMATS:
        if fmt in wrong:
            b, kind = wrong[fmt][0]
            parts.append(f"wrong on {len(wrong[fmt])} of {2 ** spec(fmt).bits} {fmt} patterns, "
                         f"e.g. {fields(b, fmt)} (a {kind} value)")
    return False, "; ".join(parts)


def check_predictions(answer):
    """Check a dict of predicted round trips against round_to (chapter: 2)."""
    def problem(key: str, value) -> str:
        number = answer_number(value)
        return "" if number is not None and _same(number, round_to(*CASES[key])) else RULES[key]

    return check_each_key(answer, CASES, "CASES", problem)


def share_below(grads: torch.Tensor, threshold: float) -> float:
    """Share of the nonzero gradients whose magnitude is below ``threshold`` (chapter: 2)."""
    nonzero = grads != 0
    return ((grads.abs() < threshold) & nonzero).sum().item() / max(1, nonzero.sum().item())


def flush_slips(grads: torch.Tensor) -> list[tuple[float, str]]:
    """Typical wrong shares of gradients that fp16 flushes to zero, each with its hint (chapter: 2)."""
    s = spec(GRAD_FORMAT)
    return [
        (share_below(grads, s.min_subnormal), "that counts the values below the smallest "
         "subnormal; round to nearest sends a value to it, not to 0, once it is above half of it"),
        (share_below(grads, s.min_normal), "that counts the values below the smallest normal: "
         "the subnormals between 0 and it are kept, with fewer significant bits"),
        (share_below(grads, s.min_subnormal / 2) * 100, "a share is a fraction between 0 and 1, "
         "not a percentage"),
    ]


def check_flushed(answer, grads, rtol: float = 0.02):
    """Check the share of ``grads`` that a cast to fp16 turns into 0 (chapter: 2)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number, a share between 0 and 1; got {type(answer).__name__}"
    if close_to(got, flushed_share(grads), rtol):
        return True
    return False, named_slip(got, flush_slips(grads), rtol) or (
        "a value becomes 0 when round to nearest sends it to 0: its magnitude is at most half "
        "the smallest subnormal; count those (or cast with grads.half() and count the zeros)")


def check_loss_scale(answer, grads):
    """Check a loss scale: a power of two, no overflow, the fewest gradients flushed (chapter: 2)."""
    scale = answer_number(answer)
    if scale is None:
        return False, f"answer a number, the loss scale S; got {type(answer).__name__}"
    if not (math.isfinite(scale) and scale > 0 and math.frexp(scale)[0] == 0.5):
        return False, f"S = {scale!r} is not a power of two (scaling by a power of two is exact in binary)"
    if overflows(grads, scale):
        return False, (f"max|g| * S is above {GRAD_FORMAT}'s max, so the largest gradient "
                       "overflows to inf")
    share = flushed_share(grads, scale)
    best = min(safe_scales(grads).values())
    if share > best:
        return False, (f"{share:.4%} of the gradients still flush to zero at S = 2**"
                       f"{math.frexp(scale)[1] - 1}; a power of two that overflows nothing "
                       f"flushes only {best:.4%}")
    return True


lab = define_lab("lab02", "Number formats")

lab.exercise(
    "2.1",
    "a decode(bit_string, sign_bits, exponent_bits, mantissa_bits, bias, has_inf) function that "
    "gives torch's value of the given patterns and of every fp8 pattern",
    check=check_decode,
    hint="normal: (-1)^s * 2^(E - bias) * (1 + M / 2^m); exponent field 0: no implicit 1 and "
    "the exponent of the smallest normal; all-ones exponent: inf (M = 0) or NaN when has_inf, "
    "else only the all-ones mantissa is NaN",
)
lab.exercise(
    "2.2",
    "round_to(x, fmt) predicted for each case of CASES",
    check=check_predictions,
    hint="answer a dict with the keys of CASES and numbers as values (float('inf') for infinity)",
)
def extremes_slips(key: str) -> list[tuple[float, str]]:
    """Typical wrong values of fp16's smallest subnormal and normal, each computed (chapter: 2)."""
    f = spec(GRAD_FORMAT)
    other = {"min_subnormal": f.min_normal, "min_normal": f.min_subnormal}[key]
    return [(other, "the two are swapped: the subnormals lie below the smallest normal")]


def check_extremes(answer):
    """2.3a: each of the two smallest values, a swap named as such (chapter: 2)."""
    f = spec(GRAD_FORMAT)
    right = {"min_subnormal": f.min_subnormal, "min_normal": f.min_normal}
    return check_each_key(answer, right, "the smallest values", lambda key, value: number_problem(
        value, right[key], rtol=1e-9, slips=lambda: extremes_slips(key)))


lab.exercise(
    "2.3a",
    "fp16's smallest positive value (min_subnormal) and smallest normal value (min_normal), "
    "from its field widths",
    check=check_extremes,
    hint="answer {'min_subnormal': ..., 'min_normal': ...}; bias = 2^(e - 1) - 1; the smallest "
    "normal has exponent field 1 and mantissa 0; the smallest subnormal has exponent field 0 and "
    "only the last mantissa bit set",
)
lab.exercise(
    "2.3b",
    "share of the gradient tensor that flushes to zero when cast to fp16 (within 2%)",
    check=check_flushed,
    rtol=0.02,
    dimensionless=True,
)
lab.exercise(
    "2.4",
    "a power-of-two loss scale S: no scaled gradient overflows fp16 and the fewest flush to zero",
    check=check_loss_scale,
    hint="the largest gradient sets how large S may be (max|g| * S <= fp16's max); a larger S "
    "lifts more small gradients above the underflow threshold",
)
