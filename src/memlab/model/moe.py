"""A mixture-of-experts MLP: a router, experts as SwiGLU MLPs, an optional shared expert (chapter: 9).

Each token's hidden state goes to ``top_k`` of ``experts`` MLPs, chosen by a linear router, and
the block adds their outputs weighted by the router's probabilities:

    p = softmax(h W_r)                          (N, E), in fp32
    w, e = top_k(p)                             (N, k) weights and expert ids
    w = w / sum(w)     (if norm_topk_prob)      Mixtral's softmax over the chosen logits
    y = sum_j w_j * expert_{e_j}(h)  [+ shared(h) * sigmoid(h W_g)]

as in Shazeer et al. 2017 ("Outrageously large neural networks: the sparsely-gated
mixture-of-experts layer"), Mixtral (Jiang et al. 2024, arXiv 2401.04088: 8 experts, top 2,
renormalized) and Qwen1.5-MoE / DeepSeekMoE (Dai et al. 2024, arXiv 2401.06066: many small
experts plus shared ones every token passes through; Qwen's shared expert has a sigmoid gate).

Dispatch and combine are written out, as the buffers they make are what this part measures:
the (token, slot) pairs are sorted by expert (``argsort``), the tokens gathered in that order
(the dispatch buffer, N·k rows), each expert runs on its contiguous run of rows, the outputs
are scaled by their weights and added back to their tokens (``index_add_``, the combine).
A capacity factor c (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021)
caps each expert at ceil(c · N · k / E) rows; the rows past it are dropped (the token keeps
its residual stream only), in token order. The Switch Transformer's load-balancing loss,
E · sum_e f_e · P_e (f_e the share of the N·k rows routed to e, P_e the mean probability of
e), is kept in ``aux_loss`` after each forward.

How many rows each expert gets depends on the values, which a trace on fake tensors does not
have: :class:`Routing` fixes the counts (balanced, or any split) so that a trace allocates what
a run with that routing allocates; a trace with none set routes evenly.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from memlab.errors import MemlabError
from memlab.model.config import MoEConfig


class Routing:
    """Rows per expert fixed in advance, for a trace on fake tensors (chapter: 9).

    ``shares`` (one number per expert, any scale) split each block's N·k rows: ``balanced``
    gives each expert the same share. The counts are rounded so that they add up to N·k.
    """

    def __init__(self, shares):
        shares = [float(s) for s in shares]
        if not shares or any(not s >= 0 for s in shares) or not sum(shares) > 0:
            raise MemlabError(f"routing shares must be numbers >= 0 with a positive sum, got "
                              f"{shares!r}")
        self.shares = tuple(shares)

    @classmethod
    def balanced(cls, experts: int) -> Routing:
        """Every expert gets the same share of the rows (chapter: 9)."""
        return cls([1.0] * experts)

    def counts(self, rows: int) -> list[int]:
        """Rows of each expert, adding up to ``rows`` (largest remainders) (chapter: 9)."""
        total = sum(self.shares)
        exact = [rows * s / total for s in self.shares]
        counts = [math.floor(x) for x in exact]
        order = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
        for i in order[: rows - sum(counts)]:
            counts[i] += 1
        return counts


_TRACE_ROUTING: list[Routing] = []  # the routing of traces run inside trace_routing(...)
_RECOMPUTING: list[bool] = []  # inside a checkpointed block's recomputation


@contextlib.contextmanager
def _recomputing():
    _RECOMPUTING.append(True)
    try:
        yield
    finally:
        _RECOMPUTING.pop()


def recompute_contexts():
    """``context_fn`` of a checkpoint: a recomputed MoE forward keeps no balancing loss (chapter: 9).

    The loss was taken in the first forward; keeping the recomputation's would hold its
    graph (the block's recomputed tensors) alive until the next step.
    """
    return contextlib.nullcontext(), _recomputing()


def keep_aux_loss(layer, aux) -> None:
    """Set ``layer.aux_loss`` unless a checkpoint is recomputing the block (chapter: 9).

    With ``aux_loss_coef`` 0 the loss is not trained: its value is kept without its graph,
    which would otherwise hold what it saved (and a checkpoint's recomputed tensors) alive.
    """
    if not _RECOMPUTING:
        layer.aux_loss = aux if layer.moe.aux_loss_coef else aux.detach()


@contextlib.contextmanager
def trace_routing(routing: Routing):
    """Traces inside route every MoE block with ``routing`` instead of evenly (chapter: 9)."""
    if not isinstance(routing, Routing):
        raise MemlabError(f"trace_routing takes a Routing, got {routing!r}")
    _TRACE_ROUTING.append(routing)
    try:
        yield routing
    finally:
        _TRACE_ROUTING.pop()


class SwiGLU(nn.Module):
    """One expert: down(silu(gate(x)) * up(x)) (Shazeer 2020), as Llama's MLP (chapter: 9)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):  # (n, C)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (n, C)


class MoE(nn.Module):
    """A block's mixture-of-experts MLP (chapter: 9): see the module's docstring."""

    def __init__(self, d_model: int, moe: MoEConfig):
        super().__init__()
        self.moe = moe
        self.router = nn.Linear(d_model, moe.experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, moe.d_ff) for _ in range(moe.experts))
        self.shared = SwiGLU(d_model, moe.shared_d_ff) if moe.shared_d_ff else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if moe.shared_gate else None
        self.routing: Routing | None = None  # fixed counts for a trace (None: from the router)
        self.aux_loss: torch.Tensor | None = None  # the last forward's load-balancing loss
        self.rows: list[int] | None = None  # the last forward's rows per expert (before capacity)
        self.dropped = 0  # rows past an expert's capacity in the last forward

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        E, k = self.moe.experts, self.moe.top_k
        h = x.reshape(B * T, C)  # (N, C)
        N = B * T
        logits = self.router(h)  # (N, E)
        probs = logits.softmax(dim=-1, dtype=torch.float32)  # (N, E) fp32
        weights, chosen = probs.topk(k, dim=-1)  # (N, k), (N, k)
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(N * k)  # (N·k,) the expert of each (token, slot) row
        routed = torch.zeros(E, dtype=torch.float32, device=h.device).scatter_add_(
            0, flat, torch.ones(N * k, dtype=torch.float32, device=h.device))  # (E,)
        # Switch Transformer's load-balancing loss: E · sum_e f_e · P_e (1 when balanced).
        keep_aux_loss(self, E * (routed / (N * k) * probs.mean(dim=0)).sum())
        routing = self.routing
        if routing is None and isinstance(h, FakeTensor):  # a trace has no values to route by
            routing = _TRACE_ROUTING[-1] if _TRACE_ROUTING else Routing.balanced(E)
        counts = routing.counts(N * k) if routing is not None else \
            [int(c) for c in routed.tolist()]
        self.rows = counts
        order = flat.argsort(stable=True)  # (N·k,) rows sorted by expert, tokens in order
        cap = self.moe.capacity(N)
        if cap is not None and any(c > cap for c in counts):  # keep each expert's first cap rows
            starts = [sum(counts[:e]) for e in range(E)]
            keep = torch.cat([torch.arange(s, s + min(c, cap), device=h.device)
                              for s, c in zip(starts, counts, strict=True)])
            order = order[keep]
            self.dropped = sum(max(c - cap, 0) for c in counts)
            counts = [min(c, cap) for c in counts]
        else:
            self.dropped = 0
        token = order // k  # (R,) the token of each kept row
        dispatched = h[token]  # (R, C): the dispatch buffer, rows grouped by expert
        outs = [expert(rows) for expert, rows in zip(self.experts, dispatched.split(counts), strict=True)]
        w = weights.reshape(N * k)[order].to(h.dtype)  # (R,)
        combined = torch.cat(outs) * w[:, None]  # (R, C)
        y = torch.zeros_like(h).index_add_(0, token, combined)  # (N, C): the combine
        if self.shared is not None:
            s = self.shared(h)  # (N, C)
            if self.shared_gate is not None:
                s = s * torch.sigmoid(self.shared_gate(h))
            y = y + s
        return y.reshape(B, T, C)


def reference_moe(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """The same MoE token by token, no dispatch buffers, no capacity: for tests (chapter: 9)."""
    B, T, C = x.shape
    h = x.reshape(B * T, C)
    probs = layer.router(h).softmax(dim=-1, dtype=torch.float32)
    weights, chosen = probs.topk(layer.moe.top_k, dim=-1)
    if layer.moe.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    rows = []
    for n in range(h.shape[0]):
        y = sum(weights[n, j].to(h.dtype) * layer.experts[int(chosen[n, j])](h[n:n + 1])[0]
                for j in range(layer.moe.top_k))
        if layer.shared is not None:
            s = layer.shared(h[n:n + 1])[0]
            if layer.shared_gate is not None:
                s = s * torch.sigmoid(layer.shared_gate(h[n:n + 1]))[0]
            y = y + s
        rows.append(y)
    return torch.stack(rows).reshape(B, T, C)
