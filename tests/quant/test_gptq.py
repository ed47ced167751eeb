"""GPTQ and round-to-nearest (memlab.quant.gptq): same grid, compensation only where inputs correlate."""

import pytest
import torch
from torch import nn

from memlab.errors import MemlabError
from memlab.quant.functional import dequantize, zeropoint_quantize
from memlab.quant.gptq import (
    HessianAccumulator,
    _gptq,
    gptq_by_column,
    gptq_objective,
    gptq_quantize,
    hessian,
    output_error,
    rtn_quantize,
)

OUT, IN = 64, 128
BIG = torch.tensor([3, 40, 77, 100])  # a few inputs with 10x the spread of the rest


def _mixing(seed: int = 0) -> torch.Tensor:
    """A fixed (in, in) matrix: x = z @ A makes the input features correlated."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(IN, IN, generator=g) / IN ** 0.5 + 0.5 * torch.eye(IN)


def _inputs(n: int, seed: int, A: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN, generator=g) @ A  # (n, in)
    x[:, BIG] *= 10
    return x


@pytest.fixture(scope="module")
def case():
    """A random weight, correlated calibration inputs, held-out inputs from the same distribution."""
    A = _mixing()
    weight = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(1))
    calib, held_out = _inputs(1024, 2, A), _inputs(1024, 3, A)
    return weight, calib, held_out, hessian(calib)


def _naive_obq(weight, H, bits, percdamp=0.01):
    """GPTQ's column order written the slow way (float64): an explicit H^-1, downdated by Gaussian
    elimination after every column, instead of its Cholesky factor and lazy block updates."""
    _, st = zeropoint_quantize(weight, bits, granularity="row", scale_dtype=torch.float16)
    scale, zero = st.scale.double(), st.zero.double()
    W, H = weight.double().clone(), H.double().clone()
    H.diagonal().add_(percdamp * H.diagonal().mean())
    Hinv = torch.linalg.inv(H)
    codes = torch.zeros(W.shape, dtype=torch.uint8)
    for i in range(W.shape[1]):
        q = (torch.round(W[:, i] / scale) + zero).clamp(0, 2 ** bits - 1)
        codes[:, i] = q.to(torch.uint8)
        err = (W[:, i] - (q - zero) * scale) / Hinv[i, i]
        W -= err.unsqueeze(1) * Hinv[i].unsqueeze(0)  # δ_F = -err · [H_F^-1]_{i,F}
        Hinv -= torch.outer(Hinv[:, i], Hinv[i]) / Hinv[i, i]  # remove input i from H_F^-1
    return codes


# No correlation, no compensation -----------------------------------------------------------------
@pytest.mark.parametrize("group_size", [None, 32])
@pytest.mark.parametrize("bits", [4, 3])
def test_identity_hessian_gives_rtn_codes(bits, group_size):
    weight = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(4))
    q_rtn, st_rtn = rtn_quantize(weight, bits, group_size=group_size)
    q, st = gptq_quantize(weight, torch.eye(IN), bits, group_size=group_size, blocksize=48)
    assert torch.equal(q, q_rtn)
    assert torch.equal(st.scale, st_rtn.scale) and torch.equal(st.zero, st_rtn.zero)
    assert (st.granularity, st.blocksize, st.shape) == (st_rtn.granularity, st_rtn.blocksize, st_rtn.shape)
    # any diagonal H: still no compensation, also when act_order reorders the columns
    diag = torch.diag(torch.rand(IN, generator=torch.Generator().manual_seed(5)) + 0.1)
    q_diag, _ = gptq_quantize(weight, diag, bits, group_size=group_size)
    assert torch.equal(q_diag, q_rtn)
    if group_size is None:
        q_act, _ = gptq_quantize(weight, diag, bits, act_order=True)
        assert torch.equal(q_act, q_rtn)


def test_rtn_is_zeropoint_quantize():
    weight = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(6))
    q, st = rtn_quantize(weight, 4, group_size=32)
    q_ref, st_ref = zeropoint_quantize(weight, 4, granularity="block", blocksize=32,
                                       scale_dtype=torch.float16)
    assert torch.equal(q, q_ref) and torch.equal(st.scale, st_ref.scale)
    assert st.scale.dtype == torch.float16 and st.granularity == "block" and st.blocksize == 32
    assert rtn_quantize(weight, 4)[1].granularity == "row"


# Correlated inputs: GPTQ beats RTN -------------------------------------------------------------
@pytest.mark.parametrize("group_size", [None, 32])
@pytest.mark.parametrize("bits", [4, 3])
def test_gptq_beats_rtn_on_correlated_inputs(case, bits, group_size):
    weight, calib, held_out, H = case
    w_rtn = dequantize(*rtn_quantize(weight, bits, group_size=group_size))
    w_gptq = dequantize(*gptq_quantize(weight, H, bits, group_size=group_size))
    for x in (calib, held_out):
        rtn, gptq = output_error(weight, w_rtn, x), output_error(weight, w_gptq, x)
        assert gptq < 0.85 * rtn, (bits, group_size, rtn, gptq)
    assert gptq_objective(weight, w_gptq, H) < 0.7 * gptq_objective(weight, w_rtn, H)


def test_objective_is_the_squared_output_error(case):
    weight, calib, _, H = case
    w_q = dequantize(*rtn_quantize(weight, 3))
    direct = ((calib @ (weight - w_q).T) ** 2).sum().item() * 2 / calib.shape[0]
    assert gptq_objective(weight, w_q, H) == pytest.approx(direct, rel=1e-4)


def test_cholesky_form_matches_naive_obq_updates(case):
    weight, _, _, H = case
    q, _ = gptq_quantize(weight, H, 4, blocksize=32)
    agree = (q == _naive_obq(weight, H, 4)).float().mean().item()
    assert agree > 0.999, agree  # float32 vs float64 may flip a rare tie


@pytest.mark.parametrize("group_size", [None, 32])
def test_lazy_batches_do_not_change_the_result(case, group_size):
    weight, _, _, H = case
    q, st = gptq_quantize(weight, H, 4, group_size=group_size, blocksize=128)
    for blocksize in (1, 48):  # 48: groups of 32 straddle the block boundaries
        q_b, st_b = gptq_quantize(weight, H, 4, group_size=group_size, blocksize=blocksize)
        assert (q_b == q).float().mean().item() > 0.999
        assert torch.allclose(st_b.scale.float(), st.scale.float(), rtol=1e-3)


# The returned state -----------------------------------------------------------------------------
@pytest.mark.parametrize(("bits", "group_size", "act_order"), [
    (4, None, False), (3, None, False), (4, 32, False), (3, 32, False), (4, None, True),
    (3, None, True),  # act_order with groups is refused (see test_bad_input)
])
def test_state_dequantizes_to_what_gptq_used(case, bits, group_size, act_order):
    weight, _, _, H = case
    q, st, w_used = _gptq(weight, H, bits, group_size, 128, 0.01, act_order)
    assert q.dtype == torch.uint8 and q.shape == (OUT, IN)
    assert int(q.min()) >= 0 and int(q.max()) <= 2 ** bits - 1
    assert int(q.max()) == 2 ** bits - 1  # the grid is used in full
    assert st.scale.dtype == torch.float16 and st.zero.dtype == torch.uint8 and st.bits == bits
    n_groups = OUT if group_size is None else OUT * IN // group_size
    assert st.scale.shape == st.zero.shape == (n_groups,)
    assert st.granularity == ("row" if group_size is None else "block") and st.blocksize == group_size
    w_q = dequantize(q, st)
    assert torch.equal(w_q, w_used)
    # re-quantizing the dequantized weight with the same scales and zeros gives the same codes
    scale = st.scale.float().repeat_interleave(IN if group_size is None else group_size)
    zero = st.zero.float().repeat_interleave(IN if group_size is None else group_size)
    again = (torch.round(w_q.reshape(-1) / scale) + zero).clamp(0, 2 ** bits - 1).to(torch.uint8)
    assert torch.equal(again.reshape(OUT, IN), q)


# GPTQ column by column: what each column was when rounded-------------------------------------------------
@pytest.mark.parametrize(("bits", "group_size", "act_order"), [
    (3, None, False), (3, 32, False), (4, None, True)])
def test_by_column_is_the_run_gptq_quantize_makes(case, bits, group_size, act_order):
    weight, _, _, H = case
    t = gptq_by_column(weight, H, bits, group_size=group_size, act_order=act_order, blocksize=48)
    q, st = gptq_quantize(weight, H, bits, group_size=group_size, act_order=act_order, blocksize=48)
    assert torch.equal(t.codes, q) and torch.equal(t.state.scale, st.scale)
    order = t.order
    assert sorted(order.tolist()) == list(range(IN))
    assert torch.equal(t.weight, weight[:, order])  # processing order
    assert torch.equal(t.quantized, dequantize(q, st)[:, order])
    # each column when rounded = the weight minus the updates of every column before it
    for j in (0, 1, 47, 48, 49, IN - 1):  # across a lazy-block boundary
        rebuilt = t.weight[:, j] - t.errors[:, :j] @ t.U[:j, j]
        assert torch.allclose(t.seen[:, j], rebuilt, atol=1e-5)
    assert torch.equal(t.update, t.seen - t.weight)
    assert t.update[:, 0].abs().max() == 0  # the first column receives nothing
    # the scaled error is the rounding error of the column as seen, over U's diagonal
    assert torch.allclose(t.errors, (t.seen - t.quantized) / torch.diagonal(t.U), atol=1e-6)
    assert (t.blocksize, t.group_size, t.bits) == (48, group_size, bits)


def test_error_path_ends_at_the_output_error(case):
    weight, calib, _, H = case
    t = gptq_by_column(weight, H, 3)
    w_rtn = dequantize(*rtn_quantize(weight, 3))
    path = t.relative_error_path(w_rtn, points=16)
    assert path["columns"][0] == 0 and path["columns"][-1] == IN and len(path["columns"]) == 17
    assert path["gptq"][0] == path["rtn"][0] == 0
    assert path["gptq"][-1] == pytest.approx(output_error(weight, t.quantized, calib), rel=1e-4)
    assert path["rtn"][-1] == pytest.approx(output_error(weight, w_rtn, calib), rel=1e-4)
    assert path["gptq"][-1] < path["rtn"][-1]
    assert "rtn" not in t.relative_error_path(points=4)


# Hessian accumulation --------------------------------------------------------------------------
def test_hessian_accumulator_matches_one_batch():
    A = _mixing()
    batches = [_inputs(n, seed, A).reshape(-1, 4, IN) for n, seed in ((64, 10), (128, 11), (32, 12))]
    acc = HessianAccumulator()
    for b in batches:
        acc.add(b)
    full = hessian(torch.cat([b.reshape(-1, IN) for b in batches]))
    assert acc.n == 224 and full.shape == (IN, IN) and full.dtype == torch.float32
    assert (torch.linalg.norm(acc.H - full) / torch.linalg.norm(full)).item() < 1e-5
    x = batches[0].reshape(-1, IN)
    assert torch.allclose(hessian(x), 2 * x.T @ x / x.shape[0])


def test_hessian_accumulator_as_forward_pre_hook():
    layer = nn.Linear(IN, 8)
    acc = HessianAccumulator()
    handle = layer.register_forward_pre_hook(acc)
    x = _inputs(96, 13, _mixing())
    with torch.no_grad():
        layer(x[:40])
        layer(x[40:].reshape(2, 28, IN))
    handle.remove()
    assert acc.n == 96
    assert torch.allclose(acc.H, hessian(x), rtol=1e-5, atol=1e-4)
    with pytest.raises(MemlabError, match="features"):
        acc.add(torch.zeros(3, IN + 1))
    with pytest.raises(MemlabError, match="no inputs"):
        _ = HessianAccumulator().H


# Dead inputs and act_order ----------------------------------------------------------------------
@pytest.mark.parametrize("group_size", [None, 32])
def test_dead_input_column(case, group_size):
    weight, calib, _, _ = case
    x = calib.clone()
    x[:, 5] = 0  # input 5 is never active
    H = hessian(x)
    assert H[5, 5] == 0
    w_q = dequantize(*gptq_quantize(weight, H, 4, group_size=group_size))
    assert torch.isfinite(w_q).all()
    assert torch.equal(w_q[:, 5], torch.zeros(OUT))
    w_rtn = dequantize(*rtn_quantize(weight, 4, group_size=group_size))
    assert output_error(weight, w_q, x) < output_error(weight, w_rtn, x)


def test_act_order(case):
    weight, calib, held_out, H = case
    w_rtn = dequantize(*rtn_quantize(weight, 4))
    w_plain = dequantize(*gptq_quantize(weight, H, 4))
    w_act = dequantize(*gptq_quantize(weight, H, 4, act_order=True))
    for x in (calib, held_out):
        assert output_error(weight, w_act, x) < output_error(weight, w_rtn, x)
    assert gptq_objective(weight, w_act, H) < gptq_objective(weight, w_plain, H)
    # codes come back in the original column order: every dequantized column is nearest to its
    # own column of the weight, and close to it in direction (a shuffled order is not)
    dist = torch.cdist(w_act.T, weight.T)  # (in, in): quantized column i vs weight column j
    assert torch.equal(dist.argmin(dim=1), torch.arange(IN))
    cos = torch.nn.functional.cosine_similarity
    assert cos(w_act, weight, dim=0).min() > 0.8
    assert cos(w_act.roll(1, dims=1), weight, dim=0).abs().max() < 0.5


# Bad input ----------------------------------------------------------------------------------------
def test_bad_input(case):
    weight, calib, _, H = case
    with pytest.raises(MemlabError, match="bits must be between 2 and 8.*got 9"):
        gptq_quantize(weight, H, 9)
    with pytest.raises(MemlabError, match="bits must be between 2 and 8.*got 9"):
        rtn_quantize(weight, 9)
    with pytest.raises(MemlabError, match=r"group_size must divide in_features \(128\), got 48"):
        gptq_quantize(weight, H, 4, group_size=48)
    with pytest.raises(MemlabError, match=r"group_size must divide in_features \(128\), got 48"):
        rtn_quantize(weight, 4, group_size=48)
    with pytest.raises(MemlabError, match=r"group_size must be a positive integer, got 0"):
        gptq_quantize(weight, H, 4, group_size=0)
    with pytest.raises(MemlabError, match=r"H must have shape .*\(128, 128\).*got \(64, 64\)"):
        gptq_quantize(weight, H[:64, :64], 4)
    with pytest.raises(MemlabError, match=r"weight must be 2-D.*got shape \(2, 32, 128\)"):
        gptq_quantize(weight.reshape(2, 32, IN), H, 4)
    with pytest.raises(MemlabError, match=r"weight must be 2-D.*got shape \(128,\)"):
        rtn_quantize(weight[0], 4)
    with pytest.raises(MemlabError, match="act_order with group_size"):
        gptq_quantize(weight, H, 4, group_size=32, act_order=True)
    with pytest.raises(MemlabError, match="percdamp must be a number >= 0.*-0.1"):
        gptq_quantize(weight, H, 4, percdamp=-0.1)
    with pytest.raises(MemlabError, match="blocksize must be a positive integer"):
        gptq_quantize(weight, H, 4, blocksize=0)
    with pytest.raises(MemlabError, match="not positive definite"):
        gptq_quantize(weight, -torch.eye(IN), 4, percdamp=0.0)
    with pytest.raises(MemlabError, match="finite"):
        gptq_quantize(weight, torch.full((IN, IN), float("nan")), 4)
    with pytest.raises(MemlabError, match="x has 64 features but the weight expects 128"):
        output_error(weight, weight, calib[:, :64])
    with pytest.raises(MemlabError, match="weight_q must have the weight's shape"):
        gptq_objective(weight, weight[:, :64], H)
