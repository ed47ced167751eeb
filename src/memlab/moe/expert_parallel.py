"""Expert parallelism: the experts sharded over N ranks, tokens sent to them and back (chapter: 9).

Each of N ranks holds E/N of a block's experts (rank r: experts r·E/N to (r+1)·E/N - 1) and its
own micro-batch. The router, the shared expert, attention, the norms and the embeddings are
replicated and trained data-parallel. In every MoE block a rank routes its own tokens, sorts
the (token, slot) rows by expert (so by owning rank), and two all-to-alls move them:

* **dispatch**: first the rows per expert (E integers), so that each rank knows how many rows
  it will receive from each other rank, then the rows themselves with uneven splits
  (``all_to_all_single``); the owner regroups them by expert and runs its experts;
* **combine**: the outputs go back along the same splits, and each rank weights and adds them
  to its tokens as one process does.

The backward pass runs both all-to-alls again in the other direction (the gradient of an
all-to-all is the all-to-all with the splits swapped). This is GShard's (Lepikhin et al.
2020) and the Switch Transformer's (Fedus et al. 2021) layout, as DeepSpeed-MoE (Rajbhandari
et al. 2022) and Megatron-LM run it: with data parallelism over the same ranks, an expert's
gradient is NOT all-reduced (its owner is its only copy) but it is divided by N, as the
replicated gradients are averaged: each rank's loss is the mean over its own tokens, and the
owner receives every rank's share.

The load-balancing loss uses the rows per expert of the whole batch (all-reduced, E numbers)
and each rank's own mean probabilities; averaged over the ranks it is one process's loss and
gives its gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

from memlab.errors import MemlabError, check_positive_int
from memlab.model.moe import MoE, Routing, keep_aux_loss

STAT_KEYS = ("dispatch_forward", "combine_forward", "combine_backward", "dispatch_backward")


def check_expert_parallel(experts: int, ranks: int) -> int:
    """The experts each rank holds, E/N; one line when N does not divide E (chapter: 9)."""
    check_positive_int("expert_parallel", ranks)
    if experts % ranks:
        raise MemlabError(f"expert parallelism over {ranks} ranks needs the {experts} experts to "
                          f"split evenly: accepted ranks divide {experts}, got {ranks}")
    return experts // ranks


class AllToAll(torch.autograd.Function):
    """Rows sent to every rank with uneven splits; the backward sends the gradients back (chapter: 9).

    ``stats`` (a dict or None) gets the bytes this rank sent to other ranks, under ``key``
    in the forward pass and under the opposite direction's name in the backward.
    """

    @staticmethod
    def forward(ctx, x, send, recv, group, stats, key):
        x = x.contiguous()
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x, output_split_sizes=list(recv),
                               input_split_sizes=list(send), group=group)
        ctx.send, ctx.recv, ctx.group, ctx.stats, ctx.key = send, recv, group, stats, key
        _count(stats, f"{key}_forward", send, x, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = grad.new_empty((sum(ctx.send),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad, output_split_sizes=list(ctx.send),
                               input_split_sizes=list(ctx.recv), group=ctx.group)
        _count(ctx.stats, f"{ctx.key}_backward", ctx.recv, grad, ctx.group)
        return out, None, None, None, None, None


def _count(stats, key, splits, x, group) -> None:
    """Add the bytes of the rows ``x`` sends to other ranks (its own chunk stays) to ``stats``."""
    if stats is None:
        return
    me = dist.get_rank(group)
    row = x[0].numel() * x.element_size() if x.dim() > 1 else x.element_size()
    stats[key] = stats.get(key, 0) + row * sum(n for j, n in enumerate(splits) if j != me)


def _all_to_all(x, send, recv, group, stats, key):
    return AllToAll.apply(x, tuple(send), tuple(recv), group, stats, key)


class ExpertParallelMoE(MoE):
    """An MoE block whose experts are spread over the ranks of ``group`` (chapter: 9).

    Made from a whole :class:`memlab.model.moe.MoE` (the same weights on every rank): this
    rank keeps its E/N experts and the replicated router, shared expert and gate. Dropless
    only (a capacity factor is refused in one line). ``stats``: the bytes sent to other ranks
    by direction (:data:`STAT_KEYS`), the rows received, and the all-to-all buffers' bytes.
    ``choice``: (N, k) expert ids that replace the router's top-k (a forced, imbalanced
    routing), the weights still the router's probabilities of those experts.
    """

    def __init__(self, layer: MoE, group=None):
        nn.Module.__init__(self)
        if layer.moe.capacity_factor is not None:
            raise MemlabError(f"expert parallelism here is dropless: capacity_factor must be "
                              f"null, got {layer.moe.capacity_factor!r}")
        self.moe, self.group = layer.moe, group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.local = check_expert_parallel(layer.moe.experts, self.world)
        first = self.rank * self.local
        self.first = first
        self.router = layer.router
        self.experts = nn.ModuleList(layer.experts[first:first + self.local])
        self.shared, self.shared_gate = layer.shared, layer.shared_gate
        self.routing: Routing | None = None
        self.choice: torch.Tensor | None = None
        self.aux_loss = None
        self.rows = None
        self.dropped = 0
        self.stats: dict = {}

    def forward(self, x):  # (B, T, C)
        B, T, C = x.shape
        E, k, W, L = self.moe.experts, self.moe.top_k, self.world, self.local
        h = x.reshape(B * T, C)  # (N, C)
        N = B * T
        probs = self.router(h).softmax(dim=-1, dtype=torch.float32)  # (N, E) fp32
        if self.choice is None:
            weights, chosen = probs.topk(k, dim=-1)  # (N, k)
        else:
            chosen = self.choice.to(h.device)
            weights = probs.gather(1, chosen)
        if self.moe.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(N * k)
        routed = torch.zeros(E, dtype=torch.float32, device=h.device).scatter_add_(
            0, flat, torch.ones(N * k, dtype=torch.float32, device=h.device))  # (E,)
        routing = self.routing
        if routing is None and isinstance(h, FakeTensor):
            routing = Routing.balanced(E)
        if routing is None:  # the true counts, exchanged: first the whole batch's, then the rows'
            total = routed.clone()
            dist.all_reduce(total, group=self.group)
            counts = [int(c) for c in routed.tolist()]
            mine = torch.tensor(counts, dtype=torch.int64, device=h.device)
            theirs = torch.empty_like(mine)  # (W·L,): from rank s, rows for each of my experts
            dist.all_to_all_single(theirs, mine, group=self.group)
            matrix = theirs.view(W, L).tolist()
        else:  # a trace: every rank routes alike
            counts = routing.counts(N * k)
            total = routed * W
            matrix = [counts[self.first:self.first + L]] * W
        # Switch Transformer's loss, the counts of the whole batch, this rank's probabilities
        keep_aux_loss(self, E * (total / (N * k * W) * probs.mean(dim=0)).sum())
        self.rows = counts
        order = flat.argsort(stable=True)  # (N·k,) rows sorted by expert, so by owning rank
        token = order // k
        send = [sum(counts[d * L:(d + 1) * L]) for d in range(W)]
        recv = [sum(row) for row in matrix]
        dispatched = h[token]  # (N·k, C): the send buffer
        received = _all_to_all(dispatched, send, recv, self.group, self.stats, "dispatch")
        # received: from rank 0 its rows for my expert 0, 1, ..., then rank 1's, ...: regroup
        starts, at = [], 0
        for s in range(W):
            row = []
            for j in range(L):
                row.append(at)
                at += matrix[s][j]
            starts.append(row)
        per_expert = [sum(matrix[s][j] for s in range(W)) for j in range(L)]
        perm = [i for j in range(L) for s in range(W)
                for i in range(starts[s][j], starts[s][j] + matrix[s][j])]
        perm_t = torch.tensor(perm, dtype=torch.int64, device=h.device)
        grouped = received[perm_t]  # (R, C) rows of my expert 0 from every rank, then 1, ...
        outs = [e(rows) for e, rows in zip(self.experts, grouped.split(per_expert), strict=True)]
        back = torch.cat(outs)[perm_t.argsort()]  # in the order they arrived
        returned = _all_to_all(back, recv, send, self.group, self.stats, "combine")  # (N·k, C)
        w = weights.reshape(N * k)[order].to(h.dtype)
        y = torch.zeros_like(h).index_add_(0, token, returned * w[:, None])  # the combine
        st = self.stats
        st["rows_received"] = st.get("rows_received", 0) + sum(recv)
        st["rows_sent_remote"] = st.get("rows_sent_remote", 0) + N * k - send[self.rank]
        st["buffer_bytes"] = max(st.get("buffer_bytes", 0), row_bytes(h) * (N * k + sum(recv)))
        if self.shared is not None:
            s = self.shared(h)
            if self.shared_gate is not None:
                s = s * torch.sigmoid(self.shared_gate(h))
            y = y + s
        return y.reshape(B, T, C)


def row_bytes(h: torch.Tensor) -> int:
    """Bytes of one row of a (rows, C) tensor (chapter: 9)."""
    return h.shape[-1] * h.element_size()


def shard_experts(model: nn.Module, group=None) -> list[ExpertParallelMoE]:
    """Replace every block's MoE by its expert-parallel version on this rank, in place (chapter: 9)."""
    layers = []
    for block in getattr(model, "blocks", ()):
        if isinstance(block.mlp, MoE) and not isinstance(block.mlp, ExpertParallelMoE):
            block.mlp = ExpertParallelMoE(block.mlp, group)
            layers.append(block.mlp)
    if not layers:
        raise MemlabError("expert parallelism needs a model with experts (a config with moe), "
                          "got one with none")
    return layers


def expert_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters that belong to this rank's experts (chapter: 9)."""
    return {id(p) for b in getattr(model, "blocks", ()) if isinstance(b.mlp, ExpertParallelMoE)
            for p in b.mlp.experts.parameters()}


def reduce_gradients(model: nn.Module, group=None) -> None:
    """Data parallelism beside expert parallelism: the replicated gradients averaged (chapter: 9).

    The experts' gradients are divided by N, not all-reduced: each has one owner.
    """
    world = dist.get_world_size(group)
    experts = expert_parameters(model)
    for p in model.parameters():
        if p.grad is None:
            continue
        if id(p) not in experts:
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(world)
