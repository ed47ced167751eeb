"""Lab 3, "Quantization": absmax and zero-point by hand, bits per parameter, outlier features,
and the scheme that fits a memory budget.

Every expected value is computed at check time from :mod:`memlab.quant.functional` (and, for the 7B model,
from :mod:`memlab.model.transformer`), or from the tensors the notebook passes in, never typed in. The
tensors are small and seeded, so everything runs on the CPU in a few seconds.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from memlab.errors import MemlabError
from memlab.labs.grader import (
    answer_number,
    check_each_key,
    define_lab,
    one_line,
)
from memlab.model.config import PRESETS, ModelConfig
from memlab.precision.formats import spec
from memlab.quant.functional import (
    LLM_INT8_THRESHOLD,
    absmax_quantize,
    bits_per_parameter,
    dequantize,
    llm_int8_matmul,
    outlier_columns,
    quantize_4bit,
    stored_bytes,
    zeropoint_quantize,
)
from memlab.quant.schemes import SCHEMES
from memlab.units import to_unit

# Exercise 3.1: a small tensor with a negative skew (its largest magnitude is negative), and the
# cases the zero-point function is called on: (label, which tensor, bits).
TENSOR = dict(rows=4, cols=8, seed=3)
ZEROPOINT_CASES = (("x", "x", 8), ("x", "x", 4), ("p", "p", 8))

# Exercise 3.2a: storage schemes whose bits per parameter the student predicts.
BITS_CASES = {
    "nf4, blocks of 64": dict(scheme="nf4", blocksize=64),
    "nf4 + double quant, blocks of 64": dict(scheme="nf4", blocksize=64, double_quant=True),
    "int8 absmax, one scale per row of 4096": dict(scheme="int8", blocksize=4096),
    "int4 zero-point, groups of 128": dict(scheme="int4-zp", blocksize=128),
}
# The format of each scheme's codes.
CODE_FORMATS = {"nf4": "nf4", "int8": "int8", "int4-zp": "int4"}
# Exercise 3.2b: a 7B model stored the QLoRA way: the blocks' Linear weights in NF4 with double
# quantization, the embedding, lm_head and norms in bf16.
MODEL = "llama2-7b"
QLORA = dict(scheme="nf4", blocksize=64, double_quant=True)
KEPT_BITS = 16  # bf16
GB_RTOL = 1e-3

# Exercise 3.3: activations (tokens, features) with injected outlier features, and a weight.
ACTIVATIONS = dict(tokens=64, features=512, seed=0)
INT8_WEIGHT = dict(out_features=256, std=0.02, seed=1)
RATIO_RTOL = 0.01

# Exercise 3.4: one Linear layer's heavy-tailed weight, the inputs the output error is measured
# on, and the budget in bits per weight (turned into bytes for this layer).
LAYER = dict(out_features=256, in_features=1024, df=5, std=0.02, seed=1)
INPUTS = dict(tokens=32, seed=2)
BUDGET_BITS = 4.4
BLOCK = 64
LAB_SCHEMES = ("bf16", "int8", "nf4", "nf4-dq", "fp4", "int4-zp", "int3-zp")  # names of memlab.quant.schemes


# ------------------------------------------------------------------------- tensors


def tensor(rows: int = TENSOR["rows"], cols: int = TENSOR["cols"],
           seed: int = TENSOR["seed"]) -> torch.Tensor:
    """A small fp32 tensor with a negative skew: negatives stretched 2.5x, positives 0.8x (chapter: 3)."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return torch.where(x < 0, 2.5 * x, 0.8 * x)


def probabilities(x: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over the last dimension of :func:`tensor`: values that are all positive (chapter: 3)."""
    return torch.softmax(tensor() if x is None else x, dim=-1)


def _zeropoint_input(which: str) -> torch.Tensor:
    return tensor() if which == "x" else probabilities()


def activations(tokens: int = ACTIVATIONS["tokens"], features: int = ACTIVATIONS["features"],
                seed: int = ACTIVATIONS["seed"]) -> torch.Tensor:
    """(tokens, features) N(0, 1) activations with three outlier features injected (chapter: 3).

    One feature is large in every token, one is large and negative in about a quarter of the
    tokens, one in a single token; a fourth feature is scaled up to just below 6.0 (a near miss).
    Which features they are is drawn from the seed.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, features, generator=g)
    every, some, single, near = torch.randperm(features, generator=g)[:4].tolist()
    sign = torch.where(torch.rand(tokens, generator=g) < 0.9, 1.0, -1.0)
    x[:, every] = torch.empty(tokens).uniform_(8.0, 20.0, generator=g) * sign
    some_tokens = torch.rand(tokens, generator=g) < 0.25
    x[some_tokens, some] = -torch.empty(int(some_tokens.sum())).uniform_(7.0, 15.0, generator=g)
    x[int(torch.randint(tokens, (1,), generator=g)), single] = float(
        torch.empty(1).uniform_(6.5, 8.0, generator=g))
    x[:, near] = x[:, near] * (5.0 / x[:, near].abs().max())
    return x


def int8_weight(in_features: int = ACTIVATIONS["features"],
                out_features: int = INT8_WEIGHT["out_features"],
                std: float = INT8_WEIGHT["std"], seed: int = INT8_WEIGHT["seed"]) -> torch.Tensor:
    """An (out_features, in_features) N(0, std^2) weight for exercise 3.3 (chapter: 3)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=g) * std


def heavy_tailed_weight(out_features: int = LAYER["out_features"],
                        in_features: int = LAYER["in_features"], df: int = LAYER["df"],
                        std: float = LAYER["std"], seed: int = LAYER["seed"]) -> torch.Tensor:
    """An (out, in) weight of Student-t values with ``df`` degrees of freedom, times ``std`` (chapter: 3).

    Heavier tails than a normal distribution, as trained weights have: a few large values per
    block.
    """
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(out_features, in_features, generator=g)
    chi2 = torch.randn(out_features, in_features, df, generator=g).pow(2).sum(-1)
    return z / (chi2 / df).sqrt() * std


def layer_inputs(tokens: int = INPUTS["tokens"], in_features: int = LAYER["in_features"],
                 seed: int = INPUTS["seed"]) -> torch.Tensor:
    """(tokens, in_features) N(0, 1) inputs the layer's output error is measured on (chapter: 3)."""
    return torch.randn(tokens, in_features, generator=torch.Generator().manual_seed(seed))


def relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    """||y - reference|| / ||reference||, Frobenius norms, computed in fp64 (chapter: 3)."""
    y, reference = y.double(), reference.double()
    return ((y - reference).norm() / reference.norm()).item()


# ------------------------------------------------------------- bits and model bytes


def quantized_parameters(cfg: ModelConfig) -> int:
    """Parameters of the blocks' Linear weights of a Llama-style model (chapter: 3).

    The weights are q, k, v, o and the MLP's.
    """
    C, F, kv = cfg.d_model, cfg.ffn_dim, cfg.kv_heads * cfg.head_dim
    return cfg.n_layer * (2 * C * C + 2 * C * kv + 3 * C * F)


def model_weights_gb(model: str = MODEL, bits: float | None = None,
                     kept_bits: float = KEPT_BITS) -> float:
    """GB (10^9 bytes) of a model's weights: Linear weights at ``bits`` per parameter (QLoRA's
    NF4 + double quantization by default), the embedding, lm_head and norms at ``kept_bits`` (chapter: 3)."""
    cfg = PRESETS[model]
    bits = bits_per_parameter(**QLORA) if bits is None else bits
    quantized = quantized_parameters(cfg)
    kept = cfg.num_parameters() - quantized
    return to_unit((quantized * bits + kept * kept_bits) / 8, "GB")


# ------------------------------------------------------------ LLM.int8() errors


def int8_errors(x: torch.Tensor, weight: torch.Tensor,
                threshold: float = LLM_INT8_THRESHOLD) -> dict[str, float]:
    """Relative output error of plain vector-wise int8 and of LLM.int8() (chapter: 3).

    Each is held to x @ W.T in fp64.
    """
    reference = x.double() @ weight.double().T
    return {
        "int8": relative_error(llm_int8_matmul(x, weight, threshold=0.0), reference),
        "LLM.int8()": relative_error(llm_int8_matmul(x, weight, threshold=threshold), reference),
    }


# ----------------------------------------------------------------- scheme table


@dataclass(frozen=True)
class SchemeRow:
    """One storage scheme of a layer's weight: real bytes stored and the output error it causes."""

    scheme: str
    description: str
    stored_bytes: int
    bits_per_weight: float
    relative_error: float


def _store(scheme: str, w: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(dequantized weight, bytes stored) of ``w`` under one of :data:`LAB_SCHEMES`."""
    if scheme == "bf16":
        stored = w.to(torch.bfloat16)
        return stored.float(), stored.numel() * stored.element_size()
    if scheme == "int8":
        q, state = absmax_quantize(w, 8, granularity="row")
    elif scheme in ("nf4", "nf4-dq", "fp4"):
        q, state = quantize_4bit(w, quant_type=scheme[:3], blocksize=BLOCK,
                                 double_quant=scheme == "nf4-dq")
    else:  # int4-zp, int3-zp: GPTQ-style storage, fp16 scale and a zero at the code width
        q, state = zeropoint_quantize(w, int(scheme[3]), granularity="block", blocksize=BLOCK,
                                      scale_dtype=torch.float16)
    return dequantize(q, state), stored_bytes(q, state)


def scheme_table(weight: torch.Tensor | None = None,
                 inputs: torch.Tensor | None = None) -> list[SchemeRow]:
    """Every scheme of :data:`LAB_SCHEMES` applied to the layer (chapter: 3).

    It gives bytes stored and output error.
    """
    w = heavy_tailed_weight() if weight is None else weight
    x = layer_inputs() if inputs is None else inputs
    reference = x.double() @ w.double().T
    rows = []
    for scheme in LAB_SCHEMES:
        description = SCHEMES[scheme].description
        w_back, n_bytes = _store(scheme, w)
        rows.append(SchemeRow(scheme, description, n_bytes, 8 * n_bytes / w.numel(),
                              relative_error(x.double() @ w_back.double().T, reference)))
    return rows


def budget_bytes(bits: float = BUDGET_BITS, weight: torch.Tensor | None = None) -> int:
    """The memory budget of exercise 3.4: ``bits`` per weight of the layer, in bytes (chapter: 3)."""
    numel = heavy_tailed_weight().numel() if weight is None else weight.numel()
    return math.floor(numel * bits / 8)


def best_scheme(table: Iterable[SchemeRow], budget: int) -> str:
    """The scheme with the smallest output error among those that fit in ``budget`` bytes (chapter: 3)."""
    table = list(table)
    fitting = [row for row in table if row.stored_bytes <= budget]
    if not fitting:
        smallest = min(table, key=lambda row: row.stored_bytes)
        raise MemlabError(f"no scheme fits in {budget:,} bytes; the smallest, {smallest.scheme}, "
                          f"stores {smallest.stored_bytes:,}")
    return min(fitting, key=lambda row: row.relative_error).scheme


# -------------------------------------------------------------------- casts and notes

# A few floats to show what a cast to int8 does, next to quantization's round and clamp.
CAST_VALUES = (2.7, -2.7, 300.0, -300.0)


def cast_vs_round(values=CAST_VALUES) -> dict[str, list[int]]:
    """The same floats cast with .to(torch.int8) and rounded then clamped to -127..127 (chapter: 3).

    A cast truncates toward zero and, past int8's range, keeps the low 8 bits (wraps modulo 256);
    converting an out-of-range float is undefined in C++, so that part can differ by CPU.
    Quantization rounds to the nearest code and clamps.
    """
    x = torch.tensor(values, dtype=torch.float32)
    return {"x.to(torch.int8)": x.to(torch.int8).tolist(),
            "x.round().clamp(-127, 127).to(torch.int8)":
                x.round().clamp(-127, 127).to(torch.int8).tolist()}


def double_quant_saving() -> dict[str, float]:
    """What double quantization saves: bits per weight, and GB on :data:`MODEL` (chapter: 3)."""
    one = bits_per_parameter(QLORA["scheme"], blocksize=QLORA["blocksize"])
    two = bits_per_parameter(**QLORA)
    return {"bits per weight": one - two,
            "GB": model_weights_gb(bits=one) - model_weights_gb(bits=two)}


def kept_share() -> dict[str, float]:
    """Share of :data:`MODEL`'s parameters kept in bf16 (embedding, lm_head, norms), and of its bytes
    stored the QLoRA way (chapter: 3)."""
    cfg = PRESETS[MODEL]
    quantized = quantized_parameters(cfg)
    kept = cfg.num_parameters() - quantized
    kept_bits = kept * KEPT_BITS
    return {"parameters": kept / cfg.num_parameters(),
            "bytes": kept_bits / (kept_bits + quantized * bits_per_parameter(**QLORA))}


# -------------------------------------------------------------------------- checks


def _close(a: float, b: float, rtol: float = 1e-5) -> bool:
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rtol, abs_tol=1e-12)


def _call(fn: Callable, name: str, *args):
    """``fn(*args)``, or a (False, hint) verdict naming the exception it raised."""
    try:
        return fn(*args), None
    except Exception as exc:
        shown = ", ".join(["x"] + [repr(a) for a in args[1:]])
        return None, (False, f"{name}({shown}) raised {type(exc).__name__}: {one_line(exc)}")


def _codes_tensor(codes, shape) -> tuple[torch.Tensor | None, str]:
    try:
        t = codes if isinstance(codes, torch.Tensor) else torch.as_tensor(codes)
    except Exception:
        return None, f"codes must be a tensor, got {type(codes).__name__}"
    if tuple(t.shape) != tuple(shape):
        return None, f"codes must have the shape of the input {tuple(shape)}, got {tuple(t.shape)}"
    if t.is_complex() or t.dtype == torch.bool:
        return None, f"codes must be integers, got {t.dtype}"
    return t, ""


def _same_codes(got: torch.Tensor, expected: torch.Tensor) -> bool:
    return bool(torch.equal(got.double(), expected.double()))


def _like(codes: torch.Tensor, rule: Callable[[torch.Tensor], torch.Tensor],
          scaled: torch.Tensor, slack: float = 1e-4) -> bool:
    """True when ``codes`` are ``rule(scaled)`` (e.g. truncation), allowing either result where
    ``scaled`` lies within ``slack`` of the rule's edge (fp32 and fp64 can land on either side)."""
    got = codes.double()
    return bool(((got == rule(scaled - slack)) | (got == rule(scaled + slack))).all())


def _like_inside(codes: torch.Tensor, rule: Callable[[torch.Tensor], torch.Tensor],
                 values: torch.Tensor, lo: float, hi: float, slack: float = 1e-4) -> bool:
    """:func:`_like` on the values inside [lo + slack, hi - slack] only: at and past the edges a
    cast of a float to an integer dtype wraps or is undefined, so those codes say nothing."""
    inside = (values >= lo + slack) & (values <= hi - slack)
    if not inside.any():
        return False
    return _like(codes.double()[inside], rule, values[inside], slack)


def _rounding_hint(codes: torch.Tensor) -> str | None:
    if codes.is_floating_point() and not torch.equal(codes, codes.round()):
        return ("the codes are not integers: round x / scale to the nearest integer "
                "(torch.round) before storing it")
    return None


def check_absmax(answer):
    """Check an absmax_int8(x) -> (codes, scale) function against absmax_quantize (chapter: 3)."""
    if not callable(answer):
        return False, f"answer the function absmax_int8 itself, got {type(answer).__name__}"
    x = tensor()
    out, error = _call(answer, "absmax_int8", x.clone())
    if error:
        return error
    if out is None:
        return None  # the stub: the function body is still empty
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return False, "return two values: (codes, scale)"
    codes, scale = out
    if codes is None and scale is None:
        return None
    scale = answer_number(scale)
    if scale is None:
        return False, "scale must be one number (a float or a 0-d tensor)"
    codes, why = _codes_tensor(codes, x.shape)
    if codes is None:
        return False, why
    q_ref, state = absmax_quantize(x, 8)
    ref_scale = (state.absmax / state.qmax).item()
    amax = x.abs().max().item()
    if not _close(scale, ref_scale):
        if _close(scale, amax / (state.qmax + 1)):
            return False, ("the largest code is 127, not 128: int8's -128..127 is not symmetric, "
                           "so absmax maps max|x| to 127 and uses the codes -127..127")
        if _close(scale, x.max().item() / state.qmax):
            return False, ("the absmax is the largest magnitude max|x|, and in this tensor it is "
                           "on the negative side: use x.abs().max(), not x.max()")
        if _close(scale, 1 / ref_scale) or _close(scale, amax):
            return False, ("scale is the step between two codes, so that x ≈ codes * scale: "
                           "max|x| divided by the largest code")
        return False, "scale must be max|x| / 127, the step between two codes"
    hint = _rounding_hint(codes)
    if hint:
        return False, hint
    if not _same_codes(codes, q_ref):
        scaled = x.double() / ref_scale
        if _like(codes, torch.trunc, scaled):
            return False, ("the codes are truncated toward zero, which is what .to(torch.int8) "
                           "does to a float (and it wraps a value outside -128..127 around "
                           "modulo 256): round x / scale with torch.round, clamp, then cast")
        if _like(codes, torch.floor, scaled):
            return False, "floor rounds down: round x / scale to the nearest integer"
        if codes.dtype == torch.uint8 and _same_codes(codes, q_ref.to(torch.int16) % 256):
            return False, ("the negative codes wrapped around: absmax codes are signed, store "
                           "them as torch.int8")
        n = int((codes.double() != q_ref.double()).sum())
        return False, f"{n} of {x.numel()} codes differ from memlab.quant.functional.absmax_quantize's"
    if codes.dtype != torch.int8:
        return False, f"the codes are right; store them as torch.int8 (1 byte each), not {codes.dtype}"
    if not torch.allclose(codes.float() * scale, dequantize(q_ref, state), rtol=1e-6, atol=0):
        return False, "codes * scale must give back memlab.quant.functional.dequantize's values"
    return True


def check_zeropoint(answer):
    """Check a zeropoint_uint8(x, bits) -> (codes, scale, zero) function against zeropoint_quantize
    on every case of :data:`ZEROPOINT_CASES` (chapter: 3)."""
    if not callable(answer):
        return False, f"answer the function zeropoint_uint8 itself, got {type(answer).__name__}"
    for label, which, bits in ZEROPOINT_CASES:
        t = _zeropoint_input(which)
        out, error = _call(answer, "zeropoint_uint8", t.clone(), bits)
        if error:
            return error
        if out is None:
            return None
        where = f"on {label} with bits={bits}"
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            return False, "return three values: (codes, scale, zero)"
        codes, scale, zero = out
        if codes is None and scale is None and zero is None:
            return None
        scale, zero = answer_number(scale), answer_number(zero)
        if scale is None or zero is None:
            return False, "scale and zero must each be one number (a float, an int or a 0-d tensor)"
        codes, why = _codes_tensor(codes, t.shape)
        if codes is None:
            return False, why
        verdict = _check_zeropoint_case(t, bits, codes, scale, zero, where)
        if verdict is not True:
            return verdict
    return True


def _check_zeropoint_case(t, bits, codes, scale, zero, where):
    q_ref, state = zeropoint_quantize(t, bits)
    ref_scale, ref_zero = state.scale.item(), state.zero.item()
    levels = 2**bits - 1
    lo, hi = min(t.min().item(), 0.0), max(t.max().item(), 0.0)
    if not _close(scale, ref_scale):
        if _close(scale, (hi - lo) / 2**bits):
            return False, (f"{where}: 2^bits codes are 2^bits - 1 steps apart from the first to "
                           "the last: scale = (max - min) / (2^bits - 1)")
        if _close(scale, (t.max().item() - t.min().item()) / levels):
            return False, (f"{where}: the range must include 0 (min <= 0 <= max), so that 0 has "
                           "a code and is stored exactly; all values here are positive")
        if _close(scale, 2 * t.abs().max().item() / levels):
            return False, (f"{where}: zero-point spreads the codes over [min, max], not over "
                           "[-max|x|, max|x|] as absmax does")
        if bits != 8 and _close(scale, (hi - lo) / 255):
            return False, f"{where}: use bits: that is the 8-bit scale"
        if _close(scale, 1 / ref_scale):
            return False, (f"{where}: scale is the step between two codes, x ≈ (codes - zero) * "
                           "scale: the range divided by the number of steps")
        return False, f"{where}: scale must be (max - min) / (2^bits - 1), with 0 in [min, max]"
    if zero != ref_zero:
        if _close(zero, -lo / scale):
            return False, (f"{where}: the zero-point is a code, an integer: round -min / scale, "
                           "so that 0 is stored exactly")
        if zero == round(lo / scale):
            return False, f"{where}: the zero-point is the code of 0, round(-min / scale), not round(min / scale)"
        if zero < 0 or zero > levels:
            return False, (f"{where}: zero = {zero:g} is not a code between 0 and 2^bits - 1: "
                           "the range must include 0")
        return False, f"{where}: the zero-point is the code that stands for 0: round(-min / scale)"
    hint = _rounding_hint(codes)
    if hint:
        return False, f"{where}: {hint}"
    if not _same_codes(codes, q_ref):
        scaled = t.double() / ref_scale
        if (_like(codes.double() - ref_zero, torch.trunc, scaled)
                or _like_inside(codes, torch.trunc, scaled + ref_zero, 0, levels)):
            return False, (f"{where}: the codes are truncated toward zero, which is what "
                           ".to(torch.uint8) does to a float (and it wraps a value outside "
                           "0..255 around modulo 256): round x / scale with torch.round, add "
                           "the zero-point, clamp, then cast")
        if _like(codes, torch.round, (t.double() - lo) / ref_scale):
            return False, (f"{where}: round x / scale first, then add the integer zero-point: "
                           "rounding (x - min) / scale moves some codes by one")
        if _same_codes(codes, q_ref.double().clamp(max=127)):
            return False, (f"{where}: codes above 127 are clamped: zero-point codes run from 0 to "
                           "2^bits - 1 (255 for 8 bits), not over int8's range")
        n = int((codes.double() != q_ref.double()).sum())
        return False, f"{where}: {n} of {t.numel()} codes differ from memlab.quant.functional.zeropoint_quantize's"
    if codes.dtype != torch.uint8:
        return False, f"{where}: the codes are right; store them as torch.uint8, not {codes.dtype}"
    back = (codes.float() - zero) * scale
    if not torch.allclose(back, dequantize(q_ref, state), rtol=1e-6, atol=1e-7):
        return False, f"{where}: (codes - zero) * scale must give back memlab.quant.functional.dequantize's values"
    return True


def _bits_variants(case: dict) -> list[tuple[float, str]]:
    """Wrong answers a student is likely to give for one case of :data:`BITS_CASES`, each with its hint."""
    scheme, n = case["scheme"], case["blocksize"]
    code = float(spec(CODE_FORMATS[scheme]).bits)
    variants = [(code, f"that is the code alone: add the scale shared by each group of {n} "
                       "weights (its bits divided by the group size)")]
    if scheme == "nf4" and case.get("double_quant"):
        one_level = bits_per_parameter("nf4", blocksize=n)
        variants += [
            (one_level, "that is NF4 without double quantization: the fp32 absmax of each "
                        "block becomes an 8-bit code"),
            (code + 8 / n, "add the second level of double quantization: one fp32 constant "
                           "for every 256 quantized absmax values (32 / (64 * 256) bits per weight)"),
        ]
    if scheme == "int4-zp":
        variants += [
            (code + 16 / n, "add the zero-point: each group stores a 4-bit zero besides its "
                            "fp16 scale"),
            (code + 32 / n, "the scale is fp16 (16 bits) here, and each group also stores a "
                            "4-bit zero"),
            (code + (32 + 4) / n, "GPTQ-style storage keeps the scale in fp16 (16 bits), not fp32"),
            (code + (16 + 8) / n, "the zero is stored at the code width, 4 bits, not as a byte"),
        ]
    return variants


def check_bits(answer):
    """Check predicted bits per parameter for every case of :data:`BITS_CASES` (chapter: 3)."""
    def problem(key: str, value) -> str:
        case = BITS_CASES[key]
        got = answer_number(value)
        if got is not None and _close(got, bits_per_parameter(**case), rtol=1e-4):
            return ""
        return next((text for v, text in _bits_variants(case)
                     if got is not None and _close(got, v, rtol=1e-4)),
                    "code bits + (scale bits + zero bits) / weights per group")

    return check_each_key(answer, BITS_CASES, "BITS_CASES", problem)


def check_model_gb(answer, rtol: float = GB_RTOL):
    """Check the GB of :data:`MODEL`'s weights stored the QLoRA way (chapter: 3)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of GB, got {type(answer).__name__}"
    expected = model_weights_gb()
    if _close(got, expected, rtol=rtol):
        return True
    cfg = PRESETS[MODEL]
    everything = to_unit(cfg.num_parameters() * bits_per_parameter(**QLORA) / 8, "GB")
    variants = [
        (model_weights_gb(bits=4.0), "that counts 4 bits per quantized weight: add the "
         "absmax of each block of 64, double-quantized (bits_per_parameter)"),
        (model_weights_gb(bits=bits_per_parameter("nf4", blocksize=QLORA["blocksize"])),
         "that is NF4 without double quantization (one fp32 absmax per block): QLoRA "
         "double-quantizes the absmax values to 8 bits"),
        (everything, "the embedding, lm_head and norms stay in bf16: quantize only the Linear "
         "weights of the blocks"),
        (expected * 10**9 / 2**30, "GiB and GB are different units: answer GB (10^9 bytes)"),
        (expected * 8, "bits and bytes are different units: answer GB (10^9 bytes)"),
        (to_unit(cfg.num_parameters() * 2, "GB"), "that is the whole model in bf16"),
    ]
    why = next((text for value, text in variants if _close(got, value, rtol=rtol)), "")
    return False, why or "(Linear weights * bits per weight + the rest * 16 bits) / 8 / 10^9"


def _index_list(answer) -> tuple[list[int] | None, str]:
    if isinstance(answer, torch.Tensor) and answer.dtype == torch.bool:
        return None, "answer the column indices (e.g. a list of ints), not a boolean mask"
    try:
        values = answer.tolist() if hasattr(answer, "tolist") else list(answer)
    except TypeError:
        return None, f"answer a list of column indices, got {type(answer).__name__}"
    if isinstance(values, (int, float)):
        values = [values]
    if any(isinstance(v, bool) for v in values):
        return None, "answer the column indices (e.g. a list of ints), not a boolean mask"
    if not all(isinstance(v, numbers.Integral) for v in values):
        return None, "answer a flat list of integer column indices"
    return sorted({int(v) for v in values}), ""


def check_outliers(answer, x):
    """Check the outlier feature columns of ``x`` at :data:`LLM_INT8_THRESHOLD` (chapter: 3)."""
    got, why = _index_list(answer)
    if got is None:
        return False, why
    expected = outlier_columns(x, LLM_INT8_THRESHOLD).tolist()
    if got == expected:
        return True
    big = x.reshape(-1, x.shape[-1]).abs() >= LLM_INT8_THRESHOLD
    rows = torch.nonzero(big.any(dim=1)).reshape(-1).tolist()
    if got == rows and rows != expected:
        return False, ("those are token (row) indices: answer the feature (column) indices, "
                       "the columns holding an outlier")
    positive = torch.nonzero((x.reshape(-1, x.shape[-1]) >= LLM_INT8_THRESHOLD).any(dim=0)).reshape(-1)
    if got == positive.tolist():
        return False, ("compare magnitudes |x| with the threshold: a feature whose outliers are "
                       "negative is an outlier feature too")
    missing, extra = set(expected) - set(got), set(got) - set(expected)
    parts = []
    if missing:
        parts.append(f"{len(missing)} outlier column(s) missing")
    if extra:
        parts.append(f"{len(extra)} of your columns hold no value with |x| >= {LLM_INT8_THRESHOLD:g}")
    return False, ", ".join(parts)


def check_error_ratio(answer, x, weight, rtol: float = RATIO_RTOL):
    """Check plain int8's output error divided by LLM.int8()'s, within ``rtol`` (chapter: 3)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number, got {type(answer).__name__}"
    errors = int8_errors(x, weight)
    expected = errors["int8"] / errors["LLM.int8()"]
    if _close(got, expected, rtol=rtol):
        return True
    if _close(got, 1 / expected, rtol=rtol):
        return False, "that is LLM.int8()'s error over plain int8's: divide the other way"
    return False, ""


def check_scheme(answer):
    """Check the scheme that fits :func:`budget_bytes` with the smallest output error (chapter: 3)."""
    if not isinstance(answer, str):
        return False, f"answer a scheme name (a string), got {type(answer).__name__}"
    name = answer.strip()
    if name not in LAB_SCHEMES:
        return False, f"unknown scheme {answer!r}; accepted: {', '.join(LAB_SCHEMES)}"
    table = scheme_table()
    budget = budget_bytes()
    row = next(r for r in table if r.scheme == name)
    if row.stored_bytes > budget:
        return False, (f"{name} stores {row.stored_bytes:,} bytes, more than the budget of "
                       f"{budget:,}: count its scales too")
    if name == best_scheme(table, budget):
        return True
    fitting = [r for r in table if r.stored_bytes <= budget]
    if row is max(fitting, key=lambda r: r.stored_bytes):
        return False, (f"{name} is the largest scheme that fits, but not the one with the "
                       "smallest output error: more bytes do not always buy less error")
    return False, f"{name} fits, but another scheme that fits has a smaller output error"


lab = define_lab("lab03", "Quantization")

lab.exercise(
    "3.1a",
    "an absmax_int8(x) -> (codes, scale) function that gives absmax_quantize's codes and values",
    check=check_absmax,
    hint="scale = max|x| / 127; codes = round(x / scale), as torch.int8",
)
lab.exercise(
    "3.1b",
    "a zeropoint_uint8(x, bits) -> (codes, scale, zero) function that gives zeropoint_quantize's "
    "codes and values",
    check=check_zeropoint,
    hint="min and max widened to include 0; scale = (max - min) / (2^bits - 1); zero = "
    "round(-min / scale); codes = round(x / scale) + zero, clamped to 0..2^bits - 1, as "
    "torch.uint8",
)
lab.exercise(
    "3.2a",
    "bits per parameter of each storage scheme of BITS_CASES, scales included",
    check=check_bits,
    hint="answer a dict with the keys of BITS_CASES; give at least three decimals",
)
lab.exercise(
    "3.2b",
    f"GB of {MODEL}'s weights: Linear weights in NF4 with double quantization, the rest in bf16 "
    f"(within {GB_RTOL:.1%})",
    check=check_model_gb,
    rtol=GB_RTOL,
    hint="count the Linear weights of the blocks from cfg (d_model, ffn_dim, n_layer); the rest "
    "is cfg.num_parameters() minus those",
)
lab.exercise(
    "3.3a",
    f"the feature (column) indices of x holding a value of magnitude >= {LLM_INT8_THRESHOLD}",
    check=check_outliers,
    hint="a column is an outlier feature when any of its values has |x| >= threshold",
)
lab.exercise(
    "3.3b",
    f"plain int8's relative output error divided by LLM.int8()'s (within {RATIO_RTOL:.0%})",
    check=check_error_ratio,
    rtol=RATIO_RTOL,
    dimensionless=True,
    hint="relative error = ||y - y_ref|| / ||y_ref|| with y_ref = x @ W.T; llm_int8_matmul with "
    f"threshold=0.0 is plain int8, with threshold={LLM_INT8_THRESHOLD} it is LLM.int8()",
)
lab.exercise(
    "3.4",
    "the scheme that fits the memory budget with the smallest output error",
    check=check_scheme,
    hint="among the schemes whose stored bytes are within the budget, take the smallest error",
)
