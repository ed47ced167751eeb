"""memlab.quant.functional: every scheme checked against bitsandbytes' functional API or plain arithmetic."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from memlab.errors import MemlabError
from memlab.quant.functional import (
    NF4_OFFSET,
    AbsmaxState,
    absmax_quantize,
    bits_per_parameter,
    blockwise_quantize,
    dequantize,
    dynamic_codebook,
    fp4_codebook,
    int8_vectorwise_quant,
    llm_int8_matmul,
    nf4_codebook,
    outlier_columns,
    pack_bits,
    quantize_4bit,
    stored_bytes,
    unpack_bits,
    zeropoint_quantize,
)
from memlab.quant.schemes import TENSOR_SCHEMES

bnb = pytest.importorskip("bitsandbytes")
BF = pytest.importorskip("bitsandbytes.functional")

SHAPES = [(37, 61), (1000,), (256, 512)]
QUANT_TYPES = ("nf4", "fp4")
GRANULARITIES = ("tensor", "row", "block")


def _randn(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


# The (256, 512) tensor is quantized by several tests: each quantization is done once.
@functools.cache
def _ours4(shape, quant_type, blocksize, double_quant):
    x = _randn(shape, seed=0)
    q, st = quantize_4bit(x, quant_type=quant_type, blocksize=blocksize, double_quant=double_quant)
    return x, q, st, dequantize(q, st)


@functools.cache
def _bnb4(shape, quant_type, blocksize, double_quant):
    qb, sb = BF.quantize_4bit(_randn(shape, seed=0), blocksize=blocksize, quant_type=quant_type,
                              compress_statistics=double_quant)
    # eager: for an odd last dimension bitsandbytes falls back to a torch.compile'd kernel, whose
    # compilation takes seconds and computes the same values
    with torch.compiler.set_stance("force_eager"):
        return qb, sb, BF.dequantize_4bit(qb, sb)


# Code books ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("quant_type, ours", [("nf4", nf4_codebook), ("fp4", fp4_codebook)])
def test_4bit_codebooks_equal_bitsandbytes(quant_type, ours):
    want = BF.get_4bit_type(quant_type, device="cpu")
    got = ours()
    assert got.dtype == torch.float32 and got.shape == (16,)
    assert torch.equal(got, want.to(torch.float32))


def test_dynamic_codebook_equals_bitsandbytes():
    got = dynamic_codebook()
    assert got.shape == (256,)
    assert torch.equal(got, BF.create_dynamic_map(signed=True).to(torch.float32))


def test_dynamic_codebook_properties():
    code = dynamic_codebook()
    assert torch.equal(code, code.sort().values)
    assert code.unique().numel() == 256
    assert int((code == 0).sum()) == 1 and float(code.max()) == 1.0
    assert -1.0 <= float(code.min()) < -0.99


def test_nf4_codebook_properties():
    code = nf4_codebook()
    assert code.numel() == 16
    assert torch.equal(code, code.sort().values)
    assert int((code == 0).sum()) == 1
    assert float(code.min()) == -1.0 and float(code.max()) == 1.0
    assert int((code > 0).sum()) == 8 and int((code < 0).sum()) == 7


def test_nf4_codebook_returns_a_copy():
    nf4_codebook()[0] = 123.0
    assert float(nf4_codebook()[0]) == -1.0


def test_nf4_values_are_normal_quantiles():
    # QLoRA §3 / bitsandbytes' create_normal_map: the extreme quantile is the mean of
    # 1 - 1/(2*15) and 1 - 1/(2*16); the halves are 8 and 7 even steps towards p = 0.5.
    offset = 0.9677083
    assert offset == pytest.approx((1 - 1 / 30 + 1 - 1 / 32) / 2, abs=1e-7)
    ndtri = torch.special.ndtri
    top = ndtri(torch.tensor(offset, dtype=torch.float64))
    code = nf4_codebook().double()
    for i in range(8):  # the positive values, from the largest down
        p = offset - i * (offset - 0.5) / 8
        assert float(code[15 - i]) == pytest.approx(float(ndtri(torch.tensor(p, dtype=torch.float64)) / top), rel=1e-6)
    for i in range(7):  # the negative values, from the most negative up
        p = offset - i * (offset - 0.5) / 7
        assert float(code[i]) == pytest.approx(-float(ndtri(torch.tensor(p, dtype=torch.float64)) / top), rel=1e-6)


def test_fp4_codebook_is_sign_symmetric():
    code = fp4_codebook()
    assert torch.equal(code[8:], -code[:8])
    assert float(code.abs().max()) == 1.0 and float(code[0]) == 0.0


# 4-bit code books against bitsandbytes ---------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("blocksize", [64, 128])
def test_quantize_4bit_matches_bitsandbytes(shape, quant_type, blocksize):
    x, q, st, d = _ours4(shape, quant_type, blocksize, False)
    qb, sb, db = _bnb4(shape, quant_type, blocksize, False)
    assert q.dtype == torch.uint8 and q.numel() == math.ceil(x.numel() / 2)
    assert torch.equal(q.reshape(-1), qb.reshape(-1))
    assert torch.equal(st.absmax, sb.absmax)
    assert st.absmax.numel() == math.ceil(x.numel() / blocksize)
    assert d.shape == x.shape and d.dtype == torch.float32
    assert torch.equal(d, db.reshape(d.shape))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantize_4bit_half_inputs_match_bitsandbytes(dtype):
    x = _randn((37, 61), seed=3, dtype=dtype)
    q, st = quantize_4bit(x, quant_type="nf4")
    qb, sb = BF.quantize_4bit(x, blocksize=64, quant_type="nf4")
    assert torch.equal(q.reshape(-1), qb.reshape(-1))
    assert torch.equal(st.absmax, sb.absmax.float())


def test_quantize_4bit_odd_count_pads_with_the_code_of_zero():
    # 3 values: the second nibble of the last byte holds the code of 0.0
    x = torch.tensor([1.0, -1.0, 0.5])
    for quant_type in QUANT_TYPES:
        q, st = quantize_4bit(x, quant_type=quant_type)
        code = st.code
        zero_index = int(torch.nonzero(code == 0)[0])
        assert q.numel() == 2
        assert int(q[1]) & 0xF == zero_index
        qb, _ = BF.quantize_4bit(x, blocksize=64, quant_type=quant_type)
        assert torch.equal(q, qb.reshape(-1))


def test_quantize_4bit_tie_goes_to_the_smaller_code():
    code = nf4_codebook()
    mid = (code[9] + code[10]) / 2  # float32, scaled by an absmax of 1 stays itself
    q, _ = quantize_4bit(torch.tensor([1.0, float(mid)]), quant_type="nf4")
    assert int(q[0]) & 0xF == 9
    assert int(q[0]) >> 4 == 15


# Double quantization ----------------------------------------------------------------------------------
def _default_blockwise_kernel():
    """bitsandbytes' pure-torch ``quantize_blockwise`` (registered as "default"), or None.

    register_kernel(..., "default") registers under CompositeExplicitAutograd; a plain call on
    CPU goes to the native kernel instead, so redispatch to that key explicitly.
    """
    op = torch.ops.bitsandbytes.quantize_blockwise.default
    if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"):
        return None
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    return lambda a, code, blocksize: op.redispatch(keys, a, code, blocksize)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("quant_type", QUANT_TYPES)
@pytest.mark.parametrize("blocksize", [64, 128])
def test_double_quant_matches_bitsandbytes(shape, quant_type, blocksize):
    x, q, st, d = _ours4(shape, quant_type, blocksize, True)
    qb, sb, db = _bnb4(shape, quant_type, blocksize, True)
    assert st.double_quant and st.absmax is None
    assert torch.equal(q.reshape(-1), qb.reshape(-1))
    ast = st.absmax_state
    assert ast.offset.dim() == 0 and torch.equal(ast.offset, sb.offset)
    assert ast.blocksize == sb.state2.blocksize == 256
    assert torch.equal(ast.code, sb.state2.code)
    assert torch.equal(ast.absmax, sb.state2.absmax)

    # The 8-bit absmax codes: bitsandbytes' native CPU kernel picks a neighbouring code for a few
    # values (3 of 2048 for randn(256, 512), blocks of 64); ours is the nearest code, at most one
    # index away, in under 1% of the values. bnb's pure-torch kernel agrees exactly (below).
    qa, qa_bnb = st.qabsmax, sb.absmax
    assert qa.dtype == torch.uint8 and qa.shape == qa_bnb.shape
    differ = qa != qa_bnb
    assert (qa.int() - qa_bnb.int()).abs().max() <= 1
    assert differ.float().mean() < 0.01
    absmax = _bnb4(shape, quant_type, blocksize, False)[1].absmax
    v = absmax - sb.offset
    absmax2 = sb.state2.absmax.repeat_interleave(256)[: v.numel()]
    code = sb.state2.code
    ours_err = (code[qa.long()] * absmax2 - v).abs()
    bnb_err = (code[qa_bnb.long()] * absmax2 - v).abs()
    assert (ours_err <= bnb_err + 1e-7).all()

    # Dequantized: identical wherever the 8-bit absmax codes agree.
    db = db.reshape(d.shape)
    same_block = ~differ.repeat_interleave(blocksize)[: x.numel()].reshape(d.shape)
    assert torch.equal(d[same_block], db[same_block])
    if not differ.any():
        assert torch.equal(d, db)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("blocksize", [64, 128])
def test_double_quant_absmax_codes_equal_bitsandbytes_default_kernel(shape, blocksize):
    kernel = _default_blockwise_kernel()
    if kernel is None:
        pytest.skip("bitsandbytes' default quantize_blockwise kernel is not reachable")
    st = _ours4(shape, "nf4", blocksize, True)[2]
    absmax = _bnb4(shape, "nf4", blocksize, False)[1].absmax
    qd, ad = kernel(absmax - st.absmax_state.offset, BF.create_dynamic_map(signed=True), 256)
    assert torch.equal(st.qabsmax, qd)
    assert torch.equal(st.absmax_state.absmax, ad)


@pytest.mark.parametrize("shape", [(1000,), (37, 61), (4096,), (3, 300)])
def test_blockwise_quantize_equals_default_kernel(shape):
    kernel = _default_blockwise_kernel()
    if kernel is None:
        pytest.skip("bitsandbytes' default quantize_blockwise kernel is not reachable")
    x = _randn(shape, seed=1)
    q, st = blockwise_quantize(x)
    qd, ad = kernel(x, BF.create_dynamic_map(signed=True), 256)
    assert q.shape == x.shape and q.dtype == torch.uint8
    assert torch.equal(q, qd)
    assert torch.equal(st.absmax, ad)


@pytest.mark.parametrize("shape", [(1000,), (37, 61), (4096,)])
def test_blockwise_quantize_against_native_kernel(shape):
    x = _randn(shape, seed=2)
    code = BF.create_dynamic_map(signed=True)
    q, st = blockwise_quantize(x)
    qb, sb = BF.quantize_blockwise(x, code=code, blocksize=256)
    assert torch.equal(st.absmax, sb.absmax)
    assert (q.int() - qb.int()).abs().max() <= 1
    assert (q != qb).float().mean() < 0.01
    scale = st.absmax.repeat_interleave(256)[: x.numel()].reshape(x.shape)
    assert ((code[q.long()] * scale - x).abs() <= (code[qb.long()] * scale - x).abs() + 1e-7).all()
    d = dequantize(q, st)
    db = BF.dequantize_blockwise(q, absmax=st.absmax, code=code, blocksize=256)
    assert torch.equal(d, db.reshape(d.shape))


# Bits per parameter ----------------------------------------------------------------------------------
def test_nf4_stored_bits_per_parameter():
    x, q, st, _ = _ours4((256, 512), "nf4", 64, False)
    n = x.numel()
    assert stored_bytes(q, st) == n // 2 + (n // 64) * 4
    assert stored_bytes(q, st) * 8 / n == bits_per_parameter("nf4") == 4.5
    _, q, st, _ = _ours4((256, 512), "nf4", 64, True)
    # codes + one uint8 per block + one fp32 per 256 blocks + one fp32 offset per tensor
    assert stored_bytes(q, st) == n // 2 + n // 64 + (n // 64 // 256) * 4 + 4
    want = bits_per_parameter("nf4", double_quant=True)
    assert want == 4 + 8 / 64 + 32 / (64 * 256)
    assert want == pytest.approx(4.127, abs=1e-3)
    assert stored_bytes(q, st) * 8 / n == want + 32 / n


# The layout each scheme stores, from the module's documentation (code bits, scale + zero bits).
FORMULA = {"fp32": (32, None), "fp16": (16, None), "bf16": (16, None),
           "int8": (8, 32), "int8-zp": (8, 32 + 8), "int4": (4, 32), "int4-zp": (4, 16 + 4),
           "int3-zp": (3, 16 + 3), "nf4": (4, 32), "fp4": (4, 32)}


def test_formula_covers_every_scheme():
    assert set(FORMULA) == set(TENSOR_SCHEMES)


@pytest.mark.parametrize("scheme", TENSOR_SCHEMES)
@pytest.mark.parametrize("blocksize", [32, 64, 128, 512])
def test_bits_per_parameter_formula(scheme, blocksize):
    code, extra = FORMULA[scheme]
    want = code if extra is None else code + extra / blocksize
    assert bits_per_parameter(scheme, blocksize=blocksize) == want


def _stored_bits_per_value(scheme, blocksize):
    """Stored bits per value of a tensor quantized with ``scheme``, from :func:`stored_bytes`."""
    if scheme in ("nf4", "fp4"):  # the cached (256, 512) quantization
        x, q, st, _ = _ours4((256, 512), scheme, blocksize, False)
        return stored_bytes(q, st) * 8 / x.numel()
    x = _randn((64, 512), seed=4)  # 512 blocks of 64: packed 3-bit zeros fill whole bytes
    if scheme in ("fp32", "fp16", "bf16"):
        t = x.to({"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[scheme])
        return t.numel() * t.element_size() * 8 / x.numel()
    bits = int(scheme[3])
    if scheme.endswith("-zp"):
        scale_dtype = torch.float32 if bits == 8 else torch.float16
        q, st = zeropoint_quantize(x, bits, granularity="block", blocksize=blocksize,
                                   scale_dtype=scale_dtype)
    else:
        q, st = absmax_quantize(x, bits, granularity="block", blocksize=blocksize)
    return stored_bytes(q, st) * 8 / x.numel()


@pytest.mark.parametrize("scheme", TENSOR_SCHEMES)
def test_bits_per_parameter_equals_stored_bytes(scheme):
    assert _stored_bits_per_value(scheme, 64) == bits_per_parameter(scheme, blocksize=64)


def test_bits_per_parameter_per_row_equals_stored_bytes():
    x = _randn((64, 512), seed=4)
    q, st = absmax_quantize(x, 8, granularity="row")
    assert stored_bytes(q, st) * 8 / x.numel() == bits_per_parameter("int8", blocksize=512)


@pytest.mark.parametrize("scheme", ["fp4", "nf4"])
@pytest.mark.parametrize("blocksize, dq_blocksize", [(64, 256), (32, 128)])
def test_bits_per_parameter_double_quant_formula(scheme, blocksize, dq_blocksize):
    got = bits_per_parameter(scheme, blocksize=blocksize, double_quant=True, dq_blocksize=dq_blocksize)
    assert got == 4 + 8 / blocksize + 32 / (blocksize * dq_blocksize)


@pytest.mark.parametrize("kwargs, match", [
    (dict(scheme="int2"), "int2"),
    (dict(scheme="int8", double_quant=True), "int8"),
    (dict(scheme="int4-zp", double_quant=True), "int4-zp"),
    (dict(scheme="fp16", double_quant=True), "fp16"),
    (dict(scheme="nf4", blocksize=0), "blocksize.*0"),
    (dict(scheme="int8", blocksize=-64), "blocksize.*-64"),
    (dict(scheme="nf4", double_quant=True, dq_blocksize=0), "dq_blocksize.*0"),
])
def test_bits_per_parameter_rejects_bad_input(kwargs, match):
    with pytest.raises(MemlabError, match=match):
        bits_per_parameter(**kwargs)


# LLM.int8(): vector-wise quantization -------------------------------------------------------------------
def _with_outliers(shape, seed=0, cols=(3, 77), factor=20.0, dtype=torch.float16):
    x = _randn(shape, seed=seed)
    for c in cols:
        if c < shape[-1]:
            x[..., c] *= factor
    return x.to(dtype)


@pytest.mark.parametrize("shape", [(37, 61), (1, 1000), (16, 128), (256, 512)])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_int8_vectorwise_quant_matches_bitsandbytes(shape, threshold):
    x = _with_outliers(shape, cols=(3, 60, 77))
    q, stats, cols = int8_vectorwise_quant(x, threshold)
    qb, sb, cb = BF.int8_vectorwise_quant(x.clone(), threshold=threshold)
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert torch.equal(q, qb)
    assert torch.equal(stats, sb)
    if threshold == 0:
        assert cols is None and cb is None
    else:
        assert torch.equal(cols, cb)
        injected = torch.tensor([c for c in (3, 60, 77) if c < shape[-1]])
        assert torch.equal(cols, injected)


@pytest.mark.parametrize("shape", [(37, 61), (16, 128), (256, 512)])
def test_outlier_columns_finds_the_injected_columns(shape):
    x = _with_outliers(shape)
    want = torch.tensor([c for c in (3, 77) if c < shape[-1]])
    assert torch.equal(outlier_columns(x, 6.0), want)
    assert outlier_columns(x.float() / 100, 6.0).numel() == 0


def test_outlier_threshold_is_inclusive_as_in_bitsandbytes():
    x = torch.zeros(3, 8, dtype=torch.float16)
    x[0, 2], x[1, 5], x[2, 6] = 6.0, -6.0, 5.99609375  # the last is the fp16 just below 6
    x[:, 0] = 1.0
    assert outlier_columns(x, 6.0).tolist() == [2, 5]
    q, stats, cols = int8_vectorwise_quant(x, 6.0)
    qb, sb, cb = BF.int8_vectorwise_quant(x.clone(), threshold=6.0)
    assert cols.tolist() == cb.tolist() == [2, 5]
    assert torch.equal(q, qb) and torch.equal(stats, sb)
    assert stats.tolist() == [1.0, 1.0, 5.99609375]


def test_int8_vectorwise_quant_zero_row_gives_zero_codes():
    x = _randn((4, 8), seed=5).half()
    x[1] = 0
    q, stats, _ = int8_vectorwise_quant(x)
    assert torch.equal(q[1], torch.zeros(8, dtype=torch.int8))
    assert float(stats[1]) == 0.0
    assert torch.equal(q, BF.int8_vectorwise_quant(x.clone())[0])


def test_outlier_columns_rejects_non_positive_threshold():
    with pytest.raises(MemlabError, match="threshold.*0"):
        outlier_columns(torch.ones(2, 3), 0.0)


# LLM.int8(): the matmul against bitsandbytes.nn.Linear8bitLt ----------------------------------------------
def _linear(k, m, seed, bias=True):
    torch.manual_seed(seed)
    return torch.nn.Linear(k, m, bias=bias)


def _bnb_linear(lin, threshold):
    m = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                            has_fp16_weights=False, threshold=threshold)
    m.load_state_dict(lin.state_dict())
    return m.to("cpu").eval()


@pytest.mark.filterwarnings("ignore:MatMul8bitLt")
@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape, k, m, bias", [((10, 64), 64, 48, True), ((2, 5, 64), 64, 48, False),
                                               ((33, 128), 128, 19, True)])
def test_llm_int8_matmul_matches_linear8bitlt(threshold, dtype, shape, k, m, bias):
    lin = _linear(k, m, seed=1, bias=bias)
    x = _with_outliers(shape, seed=2, cols=(5,), dtype=dtype)
    with torch.no_grad():
        want = _bnb_linear(lin, threshold)(x)
    b = lin.bias.data if bias else None
    got = llm_int8_matmul(x, lin.weight.data, b, threshold=threshold)
    assert got.dtype == want.dtype == dtype
    assert got.shape == want.shape == (*shape[:-1], m)
    tol = 2 ** -10 * float(want.abs().max()) * 2  # fp16 rounding of the output
    assert float((got.float() - want.float()).abs().max()) <= tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_llm_int8_decomposition_beats_plain_int8_on_outliers(dtype, seed):
    lin = _linear(256, 128, seed=seed)
    W, b = lin.weight.data, lin.bias.data
    x = _with_outliers((64, 256), seed=seed + 10, dtype=torch.float32)
    exact = x @ W.T + b
    x = x.to(dtype)
    err_int8 = (llm_int8_matmul(x, W, b, threshold=0.0).float() - exact).abs().max()
    err_mixed = (llm_int8_matmul(x, W, b, threshold=6.0).float() - exact).abs().max()
    assert err_int8 >= 5 * err_mixed


def test_llm_int8_matmul_rejects_mismatched_features():
    with pytest.raises(MemlabError, match="61.*64"):
        llm_int8_matmul(torch.ones(2, 61), torch.ones(3, 64))


# Absmax and zero-point ---------------------------------------------------------------------------------
def _group_ids(shape, granularity, blocksize):
    n = math.prod(shape)
    i = torch.arange(n)
    if granularity == "tensor":
        return torch.zeros(n, dtype=torch.long)
    if granularity == "row":
        return i // (shape[-1] if shape else 1)
    return i // blocksize


def _group_reduce(x, ids, how):
    flat = x.reshape(-1).float()
    init = {"amax": -math.inf, "amin": math.inf}[how]
    out = torch.full((int(ids.max()) + 1,), init)
    return out.scatter_reduce(0, ids, flat, how)


def _spread(shape, seed):
    """Gaussian values whose magnitude varies over 5 decades, so every group has its own scale."""
    x = _randn(shape, seed=seed).reshape(-1)
    return (x * torch.logspace(-3, 2, x.numel())).reshape(shape)


GROUP_CASES = [((5, 7), "tensor", 4), ((5, 7), "row", 4), ((5, 7), "block", 4),
               ((37, 61), "row", 64), ((37, 61), "block", 64), ((1000,), "block", 64),
               ((1000,), "tensor", 64), ((3, 4, 10), "row", 64), ((3, 4, 10), "block", 7)]


@pytest.mark.parametrize("shape, granularity, blocksize", GROUP_CASES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_absmax_round_trip_within_half_a_step(shape, granularity, blocksize, bits):
    x = _spread(shape, seed=bits)
    q, st = absmax_quantize(x, bits, granularity=granularity, blocksize=blocksize)
    qmax = 2 ** (bits - 1) - 1
    assert q.dtype == torch.int8 and q.shape == x.shape
    assert int(q.min()) >= -qmax and int(q.max()) <= qmax
    ids = _group_ids(shape, granularity, blocksize)
    group_absmax = _group_reduce(x.abs(), ids, "amax")
    if granularity == "tensor":
        assert st.absmax.dim() == 0
    assert torch.equal(st.absmax.reshape(-1), group_absmax)
    bound = (group_absmax / qmax / 2)[ids] * (1 + 1e-5)
    err = (dequantize(q, st) - x).reshape(-1).abs()
    assert (err <= bound).all(), float((err / bound).max())
    # the largest |value| of every group gets the largest code
    assert (_group_reduce(q.abs(), ids, "amax") == qmax).all()


@pytest.mark.parametrize("shape, granularity, blocksize", GROUP_CASES)
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_zeropoint_round_trip_within_half_a_step(shape, granularity, blocksize, bits):
    x = _spread(shape, seed=10 + bits) + 0.3 * _spread(shape, seed=1).abs()  # not centred on 0
    q, st = zeropoint_quantize(x, bits, granularity=granularity, blocksize=blocksize)
    levels = 2 ** bits - 1
    assert q.dtype == torch.uint8 and q.shape == x.shape
    assert int(q.max()) <= levels
    assert st.zero.dtype == torch.uint8 and int(st.zero.max()) <= levels
    ids = _group_ids(shape, granularity, blocksize)
    lo = _group_reduce(x, ids, "amin").clamp(max=0)
    hi = _group_reduce(x, ids, "amax").clamp(min=0)
    scale = (hi - lo) / levels
    assert torch.allclose(st.scale.reshape(-1).float(), scale, rtol=1e-6, atol=0)
    bound = (scale / 2)[ids] * (1 + 1e-5)
    err = (dequantize(q, st) - x).reshape(-1).abs()
    assert (err <= bound).all(), float((err / bound).max())


def test_zeropoint_fp16_scale_is_what_is_stored_and_used():
    x = _spread((37, 61), seed=7)
    q, st = zeropoint_quantize(x, 4, granularity="block", blocksize=64, scale_dtype=torch.float16)
    assert st.scale.dtype == torch.float16
    g = torch.arange(x.numel()) // 64
    scale, zero = st.scale.float()[g], st.zero.float()[g]
    # the codes are computed with the stored fp16 scale, not the fp32 one it was rounded from
    codes = (torch.round(x.reshape(-1) / scale) + zero).clamp(0, 15)
    assert torch.equal(q.reshape(-1).float(), codes)
    assert torch.equal(dequantize(q, st).reshape(-1), (q.reshape(-1).float() - zero) * scale)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("bits", [2, 3, 8])
@pytest.mark.parametrize("sign", ["mixed", "positive", "negative"])
def test_zeropoint_stores_zero_exactly(granularity, bits, sign):
    x = _randn((5, 7), seed=bits) + {"mixed": 0.0, "positive": 5.0, "negative": -5.0}[sign]
    x = x.reshape(-1)
    x[::3] = 0.0
    x = x.reshape(5, 7)
    q, st = zeropoint_quantize(x, bits, granularity=granularity, blocksize=4)
    d = dequantize(q, st)
    zeros = x == 0
    assert zeros.sum() > 0
    assert torch.equal(d[zeros], torch.zeros(int(zeros.sum())))


@pytest.mark.parametrize("quantize", [absmax_quantize, zeropoint_quantize])
@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("value", [0.0, 3.0, -0.25])
def test_constant_tensors_do_not_give_nan(quantize, granularity, value):
    x = torch.full((5, 7), value)
    q, st = quantize(x, 8, granularity=granularity, blocksize=4)
    d = dequantize(q, st)
    assert torch.isfinite(d).all()
    assert torch.allclose(d, x, rtol=1e-2, atol=0)
    if value == 0.0:
        assert torch.equal(d, x)


@pytest.mark.parametrize("shape", [(37, 61), (256, 512), (1, 1000)])
def test_absmax_per_row_8bit_equals_bitsandbytes_vectorwise(shape):
    x16 = (_randn(shape, seed=6) * 3).half()
    q, st = absmax_quantize(x16.float(), 8, granularity="row")
    qb, sb, _ = BF.int8_vectorwise_quant(x16.clone())
    assert torch.equal(q, qb)
    assert torch.equal(st.absmax, sb)


def test_absmax_default_is_per_tensor_8bit():
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q, st = absmax_quantize(x)
    assert isinstance(st, AbsmaxState)
    assert st.bits == 8 and st.qmax == 127 and st.granularity == "tensor"
    assert st.absmax.dim() == 0 and float(st.absmax) == 2.0
    assert q.dtype == torch.int8
    assert q.tolist() == [[round(0.5 * 127 / 2), -127], [round(127 / 2), round(0.25 * 127 / 2)]]


def test_dequantize_hand_built_absmax_state():
    st = AbsmaxState(absmax=torch.tensor(4.0), bits=8, qmax=127)
    q = torch.tensor([127, -64, 0], dtype=torch.int8)
    assert torch.allclose(dequantize(q, st), torch.tensor([4.0, -64 * 4 / 127, 0.0]))


def test_absmax_accepts_lists():
    q, st = absmax_quantize([1.0, -0.5])
    assert q.tolist() == [127, -64] and float(st.absmax) == 1.0


@pytest.mark.parametrize("quantize", [absmax_quantize, zeropoint_quantize])
@pytest.mark.parametrize("x, kwargs, match", [
    (torch.ones(4), dict(bits=9), "9"),
    (torch.ones(4), dict(bits=1), "1"),
    (torch.ones(4), dict(bits=0), "0"),
    (torch.ones(4), dict(granularity="column"), "column"),
    (torch.ones(4), dict(granularity="block", blocksize=0), "blocksize.*0"),
    (torch.ones(0), dict(), "empty"),
    (torch.tensor([1.0, math.inf]), dict(), "inf"),
    (torch.tensor([1.0, math.nan]), dict(), "NaN"),
])
def test_absmax_and_zeropoint_reject_bad_input(quantize, x, kwargs, match):
    with pytest.raises(MemlabError, match=match):
        quantize(x, **kwargs)


@pytest.mark.parametrize("kwargs, match", [(dict(quant_type="int4"), "int4"),
                                           (dict(blocksize=0), "blocksize.*0")])
def test_quantize_4bit_rejects_bad_input(kwargs, match):
    with pytest.raises(MemlabError, match=match):
        quantize_4bit(torch.ones(8), **kwargs)


def test_quantize_4bit_rejects_inf():
    with pytest.raises(MemlabError, match="inf"):
        quantize_4bit(torch.tensor([1.0, -math.inf]))


# Packing and stored bytes ---------------------------------------------------------------------------
def _reference_pack(codes, bits):
    stream = "".join(format(int(c), f"0{bits}b") for c in codes)
    stream += "0" * (-len(stream) % 8)
    return [int(stream[i:i + 8], 2) for i in range(0, len(stream), 8)]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [1, 7, 13, 100, 1001])
def test_pack_unpack_round_trip(bits, n):
    g = torch.Generator().manual_seed(bits * 1000 + n)
    codes = torch.randint(0, 2 ** bits, (n,), generator=g).to(torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.uint8
    assert packed.numel() == math.ceil(n * bits / 8)
    assert packed.tolist() == _reference_pack(codes.tolist(), bits)
    assert torch.equal(unpack_bits(packed, bits, n), codes)


def test_pack_bits_most_significant_first():
    assert pack_bits(torch.tensor([1, 2], dtype=torch.uint8), 4).tolist() == [0x12]
    assert pack_bits(torch.tensor([1, 0, 1], dtype=torch.uint8), 1).tolist() == [0b10100000]


@pytest.mark.parametrize("bits, code", [(1, 2), (2, 4), (3, 8), (4, 16), (7, 200)])
def test_pack_bits_refuses_a_code_that_does_not_fit(bits, code):
    with pytest.raises(MemlabError, match=f"{bits} bits"):
        pack_bits(torch.tensor([0, code], dtype=torch.uint8), bits)


@pytest.mark.parametrize("bits", [0, 9])
def test_pack_bits_rejects_bad_widths(bits):
    with pytest.raises(MemlabError, match=str(bits)):
        pack_bits(torch.zeros(4, dtype=torch.uint8), bits)
    with pytest.raises(MemlabError, match=str(bits)):
        unpack_bits(torch.zeros(4, dtype=torch.uint8), bits, 4)


def test_stored_bytes_zeropoint_3bit_blocks():
    x = _randn((37, 61), seed=8)
    n, blocksize = x.numel(), 64
    n_blocks = math.ceil(n / blocksize)
    q, st = zeropoint_quantize(x, 3, granularity="block", blocksize=blocksize)
    want = math.ceil(n * 3 / 8) + n_blocks * 4 + math.ceil(n_blocks * 3 / 8)
    assert want == 847 + 144 + 14
    assert stored_bytes(q, st) == want


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stored_bytes_absmax_per_row(bits):
    x = _randn((37, 61), seed=9)
    q, st = absmax_quantize(x, bits, granularity="row")
    assert stored_bytes(q, st) == math.ceil(x.numel() * bits / 8) + 37 * 4


def test_stored_bytes_blockwise_8bit():
    x = _randn((1000,), seed=9)
    q, st = blockwise_quantize(x)
    assert stored_bytes(q, st) == 1000 + math.ceil(1000 / 256) * 4


def test_dequantize_rejects_a_foreign_state():
    q = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(MemlabError, match="str"):
        dequantize(q, "not a state")
    with pytest.raises(MemlabError, match="dict"):
        stored_bytes(q, {"absmax": 1.0})


# Edge cases: all-zero blocks, rounded scales, shared code books, tiny values ----------------------
def test_all_zero_block_absmax_is_zero_as_in_bitsandbytes():
    x = torch.zeros(2, 64)
    x[1] = _randn(64, seed=11)
    _, st = quantize_4bit(x, quant_type="nf4")
    _, sb = BF.quantize_4bit(x, blocksize=64, quant_type="nf4")
    assert torch.equal(st.absmax, sb.absmax)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_zeropoint_rounded_scale_still_covers_the_range(dtype):
    # (hi - lo) / 255 rounds down in fp16 for this pair: the stored scale is rounded up instead
    x = torch.tensor([-0.8282761573791504, 3.274577260017395])
    exact = float(x[1] - x[0]) / 255
    assert float(torch.tensor(exact).to(torch.float16)) < exact  # the case this test is about
    q, st = zeropoint_quantize(x, 8, scale_dtype=dtype)
    assert st.scale.dtype == dtype and float(st.scale) >= exact
    err = (dequantize(q, st) - x).abs()
    assert (err <= st.scale.float() / 2).all()


@pytest.mark.parametrize("seed", range(20))
def test_zeropoint_fp16_scales_cover_every_group(seed):
    x = _randn(4096, seed=seed) * (10 ** (seed % 5 - 2))
    q, st = zeropoint_quantize(x, 4, granularity="block", blocksize=64, scale_dtype=torch.float16)
    err = (dequantize(q, st) - x).abs().reshape(-1, 64)
    assert (err <= st.scale.float().reshape(-1, 1) / 2).all()


def test_zeropoint_tiny_range_keeps_a_positive_fp16_scale():
    q, st = zeropoint_quantize(torch.tensor([0.0, 1e-9]), 8, scale_dtype=torch.float16)
    assert float(st.scale) > 0
    assert torch.isfinite(dequantize(q, st)).all()


def test_zeropoint_scale_too_large_for_its_dtype_is_refused():
    with pytest.raises(MemlabError, match="does not fit in torch.float16"):
        zeropoint_quantize(torch.tensor([0.0, 1e9]), 8, scale_dtype=torch.float16)


def test_absmax_of_subnormal_values_stays_finite():
    x = torch.tensor([1e-40, -2e-40])
    q, st = absmax_quantize(x)
    assert int(q[1]) == -127
    assert torch.isfinite(dequantize(q, st)).all()
    assert (dequantize(q, st) - x).abs().max() <= 2e-40 / 127


def test_pack_bits_of_nothing_is_empty():
    assert pack_bits(torch.zeros(0, dtype=torch.uint8), 4).numel() == 0
    assert unpack_bits(pack_bits(torch.zeros(0, dtype=torch.uint8), 3), 3, 0).numel() == 0


@pytest.mark.parametrize("make, book", [
    (lambda: quantize_4bit(torch.ones(64), quant_type="nf4")[1], nf4_codebook),
    (lambda: quantize_4bit(torch.ones(64), quant_type="fp4")[1], fp4_codebook),
    (lambda: blockwise_quantize(torch.ones(256))[1], dynamic_codebook),
])
def test_state_code_book_is_not_the_shared_cache(make, book):
    st = make()
    st.code[0] = 5.0  # a state owns its code book: writing to it leaves the module's table alone
    assert float(book()[0]) != 5.0
    assert float(make().code[0]) != 5.0


def test_nf4_offset_moves_the_outer_levels():
    """A larger offset pushes the outermost quantile out, so the inner levels (after scaling to 1) shrink."""
    default, wide = nf4_codebook(), nf4_codebook(offset=0.99)
    assert torch.equal(nf4_codebook(offset=NF4_OFFSET), default)
    assert wide[0] == -1 and wide[-1] == 1 and (wide == 0).sum() == 1
    inner = (default.abs() < 1) & (default != 0)
    assert (wide[inner].abs() < default[inner].abs()).all()


@pytest.mark.parametrize("bad", [0.5, 1.0, 1.2, "x", True])
def test_nf4_offset_must_be_a_probability_above_half(bad):
    with pytest.raises(MemlabError, match="offset must be a probability strictly between 0.5 and 1"):
        nf4_codebook(offset=bad)
