"""Chunked cross-entropy (memlab.model.loss) against the unchunked head and loss."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.longcontext.chunked import rounding_bounds
from memlab.model.loss import chunk_bounds, chunked_lm_loss, unchunked_lm_loss


def _case(seed: int, dtype=torch.float64):
    """Shapes drawn at random (not chosen in advance): N tokens, V vocabulary, C width, K chunks."""
    g = torch.Generator().manual_seed(seed)
    B, T = (int(x) for x in torch.randint(1, 6, (2,), generator=g))
    V, C = int(torch.randint(3, 300, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g))
    K = int(torch.randint(1, B * T + 1, (1,), generator=g))
    hidden = (3 * torch.randn(B, T, C, generator=g)).to(dtype).requires_grad_()
    weight = torch.randn(V, C, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    return hidden, weight, targets, K


def _grads(loss_fn, hidden, weight, targets, *args):
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    loss = loss_fn(h, w, targets, *args)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(12))
def test_same_loss_and_gradients_as_the_unchunked_head_to_a_derived_bound(seed, dtype):
    hidden, weight, targets, K = _case(seed, dtype)
    loss, gh, gw = _grads(chunked_lm_loss, hidden, weight, targets, K)
    ref, rh, rw = _grads(unchunked_lm_loss, hidden, weight, targets)
    # the bound derived in memlab.longcontext.chunked.rounding_bounds (Higham's gamma_n)
    bounds = rounding_bounds(hidden, weight, targets)
    bound_loss, bound_w, bound_h = bounds["loss"], bounds["weight"], bounds["hidden"]
    assert (loss - ref).abs() <= bound_loss
    assert ((gw - rw).abs() <= bound_w).all()
    assert ((gh - rh).abs() <= bound_h).all()


def test_one_chunk_and_one_token_per_chunk_both_match():
    hidden, weight, targets, _ = _case(99)
    N = hidden.shape[0] * hidden.shape[1]
    a = _grads(chunked_lm_loss, hidden, weight, targets, 1)
    b = _grads(chunked_lm_loss, hidden, weight, targets, N)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


def test_under_autocast_the_products_run_in_bf16_like_the_unchunked_head():
    hidden, weight, targets, _ = _case(3, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        chunked = chunked_lm_loss(hidden, weight, targets, 3)
        plain = unchunked_lm_loss(hidden, weight, targets)
    assert chunked.dtype == torch.float32
    # the same bf16 logits, upcast: only the order of the fp32 sums differs
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)


def test_saved_for_backward_is_one_float_per_token_beyond_the_inputs():
    hidden, weight, targets, _ = _case(5, torch.float32)
    N = hidden.shape[0] * hidden.shape[1]
    inputs = {hidden.untyped_storage().data_ptr(), weight.untyped_storage().data_ptr(),
              targets.untyped_storage().data_ptr()}
    saved = []

    def pack(t):
        if t.untyped_storage().data_ptr() not in inputs:
            saved.append(t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked_lm_loss(hidden, weight, targets, 2)
    assert sum(saved) == N * 4  # the log-sum-exp of each row, fp32


def test_chunks_are_nearly_equal_and_bad_counts_are_refused_in_one_line():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert [b - a for a, b in chunk_bounds(7, 7)] == [1] * 7
    hidden, weight, targets, _ = _case(1)
    N = hidden.shape[0] * hidden.shape[1]
    for bad in (0, -1, N + 1, 2.5, True, "4"):
        with pytest.raises(MemlabError, match=r"loss_chunks must be a whole number from 1 to"):
            chunked_lm_loss(hidden, weight, targets, bad)
    with pytest.raises(MemlabError, match="hidden must be"):
        chunked_lm_loss(hidden[0], weight, targets, 1)
