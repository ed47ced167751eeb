"""An analytic estimator of training and inference memory, tensor by tensor.

Every switch that changes the answer is explicit: precision (``fp32``, ``fp16-mixed``,
``bf16-mixed``, pure ``bf16``), optimizer (``adamw``, ``adam``, ``sgd``, ``sgd-momentum``,
``adamw-8bit``) and its implementation (``foreach``, ``fused``, ``for-loop``), attention
(``sdpa`` keeps no T x T matrix; ``eager`` keeps the softmax), full activation
checkpointing, gradient accumulation, and inference with a KV cache.

Activations are not a coefficient fitted to measurements: :func:`saved_tensors` lists each
tensor the book's model (:mod:`memlab.model.transformer`) keeps for the backward pass, with its shape
and dtype, so every term can be read, checked and taught. The peak is modelled phase by
phase, not as a sum of everything:

* forward:   P + O + A + the logits alive while the loss is computed
* backward:  P + O + A + the loss gradients at its start, or P + O + G at its end
* optimizer: P + O + G + the optimizer's scratch

where P, G, O and A are parameters, gradients, optimizer states and saved activations.
Tests hold this module to the traced step of :mod:`memlab.measure.step` (chapter 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import PHASES, StepSpec, checkpointing_words
from memlab.model.checkpoint import Checkpointing, parse_checkpointing
from memlab.model.flash import DEFAULT_BLOCK
from memlab.model.transformer import ATTENTION_IMPLS, ModelConfig, get_config
from memlab.units import to_unit

DEVICES = ("cuda", "cpu")
MODES = ("train", "inference")

PARAM_BYTES = {"fp32": 4, "fp16-mixed": 4, "bf16-mixed": 4, "bf16": 2}  # master weights
COMPUTE_BYTES = {"fp32": 4, "fp16-mixed": 2, "bf16-mixed": 2, "bf16": 2}  # matmul outputs
BNB_BLOCK = 256  # bitsandbytes' 8-bit optimizer block size (one fp32 absmax per block)
BNB_MIN_NUMEL = 4096  # smaller tensors keep 32-bit state in bitsandbytes


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


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes of a training step (or an inference pass), by category and phase."""

    parameters: int  # number of parameters
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # saved for backward at the end of the forward pass
    temporaries_bytes: int  # at the peak: logits/loss transients, optimizer scratch
    kv_cache_bytes: int
    other_bytes: int  # the batch of token ids
    peak_bytes: int
    peak_phase: str
    phase_peak_bytes: dict[str, int]
    setup: dict
    # Bytes by category at each phase's highest point; the categories are those of
    # memlab.measure.step.StepMemory (parameters, gradients, optimizer_states, activations,
    # temporaries, other) plus kv_cache, so plots and comparisons treat both alike.
    phase_breakdown: dict[str, dict[str, int]] = field(default_factory=dict)
    saved: tuple[SavedTensor, ...] = field(default=(), repr=False)

    def as_dict(self) -> dict:
        """The estimate as a plain dict, without the saved-tensor list (chapter: 1)."""
        d = asdict(self)
        d.pop("saved")
        return d

    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the peak (what a stacked bar shows) (chapter: 1)."""
        return dict(self.phase_breakdown[self.peak_phase])

    def table(self, unit: str | None = None) -> str:
        """The estimate as a text table with each category's share of the peak (chapter: 1)."""
        unit = unit or ("GiB" if self.peak_bytes >= 2**30 else "MiB")
        s = self.setup
        head = (
            f"estimated {s['mode']} memory: {s['model']} ({self.parameters:,} parameters), "
            f"batch {s['batch_size']} x seq {s['seq_len']}, {s['precision']}"
        )
        if s["mode"] == "train":
            head += (f", {s['optimizer']} ({s['optimizer_impl']}), {s['attention']} attention"
                     + checkpointing_words(s["checkpointing"])
                     + (f", {s['grad_accum_steps']} accumulation steps"
                        if s["grad_accum_steps"] > 1 else ""))
            if s.get("lora"):  # a fine-tuning set-up (chapter 5)
                head += (f"; LoRA r={s['lora']['r']} on {s['lora']['target_modules']}"
                         + (f", base in {s['quantize_base']}" if s.get("quantize_base") else ""))
            elif s.get("train_last"):
                head += f"; training the last {s['train_last']} blocks only"
        rows = [("weights", self.weights_bytes), ("gradients", self.gradients_bytes),
                ("optimizer states", self.optimizer_bytes),
                ("activations", self.activations_bytes),
                ("KV cache", self.kv_cache_bytes), ("temporaries", self.temporaries_bytes),
                ("other", self.other_bytes)]
        at_peak = self.breakdown()
        keys = ["parameters", "gradients", "optimizer_states", "activations", "kv_cache",
                "temporaries", "other"]
        lines = [head, f"{'category':<18}{unit:>12}{'at peak':>12}"]
        for (label, total), key in zip(rows, keys, strict=True):
            if total == 0 and at_peak.get(key, 0) == 0:
                continue
            lines.append(f"{label:<18}{to_unit(total, unit):>12.3f}"
                         f"{to_unit(at_peak.get(key, 0), unit):>12.3f}")
        lines.append(f"{'peak':<18}{'':>12}{to_unit(self.peak_bytes, unit):>12.3f}"
                     f"   (in the {self.peak_phase} phase)")
        return "\n".join(lines)


# Parameters, gradients, optimizer states ---------------------------------------------------
def param_groups(cfg: ModelConfig) -> tuple[list[int], list[int], list[int]]:
    """Element counts of the parameter tensors: (embeddings, one block, head), tied ones once (chapters: 1, 5)."""
    C, F, V, kv = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.kv_heads * cfg.head_dim
    if cfg.style == "gpt2":
        embed = [V * C, cfg.max_seq_len * C]
        block = [C, C, C * C, C, C * kv, kv, C * kv, kv, C * C, C, C, C, C * F, F, F * C, C]
        head = [C, C]
    else:
        embed = [V * C]
        block = [C, C * C, C * kv, C * kv, C * C, C, C * F, C * F, F * C]
        head = [C]
    if not cfg.tied:
        head.append(V * C)
    return embed, block, head


def _param_tensors(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(element count, how many such tensors) for the model's parameters, tied ones once."""
    embed, block, head = param_groups(cfg)
    return [(t, 1) for t in embed] + [(t, cfg.n_layer) for t in block] + [(t, 1) for t in head]


def _linear_weight_numel(cfg: ModelConfig) -> int:
    """Elements of one block's Linear weights (what autocast casts to 16 bits)."""
    C, F, kv = cfg.d_model, cfg.ffn_dim, cfg.kv_heads * cfg.head_dim
    n_mlp = 2 if cfg.style == "gpt2" else 3
    return 2 * C * C + 2 * C * kv + n_mlp * C * F


def optimizer_state_bytes(cfg: ModelConfig, precision: str, optimizer: str,
                          optimizer_impl: str = "foreach", device: str = "cuda") -> int:
    """Bytes of the optimizer's persistent state for a model (chapter: 1)."""
    return state_bytes(_param_tensors(cfg), PARAM_BYTES[precision], optimizer, optimizer_impl,
                       device)


def state_bytes(tensors: list[tuple[int, int]], param_bytes: int, optimizer: str,
                optimizer_impl: str = "foreach", device: str = "cuda") -> int:
    """Optimizer-state bytes for trainable tensors given as (elements, how many), each ``param_bytes`` wide (chapters: 1, 5)."""
    pb = param_bytes
    n = sum(t * k for t, k in tensors)
    if optimizer in ("adamw", "adam"):
        # Two moments in the parameters' dtype, plus one fp32 step counter per tensor, which
        # lives on the host on CUDA unless the fused kernel is used.
        n_tensors = sum(k for _, k in tensors)
        counters = 4 * n_tensors if (device == "cpu" or optimizer_impl == "fused") else 0
        return 2 * pb * n + counters
    if optimizer == "sgd-momentum":
        return pb * n
    if optimizer == "sgd":
        return 0
    # adamw-8bit (bitsandbytes): two uint8 states and one fp32 absmax per block of 256 for each
    # large tensor; tensors under 4096 elements keep two fp32 states.
    total = 0
    for t, k in tensors:
        if t < BNB_MIN_NUMEL:
            total += k * 8 * t
        else:
            total += k * (2 * t + 2 * 4 * -(-t // BNB_BLOCK))
    if any(t >= BNB_MIN_NUMEL for t, _ in tensors):
        total += 2 * 256 * 4  # the two fp32 quantization maps, shared by every tensor
    return total


def optimizer_step_scratch_bytes(cfg: ModelConfig, precision: str, optimizer: str,
                                 optimizer_impl: str) -> int:
    """Bytes of temporaries while the optimizer steps (chapter: 1).

    foreach Adam(W) computes its update for every parameter at once, so it holds one
    parameter-sized scratch list; the for-loop version holds two of the largest tensor;
    fused kernels, SGD and bitsandbytes' 8-bit AdamW update in place.
    """
    return step_scratch_bytes(_param_tensors(cfg), PARAM_BYTES[precision], optimizer,
                              optimizer_impl)


def step_scratch_bytes(tensors: list[tuple[int, int]], param_bytes: int, optimizer: str,
                       optimizer_impl: str) -> int:
    """:func:`optimizer_step_scratch_bytes` for trainable tensors given as (elements, how many) (chapters: 1, 5)."""
    if optimizer not in ("adamw", "adam") or optimizer_impl == "fused" or not tensors:
        return 0
    if optimizer_impl == "foreach":
        return param_bytes * sum(t * k for t, k in tensors)
    return 2 * param_bytes * max(t for t, _ in tensors)


# Activations -------------------------------------------------------------------------------
def _dt(nbytes: int) -> str:
    return {8: "int64", 4: "fp32", 2: "bf16", 1: "bool"}[nbytes]


def saved_tensors(cfg: ModelConfig, *, batch_size: int, seq_len: int, precision: str = "fp32",
                  checkpointing: bool | str | Checkpointing = False,
                  device: str = "cuda") -> list[SavedTensor]:
    """Every tensor the book's model saves for backward, with its bytes (chapters: 1, 7).

    Follows :class:`memlab.model.transformer.Transformer` line by line. ``precision`` decides the
    dtypes: in ``fp32`` everything is 4 bytes; in pure ``bf16`` the RMSNorm upcasts its input
    to fp32; under autocast (``*-mixed``) each Linear saves its own 16-bit copy of its input
    and of its weight. ``checkpointing`` is a plan of :mod:`memlab.model.checkpoint`: a
    checkpointed unit keeps its input only; ``selective`` keeps q, k and v but nothing the
    attention core makes.
    """
    plan = parse_checkpointing(checkpointing)
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
        out.append(SavedTensor(name, scope, shape, dtype, int(nbytes)))

    # Rotary tables: computed once per forward in fp32. fp32 attention uses them directly
    # (saved once); 16-bit attention casts them inside every block (saved per block);
    # checkpointing saves them once as block inputs.
    rope = cfg.style == "llama"
    if rope and (plan.recomputes_blocks or cb == 4):
        add("RoPE cos and sin tables", "model", "2 x (T, hs/2)", "fp32", 2 * T * (hs // 2) * 4)

    if cfg.style == "gpt2":
        add("positions 0..T-1 (int64)", "model", "(T,)", "int64", T * 8)
    make_block = _llama_block if cfg.style == "llama" else _gpt2_block
    units = plan.units(cfg.n_layer)
    kept_units = sum(1 for *_, c in units if c)
    kept_blocks = sum(e - s for s, e, c in units if not c)
    if plan.kind == "full":
        add("block input (kept by checkpointing)", "layer", "(B, T, C)", sdt, BT * C * sb)
    elif plan.kind in ("none", "selective"):
        out += make_block(cfg, B, T, precision, device, selective=plan.kind == "selective")
    else:  # some units keep their input only, the other blocks keep everything
        out.append(SavedTensor("unit input (kept by checkpointing)", "blocks", "(B, T, C)", sdt,
                               BT * C * sb, kept_units))
        if kept_blocks:
            out += [replace(t, scope="blocks", copies=kept_blocks)
                    for t in make_block(cfg, B, T, precision, device)]

    # The final norm, the head and the loss.
    if cfg.style == "llama":
        out += _rmsnorm("final norm", "head", BT, C, precision, consumer_linears=1)
    else:
        out += _layernorm("final norm", "head", BT, C, precision, 1, device)
    if mixed:
        add("lm_head weight cast to 16 bits", "head", "(V, C)", half, V * C * 2)
    add("log-softmax of the logits (fp32)", "head", "(B*T, V)", "fp32", BT * V * 4)
    add("loss", "head", "()", "fp32", 4)
    return out


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


def activation_bytes(saved: list[SavedTensor], n_layer: int) -> int:
    """Total bytes of a :func:`saved_tensors` list for a model of ``n_layer`` blocks (chapters: 1, 7)."""
    return sum(t.bytes * _copies(t, n_layer) for t in saved)


def _copies(t: SavedTensor, n_layer: int) -> int:
    return n_layer if t.scope == "layer" else t.copies if t.scope == "blocks" else 1


# The estimate ------------------------------------------------------------------------------
def _check_inference(model, batch_size, seq_len, precision, attention) -> ModelConfig:
    """The model's config after checking an inference pass's switches, one line per bad value."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    from memlab.memory.inference import DTYPE_BYTES

    check_choice("precision", precision, tuple(DTYPE_BYTES))
    if attention is not None:
        check_choice("attention", attention, ATTENTION_IMPLS)
        if attention != cfg.attention:
            from dataclasses import replace

            cfg = replace(cfg, attention=attention)
    return cfg


def estimate(
    model: StepSpec | ModelConfig | str,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    attention: str | None = None,
    checkpointing: bool | str = False,
    grad_accum_steps: int = 1,
    mode: str = "train",
    new_tokens: int = 1,
    device: str = "cuda",
) -> MemoryEstimate:
    """Estimate the bytes of a training step or an inference pass, by category and phase (chapter: 1).

    ``model`` may be a :class:`memlab.measure.step.StepSpec`, whose switches are then used. ``device``
    only matters where CUDA and CPU differ: where Adam keeps its step counters, and the dtype of
    an eager softmax under autocast.
    """
    check_choice("mode", mode, MODES)
    check_choice("device", device, DEVICES)
    if isinstance(model, StepSpec):
        if batch_size is not None or seq_len is not None or mode != "train":
            raise MemlabError("a StepSpec describes a whole training step: pass no batch_size, "
                              "seq_len or mode with it")
        if model.prepare is not None:
            raise MemlabError("memlab.memory.estimate does not model a prepare hook: "
                              "memlab.finetune.estimate_finetune takes a fine-tuning Setup; "
                              "trace_step or measure_step take any hook")
        spec = model
    elif mode == "inference":
        cfg = _check_inference(model, batch_size, seq_len, precision, attention)
        if parse_checkpointing(checkpointing) or grad_accum_steps != 1:
            raise MemlabError("checkpointing and grad_accum_steps are training switches; "
                              "mode 'inference' accepts precision, batch_size, seq_len, new_tokens")
        return _estimate_inference(cfg, batch_size, seq_len, precision, new_tokens)
    else:  # every switch of a training step checked once, as trace_step and measure_step check it
        spec = StepSpec(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        optimizer=optimizer, optimizer_impl=optimizer_impl,
                        checkpointing=checkpointing, grad_accum_steps=grad_accum_steps,
                        attention=attention)
    cfg, batch_size, seq_len = spec.config, spec.batch_size, spec.seq_len
    precision, optimizer, optimizer_impl = spec.precision, spec.optimizer, spec.optimizer_impl
    checkpointing, grad_accum_steps = spec.checkpointing, spec.grad_accum_steps
    B, T = batch_size, seq_len
    BT = B * T
    n = cfg.num_parameters()
    P = PARAM_BYTES[precision] * n
    G = P
    S = optimizer_state_bytes(cfg, precision, optimizer, optimizer_impl, device)
    saved = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                          checkpointing=checkpointing, device=device)
    A = activation_bytes(saved, cfg.n_layer)
    tokens = 2 * BT * 8  # input ids and targets, int64
    accumulating = grad_accum_steps > 1
    fwd, bwd = activation_peaks(cfg, saved, B, T, precision, checkpointing, device, accumulating)
    # A tied embedding gets two gradients (head and lookup); autograd holds the first until the
    # second arrives and adds them: three (V, C) tensors at the very end of the backward pass.
    # When gradients accumulate, the embedding's new gradient (V, C) is a temporary added into
    # .grad, and the tied case holds all three on top of the gradients already there.
    VC = cfg.vocab_size * cfg.d_model * PARAM_BYTES[precision]
    if accumulating:
        end = P + S + G + (3 * VC if cfg.tied else VC) + tokens
    else:
        end = P + S + G + (2 * VC if cfg.tied else 0) + tokens
    I_step = optimizer_step_scratch_bytes(cfg, precision, optimizer, optimizer_impl)
    return step_estimate(
        parameters=n, P=P, G=G, S=S, A=A, tokens=tokens, fwd=fwd, bwd=bwd, end=end,
        scratch=I_step, accumulating=accumulating, saved=saved,
        setup=dict(model=cfg.name, parameters=n, batch_size=B, seq_len=T, precision=precision,
                   optimizer=optimizer, optimizer_impl=optimizer_impl, attention=cfg.attention,
                   checkpointing=checkpointing, grad_accum_steps=grad_accum_steps, mode=mode,
                   new_tokens=0, device=device))


def step_estimate(*, parameters: int, P: int, G: int, S: int, A: int, tokens: int, fwd: int,
                  bwd: int, end: int, scratch: int, accumulating: bool, saved, setup: dict
                  ) -> MemoryEstimate:
    """A training step's estimate from its parts: the three phases, their peak and categories (chapters: 1, 5).

    P, G, S, A: bytes of parameters, gradients, optimizer states and saved activations; ``fwd``
    and ``bwd`` the activation side at the forward's and the backward's highest points; ``end``
    the bytes when the backward finishes; ``scratch`` the optimizer step's temporaries.
    """
    # With accumulation, the gradients of earlier micro-batches stay alive through the
    # forward and backward passes of the next ones.
    G_live = G if accumulating else 0
    base = P + S + G_live + tokens
    phases = {
        "forward": base + fwd,
        "backward": max(base + bwd, end),
        "optimizer": P + S + G + scratch + tokens,
    }
    peak_phase = max(PHASES, key=lambda p: phases[p])

    def cats(grads, acts, total):
        d = dict(parameters=P, gradients=grads, optimizer_states=S, activations=acts,
                 kv_cache=0, other=tokens)
        d["temporaries"] = total - sum(d.values())
        return d

    start_wins = base + bwd >= end  # the backward's high point is before the gradients grow
    breakdown = {
        "forward": cats(G_live, A, phases["forward"]),
        "backward": cats(G_live, A, phases["backward"]) if start_wins
        else cats(G, 0, phases["backward"]),
        "optimizer": cats(G, 0, phases["optimizer"]),
    }
    return MemoryEstimate(
        parameters=parameters, weights_bytes=P, gradients_bytes=G, optimizer_bytes=S,
        activations_bytes=A, temporaries_bytes=breakdown[peak_phase]["temporaries"],
        kv_cache_bytes=0, other_bytes=tokens, peak_bytes=phases[peak_phase],
        peak_phase=peak_phase, phase_peak_bytes=phases, setup=setup,
        phase_breakdown=breakdown, saved=tuple(saved))


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


def _stage(t: SavedTensor) -> str:
    """Which part of a block made a saved tensor, in forward order."""
    if t.name.startswith("Linear weights cast"):
        return "casts"
    if t.name.startswith("attention norm"):
        return "attention norm"
    if t.name.startswith("MLP norm"):
        return "MLP norm"
    return "MLP" if t.name in _MLP_NAMES or t.name.startswith("MLP") else "attention"


def grads_done_in_block(cfg: ModelConfig, precision: str) -> dict[str, tuple[int, int]]:
    """At each stage of a block's backward: (gradient bytes already computed, bytes of the 16-bit weight casts still alive under autocast) (chapters: 1, 5)."""
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
                     checkpoint_casts: int | None = None) -> tuple[int, int]:
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
    """
    plan = parse_checkpointing(checkpointing)
    V, C = cfg.vocab_size, cfg.d_model
    BT = B * T
    L = cfg.n_layer if layers is None else layers  # the blocks that save tensors
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    model_level = sum(t.bytes for t in saved if t.scope == "model")
    # Scope 'lowest': the lowest block gradients reach, when it saves less than the others
    # (fine-tuning: no gradient flows into a frozen embedding).
    lowest = [t for t in saved if t.scope == "lowest"]
    A = activation_bytes(saved, L - 1 if lowest else L)
    # The full (recomputed) block: what a non-checkpointed block saves.
    if block is None:
        block = (_llama_block if cfg.style == "llama" else _gpt2_block)(cfg, B, T, precision,
                                                                         device)
    block_bytes = sum(t.bytes for t in block)
    units = plan.units(L)
    x_in = BT * C * sb  # a checkpointed unit's input: the residual stream
    # What a block that is not recomputed keeps: the whole block, or selective's list.
    kept = block_bytes if plan.kind != "selective" else sum(
        t.bytes for t in saved if t.scope == "layer")
    kept_first = sum(t.bytes for t in lowest) if lowest else kept

    # Bytes saved under each block when its backward runs (its own unit's input included), and
    # whether the block is recomputed; ``fwd_below``: the same in the forward pass.
    below, fwd_below, recomputed = [0] * L, [0] * L, [False] * L
    acc = 0
    for s, e, ckpt in units:
        for layer in range(s, e):
            recomputed[layer] = ckpt
            below[layer] = acc + (x_in + (layer - s) * block_bytes if ckpt else 0)
            fwd_below[layer] = acc + (x_in if ckpt else 0)
        acc += x_in if ckpt else (kept_first + (e - s - 1) * kept if s == 0 else (e - s) * kept)

    # Forward.
    logits_live = BT * V * cb + (BT * V * 4 if cb != 4 else 0)
    fwd = A + logits_live
    if plan.recomputes_blocks and precision.endswith("-mixed"):
        fwd += (plan.checkpointed_blocks(L) * 2 * _linear_weight_numel(cfg)
                if checkpoint_casts is None else checkpoint_casts)
    softmax_at = None  # (bytes of the block saved up to its softmax, bytes of the scores)
    if cfg.attention == "eager":
        before = 0
        for t in block:
            before += t.bytes
            if t.name == "softmax probabilities":
                scores = B * cfg.n_head * T * T * cb
                if t.bytes != scores:  # CUDA autocast: the softmax reads an fp32 copy of them
                    scores += B * cfg.n_head * T * T * 4
                softmax_at = (before, scores)
                break
    if softmax_at is not None:
        # The last block's softmax, with its masked-scores input alive beside it.
        fwd = max(fwd, model_level + fwd_below[L - 1] + softmax_at[0] + softmax_at[1])

    # Backward.
    bwd = A + 2 * BT * V * 4  # start: the fp32 gradients of log-softmax's output and input
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
            stage = _stage(t)
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
            consumer_grad = BT * C * cb if t.name in _LINEAR_INPUTS else t.bytes
            if cfg.attention == "flash" and t.name == "attention logsumexp":
                consumer_grad = flash_backward_workspace(cfg, B, T, precision) - t.bytes
            elif t.name == "up projection":
                # The product's backward returns the gradients of both factors at once.
                consumer_grad = 2 * t.bytes
            alive = (model_level + below[layer] + prefix + casts_alive + done + grads_done + dx
                     + d_out + t.bytes + consumer_grad)
            bwd = max(bwd, alive)
    return fwd, bwd


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


def kv_cache_bytes(cfg: ModelConfig, *, batch_size: int, tokens: int, bytes_per_value: int = 2) -> int:
    """Bytes of a KV cache: 2 (K and V) x layers x KV heads x head size x tokens x batch (chapter: 1)."""
    return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * tokens * batch_size * bytes_per_value


def _estimate_inference(cfg, B, T, precision, new_tokens):
    from memlab.memory.inference import estimate_inference

    return estimate_inference(cfg, B, T, precision, new_tokens)


# Sizing helpers --------------------------------------------------------------------------------
def batch_for_peak(model: ModelConfig | str, target_bytes: float, *, seq_len: int,
                   max_batch: int = 1 << 16, **kwargs) -> int | None:
    """Smallest batch size whose estimated peak reaches ``target_bytes``, or None (chapter: 1)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)

    def peak(b):
        return estimate(cfg, batch_size=b, seq_len=seq_len, **kwargs).peak_bytes

    if peak(max_batch) < target_bytes:
        return None
    lo, hi = 1, max_batch
    if peak(lo) >= target_bytes:
        return 1
    while hi - lo > 1:  # the peak grows with the batch: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) < target_bytes else (lo, mid)
    return hi


def largest_batch_that_fits(model: ModelConfig | str, capacity_bytes: float, *, seq_len: int,
                            **kwargs) -> int:
    """Largest batch whose estimated peak stays within ``capacity_bytes`` (0 if none) (chapter: 1)."""
    first_over = batch_for_peak(model, capacity_bytes + 1, seq_len=seq_len, **kwargs)
    return (1 << 16) if first_over is None else first_over - 1


def bytes_per_param_curve(model: ModelConfig | str, *, seq_len: int, batches=(1, 2, 4, 8, 16, 32),
                          **kwargs) -> tuple[list[int], list[float]]:
    """(tokens per step, estimated peak bytes per parameter) over batch sizes (chapter: 1)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    n = cfg.num_parameters()
    tokens, bpp = [], []
    for b in batches:
        tokens.append(b * seq_len)
        bpp.append(estimate(cfg, batch_size=b, seq_len=seq_len, **kwargs).peak_bytes / n)
    return tokens, bpp


def saved_by_stage(saved: list[SavedTensor]) -> dict[str, int]:
    """Bytes of one block's saved tensors by stage, plus the tensors kept once (chapter: 1)."""
    out = {"autocast weight copies": 0, "attention norm": 0, "attention": 0, "MLP norm": 0,
           "MLP": 0}
    for t in saved:
        if t.scope == "layer":
            stage = _stage(t)
            out["autocast weight copies" if stage == "casts" else stage] += t.bytes
    out["kept once, outside the blocks"] = sum(t.bytes for t in saved if t.scope != "layer")
    return out
