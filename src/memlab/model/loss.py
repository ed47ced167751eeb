"""Chunked cross-entropy: the LM head and the loss over K chunks of tokens (chapter: 8).

With a large vocabulary the end of the forward pass is the biggest thing in a step: the LM head
makes (B, T, V) logits, cross-entropy upcasts them to fp32 and keeps its log-softmax for the
backward, and the backward makes an fp32 gradient of the same shape. Chunking computes the head
and the loss for N/K tokens at a time, so at most one chunk's logits exist: the forward keeps
only each token's log-sum-exp (N floats) and the head's input, and the backward computes each
chunk's logits again from them (the softmax is ``exp(logits - lse)``), turns them into the
gradient of the logits in place and multiplies it out into the gradients of the head's input
and weight.

What the libraries users meet do, by their documentation: Liger-Kernel's fused linear
cross-entropy also walks chunks of tokens, but computes the gradients during the forward pass
and keeps them, so the backward only returns them; Cut Cross-Entropy (Wijmans et al. 2024,
arXiv 2411.09009) computes the logits block by block in on-chip memory in a Triton kernel, so
not even a chunk's logits reach GPU memory, and skips gradient blocks whose softmax entries are
negligible. This module is the plain PyTorch version of the idea: chunks of recomputed logits,
exact to rounding, on any device.

Mixed precision follows autocast: under autocast the matrix products run in autocast's dtype
(with one 16-bit copy of the weight alive while they run, as the unchunked head makes), and the
softmax in fp32, as ``F.cross_entropy`` upcasts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from memlab.errors import MemlabError
from memlab.model.step import check_loss_chunks


def chunk_bounds(n_tokens: int, chunks: int) -> list[tuple[int, int]]:
    """(start, end) of each of ``chunks`` nearly equal chunks of ``n_tokens`` rows (chapter: 8).

    The first ``n_tokens % chunks`` chunks have one row more, as ``torch.tensor_split`` makes them.
    """
    check_loss_chunks(chunks, n_tokens)
    size, extra = divmod(n_tokens, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + size + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean next-token cross-entropy of ``hidden @ weight.T`` over ``chunks`` chunks of rows.

    hidden (N, C), weight (V, C), targets (N,) int64; returns a 0-d fp32 tensor. Keeps for the
    backward: ``hidden``, ``weight`` (both already alive) and the log-sum-exp of each row (N
    fp32 values); never more than one chunk's (N/K, V) logits at a time.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunks: int):
        dtype = _compute_dtype(hidden)
        acc = torch.promote_types(dtype, torch.float32)  # the softmax's dtype: fp32 at least
        n = hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)  # autocast's 16-bit copy of the weight (the weight itself in fp32)
            lse = torch.empty(n, dtype=acc, device=hidden.device)
            total = torch.zeros((), dtype=acc, device=hidden.device)
            for start, end in chunk_bounds(n, chunks):
                logits = (hidden[start:end].to(dtype) @ w.t()).to(acc)  # (n/K, V), fp32
                lse[start:end] = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, targets[start:end, None]).squeeze(1)
                total += (lse[start:end] - picked).sum()
                del logits
            del w
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunks, ctx.dtype = chunks, dtype
        return total / n

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets, lse = ctx.saved_tensors
        dtype, n, acc = ctx.dtype, hidden.shape[0], lse.dtype
        scale = grad.to(acc) / n
        grad_hidden = grad_weight = None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(dtype)
            if ctx.needs_input_grad[0]:
                grad_hidden = torch.empty_like(hidden)
            if ctx.needs_input_grad[1]:
                grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
            for start, end in chunk_bounds(n, ctx.chunks):
                h = hidden[start:end].to(dtype)
                g = (h @ w.t()).to(acc)  # the chunk's logits again, (n/K, V) fp32
                g.sub_(lse[start:end, None]).exp_()  # softmax
                rows = torch.arange(end - start, device=g.device)
                g[rows, targets[start:end]] -= 1  # d loss / d logits, times n
                g = (g * scale).to(dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = (g @ w).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight += (g.t() @ h).to(acc)
                del g
            del w
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None


def chunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    chunks: int) -> torch.Tensor:
    """Cross-entropy (nats, fp32) of the LM head ``weight`` on ``hidden``, in chunks (chapter: 8).

    hidden (B, T, C): the final norm's output; weight (V, C): the LM head's; targets (B, T).
    ``chunks=1`` is the unchunked loss, ``lm_loss(hidden @ weight.T, targets)`` to rounding.
    """
    if hidden.dim() != 3 or targets.shape != hidden.shape[:2]:
        raise MemlabError(f"hidden must be (B, T, C) and targets (B, T), got "
                          f"{tuple(hidden.shape)} and {tuple(targets.shape)}")
    B, T, C = hidden.shape
    check_loss_chunks(chunks, B * T)
    return ChunkedLinearCrossEntropy.apply(hidden.reshape(B * T, C), weight,
                                           targets.reshape(B * T), chunks)


def lm_loss(logits, targets):
    """Next-token cross-entropy (a 0-d tensor, nats) in fp32, as training code computes it (chapter: 0)."""
    B, T, V = logits.shape
    upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 (fp64 stays)
    return F.cross_entropy(upcast.reshape(B * T, V), targets.reshape(B * T))


def unchunked_lm_loss(hidden: torch.Tensor, weight: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
    """The LM head and :func:`lm_loss` whole, as a model computes them, for comparison (chapter: 8)."""
    return lm_loss(F.linear(hidden, weight), targets)  # (B, T, V) logits
