"""Chunked cross-entropy, measured: saved bytes and peak against the number of chunks (chapter: 8).

The loss itself is :class:`memlab.model.loss.ChunkedLinearCrossEntropy` (the step's
``loss_chunks``). Here a step of a model with a wide vocabulary is measured on this device at
each K, beside the estimate; and the chunked loss and gradients are compared with the unchunked
ones against a bound on rounding derived from the shapes (:func:`rounding_bounds`).

Two libraries do the same with their own kernels, and say so in their documentation:
Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` runs the head and the loss over chunks of
tokens and computes the gradients in the forward pass, so nothing of size (N, V) outlives a
chunk; Cut Cross-Entropy (Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language
Models", arXiv 2411.09009) never writes the logits to global memory at all, computing each
logit block in on-chip memory for the forward and again for the backward. The book's version
is plain PyTorch: it keeps one fp32 log-sum-exp per token and recomputes a chunk's logits in
the backward pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from memlab.errors import MemlabError
from memlab.measure.step import measure_step
from memlab.memory.estimator import estimate
from memlab.model.config import ModelConfig
from memlab.model.loss import chunked_lm_loss, unchunked_lm_loss

# A small model with Llama-3's vocabulary at CI scale keeps the logits the largest tensor
CHUNK_SIZES = {
    "ci": dict(config=dict(name="wide-vocab", vocab_size=32000, n_layer=2, n_head=4, d_model=64,
                           max_seq_len=512),
               batch_size=2, seq_len=128, precision="fp32", checkpointing=True,
               chunks=(1, 2, 4, 8)),
    "full": dict(config=dict(name="llama-1b-128k", vocab_size=128256, n_layer=16, n_head=32,
                             n_kv_head=8, d_model=2048, ffn_dim=8192, max_seq_len=8192),
                 batch_size=1, seq_len=8192, precision="bf16-mixed", checkpointing=True,
                 chunks=(1, 4, 16, 64)),
}


@dataclass(frozen=True)
class ChunkRow:
    """One K: the step measured on this device and estimated (chapter: 8)."""

    chunks: int
    saved_bytes: int
    peak_bytes: int
    phase_peak_bytes: dict[str, int]
    estimated_peak_bytes: int
    estimated_saved_bytes: int


@dataclass(frozen=True)
class ChunkSweep:
    """A step measured at each number of loss chunks (chapter: 8)."""

    scale: str
    device: str
    setup: dict
    rows: tuple[ChunkRow, ...]
    agreement: dict = field(default_factory=dict)  # chunked vs unchunked, with the bounds

    def as_dict(self) -> dict:
        return asdict(self)


def rounding_bounds(hidden: torch.Tensor, weight: torch.Tensor,
                    targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Bounds on how far two roundings of the head and the loss can differ (chapter: 8).

    Each computation is the exact value plus rounding: a sum of n terms is within gamma_n times
    the sum of the terms' magnitudes of the exact sum (Higham, "Accuracy and Stability of
    Numerical Algorithms", 3.1), gamma_n = nu / (1 - nu) for the unit roundoff u. A logit is a
    sum over the width C, a log-sum-exp over the vocabulary V, the weight's gradient a sum over
    the N tokens; a softmax entry inherits its logit's and its row's log-sum-exp's errors. The
    chunked and unchunked computations differ by at most twice the bound of one (first order,
    doubled again for safety). Returns the bounds of the loss, and elementwise of the hidden
    states' and the weight's gradients.
    """
    B, T, C = hidden.shape
    V, N = weight.shape[0], B * T
    u = torch.finfo(hidden.dtype).eps / 2

    def gamma(n):
        return n * u / (1 - n * u)

    H, W = hidden.detach().reshape(N, C), weight.detach()
    logits = H @ W.t()
    p = torch.softmax(logits, -1)
    dlogits = (p - torch.nn.functional.one_hot(targets.reshape(N), V)) / N
    e_logit = gamma(C) * (H.abs() @ W.abs().t())
    e_lse = e_logit.amax(-1) + gamma(V)
    e_g = p * (e_logit + e_lse[:, None]) / N
    lse = torch.logsumexp(logits, -1)
    return dict(
        loss=4 * (gamma(N) * (lse.abs() + logits.abs().amax(-1)).sum()
                  + (e_lse + e_logit.amax(-1)).sum()) / N,
        hidden=4 * (gamma(V) * dlogits.abs() @ W.abs() + e_g @ W.abs()).reshape(B, T, C),
        weight=4 * (gamma(N) * dlogits.abs().t() @ H.abs() + e_g.t() @ H.abs()),
    )


def loss_agreement(*, tokens: int = 512, vocab: int = 32000, width: int = 64, chunks: int = 16,
                   seed: int = 0) -> dict:
    """The chunked loss and gradients against the unchunked ones, in fp32, with the bounds (chapter: 8).

    Returns the largest difference over the bound for the loss and each gradient (at most 1
    when they agree to rounding) and the largest absolute differences.
    """
    if chunks > tokens:
        raise MemlabError(f"chunks must be at most the tokens ({tokens}), got {chunks!r}")
    g = torch.Generator().manual_seed(seed)
    hidden = (3 * torch.randn(1, tokens, width, generator=g)).requires_grad_()
    weight = (torch.randn(vocab, width, generator=g) / width ** 0.5).requires_grad_()
    targets = torch.randint(0, vocab, (1, tokens), generator=g)

    def run(fn, *args):
        h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        loss = fn(h, w, targets, *args)
        loss.backward()
        return loss.detach(), h.grad, w.grad

    loss, gh, gw = run(chunked_lm_loss, chunks)
    ref, rh, rw = run(unchunked_lm_loss)
    bounds = rounding_bounds(hidden, weight, targets)
    return dict(
        tokens=tokens, vocab=vocab, width=width, chunks=chunks, dtype="float32",
        loss=float(ref), loss_diff=float((loss - ref).abs()),
        hidden_grad_max_diff=float((gh - rh).abs().max()),
        weight_grad_max_diff=float((gw - rw).abs().max()),
        loss_over_bound=float((loss - ref).abs() / bounds["loss"]),
        hidden_over_bound=float(((gh - rh).abs() / bounds["hidden"]).max()),
        weight_over_bound=float(((gw - rw).abs() / bounds["weight"]).max()),
    )


def chunk_sweep(scale: str = "ci", device=None) -> ChunkSweep:
    """A step of a wide-vocabulary model measured at each K on this device (chapter: 8)."""
    from memlab.device import pick_device

    size = CHUNK_SIZES[scale]
    dev = pick_device(device)
    cfg = ModelConfig(**size["config"])
    step = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                precision=size["precision"], checkpointing=size["checkpointing"])
    rows = []
    for k in size["chunks"]:
        m = measure_step(cfg, device=dev, loss_chunks=k, **step)
        e = estimate(cfg, device=dev.type if dev.type in ("cuda", "cpu") else "cuda",
                     loss_chunks=k, **step)
        rows.append(ChunkRow(k, m.saved_activations_bytes, m.peak_bytes, dict(m.phase_peak_bytes),
                             e.peak_bytes, e.saved_activations_bytes))
    agreement = loss_agreement(vocab=cfg.vocab_size, width=cfg.d_model)
    return ChunkSweep(scale, dev.type, dict(model=cfg.name, vocab_size=cfg.vocab_size, **step),
                      tuple(rows), agreement)
