"""Attention two ways: naive (the full score matrix) and FlashAttention (tiles, online softmax).

Shapes follow the book's model: queries ``q`` are (B, nh, T, hs); keys and values ``k``, ``v``
are (B, nkv, S, hs), with ``nh`` a multiple of ``nkv`` (grouped-query attention: each key/value
head serves ``nh / nkv`` query heads) and ``S >= T`` (the T queries are the last T of the S
positions, as when decoding with a KV cache). Names in :class:`FlashAttention` are the papers'
(Dao et al. 2022, arXiv:2205.14135; Dao 2023, arXiv:2307.08691): the query block ``Q_i``, the key
and value blocks ``K_j``, ``V_j``, the score tile ``S_ij``, the running row max ``m_i``, the
running normaliser ``l_i`` and the output block ``O_i``.
"""

from __future__ import annotations

import math

import torch
from torch._subclasses.fake_tensor import is_fake

from memlab.errors import MemlabError, check_positive_int
from memlab.model.config import DEFAULT_BLOCK


class TrafficCounter:
    """Elements FlashAttention's forward moves between slow memory and its tiles, as it runs.

    Use as a context manager around :func:`flash_attention`: every Q_i, K_j, V_j loaded and
    every O_i and log-sum-exp row stored is added up, per (batch, head) pair of queries.
    """

    active: TrafficCounter | None = None

    def __init__(self):
        self.loaded = 0  # elements read from slow memory into a tile
        self.stored = 0  # elements written back

    def __enter__(self):
        TrafficCounter.active = self
        return self

    def __exit__(self, *exc):
        TrafficCounter.active = None

    @property
    def total(self) -> int:
        """Elements moved in both directions (chapter: 4)."""
        return self.loaded + self.stored


def _count(loaded: int = 0, stored: int = 0) -> None:
    if TrafficCounter.active is not None:
        TrafficCounter.active.loaded += loaded
        TrafficCounter.active.stored += stored


def _check(q, k, v, causal: bool) -> tuple[int, int]:
    """(group size nh / nkv, S - T), or a one-line error naming what does not fit."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise MemlabError(f"{name} must be a 4-d tensor (B, heads, length, head size), got "
                              f"{getattr(t, 'shape', type(t).__name__)}")
    B, nh, T, hs = q.shape
    if k.shape != v.shape:
        raise MemlabError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                          f"{tuple(v.shape)}")
    Bk, nkv, S, hsk = k.shape
    if hsk != hs:
        raise MemlabError(f"head sizes differ: q has {hs}, k and v have {hsk}")
    if Bk != B:
        raise MemlabError(f"batch sizes differ: q has {B}, k and v have {Bk}")
    if nh % nkv:
        raise MemlabError(f"n_head ({nh}) must be a multiple of n_kv_head ({nkv})")
    if causal and S < T:
        raise MemlabError(f"causal attention needs at least as many keys as queries (the "
                          f"queries are the last T of S positions), got T={T}, S={S}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16,
                                                              torch.float16):
        raise MemlabError(f"q, k, v must share one dtype of float32, bfloat16, float16; got "
                          f"{q.dtype}, {k.dtype}, {v.dtype}")
    return nh // nkv, S - T


def _causal_mask(t0: int, t1: int, s0: int, s1: int, offset: int, device) -> torch.Tensor:
    """True where query t (of t0..t1) may not see key s (of s0..s1): s > offset + t."""
    t = torch.arange(t0, t1, device=device)[:, None]
    s = torch.arange(s0, s1, device=device)[None, :]
    return s > offset + t  # (t1 - t0, s1 - s0)


def _tiles(starts: range, like: torch.Tensor, last: bool = False):
    """The tile starts to visit: all of them, or one when ``like`` holds no data (a trace).

    Under ``FakeTensorMode`` (memlab.measure's traces) or on the meta device the tiles compute
    nothing, and every iteration allocates and frees the same sizes as the one before; one
    tile (the first, or with ``last`` the last, which crosses the causal diagonal) gives the
    same saved bytes and the same peak at a small fraction of the trace's time.
    """
    if like.device.type != "meta" and not is_fake(like):
        return starts
    return starts[-1:] if last else starts[:1]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                    causal: bool = True) -> torch.Tensor:
    """Softmax(q k^T / sqrt(hs)) v with the (B, nh, T, S) scores materialised, in q's dtype (chapter: 4)."""
    g, offset = _check(q, k, v, causal)
    B, nh, T, hs = q.shape
    S = k.size(2)
    if g > 1:  # each key/value head serves g query heads
        k = k.repeat_interleave(g, dim=1)  # (B, nh, S, hs)
        v = v.repeat_interleave(g, dim=1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
    if causal:
        att = att.masked_fill(_causal_mask(0, T, 0, S, offset, q.device), float("-inf"))
    att = att.float().softmax(dim=-1).to(q.dtype)  # the probabilities: kept for backward
    return att @ v  # (B, nh, T, hs)


class FlashAttention(torch.autograd.Function):
    """Tiled exact attention: the forward keeps Q, K, V, O and the log-sum-exp per row only.

    Queries are viewed as (B, nkv, g, T, hs), so a key/value block broadcasts over the g query
    heads that share it instead of being copied. Every tile is computed in fp32.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, block_q: int, block_k: int):
        with torch.autocast(q.device.type, enabled=False):  # tiles in fp32, whatever autocast says
            O, L = FlashAttention._forward(q, k, v, causal, block_q, block_k)  # noqa: E741
        ctx.save_for_backward(q, k, v, O, L)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return O.view(q.shape)

    @staticmethod
    def _forward(q, k, v, causal: bool, block_q: int, block_k: int):
        g, offset = _check(q, k, v, causal)
        B, nh, T, hs = q.shape
        nkv, S = k.size(1), k.size(2)
        scale = 1.0 / math.sqrt(hs)
        Q = q.view(B, nkv, g, T, hs)
        O = torch.empty(B, nkv, g, T, hs, dtype=q.dtype, device=q.device)  # noqa: E741 (the papers' O)
        L = torch.empty(B, nkv, g, T, dtype=torch.float32, device=q.device)  # log-sum-exp
        for r0 in _tiles(range(0, T, block_q), q):
            r1 = min(r0 + block_q, T)
            Q_i = Q[..., r0:r1, :].float()  # (B, nkv, g, bq, hs)
            heads = B * nkv * g
            _count(loaded=heads * (r1 - r0) * hs)
            m_i = torch.full(Q_i.shape[:-1], float("-inf"), device=q.device)  # (B, nkv, g, bq)
            l_i = torch.zeros(Q_i.shape[:-1], device=q.device)
            O_i = torch.zeros(Q_i.shape, device=q.device)
            last_key = S if not causal else min(S, offset + r1)  # keys beyond are masked for all
            for c0 in _tiles(range(0, last_key, block_k), q, last=True):
                c1 = min(c0 + block_k, S)
                K_j = k[:, :, None, c0:c1].float()  # (B, nkv, 1, bk, hs): shared by g heads
                V_j = v[:, :, None, c0:c1].float()
                _count(loaded=heads * 2 * (c1 - c0) * hs)  # each query head reads its K_j, V_j
                S_ij = (Q_i @ K_j.transpose(-2, -1)) * scale  # (B, nkv, g, bq, bk)
                if causal and c1 - 1 > offset + r0:  # the tile crosses the diagonal
                    S_ij = S_ij.masked_fill(_causal_mask(r0, r1, c0, c1, offset, q.device),
                                            float("-inf"))
                m_new = torch.maximum(m_i, S_ij.amax(dim=-1))  # running max
                P_ij = torch.exp(S_ij - m_new[..., None])  # (B, nkv, g, bq, bk)
                alpha = torch.exp(m_i - m_new)  # rescales what was summed so far
                l_i = alpha * l_i + P_ij.sum(dim=-1)
                O_i = alpha[..., None] * O_i + P_ij @ V_j
                m_i = m_new
            O[..., r0:r1, :] = (O_i / l_i[..., None]).to(q.dtype)
            L[..., r0:r1] = m_i + torch.log(l_i)
            _count(stored=heads * (r1 - r0) * (hs + 1))  # O_i and the log-sum-exp rows
        return O, L

    @staticmethod
    def backward(ctx, dout):
        q, k, v, O, L = ctx.saved_tensors  # noqa: E741
        with torch.autocast(q.device.type, enabled=False):
            return FlashAttention._backward(q, k, v, O, L, dout, ctx.causal, ctx.block_q,
                                            ctx.block_k)

    @staticmethod
    def _backward(q, k, v, O, L, dout, causal: bool, block_q: int, block_k: int):  # noqa: E741
        B, nh, T, hs = q.shape
        nkv, S = k.size(1), k.size(2)
        g, offset = nh // nkv, S - T
        scale = 1.0 / math.sqrt(hs)
        Q = q.view(B, nkv, g, T, hs)
        dO = dout.reshape(B, nkv, g, T, hs).float()
        D = (dO * O.float()).sum(dim=-1)  # (B, nkv, g, T): rowsum(dO * O)
        dQ = torch.zeros(Q.shape, device=q.device)
        dK = torch.zeros(k.shape, device=q.device)
        dV = torch.zeros(v.shape, device=q.device)
        for c0 in _tiles(range(0, S, block_k), q):
            c1 = min(c0 + block_k, S)
            K_j = k[:, :, None, c0:c1].float()  # (B, nkv, 1, bk, hs)
            V_j = v[:, :, None, c0:c1].float()
            first_query = 0 if not causal else max(0, c0 - offset)  # earlier rows see none
            for r0 in _tiles(range((first_query // block_q) * block_q, T, block_q), q):
                r1 = min(r0 + block_q, T)
                Q_i = Q[..., r0:r1, :].float()
                S_ij = (Q_i @ K_j.transpose(-2, -1)) * scale  # recomputed, not stored
                if causal and c1 - 1 > offset + r0:
                    S_ij = S_ij.masked_fill(_causal_mask(r0, r1, c0, c1, offset, q.device),
                                            float("-inf"))
                P_ij = torch.exp(S_ij - L[..., r0:r1, None])  # the probabilities, again
                dO_i = dO[..., r0:r1, :]
                dV[:, :, c0:c1] += (P_ij.transpose(-2, -1) @ dO_i).sum(dim=2)  # over g
                dP_ij = dO_i @ V_j.transpose(-2, -1)
                dS_ij = P_ij * (dP_ij - D[..., r0:r1, None])
                dQ[..., r0:r1, :] += (dS_ij @ K_j) * scale
                dK[:, :, c0:c1] += ((dS_ij.transpose(-2, -1) @ Q_i) * scale).sum(dim=2)
        return (dQ.view(B, nh, T, hs).to(q.dtype), dK.to(k.dtype), dV.to(v.dtype),
                None, None, None)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                    block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK) -> torch.Tensor:
    """Exact attention in tiles of ``block_q`` x ``block_k``, in q's dtype (chapter: 4).

    It saves O(T) bytes for backward.
    """
    check_positive_int("block_q", block_q)
    check_positive_int("block_k", block_k)
    _check(q, k, v, causal)
    return FlashAttention.apply(q, k, v, causal, block_q, block_k)


def standard_traffic(T: int, S: int, hs: int) -> int:
    """Elements the standard algorithm moves per head (chapter: 4).

    Q, K in, S out, S in, P out, P and V in, O out.

    The FlashAttention paper's Algorithm 0: Theta(T hs + T S).
    """
    for name, n in (("T", T), ("S", S), ("hs", hs)):
        check_positive_int(name, n)
    return (T * hs + S * hs) + T * S + (T * S + T * S) + (T * S + S * hs) + T * hs


def tiled_traffic(T: int, S: int, hs: int, *, block_q: int, causal: bool = False) -> int:
    """Elements this module's tiled forward moves per head (chapter: 4).

    Without the causal skip unless asked.

    Q and O cross once; K and V cross once per query block: T hs + (T / block_q) 2 S hs + T (hs + 1).
    """
    for name, n in (("T", T), ("S", S), ("hs", hs), ("block_q", block_q)):
        check_positive_int(name, n)
    keys = 0
    for r0 in range(0, T, block_q):
        r1 = min(r0 + block_q, T)
        keys += S if not causal else min(S, S - T + r1)
    # keys read per query block are whole K/V blocks: the count above is exact only for whole
    # blocks, which flash_attention reads (the last block may be partial)
    return T * hs + 2 * keys * hs + T * (hs + 1)


def sram_blocks(sram_elements: int, hs: int) -> tuple[int, int]:
    """FlashAttention's block sizes for a fast memory of ``sram_elements`` (chapter: 4).

    (B_r, B_c) = (min(ceil(M / 4d), d), ceil(M / 4d)).
    """
    check_positive_int("sram_elements", sram_elements)
    check_positive_int("hs", hs)
    b_c = -(-sram_elements // (4 * hs))
    return min(b_c, hs), b_c


def online_softmax_update(m: torch.Tensor, l: torch.Tensor, x_block: torch.Tensor):  # noqa: E741
    """One block of the online softmax (chapter: 4).

    It gives the new running max and normaliser, and the rescale of the old sum.

    ``m`` and ``l`` are the max and the sum of exp(x - m) over the blocks seen so far (``-inf``
    and 0 before the first); returns ``(m_new, l_new, alpha)`` with ``alpha = exp(m - m_new)``,
    the factor that rescales everything accumulated before this block.
    """
    m_new = torch.maximum(m, x_block.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    l_new = alpha * l + torch.exp(x_block - m_new[..., None]).sum(dim=-1)
    return m_new, l_new, alpha


def online_softmax(x: torch.Tensor, block: int):
    """Softmax over the last dimension computed block by block (chapter: 4).

    With the running (max, normaliser) after each block.
    """
    check_positive_int("block", block)
    x = x.float()
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])  # noqa: E741 (the papers' l)
    steps = []
    for c0 in range(0, x.size(-1), block):
        m, l, _ = online_softmax_update(m, l, x[..., c0:c0 + block])  # noqa: E741
        steps.append((m.clone(), l.clone()))
    return torch.exp(x - m[..., None]) / l[..., None], steps
