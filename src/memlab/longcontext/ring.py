"""Ring attention: context parallelism over N ranks, written from scratch (chapter: 8).

Each of N ranks holds T/N of the sequence: its queries, keys and values. Attention needs every
query against every key, so the key/value blocks travel around a ring of ranks: at step s rank r
holds the block of rank (r - s) mod N, attends its queries to it, and passes it on to rank r + 1
while it receives the next from rank r - 1 (Liu, Zaharia and Abbeel 2023, "Ring Attention with
Blockwise Transformers", arXiv 2310.01889). The blocks' partial results are merged exactly, as
FlashAttention merges its tiles: a running output and log-sum-exp per query row, rescaled when a
block brings a larger one. No rank ever holds more than its own queries and two key/value blocks.

The backward pass goes around the ring again: each rank recomputes a block's probabilities from
the saved log-sum-exp, adds the block's share to its own query gradient, and adds the block's key
and value gradients to accumulators that travel with the block, so after N passes every block's
gradients are home.

With a causal mask, a contiguous split gives rank 0 one block of work and rank N-1 all N of
them. The zig-zag split (Brandon et al. 2023, "Striped Attention", and the load-balanced layouts
of Megatron-LM and torchtitan's context parallelism) cuts the sequence into 2N chunks and gives
rank r chunks r and 2N-1-r: an early chunk and a late one, so every rank does the same work.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.memory.context import kv_bytes_sent_per_step

LAYOUTS = ("contiguous", "zigzag")


def token_positions(rank: int, world: int, seq_len: int, layout: str = "zigzag") -> torch.Tensor:
    """The global positions of the tokens rank ``rank`` of ``world`` holds, in order (chapter: 8).

    ``contiguous``: T/N consecutive tokens. ``zigzag``: chunks ``rank`` and ``2N-1-rank`` of
    the sequence cut into 2N chunks. The sequence must divide evenly (one-line error otherwise).
    """
    check_choice("layout", layout, LAYOUTS)
    check_positive_int("world size", world)
    parts = world if layout == "contiguous" else 2 * world
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0 or seq_len % parts:
        raise MemlabError(f"context parallelism over {world} ranks ({layout}) splits the sequence "
                          f"into {parts} equal parts: seq_len must be a positive multiple of "
                          f"{parts}, got {seq_len!r}")
    if not 0 <= rank < world:
        raise MemlabError(f"rank must be from 0 to {world - 1}, got {rank!r}")
    size = seq_len // parts
    if layout == "contiguous":
        return torch.arange(rank * size, (rank + 1) * size)
    late = 2 * world - 1 - rank
    return torch.cat([torch.arange(rank * size, (rank + 1) * size),
                      torch.arange(late * size, (late + 1) * size)])


def local_tokens(x: torch.Tensor, rank: int, world: int, layout: str = "zigzag",
                 dim: int = -2) -> torch.Tensor:
    """The slice of a whole-sequence tensor that rank ``rank`` holds (chapter: 8)."""
    pos = token_positions(rank, world, x.shape[dim], layout)
    return x.index_select(dim, pos.to(x.device))


def causal_pairs(rank: int, world: int, seq_len: int, layout: str = "zigzag") -> int:
    """(query, key) pairs rank ``rank`` computes under a causal mask: its share of the work (chapter: 8).

    A query at position i attends the i + 1 keys at or before it, so a rank's work is the sum of
    its positions plus one. Contiguous: rank N-1 does 2N-1 times rank 0's; zig-zag: all equal.
    """
    return int((token_positions(rank, world, seq_len, layout) + 1).sum())


def _expand(kv: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * groups, T, D): each KV head serves ``groups`` query heads."""
    return kv if groups == 1 else kv.repeat_interleave(groups, dim=1)


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of :func:`_expand`: the query heads' shares summed per KV head."""
    if groups == 1:
        return grad
    B, H, T, D = grad.shape
    return grad.view(B, H // groups, groups, T, D).sum(2)


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """Which (query, key) pairs may attend: a key at or before its query when causal."""
    return (k_pos[None, :] <= q_pos[:, None]) if causal else None


def _any_pair(rank: int, owner: int, world: int, seq_len: int, layout: str, causal: bool) -> bool:
    """Whether any query of ``rank`` may attend a key of ``owner``: its first key is at or before
    the rank's last query. Integer arithmetic, so a traced (fake) step need not read a mask."""
    if not causal:
        return True
    parts = world if layout == "contiguous" else 2 * world
    size = seq_len // parts
    last = (rank + 1) * size - 1 if layout == "contiguous" else (2 * world - rank) * size - 1
    return owner * size <= last


def _scores(q, k, mask, scale):
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """``lse`` with -inf (a row with no key to attend) replaced by 0, so exp(s - lse) is 0 there."""
    return lse.masked_fill(torch.isinf(lse), 0.0)


def _ring_pass(tensors: list[torch.Tensor], group) -> tuple[list[torch.Tensor], int]:
    """Send each tensor to the next rank and receive the previous rank's; the bytes sent."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nxt = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
    prv = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world
    out, reqs, sent = [], [], 0
    for t in tensors:
        t = t.contiguous()
        buf = torch.empty_like(t)
        reqs.append(dist.isend(t, nxt, group=group))
        reqs.append(dist.irecv(buf, prv, group=group))
        out.append(buf)
        sent += t.numel() * t.element_size()
    for r in reqs:
        r.wait()
    return out, sent


def _attend(q, kb, vb, mask, scale, groups, acc):
    """One key/value block's output and log-sum-exp for this rank's queries.

    Its (B, H, Tl, Tl) scores and probabilities are freed when it returns.
    """
    s = _scores(q.to(acc), _expand(kb, groups).to(acc), mask, scale)
    block_lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - _finite(block_lse)[..., None])
    del s
    return p @ _expand(vb, groups).to(acc), block_lse


def _merge(o, lse, block_o, block_lse):
    """The running output and log-sum-exp with one more block's merged in, exactly."""
    new = torch.logaddexp(lse, block_lse)
    return (o * torch.exp(lse - _finite(new))[..., None]
            + block_o * torch.exp(block_lse - _finite(new))[..., None]), new


def _block_grads(qa, dO, delta, lse, kb, vb, mask, scale, groups, dq):
    """One block's key and value gradients (per KV head); its share of dq is added into ``dq``."""
    kb, vb = _expand(kb, groups).to(qa.dtype), _expand(vb, groups).to(qa.dtype)
    p = torch.exp(_scores(qa, kb, mask, scale) - _finite(lse)[..., None])
    dv = _fold(p.transpose(-1, -2) @ dO, groups)
    ds = p * (dO @ vb.transpose(-1, -2) - delta[..., None])
    del p
    dq += (ds @ kb) * scale
    return _fold((ds.transpose(-1, -2) @ qa) * scale, groups), dv


class RingAttention(torch.autograd.Function):
    """Attention of this rank's queries over the whole sequence's keys and values, passed around a ring.

    q (B, H, Tl, D), k and v (B, H_kv, Tl, D): this rank's tokens; ``positions`` (Tl,): their
    global positions, the same layout on every rank (:func:`token_positions`). Returns this
    rank's output (B, H, Tl, D). ``stats`` (a dict, or None) gets the bytes this rank sent.
    """

    @staticmethod
    def forward(ctx, q, k, v, positions, layout, causal, group, stats):
        # The ring picks its own precision (fp32 accumulators at least): autocast stays out.
        with torch.autocast(q.device.type, enabled=False):
            return RingAttention._forward(ctx, q, k, v, positions, layout, causal, group, stats)

    @staticmethod
    def _forward(ctx, q, k, v, positions, layout, causal, group, stats):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        T = positions.numel() * world
        groups = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        acc = torch.promote_types(q.dtype, torch.float32)
        o = torch.zeros(q.shape, dtype=acc, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        kv, sent = [k, v], 0
        for step in range(world):
            owner = (rank - step) % world
            if _any_pair(rank, owner, world, T, layout, causal):
                mask = _mask(positions, token_positions(owner, world, T, layout).to(q.device),
                             causal)
                o, lse = _merge(o, lse, *_attend(q, kv[0], kv[1], mask, scale, groups, acc))
            if step < world - 1:
                kv, n = _ring_pass(kv, group)
                sent += n
        if stats is not None:
            stats["forward_bytes_sent"] = stats.get("forward_bytes_sent", 0) + sent
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, positions, out, lse)
        ctx.layout, ctx.causal, ctx.group, ctx.stats = layout, causal, group, stats
        return out

    @staticmethod
    def backward(ctx, grad_out):
        with torch.autocast(grad_out.device.type, enabled=False):
            return RingAttention._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        q, k, v, positions, out, lse = ctx.saved_tensors
        group = ctx.group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        T = positions.numel() * world
        groups = q.shape[1] // k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1])
        acc = lse.dtype
        dO, qa = grad_out.to(acc), q.to(acc)
        delta = (dO * out.to(acc)).sum(-1)  # (B, H, Tl): rowsum(dO * O)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        block = [k, v, torch.zeros(k.shape, dtype=acc, device=k.device),
                 torch.zeros(v.shape, dtype=acc, device=v.device)]
        sent = 0
        for step in range(world):
            owner = (rank - step) % world
            if _any_pair(rank, owner, world, T, ctx.layout, ctx.causal):
                mask = _mask(positions, token_positions(owner, world, T, ctx.layout).to(q.device),
                             ctx.causal)
                dk, dv = _block_grads(qa, dO, delta, lse, block[0], block[1], mask, scale, groups,
                                      dq)
                block[2] = block[2] + dk
                block[3] = block[3] + dv
                del dk, dv
            # the block moves on with its gradients; after the last step only the gradients travel,
            # and arrive at the block's own rank
            if world == 1:
                break
            moving = block if step < world - 1 else block[2:]
            moved, n = _ring_pass(moving, group)
            del moving  # sent: this rank's copies are freed as the block moves on
            sent += n
            block = moved if step < world - 1 else block[:2] + moved
        if ctx.stats is not None:
            ctx.stats["backward_bytes_sent"] = ctx.stats.get("backward_bytes_sent", 0) + sent
        return (dq.to(q.dtype), block[2].to(k.dtype), block[3].to(v.dtype),
                None, None, None, None, None)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                   layout: str = "zigzag", group=None, stats: dict | None = None) -> torch.Tensor:
    """Ring attention over the ranks of ``group`` (the default group when None) (chapter: 8).

    q (B, H, Tl, D), k and v (B, H_kv, Tl, D): this rank's share of the sequence, laid out as
    :func:`local_tokens` cuts it. Equal to ``F.scaled_dot_product_attention`` on the whole
    sequence (``is_causal=causal``, ``enable_gqa=True``), restricted to this rank's queries.
    """
    check_choice("layout", layout, LAYOUTS)
    if not dist.is_initialized():
        raise MemlabError("ring_attention needs a process group: launch it with torchrun "
                          "(memlab.distributed.launch) or call torch.distributed.init_process_group")
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[1] % k.shape[1] or \
            q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise MemlabError(f"q must be (B, H, Tl, D) and k, v (B, H_kv, Tl, D) with H_kv dividing "
                          f"H, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    positions = token_positions(rank, world, q.shape[2] * world, layout).to(q.device)
    return RingAttention.apply(q, k, v, positions, layout, bool(causal), group, stats)


DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def case_tolerance(seq_len: int, head_dim: int, dtype: str) -> float:
    """The largest error allowed against SDPA, relative to the reference's largest value (chapter: 8).

    Both compute sums of at most T + D terms in another order, so each is within
    gamma_n = n u / (1 - n u) of the exact result, relative to the sum of the terms' magnitudes
    (Higham, Accuracy and Stability, 3.1); the merge's rescaling adds a few roundings per block.
    Twice that, for two computations, times 4 for the softmax's exponentials and the rescaling.
    """
    u = torch.finfo(DTYPES[dtype]).eps / 2
    n = seq_len + head_dim
    return 8 * n * u / (1 - n * u)


def compare_with_sdpa(spec: dict, device: torch.device) -> dict:
    """Each case of ``spec['cases']`` on this rank: ring attention against SDPA on the whole sequence.

    A case: batch, heads, kv_heads, seq_len, head_dim, causal, layout, dtype, seed. Every rank
    draws the same whole-sequence q, k, v and output gradient from the seed, runs SDPA on the
    whole of it, and compares its own rows of the output and of the three gradients with ring
    attention's. The run of torchrun ``launch('memlab.longcontext.ring:compare_with_sdpa', ...)``
    (chapter: 8).
    """
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for case in spec["cases"]:
        dtype = DTYPES[case["dtype"]]
        g = torch.Generator().manual_seed(case["seed"])
        B, H, Hkv = case["batch"], case["heads"], case["kv_heads"]
        T, D, layout = case["seq_len"], case["head_dim"], case["layout"]
        q = torch.randn(B, H, T, D, generator=g, dtype=dtype)
        k = torch.randn(B, Hkv, T, D, generator=g, dtype=dtype)
        v = torch.randn(B, Hkv, T, D, generator=g, dtype=dtype)
        dO = torch.randn(B, H, T, D, generator=g, dtype=dtype)
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*whole, is_causal=case["causal"], enable_gqa=True)
        ref.backward(dO)
        mine = [local_tokens(t, rank, world, layout).clone().to(device).requires_grad_()
                for t in (q, k, v)]
        stats: dict = {}
        out = ring_attention(*mine, causal=case["causal"], layout=layout, stats=stats)
        out.backward(local_tokens(dO, rank, world, layout).to(device))
        pairs = [(out, ref)] + [(m.grad, w.grad) for m, w in zip(mine, whole, strict=True)]
        errors = []
        for got, want in pairs:
            want = local_tokens(want.detach(), rank, world, layout)
            scale = want.abs().max().item() or 1.0
            errors.append((got.detach().cpu() - want).abs().max().item() / scale)
        results.append(dict(case=case, errors=dict(zip(("out", "dq", "dk", "dv"), errors, strict=True)),
                            tolerance=case_tolerance(T, D, case["dtype"]),
                            bytes_sent=stats, formula=kv_bytes_sent_per_step(
                                B, Hkv, T, D, world, torch.finfo(dtype).bits // 8)))
    return dict(results=results)
