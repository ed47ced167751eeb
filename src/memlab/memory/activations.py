"""The saved-tensor inventory: every tensor the book's model keeps for the backward pass, and the
activation side of a step's peak (chapters 1, 4, 5, 7).

:func:`saved_tensors` lists each tensor :class:`memlab.model.transformer.Transformer` saves, with
its symbolic shape, dtype and bytes, layer kind by layer kind (Llama-style and GPT-2-style blocks,
the attention cores, the norms, the weight casts of autocast), so every term can be read, checked
and taught. :func:`activation_peaks` walks the forward and the backward pass over them.
Arithmetic on a :class:`memlab.model.config.ModelConfig`: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.model.checkpoint import Checkpointing, parse_checkpointing
from memlab.model.config import DEFAULT_BLOCK, ModelConfig, check_dense, param_groups

PARAM_BYTES = {"fp32": 4, "fp16-mixed": 4, "bf16-mixed": 4, "bf16": 2}  # master weights
COMPUTE_BYTES = {"fp32": 4, "fp16-mixed": 2, "bf16-mixed": 2, "bf16": 2}  # matmul outputs


@dataclass(frozen=True)
class SavedTensor:
    """One tensor kept alive for the backward pass: where it comes from and its bytes."""

    name: str
    # 'layer' (one per block), 'model' (once), 'head', 'lowest' (the lowest block gradients
    # reach, fine-tuning) or 'blocks' (``copies`` of it: a checkpointing plan that treats the
    # blocks differently)
    scope: str
    shape: str  # symbolic shape, e.g. '(B, T, C)'
    dtype: str  # 'fp32', 'bf16', 'fp16', 'bool'
    bytes: int  # for one block when scope == 'layer', for one copy when scope == 'blocks'
    copies: int = 0  # scope 'blocks': how many blocks (or checkpointed units) keep it


def _linear_weight_numel(cfg: ModelConfig) -> int:
    """Elements of one block's Linear weights (what autocast casts to 16 bits)."""
    C, F, kv = cfg.d_model, cfg.ffn_dim, cfg.kv_heads * cfg.head_dim
    n_mlp = 2 if cfg.style == "gpt2" else 3
    return 2 * C * C + 2 * C * kv + n_mlp * C * F


# Activations -------------------------------------------------------------------------------
def _dt(nbytes: int) -> str:
    return {8: "int64", 4: "fp32", 2: "bf16", 1: "bool"}[nbytes]


def saved_tensors(cfg: ModelConfig, *, batch_size: int, seq_len: int, precision: str = "fp32",
                  checkpointing: bool | str | Checkpointing = False,
                  device: str = "cuda", loss_chunks: int = 1) -> list[SavedTensor]:
    """Every tensor the book's model saves for backward, with its bytes (chapters: 1, 7, 8).

    Follows :class:`memlab.model.transformer.Transformer` line by line. ``precision`` decides the
    dtypes: in ``fp32`` everything is 4 bytes; in pure ``bf16`` the RMSNorm upcasts its input
    to fp32; under autocast (``*-mixed``) each Linear saves its own 16-bit copy of its input
    and of its weight. ``checkpointing`` is a plan of :mod:`memlab.model.checkpoint`: a
    checkpointed unit keeps its input only; ``selective`` keeps q, k and v but nothing the
    attention core makes. ``loss_chunks`` > 1: the head and the loss run in chunks
    (:mod:`memlab.model.loss`), which keep the final norm's output and one log-sum-exp per token
    instead of the logits' log-softmax (and, under autocast, of the head's 16-bit copies).
    """
    plan = parse_checkpointing(checkpointing)
    check_dense(cfg, "the estimator")
    B, T, C, V = batch_size, seq_len, cfg.d_model, cfg.vocab_size
    hs = cfg.head_dim
    BT = B * T
    mixed = precision.endswith("-mixed")
    cb = COMPUTE_BYTES[precision]  # bytes of a matmul output
    sb = PARAM_BYTES[precision]  # bytes of the residual stream (the parameters' dtype)
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    sdt = _dt(sb) if sb == 4 else half
    out: list[SavedTensor] = []

    def add(name, scope, shape, dtype, nbytes):
        out.append(SavedTensor(name, scope, shape, dtype, nbytes))

    # Rotary tables: computed once per forward in fp32. fp32 attention uses them directly
    # (saved once); 16-bit attention casts them inside every block (saved per block);
    # checkpointing saves them once as block inputs.
    rope = cfg.style == "llama"
    if rope and (plan.recomputes_blocks or cb == 4):
        add("RoPE cos and sin tables", "model", "2 x (T, hs/2)", "fp32", 2 * T * (hs // 2) * 4)

    if cfg.style == "gpt2":
        add("positions 0..T-1 (int64)", "model", "(T,)", "int64", T * 8)
    units = plan.units(cfg.n_layer)
    kept_units = sum(1 for *_, c in units if c)
    kept_blocks = sum(e - s for s, e, c in units if not c)
    if plan.kind == "full":
        add("block input (kept by checkpointing)", "layer", "(B, T, C)", sdt, BT * C * sb)
    elif plan.kind in ("none", "selective"):
        out += block_tensors(cfg, B, T, precision, device, selective=plan.kind == "selective")
    else:  # some units keep their input only, the other blocks keep everything
        out.append(SavedTensor("unit input (kept by checkpointing)", "blocks", "(B, T, C)", sdt,
                               BT * C * sb, kept_units))
        if kept_blocks:
            out += [replace(t, scope="blocks", copies=kept_blocks)
                    for t in block_tensors(cfg, B, T, precision, device)]

    # The final norm, the head and the loss.
    if cfg.style == "llama":
        norm = _rmsnorm("final norm", "head", BT, C, precision, consumer_linears=1)
    else:
        norm = _layernorm("final norm", "head", BT, C, precision, 1, device)
    if loss_chunks > 1:  # the chunked loss keeps the norm's output as it is (fp32 under autocast)
        if mixed:
            norm[-1] = SavedTensor("final norm: output (kept by the chunked loss)", "head",
                                   "(B, T, C)", "fp32", BT * C * 4)
        out += norm
        add("log-sum-exp of each token's logits (chunked loss)", "head", "(B*T,)", "fp32",
            BT * 4)
        return out
    out += norm
    if mixed:
        add("lm_head weight cast to 16 bits", "head", "(V, C)", half, V * C * 2)
    add("log-softmax of the logits (fp32)", "head", "(B*T, V)", "fp32", BT * V * 4)
    add("loss", "head", "()", "fp32", 4)
    return out


def checkpointed_block_peak(cfg: ModelConfig, B: int, T: int, precision: str) -> int:
    """Bytes a checkpointed block holds at its forward's highest point, besides its input (chapter: 8).

    Traced at its MLP: the residual stream after attention and the MLP norm's output, with the
    SwiGLU's silu(gate), up and their product (Llama), or the fc output and its GELU (GPT-2).
    """
    BT, C, F = B * T, cfg.d_model, cfg.ffn_dim
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    norm_out = 4 if precision.endswith("-mixed") else sb  # autocast's norms run in fp32
    wide = 3 if cfg.style == "llama" else 2
    return wide * BT * F * cb + BT * C * (sb + norm_out)


def chunked_head_peaks(cfg: ModelConfig, B: int, T: int, precision: str,
                       loss_chunks: int, *, weight_grad: bool = True) -> tuple[int, int]:
    """Bytes the chunked head and loss add to the saved ones, at their two peaks (chapter: 8).

    Read against :class:`memlab.model.loss.ChunkedLinearCrossEntropy`, for its largest chunk of
    ``n`` = ceil(B*T / K) tokens. Forward: the chunk's logits (in the compute dtype, and their
    fp32 copy) and the log-sum-exp's two per-row temporaries, beside autocast's 16-bit copy of
    the head's weight. Backward: the gradient of the norm's output (B*T, C) and the fp32
    accumulator of the head's weight gradient (V, C), beside the larger of two moments in a
    chunk: the logits again with their softmax gradient scaled (fp32) and cast, or that
    gradient's product with the chunk's input, a (V, C) matrix (and its fp32 copy), on its way
    into the accumulator. Few tokens per chunk make the second the larger.

    ``weight_grad=False``: the head's weight is frozen (fine-tuning, chapter 5), so the backward
    makes neither the accumulator nor the per-chunk product: only the first moment remains.
    """
    V, C, BT = cfg.vocab_size, cfg.d_model, B * T
    n = -(-BT // loss_chunks)
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    w_cast = V * C * cb if cb != sb else 0  # autocast: the weight in 16 bits, once per pass
    h_cast = n * C * cb if cb != sb else 0
    if cb == 4:
        fwd_rows, bwd_rows = V * 4 + 8, 2 * V * 4 + 8
    else:
        fwd_rows, bwd_rows = V * cb + V * 4 + 4, 2 * V * 4 + V * cb + 8
    fwd = w_cast + n * fwd_rows + 4  # + the running total
    at_softmax = n * bwd_rows
    at_weight_grad = n * 8 + n * V * cb + V * C * cb + (V * C * 4 if cb != 4 else 0)
    if not weight_grad:
        return fwd, BT * C * sb + w_cast + h_cast + at_softmax
    bwd = BT * C * sb + V * C * 4 + w_cast + h_cast + max(at_softmax, at_weight_grad)
    return fwd, bwd


def head_peaks(cfg: ModelConfig, B: int, T: int, precision: str,
               loss_chunks: int = 1, *, weight_grad: bool = True) -> tuple[int, int]:
    """Bytes the LM head and the loss hold at their forward and backward highest points (chapter: 8).

    Whole: the (B, T, V) logits in the compute dtype and their fp32 copy for the loss, then the
    fp32 gradients of log-softmax's output and input. Chunked: :func:`chunked_head_peaks`
    (``weight_grad=False`` for a frozen head).
    """
    if loss_chunks > 1:
        return chunked_head_peaks(cfg, B, T, precision, loss_chunks, weight_grad=weight_grad)
    BTV, cb = B * T * cfg.vocab_size, COMPUTE_BYTES[precision]
    return BTV * cb + (BTV * 4 if cb != 4 else 0), 2 * BTV * 4


def _rmsnorm(label, scope, BT, C, precision, consumer_linears):
    """RMSNorm (x * rsqrt(mean(x^2) + eps)) * w, computed in fp32 as in models.RMSNorm."""
    out = []
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    if precision == "bf16":  # x.float() makes an fp32 copy; the bf16 input itself is not kept
        out.append(SavedTensor(f"{label}: input upcast to fp32", scope, "(B, T, C)", "fp32",
                               BT * C * 4))
    else:
        out.append(SavedTensor(f"{label}: input (residual stream)", scope, "(B, T, C)", "fp32",
                               BT * C * 4))
    out.append(SavedTensor(f"{label}: 1/rms", scope, "(B, T, 1)", "fp32", BT * 4))
    if precision == "bf16":
        out.append(SavedTensor(f"{label}: normalized x, back in bf16", scope, "(B, T, C)",
                               "bf16", BT * C * 2))
        out.append(SavedTensor(f"{label}: output", scope, "(B, T, C)", "bf16", BT * C * 2))
    elif precision == "fp32":
        out.append(SavedTensor(f"{label}: normalized x", scope, "(B, T, C)", "fp32", BT * C * 4))
        out.append(SavedTensor(f"{label}: output", scope, "(B, T, C)", "fp32", BT * C * 4))
    else:  # autocast: the fp32 output is not kept; each Linear keeps its own 16-bit copy
        out.append(SavedTensor(f"{label}: normalized x", scope, "(B, T, C)", "fp32", BT * C * 4))
        out.append(SavedTensor(f"{label}: output cast to 16 bits, once per Linear "
                               f"({consumer_linears})", scope, f"{consumer_linears} x (B, T, C)",
                               half, consumer_linears * BT * C * 2))
    return out


def _layernorm(label, scope, BT, C, precision, consumer_linears, device):
    """nn.LayerNorm: keeps its input, mean and 1/std; its consumers keep the output."""
    mixed = precision.endswith("-mixed")
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    sb = PARAM_BYTES[precision]
    sdt = "fp32" if sb == 4 else "bf16"
    stat = 4 if (sb == 4 or device == "cuda") else 2  # CPU keeps bf16 statistics for bf16 input
    out = [
        SavedTensor(f"{label}: input (residual stream)", scope, "(B, T, C)", sdt, BT * C * sb),
        SavedTensor(f"{label}: mean and 1/std", scope, "2 x (B, T, 1)", _dt(stat) if stat == 4
                    else "bf16", 2 * BT * stat),
    ]
    if mixed:  # the fp32 output is not kept; each Linear keeps its own 16-bit copy
        out.append(SavedTensor(f"{label}: output cast to 16 bits, once per Linear "
                               f"({consumer_linears})", scope, f"{consumer_linears} x (B, T, C)",
                               half, consumer_linears * BT * C * 2))
    else:
        out.append(SavedTensor(f"{label}: output", scope, "(B, T, C)", sdt, BT * C * sb))
    return out


P_COPY = "softmax probabilities cast to 16 bits for P @ V (CUDA autocast)"


def _attention_core(cfg, B, T, precision, device, scope="layer", selective=False):
    """q, k, v after RoPE and GQA repetition, and what the attention kernel keeps.

    ``selective``: the core is recomputed in the backward pass, so only its inputs stay (k and
    v before the GQA repetition, which happens inside the core).
    """
    nh, hs, C = cfg.n_head, cfg.head_dim, cfg.d_model
    BT = B * T
    cb = COMPUTE_BYTES[precision]
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    cdt = "fp32" if cb == 4 else half
    out = []
    if cfg.style == "llama" and cb != 4:
        out.append(SavedTensor("RoPE cos and sin cast to 16 bits (for q and for k)", scope,
                               "4 x (T, hs/2)", half, 4 * T * (hs // 2) * 2))
    nkv = cfg.kv_heads
    if cfg.attention == "flash" or selective:  # k and v as they are, per KV head
        out.append(SavedTensor("q", scope, "(B, nh, T, hs)", cdt, BT * C * cb))
        for name in ("k", "v"):
            out.append(SavedTensor(name, scope, "(B, nkv, T, hs)", cdt, B * nkv * T * hs * cb))
    if selective:  # the core's own tensors are made again in the backward pass
        # o_proj keeps its input: the merged copy of the core's output, or the output itself
        # where merging the heads is a view.
        out.append(SavedTensor(O_PROJ_INPUT, scope, "(B, T, C)", cdt, BT * C * cb))
        return out
    if cfg.attention == "flash":  # the book's FlashAttention: k and v as they are, per KV head
        out.append(SavedTensor("attention output", scope, "(B, nh, T, hs)", cdt, BT * C * cb))
        out.append(SavedTensor("attention logsumexp", scope, "(B, nh, T)", "fp32", B * nh * T * 4))
        out.append(SavedTensor("attention output, heads merged (a copy)", scope, "(B, T, C)",
                               cdt, BT * C * cb))
        return out
    kv_note = " (repeated to all heads)" if cfg.kv_heads != nh else ""
    for name in ("q", f"k{kv_note}", f"v{kv_note}"):
        out.append(SavedTensor(name, scope, "(B, nh, T, hs)", cdt, BT * C * cb))
    if cfg.attention == "sdpa":
        out.append(SavedTensor("attention output", scope, "(B, nh, T, hs)", cdt, BT * C * cb))
        out.append(SavedTensor("attention logsumexp", scope, "(B, nh, T)", "fp32", B * nh * T * 4))
    else:
        # CUDA autocast runs softmax in fp32 (its documented fp32 list), and P @ V, a matmul,
        # in 16 bits: the matmul casts P down and keeps that copy for its backward, beside the
        # fp32 P the softmax keeps. CPU autocast keeps the softmax in 16 bits: one P.
        pb = 4 if (precision.endswith("-mixed") and device == "cuda") else cb
        out.append(SavedTensor("softmax probabilities", scope, "(B, nh, T, T)", _dt(pb) if pb == 4
                               else half, B * nh * T * T * pb))
        if pb != cb:
            out.append(SavedTensor(P_COPY, scope, "(B, nh, T, T)", half, B * nh * T * T * cb))
        out.append(SavedTensor("causal mask", scope, "(T, T)", "bool", T * T))
    # Merging the heads, y.transpose(1, 2).reshape(B, T, C), copies unless the kernel already
    # wrote y as (B, T, nh, hs): CUDA's flash and memory-efficient kernels and the CPU kernel
    # with GPT-2's strided q do; eager attention and the CPU kernel with RoPE's q do not.
    if cfg.attention == "eager" or (device == "cpu" and cfg.style == "llama"):
        out.append(SavedTensor("attention output, heads merged (a copy)", scope, "(B, T, C)",
                               cdt, BT * C * cb))
    return out


def _weight_casts(cfg, precision, scope="layer"):
    if not precision.endswith("-mixed"):
        return []
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    return [SavedTensor("Linear weights cast to 16 bits (autocast cache)", scope,
                        "all of the block's weights", half, 2 * _linear_weight_numel(cfg))]


def _llama_block(cfg, B, T, precision, device, selective=False):
    C, F = cfg.d_model, cfg.ffn_dim
    BT = B * T
    cb = COMPUTE_BYTES[precision]
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    cdt = "fp32" if cb == 4 else half
    # Weight casts first: in the backward walk they stay alive for the whole block.
    out = _weight_casts(cfg, precision)
    out += _rmsnorm("attention norm", "layer", BT, C, precision, consumer_linears=3)
    out += _attention_core(cfg, B, T, precision, device, selective=selective)
    out += _rmsnorm("MLP norm", "layer", BT, C, precision, consumer_linears=2)
    out += [
        SavedTensor("gate projection", "layer", "(B, T, F)", cdt, BT * F * cb),
        SavedTensor("silu(gate)", "layer", "(B, T, F)", cdt, BT * F * cb),
        SavedTensor("up projection", "layer", "(B, T, F)", cdt, BT * F * cb),
        SavedTensor("silu(gate) * up", "layer", "(B, T, F)", cdt, BT * F * cb),
    ]
    return out


def _gpt2_block(cfg, B, T, precision, device, selective=False):
    C, F = cfg.d_model, cfg.ffn_dim
    BT = B * T
    cb = COMPUTE_BYTES[precision]
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    cdt = "fp32" if cb == 4 else half
    out = _weight_casts(cfg, precision)
    out += _layernorm("attention norm", "layer", BT, C, precision, 3, device)
    out += _attention_core(cfg, B, T, precision, device, selective=selective)
    out += _layernorm("MLP norm", "layer", BT, C, precision, 1, device)
    out += [
        SavedTensor("MLP up projection (GELU input)", "layer", "(B, T, F)", cdt, BT * F * cb),
        SavedTensor("GELU output", "layer", "(B, T, F)", cdt, BT * F * cb),
    ]
    return out


def block_tensors(cfg, B, T, precision, device, selective=False) -> list[SavedTensor]:
    """What one block of the model's style saves, in forward order (chapters: 1, 7)."""
    make_block = _llama_block if cfg.style == "llama" else _gpt2_block
    return make_block(cfg, B, T, precision, device, selective=selective)


def activation_bytes(saved: list[SavedTensor], n_layer: int) -> int:
    """Total bytes of a :func:`saved_tensors` list for a model of ``n_layer`` blocks (chapters: 1, 7)."""
    return sum(t.bytes * _copies(t, n_layer) for t in saved)


def _copies(t: SavedTensor, n_layer: int) -> int:
    return n_layer if t.scope == "layer" else t.copies if t.scope == "blocks" else 1


def _block_param_grad_bytes(cfg: ModelConfig, precision: str) -> tuple[int, int]:
    """Gradient bytes of one block, and of the head (final norm + untied lm_head)."""
    _, block, head = param_groups(cfg)
    return PARAM_BYTES[precision] * sum(block), PARAM_BYTES[precision] * sum(head)


# Saved tensors whose consumer is a Linear back to width C (o_proj, down_proj).
O_PROJ_INPUT = "attention output, heads merged (o_proj's input)"
_LINEAR_INPUTS = {"silu(gate) * up", "GELU output", "attention output, heads merged (a copy)",
                  O_PROJ_INPUT}
_MLP_NAMES = {"gate projection", "silu(gate)", "up projection", "silu(gate) * up",
              "MLP up projection (GELU input)", "GELU output"}


def stage_of(t: SavedTensor) -> str:
    """Which part of a block made a saved tensor, in forward order (chapters: 1, 7)."""
    if t.name.startswith("Linear weights cast"):
        return "casts"
    if t.name.startswith("attention norm"):
        return "attention norm"
    if t.name.startswith("MLP norm"):
        return "MLP norm"
    return "MLP" if t.name in _MLP_NAMES or t.name.startswith("MLP") else "attention"



def backward_role(t: SavedTensor) -> str | None:
    """What a saved tensor's backward holds beside it, if not a gradient of its size (chapters: 1, 7).

    'linear input': the gradient of an output Linear's (B, T, C) output; 'softmax': eager
    attention's probabilities, whose scores are alive beside them in the forward pass;
    'logsumexp': FlashAttention's, whose backward allocates its workspace
    (:func:`flash_backward_workspace`); 'product factor': one factor of silu(gate) * up, whose
    backward returns both factors' gradients at once. None otherwise.
    """
    if t.name in _LINEAR_INPUTS:
        return "linear input"
    return {"softmax probabilities": "softmax", "attention logsumexp": "logsumexp",
            "up projection": "product factor"}.get(t.name)


def grads_done_in_block(cfg: ModelConfig, precision: str) -> dict[str, tuple[int, int]]:
    """Bytes at each stage of a block's backward: gradients done, weight casts alive (chapters: 1, 5).

    Each stage maps to (gradient bytes already computed, bytes of the 16-bit weight casts still
    alive under autocast).
    """
    C, F, kv = cfg.d_model, cfg.ffn_dim, cfg.kv_heads * cfg.head_dim
    _, block, _ = param_groups(cfg)
    pb = PARAM_BYTES[precision]
    if cfg.style == "gpt2":  # ln1 (2), q k v (6), o (2), ln2 (2), up (2), down (2)
        norm1, o, norm2, down = sum(block[0:2]), sum(block[8:10]), sum(block[10:12]), sum(block[14:16])
        mlp, mlp_w = sum(block[12:]), [C * F, F * C]
    else:  # norm1, q, k, v, o, norm2, gate, up, down
        norm1, o, norm2, down = block[0], block[4], block[5], block[8]
        mlp, mlp_w = sum(block[6:]), [C * F, C * F, F * C]
    total = sum(block)
    cast = 2 if precision.endswith("-mixed") else 0
    qkv_w = C * C + 2 * C * kv
    return {
        "attention norm": (pb * (total - norm1), cast * qkv_w),
        "attention": (pb * (o + norm2 + mlp), cast * qkv_w),
        "MLP norm": (pb * mlp, cast * (qkv_w + C * C)),
        "MLP": (pb * down, cast * (qkv_w + C * C + sum(mlp_w[:-1]))),
    }


@dataclass(frozen=True)
class BackwardGrads:
    """What a backward walk needs to know of the gradients: bytes per block and for the head,
    the largest single gradient, and by stage inside a block (gradients done, casts alive)."""

    block: int
    head: int
    largest: int
    in_block: dict[str, tuple[int, int]]


def activation_peaks(cfg, saved, B, T, precision, checkpointing, device, accumulating=False, *,
                     block: list[SavedTensor] | None = None, layers: int | None = None,
                     grads: BackwardGrads | None = None,
                     checkpoint_casts: int | None = None, loss_chunks: int = 1,
                     offload: bool = False, frozen_head: bool = False) -> tuple[int, int]:
    """Activation-side bytes at the forward and the backward pass's highest points (chapters: 1, 7).

    Forward: everything saved, plus the logits (and their fp32 copy) while the loss is
    computed; under autocast, the weight-cast cache of every checkpointed block also lives
    until autocast exits; eager attention adds the masked scores beside the softmax.

    Backward: walking the saved tensors in reverse, each one's backward holds about twice its
    size in gradients (the gradient of its output and of its input) while the tensors saved
    before it, the gradients finished so far and the gradient of the block's output are
    alive. A checkpointed unit is recomputed whole when its backward starts: its blocks below
    the one walked are alive in full. ``checkpointing`` is a plan of
    :mod:`memlab.model.checkpoint` (False and True for none and full).

    ``offload``: every tensor the blocks save is on the host between the passes
    (:mod:`memlab.model.offload`): a checkpointed unit's input is on the device only while the
    unit runs, in the forward pass and again when its backward recomputes it; a block that is
    not recomputed has on the device only the saved tensor its backward is using.
    ``frozen_head``: the LM head's weight takes no gradient (fine-tuning, chapter 5).
    """
    plan = parse_checkpointing(checkpointing)
    C = cfg.d_model
    BT = B * T
    L = cfg.n_layer if layers is None else layers  # the blocks that save tensors
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    model_level = sum(t.bytes for t in saved if t.scope == "model")
    lowest = [t for t in saved if t.scope == "lowest"]
    A = activation_bytes(saved, L - 1 if lowest else L)
    # The full (recomputed) block: what a non-checkpointed block saves.
    if block is None:
        block = block_tensors(cfg, B, T, precision, device)
    x_in = BT * C * sb  # a checkpointed unit's input: the residual stream
    units = plan.units(L)
    below, fwd_below, recomputed, offloaded = _saved_below(plan, saved, block, L, x_in, offload)
    A -= offloaded  # on the host once the forward pass ends (memlab.model.offload)

    # Forward.
    head_fwd, head_bwd = head_peaks(cfg, B, T, precision, loss_chunks,
                                    weight_grad=not frozen_head)
    fwd = A + head_fwd  # the logits (whole, or a chunk's) while the loss is computed
    if offload and precision.endswith("-mixed"):
        # autocast's cache keeps the offloaded weight casts on the device until it exits
        fwd += (L - plan.checkpointed_blocks(L)) * 2 * _linear_weight_numel(cfg)
    casts = 0
    if plan.recomputes_blocks and precision.endswith("-mixed"):
        casts = (plan.checkpointed_blocks(L) * 2 * _linear_weight_numel(cfg)
                 if checkpoint_casts is None else checkpoint_casts)
        fwd += casts
    if plan.recomputes_blocks:
        # A checkpointed block's forward keeps nothing for the backward, but its tensors live
        # while it runs: with a chunked loss (or a small vocabulary) its MLP can be the forward's
        # highest point. That moment is the last checkpointed block's MLP product (before its
        # down projection, whose 16-bit weight copy autocast has not made yet).
        last = max(layer for layer in range(L) if recomputed[layer])
        down = cfg.ffn_dim * C * 2 if (casts and checkpoint_casts is None) else 0
        fwd = max(fwd, model_level + fwd_below[last] + casts - down
                  + checkpointed_block_peak(cfg, B, T, precision))
    softmax_at = None  # (bytes of the block saved up to its softmax, bytes of the scores)
    if cfg.attention == "eager":
        before = 0
        for t in block:
            before += t.bytes
            if backward_role(t) == "softmax":
                scores = B * cfg.n_head * T * T * cb
                if t.bytes != scores:  # CUDA autocast: the softmax reads an fp32 copy of them
                    scores += B * cfg.n_head * T * T * 4
                softmax_at = (before, scores)
                break
    if softmax_at is not None:
        # The last block's softmax, with its masked-scores input alive beside it.
        fwd = max(fwd, model_level + fwd_below[L - 1] + softmax_at[0] + softmax_at[1])

    # Backward.
    # start: the fp32 gradients of log-softmax's output and input (or the chunked head's)
    bwd = A + head_bwd
    if grads is None:
        G_block, G_head = _block_param_grad_bytes(cfg, precision)
        grads = BackwardGrads(G_block, G_head, PARAM_BYTES[precision] * max(param_groups(cfg)[1]),
                              grads_done_in_block(cfg, precision))
    G_block, G_head, in_block, fresh_grad = grads.block, grads.head, grads.in_block, grads.largest
    dx = BT * C * sb  # gradient of the residual stream
    # The walk is linear in the layer index inside a run of like blocks: its ends bound it.
    walked = sorted({layer for s, e, _ in units for layer in (s, e - 1)} | {0, L - 1})
    for layer in walked:
        # Accumulated gradients are added into .grad in place (counted in the base): only the
        # largest new weight gradient is alive at a time.
        done = fresh_grad if accumulating else G_head + (L - 1 - layer) * G_block
        if softmax_at is not None and (recomputed[layer] or plan.kind == "selective"):
            # the recomputed forward's softmax
            bwd = max(bwd, model_level + below[layer] + softmax_at[0] + softmax_at[1] + done + dx)
        prefix = 0
        for t in (lowest if lowest and layer == 0 and not recomputed[layer] else block):
            stage = stage_of(t)
            if stage == "casts":  # freed one Linear at a time: counted per stage below
                continue
            prefix += t.bytes
            grads_done, casts_alive = in_block[stage]
            if accumulating:
                grads_done = 0
            # Inside attention, the gradient of its output is alive beside the residual's.
            d_out = BT * C * cb if stage == "attention" else 0
            # Its backward holds the tensor, the gradient w.r.t. it, and the gradient of what
            # consumed it: the same size for elementwise ops, (B, T, C) for the output Linears.
            role = backward_role(t)
            consumer_grad = BT * C * cb if role == "linear input" else t.bytes
            if cfg.attention == "flash" and role == "logsumexp":
                consumer_grad = flash_backward_workspace(cfg, B, T, precision) - t.bytes
            elif role == "product factor":
                # The product's backward returns the gradients of both factors at once.
                consumer_grad = 2 * t.bytes
            if offload and not recomputed[layer]:  # on the host, but for the one in use
                prefix, casts_alive = t.bytes, 0
            alive = (model_level + below[layer] + prefix + casts_alive + done + grads_done + dx
                     + d_out + t.bytes + consumer_grad)
            bwd = max(bwd, alive)
    return fwd, bwd


def _saved_below(plan, saved, block, L: int, x_in: int, offload: bool):
    """Per block, the bytes saved below it on the device in the backward and the forward pass.

    Also whether each block is recomputed, and the bytes the blocks save in all (what
    offloading moves to the host; 0 without ``offload``). A checkpointed unit saves its input
    ``x_in``; another block what it saves whole, or selective checkpointing's list.
    """
    block_bytes = sum(t.bytes for t in block)
    lowest = [t for t in saved if t.scope == "lowest"]
    kept = block_bytes if plan.kind != "selective" else sum(
        t.bytes for t in saved if t.scope == "layer")
    kept_first = sum(t.bytes for t in lowest) if lowest else kept
    below, fwd_below, recomputed = [0] * L, [0] * L, [False] * L
    acc = total = 0
    for s, e, ckpt in plan.units(L):
        for layer in range(s, e):
            recomputed[layer] = ckpt
            below[layer] = acc + (x_in + (layer - s) * block_bytes if ckpt else 0)
            fwd_below[layer] = acc + (x_in if ckpt else 0)
        unit = x_in if ckpt else (kept_first + (e - s - 1) * kept if s == 0 else (e - s) * kept)
        total += unit
        acc += 0 if offload else unit
    return below, fwd_below, recomputed, total if offload else 0


def offloaded_activation_bytes(cfg: ModelConfig, *, batch_size: int, seq_len: int,
                               precision: str = "fp32", checkpointing: bool | str = False,
                               device: str = "cuda", layers: int | None = None) -> int:
    """Bytes activation offloading keeps on the host after the forward pass (chapters: 5, 8).

    Everything the blocks save: with full checkpointing, exactly L x B x T x C elements of the
    residual stream's dtype (the units' inputs); without it, every block's saved tensors.
    ``layers``: the blocks that save anything, when fewer than the model's (the trained blocks
    of a fine-tuning step, chapter 5, below which nothing needs a gradient).
    """
    plan = parse_checkpointing(checkpointing)
    saved = saved_tensors(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                          checkpointing=checkpointing, device=device)
    block = block_tensors(cfg, batch_size, seq_len, precision, device)
    x_in = batch_size * seq_len * cfg.d_model * PARAM_BYTES[precision]
    L = cfg.n_layer if layers is None else layers
    return _saved_below(plan, saved, block, L, x_in, True)[3]


# Tiles alive in the book's FlashAttention backward: at the loop's highest point (S_ij, P_ij,
# dP_ij, dS_ij and two temporaries) and at the end (the last iteration's four, named ones).
FLASH_TILES = {"loop": 6, "end": 4}


def flash_backward_workspace(cfg: ModelConfig, B: int, T: int, precision: str,
                             block: int = DEFAULT_BLOCK) -> int:
    """Bytes the book's FlashAttention backward allocates beyond what it saved, for one layer (chapter: 4).

    dQ, dK and dV accumulate in fp32 beside the fp32 row sums D, and each iteration holds a few
    (block x block) tiles per query head; 16-bit inputs add dO and the blocks in fp32, and the
    three gradients cast back at the end, beside the last iteration's tiles.
    """
    nh, nkv, hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
    q_el, kv_el = B * nh * T * hs, B * nkv * T * hs
    cb = COMPUTE_BYTES[precision]
    tile = 4 * B * nh * min(block, T) ** 2  # one (block, block) tile per query head, fp32
    base = 4 * (q_el + 2 * kv_el) + 4 * B * nh * T  # dQ, dK, dV and the row sums D
    if cb == 4:  # the loop's highest point
        return base + FLASH_TILES["loop"] * tile
    blocks = 4 * (B * nh * min(block, T) * hs + 2 * B * nkv * min(block, T) * hs)  # Q_i, K_j, V_j
    dO = 4 * q_el  # dO in fp32
    loop = base + dO + blocks + FLASH_TILES["loop"] * tile
    end = base + dO + blocks + FLASH_TILES["end"] * tile + cb * (q_el + 2 * kv_el)  # dQ, dK, dV cast back
    return max(loop, end)


def saved_by_stage(saved: list[SavedTensor]) -> dict[str, int]:
    """Bytes of one block's saved tensors by stage, plus the tensors kept once (chapter: 1)."""
    out = {"autocast weight copies": 0, "attention norm": 0, "attention": 0, "MLP norm": 0,
           "MLP": 0}
    for t in saved:
        if t.scope == "layer":
            stage = stage_of(t)
            out["autocast weight copies" if stage == "casts" else stage] += t.bytes
    out["kept once, outside the blocks"] = sum(t.bytes for t in saved if t.scope != "layer")
    return out
