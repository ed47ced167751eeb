"""The estimator of chapter 1, taught fine-tuning: frozen blocks, LoRA adapters, a quantized base.

What changes when the base is frozen, tensor by tensor:

* **Weights.** Every base weight is still stored (in its stored format: the parameters' dtype,
  or 4-bit codes with their block scales for a quantized base), plus the adapters in fp32, as
  peft keeps them.
* **Gradients and optimizer states** exist only for what trains: the last blocks, or the
  adapters (fp32, so Adam keeps two fp32 moments per adapter weight).
* **Activations.** PyTorch saves a tensor only if a gradient will need it. A frozen linear
  layer keeps no copy of its input (that copy serves only its weight's gradient), and a frozen
  norm keeps no normalized input; but gradients still flow back through every block below the
  first adapter, so everything their input gradients need is saved. An adapted linear keeps its
  input again (for A's gradient), cast to 16 bits under autocast and to fp32 in pure bf16, once
  per adapter, plus the (B, T, r) output of A. Blocks below the last ``k`` trained blocks save
  nothing when only those train.
* **The chunked loss** (:mod:`memlab.model.loss`, chapter 8). The head is frozen, so the
  chunked loss keeps the final norm's output and one log-sum-exp per token, and its backward
  makes no weight gradient: no fp32 (V, C) accumulator, no per-chunk (V, C) product, only a
  chunk's logits and their softmax gradient beside the gradient of the norm's output.
* **The optimizer** sees the trained tensors by shape (LoRA's A (r, in) and B (out, r), a
  block's weights), so Adafactor's factored moments and 8-bit AdamW's small-tensor rule apply.

Held to :func:`memlab.measure.step.trace_step` with the set-up as its ``prepare`` hook (full,
frozen, LoRA) and, for a quantized base, to :func:`memlab.measure.step.measure_step` on the book's
model (chapter 5).
"""

from __future__ import annotations

import math
from dataclasses import replace

from memlab.errors import MemlabError, check_choice
from memlab.finetune.counts import adapted_linears, block_linear_shapes, trainable_parameters
from memlab.finetune.lora import LoraConfig
from memlab.finetune.qlora import BASE_SCHEMES
from memlab.memory.activations import (
    COMPUTE_BYTES,
    PARAM_BYTES,
    BackwardGrads,
    SavedTensor,
    activation_bytes,
    activation_peaks,
    checkpointed_block_peak,
    grads_done_in_block,
    offloaded_activation_bytes,
    saved_tensors,
)
from memlab.memory.estimator import (
    DEVICES,
    MemoryEstimate,
    estimate,
    param_shape_groups,
    state_bytes,
    step_estimate,
    step_scratch_bytes,
)
from memlab.model.checkpoint import check_plan
from memlab.model.config import ModelConfig, get_config, param_groups
from memlab.model.step import StepSpec
from memlab.quant.functional import DQ_BLOCKSIZE

NF4_BLOCK = 64  # bitsandbytes' 4-bit block: one absmax per 64 weights
DQ_BLOCK = DQ_BLOCKSIZE  # double quantization: one fp32 absmax per 256 8-bit absmax values
ADAPTER_BYTES = 4  # peft keeps adapters in fp32 (autocast_adapter_dtype), so does memlab

# Saved tensors that are a linear layer's input, kept only for that layer's weight gradient:
# the block linears that consume them.
_INPUT_OF = {
    "attention norm: output": ("q_proj", "k_proj", "v_proj"),
    "attention output, heads merged (a copy)": ("o_proj",),
    "attention output, heads merged (a view)": ("o_proj",),
    "silu(gate) * up": ("down_proj",),
    "GELU output": ("down_proj",),
}


def quantized_weight_bytes(in_features: int, out_features: int, scheme: str) -> int:
    """Bytes bitsandbytes stores for one (out x in) weight in ``scheme``: codes and scales (chapter: 5).

    NF4 and FP4 pack two codes per byte with one fp32 absmax per 64 weights; ``nf4-dq`` stores
    those absmax values in 8 bits with one fp32 absmax per 256 of them and one fp32 offset;
    int8 keeps one byte per weight and one fp32 scale per output row.
    """
    check_choice("base quantization", scheme, BASE_SCHEMES)
    n = in_features * out_features
    if scheme == "int8":
        return n + 4 * out_features
    blocks = -(-n // NF4_BLOCK)
    if scheme == "nf4-dq":
        return -(-n // 2) + blocks + 4 * -(-blocks // DQ_BLOCK) + 4
    return -(-n // 2) + 4 * blocks


def base_weight_bytes(model: ModelConfig | str, precision: str = "bf16-mixed",
                      quantize_base: str | None = None) -> int:
    """Bytes of the frozen base as stored (chapter: 5).

    In the parameters' dtype, or quantized block linears beside the rest.
    """
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_choice("precision", precision, tuple(PARAM_BYTES))
    pb = PARAM_BYTES[precision]
    n = cfg.num_parameters()
    if quantize_base is None:
        return pb * n
    shapes = block_linear_shapes(cfg).values()
    linear = cfg.n_layer * sum(i * o for i, o, _ in shapes)
    quant = cfg.n_layer * sum(quantized_weight_bytes(i, o, quantize_base) for i, o, _ in shapes)
    return pb * (n - linear) + quant


def _consumers(cfg: ModelConfig, name: str) -> tuple[str, ...]:
    """The block linears whose input a saved tensor is, () if it is no linear's input."""
    if name.startswith("MLP norm: output"):
        return ("gate_proj", "up_proj") if cfg.style == "llama" else ("up_proj",)
    if name.startswith("attention norm: output"):
        return _INPUT_OF["attention norm: output"]
    return _INPUT_OF.get(name, ())


def _frozen_head(head: list[SavedTensor], chunked: bool = False) -> list[SavedTensor]:
    """The final norm and head with a frozen LM head: no copy of its input, no normalized x.

    A ``chunked`` loss (:class:`memlab.model.loss.ChunkedLinearCrossEntropy`) keeps the norm's
    output all the same: its backward makes each chunk's logits again from it, for the
    gradient of the norm's output, whether or not the head's weight trains.
    """
    return [t for t in head if not (t.name.startswith("final norm: normalized x")
                                    or (t.name.startswith("final norm: output")
                                        and not chunked))]


_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


def _group(name: str) -> int:
    """Forward-order index of a block linear's input group: q/k/v 0, o 1, gate/up 2, down 3."""
    return next(g for g, names in enumerate(_GROUPS) if name in names)


def _lora_block(cfg: ModelConfig, block: list[SavedTensor], B: int, T: int, precision: str,
                lora: LoraConfig, quantized: bool, device: str,
                lowest: bool = False) -> list[SavedTensor]:
    """One block with a frozen base and adapters.

    In the ``lowest`` block reached by gradients, nothing before the first adapter needs a
    gradient: those tensors are not saved, nor the weight casts of frozen linears whose input
    needs none, nor the dropout mask of an adapter whose input needs none.
    """
    BT = B * T
    mixed = precision.endswith("-mixed")
    half = "fp16" if precision == "fp16-mixed" else "bf16"
    targets = adapted_linears(cfg, lora)
    shapes = block_linear_shapes(cfg)
    in_bytes = 2 if mixed else 4  # an adapter's saved input: autocast's 16-bit cast, or fp32
    shared = precision == "fp32" and lora.dropout == 0  # fp32: one saved input for all siblings
    mid = 2 if mixed else 4  # A's output (B, T, r)
    # Dropout acts on the fp32 copy of the input: CUDA keeps a bool mask, the CPU kernel an
    # fp32 one (input * noise).
    mask, mask_dt = (1, "bool") if device == "cuda" else (4, "fp32")
    first = min((_group(u) for u in targets), default=len(_GROUPS))

    def flowing(group: int) -> bool:  # does the input of this group's linears need a gradient?
        return not lowest or group > first

    if not any(_consumers(cfg, t.name) == ("o_proj",) for t in block):
        # The kernel wrote its output as (B, T, nh, hs): o_proj's input is a view of it, which
        # an adapter on o_proj keeps (no new bytes in fp32, a cast copy otherwise).
        at = next(i for i, t in enumerate(block) if t.name.startswith("MLP norm"))
        block = [*block[:at], SavedTensor("attention output, heads merged (a view)", "layer",
                                          "(B, T, C)", "-", 0), *block[at:]]
    out: list[SavedTensor] = []
    group = -1  # the last input group passed
    for t in block:
        if "normalized x" in t.name:  # only the frozen norm weight's gradient needed it
            continue
        if t.name.startswith("Linear weights cast"):
            frozen = 0 if quantized else 2 * sum(i * o for n, (i, o, _) in shapes.items()
                                                 if flowing(_group(n)))
            adapters = 2 * sum(lora.r * (i + o) for i, o in targets.values())
            out.append(replace(t, name="Linear weights cast to 16 bits (frozen base and adapters)",
                               bytes=frozen + adapters))
            continue
        users = _consumers(cfg, t.name)
        if not users:
            if flowing(group + 1):  # made after the last input passed: saved once a gradient flows
                out.append(t)
            continue
        group = _group(users[0])
        adapted = [u for u in users if u in targets]
        if shared and adapted and t.bytes:
            out.append(t)  # the same tensor, now kept for A's gradient
        stage = "MLP" if group >= 2 else "attention"
        for u in adapted:
            i, _ = targets[u]
            if not shared:
                dtype = half if mixed else "fp32"
                out.append(SavedTensor(f"{stage} adapter {u}: its input ({dtype} copy)", "layer",
                                       "(B, T, in)", dtype, BT * i * in_bytes))
            if lora.dropout > 0 and flowing(group):
                out.append(SavedTensor(f"{stage} adapter {u}: dropout mask", "layer",
                                       "(B, T, in)", mask_dt, BT * i * mask))
            out.append(SavedTensor(f"{stage} adapter {u}: A's output", "layer", "(B, T, r)",
                                   half if mixed else "fp32", BT * lora.r * mid))
    return out


def _up_adapter_extra(cfg: ModelConfig, B: int, T: int, precision: str, lora: LoraConfig) -> int:
    """Bytes an adapter on up_proj adds to a checkpointed block's forward at its MLP.

    Where the plain block holds up's output and the product (or the GELU's output), the
    adapted one holds the base's output, B's scaled output and their sum, in the adapter's
    dtype (fp32 but under autocast), and A's (B, T, r) output.
    """
    cb = COMPUTE_BYTES[precision]
    ab = cb if precision.endswith("-mixed") else ADAPTER_BYTES
    return B * T * (cfg.ffn_dim * (2 * ab - cb) + lora.r * ab)


def _down_proj_moment(cfg: ModelConfig, B: int, T: int, precision: str, lora: LoraConfig | None,
                      block: list[SavedTensor] | None, device: str) -> int:
    """Bytes alive at the last block's down_proj beyond what the blocks save, in the forward pass.

    A frozen linear keeps no copy of its input, so the MLP norm's output (alive until the MLP
    returns) and the MLP's product (or GELU output), the down projection's input, are on the
    device then without being saved; beside them the projection's output, or with an adapter
    the larger of two moments: A reading its fp32 copy of the input (and, under autocast, the
    16-bit cast it saves), dropout making its mask and output from that copy, or the base's
    output, B's and B's scaled. ``block``: what the block
    saves, or None when it is checkpointed (then it saves nothing, and the residual stream
    after attention is alive too).
    """
    BT, C, F = B * T, cfg.d_model, cfg.ffn_dim
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    mixed = precision.endswith("-mixed")
    names = set() if block is None else {t.name for t in block}
    h2 = 0 if (not mixed and "MLP norm: output" in names) else BT * C * (4 if mixed else sb)
    product = 0 if names & {"silu(gate) * up", "GELU output"} else BT * F * cb
    residual = BT * C * sb if block is None else 0
    if lora is None or not lora.selects("down_proj"):
        return residual + h2 + product + BT * C * cb
    ab = cb if mixed else ADAPTER_BYTES  # the adapter's output
    x32 = BT * F * 4 if cb != 4 else 0  # x.to(fp32): a copy of a 16-bit input
    x16 = BT * F * cb if (mixed and block is None) else 0  # autocast's cast, saved unless checkpointed
    at_a = BT * C * cb + x32 + x16 + BT * lora.r * ab
    at_b = BT * C * (cb + 2 * ab)
    at_dropout = 0
    if lora.dropout > 0:  # the mask and the output are saved unless the block is checkpointed
        kept = 0 if block is not None else BT * F * ((1 if device == "cuda" else 4) + 4)
        at_dropout = BT * C * cb + x32 + kept
    return residual + h2 + product + max(at_a, at_b, at_dropout)


def _down_input_grad(cfg: ModelConfig, B: int, T: int, lora: LoraConfig,
                     block: list[SavedTensor]) -> int:
    """fp32: the down projection's input gradient in two parts and their sum, less what is freed.

    The base's part and the adapter's are added when both have arrived; by then the adapter's
    saved input (and dropout mask) and A's output have been used and freed.
    """
    freed = sum(t.bytes for t in block if t.name.startswith("MLP adapter down_proj")
                or t.name in ("silu(gate) * up", "GELU output"))
    return 3 * B * T * cfg.ffn_dim * 4 - freed


def _first_trained_block(cfg: ModelConfig, block: list[SavedTensor]) -> list[SavedTensor]:
    """The lowest block gradients reach: its input (the frozen embedding's output, or a frozen
    block's) needs no gradient, so an RMSNorm keeps only what its own weight's gradient needs."""
    drop = ("attention norm: input", "attention norm: 1/rms")
    if cfg.style == "gpt2" or not any(t.name.startswith(drop) for t in block):
        return block  # LayerNorm keeps its input and statistics for its own weights
    return [t for t in block if not t.name.startswith(drop)]


def estimate_finetune(model: StepSpec | ModelConfig | str, *, lora: LoraConfig | None = None,
                      train_last: int | None = None, quantize_base: str | None = None,
                      device: str = "cuda", **switches) -> MemoryEstimate:
    """Estimate a fine-tuning step's bytes by category and phase (chapter: 5).

    For full, last blocks, LoRA or QLoRA.

    ``model`` is a preset name or config with the switches of a
    :class:`~memlab.model.step.StepSpec` (``batch_size``, ``seq_len``, ``precision``, ...), or a
    spec whose ``prepare`` is a :class:`memlab.finetune.Setup`, whose set-up is then used. With
    no set-up this is :func:`memlab.memory.estimate`.
    """
    check_choice("device", device, DEVICES)
    spec = StepSpec.of(model, **switches)
    s = spec.prepare
    if s is not None:
        if not all(hasattr(s, a) for a in ("lora", "train_last", "quantize_base")):
            raise MemlabError("the estimator models the set-ups of memlab.finetune.Setup; "
                              "trace or measure another prepare hook")
        if (lora, train_last, quantize_base) != (None, None, None):
            raise MemlabError("pass the set-up in the StepSpec's prepare or as lora, train_last "
                              "and quantize_base, not both")
        lora, train_last, quantize_base = s.lora, s.train_last, s.quantize_base
        spec = replace(spec, prepare=None)
    cfg = spec.config
    # Checks the set-up in one line each: the LoRA config and its targets, the blocks to train,
    # not both.
    trainable = trainable_parameters(cfg, lora=lora, train_last=train_last)
    if quantize_base is not None:
        check_choice("base quantization", quantize_base, BASE_SCHEMES)
        if lora is None:
            raise MemlabError("a quantized base needs LoRA adapters (a LoRA rank)")
    full = estimate(spec, device=device)
    if lora is None and train_last is None:
        return replace(full, setup={**full.setup, "trainable_parameters": full.parameters})
    B, T, precision = spec.batch_size, spec.seq_len, spec.precision
    optimizer, optimizer_impl = spec.optimizer, spec.optimizer_impl
    ckpt = bool(check_plan(spec.checkpointing, ("none", "full"), "a LoRA or last-blocks estimate"))
    accumulating = spec.grad_accum_steps > 1
    pb = PARAM_BYTES[precision]
    BT = B * T
    if spec.offload_activations and not ckpt:
        raise MemlabError("a fine-tuning estimate models activation offloading with full "
                          "checkpointing (the units' inputs on the host); without it, trace "
                          "the step (memlab trace), or add checkpointing")

    K = spec.loss_chunks
    everything = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision, device=device,
                               loss_chunks=K)
    model_level = [t for t in everything if t.scope == "model"]
    block = everything_block = [t for t in everything if t.scope == "layer"]
    head = _frozen_head([t for t in everything if t.scope == "head"], chunked=K > 1)
    model_level = [t for t in model_level if not t.name.startswith("positions")]  # frozen pos_emb
    checkpointed = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                                 checkpointing=True, device=device)
    ckpt_input = [t for t in checkpointed if t.scope == "layer"]
    in_block = grads_done_in_block(cfg, precision)
    _, block_tensors, _ = param_groups(cfg)

    if lora is not None:
        targets = adapted_linears(cfg, lora)
        layers = cfg.n_layer
        block = _lora_block(cfg, block, B, T, precision, lora, quantize_base is not None,
                            device)
        # A (r, in) then B (out, r) of each adapted linear, block by block, as the optimizer
        # visits them (Adafactor's state and scratch follow the shapes, 8-bit AdamW the sizes).
        tensors = [(s, 1) for _ in range(layers) for i, o in targets.values()
                   for s in ((lora.r, i), (o, lora.r))]
        trained_pb = ADAPTER_BYTES
        weights = base_weight_bytes(cfg, precision, quantize_base) + ADAPTER_BYTES * trainable
        # A 4-bit base dequantizes again in backward: no 16-bit weight copies stay alive.
        in_block = {k: (0, 0 if quantize_base else c) for k, (_, c) in in_block.items()}
        per_block = trainable // layers  # adapter weights in one block
        g_block = ADAPTER_BYTES * per_block
        ckpt_casts = layers * 2 * per_block
    else:
        layers = train_last
        tensors = [(s, 1) for _ in range(layers) for s in param_shape_groups(cfg)[1]]
        trained_pb = pb
        weights = pb * cfg.num_parameters()
        g_block = pb * sum(block_tensors)
        ckpt_casts = layers * 2 * sum(i * o for i, o, _ in block_linear_shapes(cfg).values())
    # No gradient flows into the frozen embedding: the lowest block saves less.
    first = (_first_trained_block(cfg, block) if lora is None else
             _lora_block(cfg, everything_block, B, T, precision, lora, quantize_base is not None,
                         device, lowest=True))
    if ckpt:
        # the units' inputs, and the RoPE tables the recomputed blocks read again
        saved = [t for t in checkpointed if t.scope == "model" and not t.name.startswith(
            "positions")] + ckpt_input + head
    elif first == block:
        saved = model_level + block + head
    else:  # the lowest block gradients reach saves less: its own list, once
        saved = model_level + [replace(t, scope="lowest") for t in first] + block + head
    P = weights
    G = trained_pb * sum(math.prod(t) * k for t, k in tensors)
    S = state_bytes(tensors, trained_pb, optimizer, optimizer_impl, device)
    scratch = step_scratch_bytes(tensors, trained_pb, optimizer, optimizer_impl)
    A = activation_bytes(saved, layers - 1 if any(t.scope == "lowest" for t in saved)
                         else layers)
    host = 0
    if spec.offload_activations:  # the trained units' inputs (memlab.model.offload)
        host = offloaded_activation_bytes(cfg, batch_size=B, seq_len=T, precision=precision,
                                          checkpointing=True, device=device, layers=layers)
    A -= host
    grads = BackwardGrads(g_block, 0, trained_pb * max(math.prod(t) for t, _ in tensors),
                          in_block)
    # One checkpointed block is the lowest one gradients reach: its recomputation saves less.
    fwd, bwd = activation_peaks(cfg, saved, B, T, precision, ckpt, device, accumulating,
                                block=first if ckpt and layers == 1 else block,
                                layers=layers, grads=grads,
                                checkpoint_casts=ckpt_casts, offload=spec.offload_activations,
                                loss_chunks=K, frozen_head=True)
    model_bytes = sum(t.bytes for t in saved if t.scope == "model")
    if ckpt:  # inside the last checkpointed block, which saves nothing: its MLP
        below = (model_bytes + BT * cfg.d_model * pb * (1 if spec.offload_activations else layers)
                 + (ckpt_casts if precision.endswith("-mixed") else 0))
        fwd = max(fwd, below + _down_proj_moment(cfg, B, T, precision, lora, None, device))
        if lora is not None and lora.selects("down_proj"):
            # The backward recomputes the top block up to the last tensor it saves, here down's
            # adapter's: all it saves, with those transients again, beside the gradient of the
            # residual stream (and, in fp32, the two parts of the down projection's input's).
            top = first if layers == 1 else block
            top_bytes = below + sum(t.bytes for t in top) + BT * cfg.d_model * pb
            bwd = max(bwd, top_bytes + _down_proj_moment(cfg, B, T, precision, lora, top, device))
            if precision == "fp32":
                bwd = max(bwd, top_bytes + _down_input_grad(cfg, B, T, lora, top))
        if lora is not None and "up_proj" in targets:
            fwd = max(fwd, below + checkpointed_block_peak(cfg, B, T, precision)
                      + _up_adapter_extra(cfg, B, T, precision, lora))
    else:  # the last block's down projection, before the final norm and the loss
        fwd = max(fwd, A - sum(t.bytes for t in head)
                  + _down_proj_moment(cfg, B, T, precision, lora, block, device))
        if precision == "fp32" and lora is not None and lora.selects("down_proj"):
            bwd = max(bwd, A - sum(t.bytes for t in head) + BT * cfg.d_model * pb
                      + _down_input_grad(cfg, B, T, lora, block))
    setup = {**full.setup, "trainable_parameters": trainable,
             "lora": None if lora is None else {
                 "r": lora.r, "alpha": lora.alpha, "dropout": lora.dropout,
                 "target_modules": lora.target_modules if isinstance(lora.target_modules, str)
                 else ",".join(lora.target_modules)},
             "train_last": train_last, "quantize_base": quantize_base,
             **({"offload_activations": True, "offloaded_bytes": host} if host else {})}
    tokens = 2 * BT * 8  # input ids and targets, int64
    # No embedding gradient arrives at the end: the embedding is frozen.
    return step_estimate(parameters=full.parameters, P=P, G=G, S=S, A=A, tokens=tokens, fwd=fwd,
                         bwd=bwd, end=P + S + G + tokens, scratch=scratch,
                         accumulating=accumulating, saved=saved, setup=setup)
