"""One rank's bytes under context parallelism: ring attention's saved tensors and buffers (chapter: 8).

With context parallelism over N ranks every rank holds T/N tokens of every sequence and the whole
model: parameters, gradients and optimizer states are replicated, not sharded. Every layer but
attention works token by token, so a rank saves what a step at T/N tokens saves. Attention runs as
the book's ring (:class:`memlab.longcontext.ring.RingAttention`, Liu, Zaharia and Abbeel 2023,
"Ring Attention with Blockwise Transformers"): it saves q, k, v, the rank's token positions, its
output and one log-sum-exp per query row, and while it runs it holds a key/value block received
from a neighbour beside the scores of its queries against that block. The arithmetic here is read
line by line off that class and held to its trace by tests. No torch.
"""

from __future__ import annotations

from memlab.errors import MemlabError
from memlab.memory.activations import (
    COMPUTE_BYTES,
    PARAM_BYTES,
    SavedTensor,
    block_tensors,
    grads_done_in_block,
    stage_of,
)
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import ModelConfig, param_groups

RING_CORE = "ring attention"  # the names of the ring's saved tensors start with this


def check_context_parallel(ranks, seq_len: int) -> int:
    """``ranks`` if context parallelism over it can split ``seq_len`` tokens (chapter: 8).

    The zig-zag layout cuts the sequence into 2N equal chunks (two per rank), so 2N must divide
    T; else a one-line error naming both values.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise MemlabError(f"context_parallel must be a positive whole number of ranks, got {ranks!r}")
    if ranks > 1 and seq_len % (2 * ranks):
        raise MemlabError(f"context parallelism over {ranks} ranks (zig-zag) cuts the sequence "
                          f"into {2 * ranks} equal chunks: seq_len must be a multiple of "
                          f"{2 * ranks}, got {seq_len!r}")
    return ranks


def ring_core_tensors(cfg: ModelConfig, B: int, n: int, precision: str) -> list[SavedTensor]:
    """What ring attention saves for one layer of a rank holding ``n`` tokens (chapter: 8).

    ``ctx.save_for_backward(q, k, v, positions, out, lse)``: k and v per KV head (the ring
    repeats them for GQA only inside a block), the rank's global positions (int64), the output
    and the fp32 log-sum-exp; then o_proj keeps its input, the heads merged (a copy).
    """
    nh, nkv, hs, C = cfg.n_head, cfg.kv_heads, cfg.head_dim, cfg.d_model
    cb = COMPUTE_BYTES[precision]
    cdt = "fp32" if cb == 4 else ("fp16" if precision == "fp16-mixed" else "bf16")
    q = B * nh * n * hs * cb
    kv = B * nkv * n * hs * cb
    return [
        SavedTensor(f"{RING_CORE}: q", "layer", "(B, nh, T/N, hs)", cdt, q),
        SavedTensor(f"{RING_CORE}: k", "layer", "(B, nkv, T/N, hs)", cdt, kv),
        SavedTensor(f"{RING_CORE}: v", "layer", "(B, nkv, T/N, hs)", cdt, kv),
        SavedTensor(f"{RING_CORE}: the rank's token positions", "layer", "(T/N,)", "int64", n * 8),
        SavedTensor(f"{RING_CORE}: output", "layer", "(B, nh, T/N, hs)", cdt, q),
        SavedTensor(f"{RING_CORE}: log-sum-exp", "layer", "(B, nh, T/N)", "fp32", B * nh * n * 4),
        SavedTensor(f"{RING_CORE}: output, heads merged (o_proj's input, a copy)", "layer",
                    "(B, T/N, C)", cdt, B * n * C * cb),
    ]


def ring_block(cfg: ModelConfig, B: int, n: int, precision: str, device: str = "cuda"
               ) -> list[SavedTensor]:
    """One block's saved tensors at ``n`` tokens with its attention core run as the ring (chapter: 8).

    The block's own list (:func:`memlab.memory.activations.block_tensors`) with the core's
    tensors (q, k, v, the kernel's output and statistics, the merged heads) replaced by
    :func:`ring_core_tensors`; the RoPE tables' 16-bit casts stay.
    """
    out, core = [], ring_core_tensors(cfg, B, n, precision)
    for t in block_tensors(cfg, B, n, precision, device):
        if stage_of(t) == "attention" and not t.name.startswith("RoPE"):
            out += core
            core = []
        else:
            out.append(t)
    return out


def ring_saved_tensors(saved: list[SavedTensor], block: list[SavedTensor]) -> list[SavedTensor]:
    """A step's saved-tensor list with every block's tensors replaced by ``block`` (chapter: 8).

    Lists whose blocks keep only their input (full checkpointing) come back as they are.
    """
    names = {t.name for t in block}
    if not any(t.scope == "layer" and t.name in names for t in saved):
        return list(saved)
    out = [t for t in saved if t.scope != "layer"]
    return out[:_first_layer(saved)] + block + out[_first_layer(saved):]


def _first_layer(saved: list[SavedTensor]) -> int:
    return next(i for i, t in enumerate(saved) if t.scope == "layer")


def ring_buffer_bytes(cfg: ModelConfig, B: int, n: int, ranks: int, precision: str
                      ) -> dict[str, int]:
    """Bytes of the ring's travelling blocks on one rank, beside its own k and v (chapter: 8).

    Forward: the key/value block received from the previous rank while the scores against it
    are computed (and, while it is passed on, the next one arriving: the same bytes again, when
    the scores are gone). Backward: the received k and v, and the fp32 accumulators of their
    gradients that travel with them. None with one rank.
    """
    if ranks == 1:
        return {"forward": 0, "backward": 0}
    kv = B * cfg.kv_heads * n * cfg.head_dim
    cb = COMPUTE_BYTES[precision]
    return {"forward": 2 * kv * cb, "backward": 2 * kv * cb + 2 * kv * 4}


def ring_transient_bytes(cfg: ModelConfig, B: int, n: int, ranks: int, precision: str
                         ) -> dict[str, int]:
    """Bytes a ring-attention call holds above its inputs, forward and backward, at peak (chapter: 8).

    Read off :class:`memlab.longcontext.ring.RingAttention`, which computes each block's scores
    whole (no tiling inside a block), in fp32: at the forward's highest point, the scores, their
    difference from the block's log-sum-exp and its exponential (three (B, H, n, n) fp32
    tensors), the (n, n) causal mask, the running fp32 output, the running and the block's
    log-sum-exp, the received key/value block and the rank's positions. At the backward's:
    the probabilities, dP = dO V^T and dP minus the row sums (three again), the mask, k and v
    repeated to every head in fp32 (unless they already are), the block's dV, the fp32 dq and
    row sums, dO and q in fp32 (16-bit inputs), and the travelling block with its gradients.
    """
    nh, nkv, hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
    cb = COMPUTE_BYTES[precision]
    S = B * nh * n * n * 4  # one block's scores, fp32
    Q = B * nh * n * hs  # elements of q (or of k, v repeated to every head)
    KV = B * nkv * n * hs
    R = B * nh * n * 4  # one fp32 value per query row
    buffers = ring_buffer_bytes(cfg, B, n, ranks, precision)
    fwd = 3 * S + n * n + Q * 4 + 2 * R + buffers["forward"] + n * 8
    upcast = cb != 4
    repeated = 2 * Q * 4 if (nkv != nh or upcast) else 0
    bwd = (3 * S + n * n + repeated + KV * 4 + Q * 4 + R + (2 * Q * 4 if upcast else 0)
           + (buffers["backward"] if ranks > 1 else 2 * KV * 4))
    return {"forward": fwd, "backward": bwd}


def ring_peaks(cfg: ModelConfig, block: list[SavedTensor], *, B: int, n: int, ranks: int,
               precision: str, checkpointing, model_level: int, accumulating: bool = False
               ) -> tuple[int, int]:
    """Activation-side bytes while a block's ring attention runs, forward and backward (chapter: 8).

    Forward: the blocks below (their saved tensors, or their inputs when checkpointed), the
    last block's tensors up to the core's inputs and the ring's forward transients. Backward, at
    the first and the last block walked: the same below it, the block's tensors through the
    core, the gradients finished so far, the residual's gradient and the attention output's,
    and the ring's backward transients. ``checkpointing``: none or full.
    """
    plan = parse_checkpointing(checkpointing)
    if plan.kind not in ("none", "full"):
        raise MemlabError(f"context parallelism is estimated with checkpointing False or True, "
                          f"got {checkpointing!r}")
    L, C, F, hs = cfg.n_layer, cfg.d_model, cfg.ffn_dim, cfg.head_dim
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    ring = ring_transient_bytes(cfg, B, n, ranks, precision)
    core = [t for t in block if t.name.startswith(RING_CORE)]
    inputs_end = next(i for i, t in enumerate(block) if t.name.startswith(RING_CORE)) + 3
    body = [t for t in block if stage_of(t) != "casts"]
    to_inputs = sum(t.bytes for t in body[:body.index(block[inputs_end - 1]) + 1])
    through_core = sum(t.bytes for t in body[:body.index(core[-2]) + 1])
    block_bytes = sum(t.bytes for t in block)
    x_in = B * n * C * sb
    full = plan.kind == "full"
    kept = x_in if full else block_bytes
    mixed = precision.endswith("-mixed")
    qkv_w = C * cfg.n_head * hs + 2 * C * cfg.kv_heads * hs
    block_w = qkv_w + cfg.n_head * hs * C + (2 if cfg.style == "gpt2" else 3) * C * F
    # Autocast's 16-bit weight copies: in a checkpointed forward every block's stays until
    # autocast exits; the last block has made q, k and v's when its ring runs.
    casts = (2 * ((L - 1) * block_w + qkv_w) if full else 2 * qkv_w) if mixed else 0
    # A checkpointed block's input is its attention norm's saved input: counted once, there.
    fwd = model_level + (L - 1) * kept + casts + to_inputs + ring["forward"]
    _, blk, head = param_groups(cfg)
    G_block, G_head = sb * sum(blk), sb * sum(head)
    grads_done, casts_alive = grads_done_in_block(cfg, precision)["attention"]
    dx, d_out = B * n * C * sb, B * n * C * cb
    bwd = 0
    for layer in {0, L - 1}:
        done = sb * max(blk) if accumulating else G_head + (L - 1 - layer) * G_block
        bwd = max(bwd, model_level + layer * kept + through_core + casts_alive + done
                  + (0 if accumulating else grads_done) + dx + d_out + ring["backward"])
    return fwd, bwd


def kv_bytes_sent_per_step(batch: int, kv_heads: int, seq_len: int, head_dim: int, world: int,
                           bytes_per_value: int) -> dict[str, int]:
    """Bytes one rank sends in a training step of one attention layer, by formula (chapter: 8).

    Forward: its K and V blocks go N-1 hops, each (B, H_kv, T/N, D). Backward: N-1 hops of K, V
    and their gradient accumulators (fp32 at least), and one last hop of the gradients home.
    """
    block = batch * kv_heads * (seq_len // world) * head_dim
    grad_bytes = max(bytes_per_value, 4)
    fwd = (world - 1) * 2 * block * bytes_per_value
    bwd = (world - 1) * 2 * block * (bytes_per_value + grad_bytes) + 2 * block * grad_bytes
    if world == 1:  # one rank: the block never leaves, nothing is sent
        bwd = 0
    return {"forward": fwd, "backward": bwd}
