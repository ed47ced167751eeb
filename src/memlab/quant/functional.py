"""Quantization from scratch: pure functions that return ``(q, state)`` (chapters: 2, 3).

Every scheme here is written out in plain torch, and the tests check each one against
bitsandbytes' functional API (``quantize_4bit``, ``dequantize_4bit``, ``quantize_blockwise``,
``int8_vectorwise_quant``) and ``bitsandbytes.nn.Linear8bitLt``.

* **Absmax** (symmetric): ``q = round(qmax * x / max|x|)``, codes in ``[-qmax, qmax]``.
* **Zero-point** (asymmetric): ``q = round(x / scale) + zero`` with ``scale = (max - min) /
  (2^bits - 1)``, codes in ``[0, 2^bits - 1]``: the full range of codes covers ``[min, max]``.
* **Granularity**: one scale for the whole tensor, one per row (per output channel of a
  weight, per token of an activation), or one per block of ``blocksize`` consecutive values of
  the flattened tensor (the last block may be shorter).
* **Code books**: NF4 (quantiles of N(0, 1), QLoRA, arXiv:2305.14314 §3), bitsandbytes' FP4, and
  the 8-bit dynamic map (Dettmers 2015, arXiv:1511.04561) that double quantization stores the
  4-bit scales in. A value is scaled by its block's absmax into [-1, 1] and stored as the index
  of the nearest code.
* **Double quantization**: the fp32 absmax of every 64-value block is itself quantized, to
  8 bits in blocks of 256, after subtracting their mean (QLoRA §3).
* **LLM.int8()** (Dettmers et al. 2022, arXiv:2208.07339): input columns holding a value of
  magnitude at least ``threshold`` are multiplied in 16-bit, the rest with int8 codes, one
  absmax per input row and one per weight row ("vector-wise").

:func:`stored_bytes` counts the bytes a scheme really stores, codes packed and scales included;
:func:`bits_per_parameter` is the same count as a formula.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.quant.schemes import QUANT_TYPES, get_scheme

GRANULARITIES = ("tensor", "row", "block")
LLM_INT8_THRESHOLD = 6.0  # LLM.int8()'s outlier threshold: the paper's and bitsandbytes' default
DQ_BLOCKSIZE = 256  # double quantization: one fp32 absmax per 256 quantized absmax values
# NF4's extreme quantile (QLoRA §3; bitsandbytes' create_normal_map): the mean of
# 1 - 1/(2*15) and 1 - 1/(2*16), so that the ends of both halves sit on +-1.
NF4_OFFSET = 0.9677083

# States ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AbsmaxState:
    """What absmax dequantization needs: the scale (max|x| of each group) and the code range."""

    absmax: torch.Tensor  # float32: 0-d (tensor), (rows,) (row) or (n_blocks,) (block)
    bits: int
    qmax: int  # the largest code: 2^(bits-1) - 1, e.g. 127 for 8 bits
    granularity: str = "tensor"
    blocksize: int | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ZeroPointState:
    """What zero-point dequantization needs: x = (q - zero) * scale, for every group."""

    scale: torch.Tensor  # scale_dtype, one per group
    zero: torch.Tensor  # uint8 codes in [0, 2^bits - 1], one per group
    bits: int
    granularity: str
    blocksize: int | None
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BlockwiseState:
    """An 8-bit code-book quantization (bitsandbytes' ``quantize_blockwise``): code[q] * absmax."""

    absmax: torch.Tensor  # float32, one per block
    code: torch.Tensor  # (256,) float32, sorted
    blocksize: int
    shape: tuple[int, ...]
    offset: torch.Tensor | None = None  # added back after dequantization (double quantization)


@dataclass(frozen=True)
class FourBitState:
    """A 4-bit code-book quantization: code[q] * absmax of the block, two codes per byte."""

    quant_type: str
    code: torch.Tensor  # (16,) float32, index order
    blocksize: int
    shape: tuple[int, ...]
    absmax: torch.Tensor | None  # float32 per block, or None when double-quantized
    qabsmax: torch.Tensor | None = None  # uint8 per block: the absmax, double-quantized
    absmax_state: BlockwiseState | None = None  # how to dequantize qabsmax

    @property
    def double_quant(self) -> bool:
        return self.qabsmax is not None


# Input checks ----------------------------------------------------------------------------------
def _as_tensor(x) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float32)
    if not t.is_floating_point():
        t = t.float()
    if t.numel() == 0:
        raise MemlabError("cannot quantize an empty tensor")
    if not torch.isfinite(t).all():
        raise MemlabError("quantization needs finite values (got inf or NaN)")
    return t


def _check_bits(bits: int, lo: int = 2, hi: int = 8) -> int:
    check_positive_int("bits", bits)
    if not lo <= bits <= hi:
        raise MemlabError(f"bits must be between {lo} and {hi} for 8-bit storage, got {bits}")
    return bits


def _groups(t: torch.Tensor, granularity: str, blocksize: int) -> torch.Tensor:
    """``t`` as (groups, group_size): one row per scale. A short last block is padded with its
    own last value, which changes neither its max|x| nor its min and max."""
    check_choice("granularity", granularity, GRANULARITIES)
    if granularity == "tensor":
        return t.reshape(1, -1)
    if granularity == "row":
        return t.reshape(-1, t.shape[-1]) if t.dim() else t.reshape(1, 1)
    check_positive_int("blocksize", blocksize)
    flat = t.reshape(-1)
    pad = (-flat.numel()) % blocksize
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    return flat.reshape(-1, blocksize)


def _ungroup(g: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    return g.reshape(-1)[:n].reshape(shape)


def _nonzero(v: torch.Tensor) -> torch.Tensor:
    """``v`` with zeros replaced by 1: a divisor for all-zero groups (their values stay 0)."""
    return torch.where(v > 0, v, torch.ones_like(v))


def _round_up_to(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Positive float32 ``v`` rounded to ``dtype``, never down, returned as float32.

    A scale rounded down would make the grid span less than [min, max], so the extreme values
    would be clipped by up to a step; a scale too small for ``dtype`` would become 0.
    """
    r = v.to(dtype)
    r = torch.where(r.float() < v, torch.nextafter(r, torch.full_like(r, math.inf)), r)
    if not torch.isfinite(r).all():
        raise MemlabError(f"a scale of {float(v.max()):.4g} does not fit in {dtype} "
                          f"(largest finite {torch.finfo(dtype).max:.4g})")
    return r.float()


def _state_view(v: torch.Tensor, granularity: str) -> torch.Tensor:
    """A per-group statistic as stored: 0-d for a tensor, one per group otherwise."""
    return v.reshape(()) if granularity == "tensor" else v.reshape(-1)


# Absmax and zero-point -------------------------------------------------------------------------
def absmax_quantize(x, bits: int = 8, *, granularity: str = "tensor",
                    blocksize: int = 64) -> tuple[torch.Tensor, AbsmaxState]:
    """Symmetric absmax per tensor, row or block; int8 codes (chapters: 2, 3).

    q = round(qmax * x / max|x|).
    """
    _check_bits(bits)
    t = _as_tensor(x).float()
    qmax = 2 ** (bits - 1) - 1
    g = _groups(t, granularity, blocksize)  # (G, n)
    absmax = g.abs().amax(dim=1, keepdim=True)  # (G, 1)
    scale = qmax / _nonzero(absmax)  # x * (qmax / absmax), as bitsandbytes rounds it
    # ... unless qmax / absmax overflows (absmax below ~4e-37): then x / absmax * qmax
    q = torch.where(torch.isinf(scale), g / _nonzero(absmax) * qmax, g * scale)
    q = torch.round(q).clamp(-qmax, qmax).to(torch.int8)  # round half to even
    return _ungroup(q, tuple(t.shape)), AbsmaxState(
        absmax=_state_view(absmax, granularity), bits=bits, qmax=qmax, granularity=granularity,
        blocksize=blocksize if granularity == "block" else None, shape=tuple(t.shape))


def zeropoint_quantize(x, bits: int = 8, *, granularity: str = "tensor", blocksize: int = 64,
                       scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ZeroPointState]:
    """Asymmetric zero-point: q = round(x / scale) + zero, codes 0..2^bits-1 cover [min, max] (chapter: 3).

    The range always includes 0, so that 0 is stored exactly (padding, ReLU outputs). The scale is
    rounded up to ``scale_dtype`` (GPTQ stores fp16) before use, so what is stored is what is used
    and the grid still spans [min, max].
    """
    _check_bits(bits)
    t = _as_tensor(x).float()
    levels = 2 ** bits - 1
    g = _groups(t, granularity, blocksize)  # (G, n)
    lo = g.amin(dim=1, keepdim=True).clamp(max=0)  # (G, 1)
    hi = g.amax(dim=1, keepdim=True).clamp(min=0)
    scale = _round_up_to(_nonzero((hi - lo) / levels), scale_dtype)
    zero = torch.round(-lo / scale).clamp(0, levels)
    q = (torch.round(g / scale) + zero).clamp(0, levels).to(torch.uint8)
    return _ungroup(q, tuple(t.shape)), ZeroPointState(
        scale=_state_view(scale, granularity).to(scale_dtype),
        zero=_state_view(zero, granularity).to(torch.uint8), bits=bits, granularity=granularity,
        blocksize=blocksize if granularity == "block" else None, shape=tuple(t.shape))


# Code books --------------------------------------------------------------------------------------
@functools.cache
def _nf4(offset: float = NF4_OFFSET) -> torch.Tensor:
    ndtri = torch.special.ndtri
    # Probabilities in float32 and quantiles in float64, then float32: bitsandbytes' exact steps.
    pos = ndtri(torch.linspace(offset, 0.5, 9)[:-1].double())  # 8 positive quantiles
    neg = -ndtri(torch.linspace(offset, 0.5, 8)[:-1].double())  # 7 negative ones
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).float().sort().values
    return v / v.max()


def nf4_codebook(offset: float = NF4_OFFSET) -> torch.Tensor:
    """NF4's 16 values, from quantiles of N(0, 1) scaled to [-1, 1]; exact 0 included (chapter: 3).

    Asymmetric on purpose: 8 positive and 7 negative quantiles, so that 0 is a code. Sorted, which
    is also bitsandbytes' index order. ``offset`` is the probability of the outermost quantile
    (QLoRA's 0.9677 by default); it must lie strictly between 0.5 and 1.
    """
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not 0.5 < offset < 1:
        raise MemlabError(f"offset must be a probability strictly between 0.5 and 1, got {offset!r}")
    return _nf4(float(offset)).clone()


@functools.cache
def _fp4() -> torch.Tensor:
    # E2M1 magnitudes scaled so the largest is 1 (max 6 -> 1); bitsandbytes stores them in this
    # index order, and replaces E2M1's subnormal 0.5 (0.0833 after scaling) with 1/192.
    mags = [0.0, 1 / 192, 4 / 6, 1.0, 2 / 6, 3 / 6, 1 / 6, 1.5 / 6]
    return torch.tensor(mags + [-m for m in mags], dtype=torch.float32)


def fp4_codebook() -> torch.Tensor:
    """bitsandbytes' FP4: sign, 2 exponent and 1 mantissa bits, in its index order (chapter: 3)."""
    return _fp4().clone()


@functools.cache
def _dynamic(signed: bool = True) -> torch.Tensor:
    # Dettmers (arXiv:1511.04561) dynamic tree quantization, as bitsandbytes' create_dynamic_map:
    # for each decade 10^-6 .. 10^0 the midpoints of an even grid over [0.1, 1]; the grid gets one
    # more fraction bit per decade, then 0 and 1 are added.
    data: list[float] = []
    max_exp, non_sign = 7, 7
    for i in range(max_exp):
        items = 2 ** (i + non_sign - max_exp) + 1 if signed else 2 ** (i + non_sign - max_exp + 1) + 1
        b = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (b[:-1] + b[1:]) / 2.0
        data += ((10 ** (-(max_exp - 1) + i)) * means).tolist()  # float32 products
        if signed:
            data += ((-(10 ** (-(max_exp - 1) + i))) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(data, dtype=torch.float32).sort().values


def dynamic_codebook() -> torch.Tensor:
    """The signed 8-bit dynamic map (256 sorted values in [-1, 1]) double quantization uses (chapter: 3)."""
    return _dynamic().clone()


def _code(quant_type: str) -> torch.Tensor:
    check_choice("4-bit quant_type", quant_type, QUANT_TYPES)
    return _nf4() if quant_type == "nf4" else _fp4()


def _nearest(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the nearest code for every value in [-1, 1]; a tie goes to the smaller code."""
    order = torch.argsort(code)
    sorted_code = code[order]
    mid = (sorted_code[:-1] + sorted_code[1:]) / 2  # decision boundaries
    return order[torch.bucketize(scaled, mid)]


def blockwise_quantize(x, *, code: torch.Tensor | None = None,
                       blocksize: int = DQ_BLOCKSIZE) -> tuple[torch.Tensor, BlockwiseState]:
    """8-bit code-book quantization per block: q = nearest(code, x / absmax) (chapter: 3)."""
    t = _as_tensor(x).float()
    code = _dynamic().clone() if code is None else code.clone()  # the state owns its code book
    g = _groups(t, "block", blocksize)  # (G, blocksize)
    absmax = g.abs().amax(dim=1, keepdim=True)  # 0 for an all-zero block, as bitsandbytes stores
    q = _nearest((g / _nonzero(absmax)).clamp(-1, 1), code).to(torch.uint8)
    return _ungroup(q, tuple(t.shape)), BlockwiseState(
        absmax=absmax.reshape(-1), code=code, blocksize=blocksize, shape=tuple(t.shape))


def quantize_4bit(x, *, quant_type: str = "nf4", blocksize: int = 64,
                  double_quant: bool = False) -> tuple[torch.Tensor, FourBitState]:
    """4-bit code-book quantization (NF4 or FP4) per block, two codes per byte (chapter: 3).

    Scales are optionally double-quantized.
    """
    code = _code(quant_type).clone()  # the state owns its code book
    check_positive_int("blocksize", blocksize)
    t = _as_tensor(x).float()
    g = _groups(t, "block", blocksize)  # (G, blocksize)
    absmax = g.abs().amax(dim=1, keepdim=True)  # (G, 1); 0 for an all-zero block, as bitsandbytes
    idx = _ungroup(_nearest((g / _nonzero(absmax)).clamp(-1, 1), code), tuple(t.shape)).reshape(-1)
    if idx.numel() % 2:  # an odd count: the last byte's second code is that of 0.0, as bitsandbytes
        idx = torch.cat([idx, _nearest(torch.zeros(1), code)])
    packed = pack_bits(idx.to(torch.uint8), 4)
    absmax = absmax.reshape(-1)
    if not double_quant:
        return packed, FourBitState(quant_type, code, blocksize, tuple(t.shape), absmax)
    offset = absmax.mean()  # the absmax values are all positive: centre them before the 8-bit map
    qabsmax, st = blockwise_quantize(absmax - offset, blocksize=DQ_BLOCKSIZE)
    st = BlockwiseState(st.absmax, st.code, st.blocksize, st.shape, offset=offset)
    return packed, FourBitState(quant_type, code, blocksize, tuple(t.shape), None, qabsmax, st)


# Packing -----------------------------------------------------------------------------------------
def pack_bits(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes 0..2^bits-1 packed densely, most significant bit first: ceil(n*bits/8) bytes (chapter: 3)."""
    _check_bits(bits, 1, 8)
    flat = q.reshape(-1).to(torch.uint8)
    if bits == 8:
        return flat.clone()
    if flat.numel() and int(flat.max()) >= 2 ** bits:
        raise MemlabError(f"a code does not fit in {bits} bits (largest is {int(flat.max())})")
    shifts = torch.arange(bits - 1, -1, -1, dtype=torch.uint8)
    stream = ((flat.unsqueeze(1) >> shifts) & 1).reshape(-1)  # (n * bits,)
    stream = torch.cat([stream, stream.new_zeros((-stream.numel()) % 8)]).reshape(-1, 8)
    weights = (2 ** torch.arange(7, -1, -1)).to(torch.uint8)
    return (stream * weights).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` codes stored by :func:`pack_bits` (chapter: 3)."""
    _check_bits(bits, 1, 8)
    if bits == 8:
        return packed.reshape(-1)[:n].clone()
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    stream = ((packed.reshape(-1).unsqueeze(1) >> shifts) & 1).reshape(-1)[: n * bits]
    weights = (2 ** torch.arange(bits - 1, -1, -1)).to(torch.uint8)
    return (stream.reshape(n, bits) * weights).sum(dim=1, dtype=torch.uint8)


# Dequantization and storage ----------------------------------------------------------------------
def _per_group(v: torch.Tensor) -> torch.Tensor:
    """A stored per-group statistic (0-d for a whole tensor) as a (G, 1) float32 column."""
    return v.float().reshape(-1, 1)


def dequantize(q: torch.Tensor, state) -> torch.Tensor:
    """The float32 values the codes ``q`` stand for, under any state from this module (chapters: 2, 3)."""
    if isinstance(state, AbsmaxState):
        if state.shape is None:  # built by hand: a single scale
            return q.float() * (state.absmax / state.qmax)
        g = _groups(q.float(), state.granularity, state.blocksize or 1)
        return _ungroup(g * (_per_group(state.absmax) / state.qmax), state.shape)
    if isinstance(state, ZeroPointState):
        g = _groups(q.float(), state.granularity, state.blocksize or 1)
        scale = _per_group(state.scale)
        zero = _per_group(state.zero)
        return _ungroup((g - zero) * scale, state.shape)
    if isinstance(state, BlockwiseState):
        g = _groups(state.code[q.long()], "block", state.blocksize)
        out = _ungroup(g * state.absmax.reshape(-1, 1), state.shape)
        return out + state.offset if state.offset is not None else out
    if isinstance(state, FourBitState):
        n = math.prod(state.shape)
        idx = unpack_bits(q, 4, n).long()
        absmax = state.absmax if not state.double_quant else dequantize(state.qabsmax, state.absmax_state)
        g = _groups(state.code[idx].reshape(state.shape), "block", state.blocksize)
        return _ungroup(g * absmax.reshape(-1, 1), state.shape)
    raise MemlabError(f"state must be a state from memlab.quant.functional, got {type(state).__name__}")


def _state_tensors(state) -> list[torch.Tensor]:
    if isinstance(state, AbsmaxState):
        return [state.absmax]
    if isinstance(state, ZeroPointState):
        # GPTQ-style storage: zeros packed at the code width
        return [state.scale, pack_bits(state.zero, state.bits)]
    if isinstance(state, BlockwiseState):
        return [state.absmax] + ([state.offset] if state.offset is not None else [])
    if isinstance(state, FourBitState):
        if state.double_quant:
            return [state.qabsmax] + _state_tensors(state.absmax_state)
        return [state.absmax]
    raise MemlabError(f"state must be a state from memlab.quant.functional, got {type(state).__name__}")


def stored_bytes(q: torch.Tensor, state) -> int:
    """Bytes of every tensor a scheme stores (chapter: 3).

    Codes (packed below 8 bits) plus scales and zeros.
    """
    bits = getattr(state, "bits", 8)
    codes = q if isinstance(state, FourBitState) or bits == 8 else pack_bits(
        q if isinstance(state, ZeroPointState) else (q.to(torch.int16) + state.qmax).to(torch.uint8), bits)
    return codes.numel() * codes.element_size() + sum(
        t.numel() * t.element_size() for t in _state_tensors(state))


def bits_per_parameter(scheme: str, *, blocksize: int = 64, double_quant: bool = False,
                       dq_blocksize: int = DQ_BLOCKSIZE) -> float:
    """Stored bits per weight, scales included: code bits + (scale + zero bits) / blocksize (chapter: 3).

    ``scheme`` is any name of :data:`memlab.quant.schemes.SCHEMES`; ``blocksize`` is the number of
    weights sharing one scale (the row length for per-row schemes).
    With ``double_quant`` (NF4, FP4) each fp32 absmax becomes 8 bits plus one fp32 per
    ``dq_blocksize`` of them: 4 + 8/64 + 32/(64*256) = 4.127 bits for NF4 with blocks of 64.
    """
    sch = get_scheme(scheme)
    check_positive_int("blocksize", blocksize)
    check_positive_int("dq_blocksize", dq_blocksize)
    code, scale, zero = sch.code_bits, sch.scale_bits, sch.zero_bits
    if sch.double_quant:  # 'nf4-dq' is 'nf4' with double_quant=True
        double_quant, scheme = True, scheme.removesuffix("-dq")
    if scale == 0:
        if double_quant:
            raise MemlabError(f"double_quant applies to nf4 and fp4, not {scheme!r}")
        return float(code)
    if double_quant:
        if scheme not in QUANT_TYPES:
            raise MemlabError(f"double_quant applies to nf4 and fp4, not {scheme!r}")
        return code + 8 / blocksize + 32 / (blocksize * dq_blocksize)
    return code + (scale + zero) / blocksize


# LLM.int8() --------------------------------------------------------------------------------------
def outlier_columns(x: torch.Tensor, threshold: float = LLM_INT8_THRESHOLD) -> torch.Tensor:
    """Indices of the columns (features) of ``x`` holding any |value| >= threshold (chapter: 3)."""
    if not threshold > 0:
        raise MemlabError(f"threshold must be positive, got {threshold!r}")
    x2 = x.reshape(-1, x.shape[-1])
    return torch.nonzero((x2.abs() >= threshold).any(dim=0)).reshape(-1)


def int8_vectorwise_quant(x, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-row absmax int8 (LLM.int8()'s vector-wise): (codes, row absmax, outlier columns) (chapter: 3).

    With ``threshold > 0`` the outlier values are left out of each row's absmax and the codes of
    the outlier columns are set to 0: those columns are multiplied in 16-bit instead.
    """
    t = _as_tensor(x)
    rows = t.reshape(-1, t.shape[-1]).float()  # (N, K)
    cols = None
    if threshold > 0:
        cols = outlier_columns(rows, threshold)
        rows = torch.where(rows.abs() >= threshold, torch.zeros_like(rows), rows)
    absmax = rows.abs().amax(dim=1)  # (N,)
    q = torch.round(rows * (127.0 / absmax.unsqueeze(1))).to(torch.int8)  # 0/0 rows -> see below
    q = torch.where(absmax.unsqueeze(1) > 0, q, torch.zeros_like(q))
    if cols is not None and rows.shape[0] > 1:
        q[:, cols] = 0
    return q.reshape(t.shape), absmax, cols


def llm_int8_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                    threshold: float = LLM_INT8_THRESHOLD) -> torch.Tensor:
    """y = x @ W.T with LLM.int8() (chapter: 3).

    Outlier input columns in 16-bit, the rest int8 vector-wise.

    ``threshold=0`` gives plain vector-wise int8 (no decomposition). As in bitsandbytes with
    int8 weights, the outlier columns multiply the int8 weight dequantized; the int8 part rounds
    the inputs to fp16 first, and the result has the input's dtype.
    """
    if x.shape[-1] != weight.shape[-1]:
        raise MemlabError(f"x has {x.shape[-1]} features but the weight expects {weight.shape[-1]}")
    dtype = x.dtype if x.is_floating_point() else torch.float32
    a = x.reshape(-1, x.shape[-1]).to(dtype)  # (N, K)
    cb, scb, _ = int8_vectorwise_quant(weight.to(torch.float16))  # (M, K) int8, (M,)
    ca, sca, cols = int8_vectorwise_quant(a.to(torch.float16), threshold)  # (N, K) int8, (N,)
    acc = ca.float() @ cb.float().t()  # (N, M): exact integer sums, as an int8 GEMM gives
    y = acc * (sca.unsqueeze(1) * scb.unsqueeze(0)) / (127.0 * 127.0)
    if bias is not None:
        y = y + bias.float()
    y = y.to(dtype)
    if cols is not None and cols.numel():
        w_out = (cb[:, cols].float() * (scb.unsqueeze(1) / 127.0)).to(dtype)  # (M, n_out)
        y = y + a[:, cols] @ w_out.t()
    return y.reshape(*x.shape[:-1], weight.shape[0])
