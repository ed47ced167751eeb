"""FlashAttention from scratch against PyTorch's scaled_dot_product_attention."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from memlab.attention import flash_attention, naive_attention
from memlab.errors import MemlabError


def reference(q, k, v, causal):
    """SDPA with an explicit mask: query t sits at position S - T + t (bottom-right aligned)."""
    T, S = q.size(2), k.size(2)
    g = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    mask = None
    if causal:
        t = torch.arange(T)[:, None]
        s = torch.arange(S)[None, :]
        mask = s <= (S - T) + t
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)


# (B, nh, nkv, T, S, hs, block_q, block_k, causal)
SHAPES = [
    (2, 4, 4, 16, 16, 8, 4, 4, True),      # multi-head, exact tiles
    (1, 4, 2, 37, 37, 8, 8, 16, True),     # GQA, T not a multiple of the blocks
    (2, 8, 1, 20, 20, 16, 7, 5, True),     # multi-query
    (1, 2, 2, 13, 29, 8, 4, 8, True),      # a KV cache longer than the queries
    (1, 4, 2, 1, 33, 8, 4, 8, True),       # one decoded token
    (2, 2, 1, 19, 23, 8, 6, 4, False),     # non-causal, S != T
    (1, 3, 3, 64, 64, 32, 64, 64, True),   # one tile
]


def _inputs(B, nh, nkv, T, S, hs, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, nh, T, hs, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, nkv, S, hs, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, nkv, S, hs, generator=g).to(dtype).requires_grad_()
    return q, k, v


@pytest.mark.parametrize("B, nh, nkv, T, S, hs, bq, bk, causal", SHAPES)
def test_forward_and_gradients_match_sdpa_in_fp32(B, nh, nkv, T, S, hs, bq, bk, causal):
    q, k, v = _inputs(B, nh, nkv, T, S, hs)
    out = flash_attention(q, k, v, causal=causal, block_q=bq, block_k=bk)
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = reference(qr, kr, vr, causal)
    assert out.shape == (B, nh, T, hs) and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for mine, theirs in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-5)
    naive = naive_attention(q.detach(), k.detach(), v.detach(), causal=causal)
    torch.testing.assert_close(naive, ref.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sixteen_bit_inputs_accumulate_in_fp32(dtype):
    """The tolerance is the 16-bit rounding of inputs and output: a few units in the last
    place of the format (bf16 keeps 8 significant bits, fp16 11), not an accumulation error."""
    q, k, v = _inputs(2, 4, 2, 40, 40, 16, dtype=dtype)
    out = flash_attention(q, k, v, block_q=16, block_k=8)
    ref = reference(q.detach(), k.detach(), v.detach(), True)
    eps = torch.finfo(dtype).eps
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=4 * eps, atol=4 * eps)
    out.float().sum().backward()
    assert q.grad.dtype == dtype and torch.isfinite(q.grad.float()).all()


def _saved_bytes(fn, T):
    q, k, v = _inputs(1, 2, 2, T, T, 16)
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v)
    return total


def test_bytes_saved_for_backward_grow_linearly_in_T():
    """Doubling T doubles what FlashAttention saves; naive attention's quadruples (its T x S
    probabilities), so a non-tiled implementation fails the first assertion."""
    flash = [_saved_bytes(lambda q, k, v: flash_attention(q, k, v, block_q=16, block_k=16), T)
             for T in (64, 128, 256)]
    naive = [_saved_bytes(naive_attention, T) for T in (64, 128, 256)]
    assert flash[1] / flash[0] == pytest.approx(2, rel=0.01)
    assert flash[2] / flash[1] == pytest.approx(2, rel=0.01)
    assert naive[2] / naive[1] > 3
    # q, k, v, O in fp32 (4 x T x hs x 4 bytes per head) and the log-sum-exp (T x 4)
    assert flash[0] == 2 * 64 * (4 * 16 * 4 + 4)


@pytest.mark.parametrize("args, match", [
    (dict(q=(1, 2, 4, 8), k=(1, 2, 4, 16)), "head sizes differ"),
    (dict(q=(1, 3, 4, 8), k=(1, 2, 4, 8)), "multiple of n_kv_head"),
    (dict(q=(1, 2, 8, 8), k=(1, 2, 4, 8)), "at least as many keys"),
])
def test_bad_shapes_are_one_line_errors(args, match):
    q, k = torch.zeros(args["q"]), torch.zeros(args["k"])
    with pytest.raises(MemlabError, match=match) as err:
        flash_attention(q, k, k.clone())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("block", [0, -4, 2.5])
def test_bad_block_is_a_one_line_error(block):
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(MemlabError, match="block_q"):
        flash_attention(q, q, q, block_q=block)


def test_scale_is_one_over_sqrt_head_size():
    q, k, v = _inputs(1, 1, 1, 5, 5, 4)
    out = flash_attention(q, k, v, causal=False)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(4)
    torch.testing.assert_close(out, s.softmax(-1) @ v, rtol=1e-5, atol=1e-6)


def test_online_softmax_equals_softmax_and_keeps_the_running_max():
    from memlab.attention import online_softmax

    x = torch.tensor([[1.0, 3.0, -2.0, 5.0, 0.5, 4.0, 7.0]])
    p, steps = online_softmax(x, block=3)
    torch.testing.assert_close(p, x.softmax(-1))
    assert [float(m) for m, _ in steps] == [3.0, 5.0, 7.0]
    _, norm = steps[-1]
    assert float(norm) == pytest.approx(float(torch.exp(x - 7.0).sum()))
