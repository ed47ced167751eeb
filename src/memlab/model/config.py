"""A model's configuration: its shape, the presets, Hugging Face config.json files, and the
vocabularies of a training step (precisions, optimizers, attention implementations).

Plain Python, no torch: the estimator (chapter 1) is arithmetic over these, and
:mod:`memlab.model.transformer` builds the modules from them. Sizes are counts, not bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from numbers import Real
from pathlib import Path

from memlab.errors import MemlabError, check_choice

# How a step stores and computes: master weights in fp32 with fp16/bf16 autocast, or pure bf16.
PRECISIONS = ("fp32", "fp16-mixed", "bf16-mixed", "bf16")
# Optimizers by the book's names; 'adamw-8bit' is bitsandbytes' AdamW8bit, 'adamw-bf16-moments'
# the book's AdamW with bf16 moments (memlab.model.optim), 'adafactor' torch's Adafactor.
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adamw-8bit", "adamw-bf16-moments",
              "adafactor")
# How torch's optimizers loop over parameters: one kernel per tensor group, one per tensor, or fused.
OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")
DEFAULT_BLOCK = 64  # the book's FlashAttention (memlab.model.flash): rows of Q and of K/V per tile
ATTENTION_IMPLS = ("sdpa", "eager", "flash")


@dataclass(frozen=True)
class MoEConfig:
    """The experts of every block's MLP (:mod:`memlab.model.moe`) (chapter: 9). Sizes are counts."""

    experts: int  # E, routed experts per block
    top_k: int  # k, experts each token goes to
    d_ff: int  # each routed expert's hidden width
    shared_d_ff: int = 0  # the shared experts' hidden width, all of them together (0: none)
    shared_gate: bool = False  # a sigmoid gate on the shared output (Qwen-MoE)
    norm_topk_prob: bool = True  # renormalize the k chosen probabilities (Mixtral) or not
    capacity_factor: float | None = None  # None: every routed row is computed (dropless)
    aux_loss_coef: float = 0.0  # weight of the load-balancing loss in the training loss

    def __post_init__(self) -> None:
        for f in ("experts", "top_k", "d_ff"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise MemlabError(f"moe {f} must be a positive integer, got {v!r}")
        if self.top_k > self.experts:
            raise MemlabError(f"moe top_k ({self.top_k}) must be at most the experts "
                              f"({self.experts})")
        v = self.shared_d_ff
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise MemlabError(f"moe shared_d_ff must be a whole number (0: no shared expert), "
                              f"got {v!r}")
        for f in ("shared_gate", "norm_topk_prob"):
            if not isinstance(getattr(self, f), bool):
                raise MemlabError(f"moe {f} must be true or false, got {getattr(self, f)!r}")
        if self.shared_gate and not self.shared_d_ff:
            raise MemlabError("moe shared_gate needs a shared expert (shared_d_ff > 0)")
        c = self.capacity_factor
        if c is not None and (isinstance(c, bool) or not isinstance(c, Real) or not c > 0
                              or not math.isfinite(c)):
            raise MemlabError(f"moe capacity_factor must be a positive number or null "
                              f"(dropless), got {c!r}")
        a = self.aux_loss_coef
        if isinstance(a, bool) or not isinstance(a, Real) or not a >= 0 or not math.isfinite(a):
            raise MemlabError(f"moe aux_loss_coef must be a number >= 0, got {a!r}")

    def capacity(self, tokens: int) -> int | None:
        """Rows one expert computes at most for ``tokens`` tokens: ceil(c·N·k/E) (chapter: 9)."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def block_parameters(self, d_model: int) -> int:
        """Parameters of one block's MoE MLP: router, experts, shared expert and its gate (chapter: 9)."""
        C = d_model
        return (C * self.experts + self.experts * 3 * C * self.d_ff + 3 * C * self.shared_d_ff
                + (C if self.shared_gate else 0))

    def active_block_parameters(self, d_model: int) -> int:
        """Parameters one token passes through in one block's MoE MLP (chapter: 9).

        The router (all of it: every expert's logit is computed), its k experts and the shared
        expert with its gate.
        """
        C = d_model
        return (C * self.experts + self.top_k * 3 * C * self.d_ff + 3 * C * self.shared_d_ff
                + (C if self.shared_gate else 0))

    def to_dict(self) -> dict:
        """The fields as a plain dict (chapter: 9)."""
        return asdict(self)


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer. Sizes are counts, not bytes."""

    name: str = "custom"
    style: str = "llama"  # "llama" or "gpt2"
    vocab_size: int = 32000
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int | None = None  # None: same as n_head (plain multi-head attention)
    d_model: int = 64
    d_ff: int | None = None  # None: 4*d_model (gpt2) or the Llama SwiGLU rule
    max_seq_len: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool | None = None  # None: tied for gpt2, untied for llama
    # "sdpa" (PyTorch's fused kernels), "eager" (stores the softmax) or "flash" (the book's own
    # tiled FlashAttention, memlab.model.flash: saves O(T), reads K and V once per query group)
    attention: str = "sdpa"
    # Biases on the q, k and v projections of a Llama-style model (Qwen2's attention); GPT-2
    # style has biases everywhere regardless.
    qkv_bias: bool = False
    # Every block's MLP a mixture of experts (Llama style only; memlab.model.moe), or dense.
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        check_choice("model style", self.style, ("llama", "gpt2"))
        if isinstance(self.moe, dict):  # a config read back from JSON
            object.__setattr__(self, "moe", MoEConfig(**self.moe))
        if self.moe is not None and not isinstance(self.moe, MoEConfig):
            raise MemlabError(f"model config moe must be a MoEConfig or null, got {self.moe!r}")
        if self.moe is not None and self.style != "llama":
            raise MemlabError("model config moe needs style 'llama' (experts are SwiGLU MLPs), "
                              f"got style {self.style!r}")
        if not isinstance(self.qkv_bias, bool):
            raise MemlabError(f"model config qkv_bias must be true or false, got {self.qkv_bias!r}")
        check_choice("attention", self.attention, ATTENTION_IMPLS)
        for f in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise MemlabError(f"model config {f} must be a positive integer, got {v!r}")
        if self.d_ff is not None and (
            isinstance(self.d_ff, bool) or not isinstance(self.d_ff, int) or self.d_ff <= 0
        ):
            raise MemlabError(f"model config d_ff must be a positive integer, got {self.d_ff!r}")
        if self.d_model % self.n_head:
            raise MemlabError(
                f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})"
            )
        if self.n_kv_head is not None and (
            isinstance(self.n_kv_head, bool) or not isinstance(self.n_kv_head, int)
            or self.n_kv_head <= 0 or self.n_head % self.n_kv_head
        ):
            raise MemlabError(
                f"n_kv_head ({self.n_kv_head}) must be a positive divisor of n_head ({self.n_head})"
            )

    # Derived sizes -----------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (n_head for plain multi-head attention)."""
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        """Size of one attention head, d_model / n_head."""
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        """Width of the MLP's hidden layer."""
        if self.d_ff is not None:
            return self.d_ff
        if self.style == "gpt2":
            return 4 * self.d_model
        # Llama rule: 2/3 of 4C, rounded up to a multiple of 256.
        hidden = int(2 * 4 * self.d_model / 3)
        return 256 * math.ceil(hidden / 256)

    @property
    def tied(self) -> bool:
        """Whether the output head shares the token embedding's weight."""
        return self.style == "gpt2" if self.tie_embeddings is None else self.tie_embeddings

    def num_parameters(self) -> int:
        """Exact parameter count of :class:`Transformer` built from this config, by formula."""
        C, L, V, F_ = self.d_model, self.n_layer, self.vocab_size, self.ffn_dim
        kv = self.kv_heads * self.head_dim
        if self.style == "gpt2":
            attn = (C * C + C) + 2 * (C * kv + kv) + (C * C + C)  # q, k, v, o with biases
            mlp = C * F_ + F_ + F_ * C + C
            norms = 2 * 2 * C  # two LayerNorms, weight + bias
            block = attn + mlp + norms
            total = V * C + self.max_seq_len * C + L * block + 2 * C  # wte + wpe + blocks + ln_f
        else:
            attn = C * C + 2 * C * kv + C * C  # q, k, v, o
            if self.qkv_bias:
                attn += C + 2 * kv
            mlp = 3 * C * F_ if self.moe is None else self.moe.block_parameters(C)
            norms = 2 * C
            block = attn + mlp + norms
            total = V * C + L * block + C  # embed + blocks + final norm
        if not self.tied:
            total += V * C
        return total

    def active_parameters(self) -> int:
        """Parameters one token passes through (chapter: 9).

        All of a dense model; an MoE model's embedding, attention, norms, head, router, k
        experts and shared expert per block (:meth:`MoEConfig.active_block_parameters`).
        """
        n = self.num_parameters()
        if self.moe is None:
            return n
        C = self.d_model
        return n - self.n_layer * (self.moe.block_parameters(C)
                                   - self.moe.active_block_parameters(C))

    def to_dict(self) -> dict:
        """The config's fields as a plain dict (chapter: all)."""
        return asdict(self)


# Presets -------------------------------------------------------------------------------
# Shapes from the models' published config.json files; parameter counts are pinned in tests.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        name="tiny", style="llama", vocab_size=512, n_layer=2, n_head=4, n_kv_head=2,
        d_model=64, d_ff=176, max_seq_len=128,
    ),
    # The tiny model with a mixture of experts in every block, a shared expert and its gate.
    "tiny-moe": ModelConfig(
        name="tiny-moe", style="llama", vocab_size=512, n_layer=2, n_head=4, n_kv_head=2,
        d_model=64, d_ff=176, max_seq_len=128,
        moe=MoEConfig(experts=4, top_k=2, d_ff=64, shared_d_ff=64, shared_gate=True,
                      aux_loss_coef=0.01),
    ),
    "tiny-gpt2": ModelConfig(
        name="tiny-gpt2", style="gpt2", vocab_size=512, n_layer=2, n_head=4, d_model=64,
        max_seq_len=128,
    ),
    "gpt2": ModelConfig(
        name="gpt2", style="gpt2", vocab_size=50257, n_layer=12, n_head=12, d_model=768,
        max_seq_len=1024,
    ),
    "gpt2-xl": ModelConfig(
        name="gpt2-xl", style="gpt2", vocab_size=50257, n_layer=48, n_head=25, d_model=1600,
        max_seq_len=1024,
    ),
    # TinyLlama-1.1B's shape: the book's Llama-style "1B-class" model.
    "llama-1b": ModelConfig(
        name="llama-1b", vocab_size=32000, n_layer=22, n_head=32, n_kv_head=4, d_model=2048,
        d_ff=5632, max_seq_len=2048,
    ),
    "llama2-7b": ModelConfig(
        name="llama2-7b", vocab_size=32000, n_layer=32, n_head=32, d_model=4096, d_ff=11008,
        max_seq_len=4096,
    ),
    "llama2-13b": ModelConfig(
        name="llama2-13b", vocab_size=32000, n_layer=40, n_head=40, d_model=5120, d_ff=13824,
        max_seq_len=4096,
    ),
    "llama2-70b": ModelConfig(
        name="llama2-70b", vocab_size=32000, n_layer=80, n_head=64, n_kv_head=8, d_model=8192,
        d_ff=28672, max_seq_len=4096,
    ),
    "llama3-8b": ModelConfig(
        name="llama3-8b", vocab_size=128256, n_layer=32, n_head=32, n_kv_head=8, d_model=4096,
        d_ff=14336, max_seq_len=8192, rope_theta=500000.0,
    ),
    # Llama 3.1 8B: Llama 3 8B's shape with a 131,072-token context (its RoPE frequencies are
    # rescaled for that length, which changes no shape and no byte).
    "llama3.1-8b": ModelConfig(
        name="llama3.1-8b", vocab_size=128256, n_layer=32, n_head=32, n_kv_head=8, d_model=4096,
        d_ff=14336, max_seq_len=131072, rope_theta=500000.0,
    ),
    # Qwen2.5 7B: a 152,064-token vocabulary, biases on q, k and v, a 32,768-token context
    # (131,072 with YaRN scaling, which changes no shape).
    "qwen2.5-7b": ModelConfig(
        name="qwen2.5-7b", vocab_size=152064, n_layer=28, n_head=28, n_kv_head=4, d_model=3584,
        d_ff=18944, max_seq_len=32768, rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True,
    ),
    # Llama 3.1 405B's shape (the book keeps llama3-8b's max_seq_len of 8192).
    "llama3-405b": ModelConfig(
        name="llama3-405b", vocab_size=128256, n_layer=126, n_head=128, n_kv_head=8,
        d_model=16384, d_ff=53248, max_seq_len=8192, rope_theta=500000.0,
    ),
    # Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088): Mistral 7B's attention, every MLP
    # eight SwiGLU experts of Mistral's width, two per token, renormalized.
    "mixtral-8x7b": ModelConfig(
        name="mixtral-8x7b", vocab_size=32000, n_layer=32, n_head=32, n_kv_head=8, d_model=4096,
        d_ff=14336, max_seq_len=32768, rope_theta=1000000.0,
        moe=MoEConfig(experts=8, top_k=2, d_ff=14336, norm_topk_prob=True, aux_loss_coef=0.02),
    ),
    # Qwen1.5-MoE-A2.7B: 60 small experts, four per token, not renormalized, and a shared
    # expert four experts wide with a sigmoid gate; biases on q, k and v (its config.json).
    "qwen1.5-moe-a2.7b": ModelConfig(
        name="qwen1.5-moe-a2.7b", vocab_size=151936, n_layer=24, n_head=16, d_model=2048,
        d_ff=5632, max_seq_len=8192, rope_theta=1000000.0, norm_eps=1e-6, qkv_bias=True,
        moe=MoEConfig(experts=60, top_k=4, d_ff=1408, shared_d_ff=5632, shared_gate=True,
                      norm_topk_prob=False, aux_loss_coef=0.001),
    ),
    "mistral-7b": ModelConfig(
        name="mistral-7b", vocab_size=32000, n_layer=32, n_head=32, n_kv_head=8, d_model=4096,
        d_ff=14336, max_seq_len=32768, rope_theta=1000000.0,
    ),
}


# The hub ids of the presets' published checkpoints (base and instruct share a shape), lower-cased:
# what an axolotl config's ``base_model`` names (memlab.fromconfig).
HUB_IDS: dict[str, str] = {
    "tinyllama/tinyllama-1.1b-intermediate-step-1431k-3t": "llama-1b",
    "tinyllama/tinyllama_v1.1": "llama-1b",
    "tinyllama/tinyllama-1.1b-chat-v1.0": "llama-1b",
    "openai-community/gpt2": "gpt2",
    "openai-community/gpt2-xl": "gpt2-xl",
    "meta-llama/llama-2-7b-hf": "llama2-7b",
    "meta-llama/llama-2-7b-chat-hf": "llama2-7b",
    "meta-llama/llama-2-13b-hf": "llama2-13b",
    "meta-llama/llama-2-13b-chat-hf": "llama2-13b",
    "meta-llama/llama-2-70b-hf": "llama2-70b",
    "meta-llama/llama-2-70b-chat-hf": "llama2-70b",
    "meta-llama/meta-llama-3-8b": "llama3-8b",
    "meta-llama/meta-llama-3-8b-instruct": "llama3-8b",
    "meta-llama/llama-3.1-8b": "llama3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama3.1-8b",
    "meta-llama/meta-llama-3.1-8b": "llama3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama3.1-8b",
    "meta-llama/llama-3.1-405b": "llama3-405b",
    "meta-llama/meta-llama-3.1-405b": "llama3-405b",
    "qwen/qwen2.5-7b": "qwen2.5-7b",
    "qwen/qwen2.5-7b-instruct": "qwen2.5-7b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "qwen/qwen1.5-moe-a2.7b": "qwen1.5-moe-a2.7b",
    "qwen/qwen1.5-moe-a2.7b-chat": "qwen1.5-moe-a2.7b",
    "mistralai/mistral-7b-v0.1": "mistral-7b",
    "mistralai/mistral-7b-instruct-v0.2": "mistral-7b",
}


def get_config(name_or_path: str | Path, **overrides) -> ModelConfig:
    """Return a preset's config, or load a Hugging Face ``config.json`` from disk (chapter: 1)."""
    key = str(name_or_path)
    if key in PRESETS:
        cfg = PRESETS[key]
    elif key.endswith(".json") or Path(key).is_file():
        cfg = config_from_hf(key)
    else:
        raise MemlabError(
            f"unknown model {key!r}; accepted: {', '.join(PRESETS)} or a path to a config.json"
        )
    if overrides:
        valid = {f.name for f in fields(ModelConfig)}
        bad = sorted(set(overrides) - valid)
        if bad:
            raise MemlabError(f"unknown config field(s) {bad}; accepted: {', '.join(sorted(valid))}")
        cfg = replace(cfg, **overrides)
    return cfg


# Hugging Face config.json -------------------------------------------------------------------
# One table says how a config.json becomes a ModelConfig; the Python loader below and the
# kernel-free estimator's script (memlab.interactive.estimator) both read it.
# Each family read: its model_type, the style of the book's model it becomes, and the class its
# config.json's ``architectures`` names (transformers), which stands for a missing model_type.
HF_FAMILIES = (("gpt2", "gpt2", "GPT2LMHeadModel"), ("llama", "llama", "LlamaForCausalLM"),
               ("mistral", "llama", "MistralForCausalLM"), ("qwen2", "llama", "Qwen2ForCausalLM"),
               ("mixtral", "llama", "MixtralForCausalLM"),
               ("qwen2_moe", "llama", "Qwen2MoeForCausalLM"))
HF_STYLES = {mtype: style for mtype, style, _ in HF_FAMILIES}  # model_type -> style
HF_ARCHITECTURES = {arch: mtype for mtype, _, arch in HF_FAMILIES}  # architectures[0] -> model_type
# Fields a family fixes rather than its config.json: Qwen2 and Qwen2-MoE always have q/k/v
# biases (transformers' Qwen2Attention: bias=True on q_proj, k_proj, v_proj; none on o_proj).
HF_FIXED = {"qwen2": {"qkv_bias": True}, "qwen2_moe": {"qkv_bias": True}}
HF_KINDS = {  # what a field's value must be, as the one-line errors say it
    "count": "a positive integer",
    "count-or-null": "a positive integer or null",
    "number": "a number",
    "flag-or-null": "true, false or null",
}
HF_BIAS_FLAGS = ("attention_bias", "mlp_bias")  # biases the Llama-style model does not have


@dataclass(frozen=True)
class HFField:
    """One :class:`ModelConfig` field read from a config.json.

    It names the keys tried in order, the value's kind, and the default when absent.
    """

    field: str  # the ModelConfig field
    keys: tuple[str, ...]  # Hugging Face keys, tried in order
    kind: str  # a key of HF_KINDS
    required: bool = True
    default: object = None  # when no key is present (required=False)


HF_FIELDS: dict[str, tuple[HFField, ...]] = {
    "gpt2": (
        HFField("vocab_size", ("vocab_size",), "count"),
        HFField("n_layer", ("n_layer", "num_hidden_layers"), "count"),
        HFField("n_head", ("n_head", "num_attention_heads"), "count"),
        HFField("d_model", ("n_embd", "hidden_size"), "count"),
        HFField("d_ff", ("n_inner",), "count-or-null", required=False),
        HFField("max_seq_len", ("n_positions", "max_position_embeddings"), "count"),
        HFField("norm_eps", ("layer_norm_epsilon",), "number", required=False, default=1e-5),
        HFField("tie_embeddings", ("tie_word_embeddings",), "flag-or-null", required=False,
                default=True),
    ),
    "llama": (
        HFField("vocab_size", ("vocab_size",), "count"),
        HFField("n_layer", ("num_hidden_layers",), "count"),
        HFField("n_head", ("num_attention_heads",), "count"),
        HFField("n_kv_head", ("num_key_value_heads",), "count-or-null", required=False),
        HFField("d_model", ("hidden_size",), "count"),
        HFField("d_ff", ("intermediate_size",), "count"),
        HFField("max_seq_len", ("max_position_embeddings",), "count", required=False,
                default=2048),
        HFField("norm_eps", ("rms_norm_eps",), "number", required=False, default=1e-5),
        HFField("rope_theta", ("rope_theta",), "number", required=False, default=10000.0),
        HFField("tie_embeddings", ("tie_word_embeddings",), "flag-or-null", required=False,
                default=False),
    ),
}


# The experts of the mixture-of-experts families (MoEConfig's fields), read as HF_FIELDS are;
# what a family fixes is in HF_MOE_FIXED: Mixtral renormalizes its top-k probabilities
# (transformers' MixtralSparseMoeBlock) and its experts are intermediate_size wide; Qwen2-MoE
# gates its shared expert with a sigmoid (Qwen2MoeSparseMoeBlock.shared_expert_gate).
HF_MOE_FIELDS: dict[str, tuple[HFField, ...]] = {
    "mixtral": (
        HFField("experts", ("num_local_experts",), "count"),
        HFField("top_k", ("num_experts_per_tok",), "count"),
        HFField("d_ff", ("intermediate_size",), "count"),
        HFField("aux_loss_coef", ("router_aux_loss_coef",), "number", required=False,
                default=0.0),
    ),
    "qwen2_moe": (
        HFField("experts", ("num_experts",), "count"),
        HFField("top_k", ("num_experts_per_tok",), "count"),
        HFField("d_ff", ("moe_intermediate_size",), "count"),
        HFField("shared_d_ff", ("shared_expert_intermediate_size",), "count"),
        HFField("norm_topk_prob", ("norm_topk_prob",), "flag-or-null", required=False,
                default=False),
        HFField("aux_loss_coef", ("router_aux_loss_coef",), "number", required=False,
                default=0.0),
    ),
}
# Keys that say a config.json has routed experts (DeepSeek-V2/V3, OLMoE, gpt-oss, Mixtral...)
HF_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts",
                  "num_experts_per_tok")
HF_MOE_FIXED = {"mixtral": {"norm_topk_prob": True}, "qwen2_moe": {"shared_gate": True}}


def _hf_moe(raw: dict, mtype: str, source: str) -> MoEConfig | None:
    """The experts of a mixture-of-experts family's config.json, or None for a dense one."""
    if mtype not in HF_MOE_FIELDS:
        return None
    if mtype == "qwen2_moe" and (raw.get("decoder_sparse_step", 1) != 1
                                 or raw.get("mlp_only_layers")):
        raise MemlabError(f"{source} makes some blocks dense (decoder_sparse_step "
                          f"{raw.get('decoder_sparse_step', 1)!r}, mlp_only_layers "
                          f"{raw.get('mlp_only_layers')!r}): the book's model has experts in "
                          f"every block; accepted: decoder_sparse_step 1 and no mlp_only_layers")
    values = dict(HF_MOE_FIXED.get(mtype, {})) | _hf_fields(raw, HF_MOE_FIELDS[mtype], source)[0]
    if values.get("norm_topk_prob") is None:
        values["norm_topk_prob"] = False
    try:
        return MoEConfig(**values)
    except MemlabError as exc:
        raise MemlabError(f"{source}: {exc}") from None


def _hf_fields(raw: dict, fields, source: str) -> tuple[dict, dict]:
    """Each field's value (checked, or its default) and the key it was read from."""
    values, used = {}, {}
    for f in fields:
        key = next((k for k in f.keys if k in raw), None)
        if key is None:
            if f.required:
                raise MemlabError(f"{source} lacks the key {f.keys[0]!r}; accepted keys: "
                                  f"{', '.join(f.keys)}")
            values[f.field] = f.default
        else:
            values[f.field] = _hf_value(source, key, raw[key], f.kind)
        used[f.field] = key or f.keys[0]
    return values, used


def _hf_value(source: str, key: str, value, kind: str):
    """``value`` checked against ``kind``; JSON has one number type, so 768.0 reads as 768."""
    if kind in ("count", "count-or-null"):
        if value is None and kind == "count-or-null":
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    elif kind == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:  # flag-or-null
        ok = value is None or isinstance(value, bool)
    if not ok:
        raise MemlabError(f"{source}: {key} must be {HF_KINDS[kind]}, got {value!r}")
    return value


def hf_model_type(raw: dict):
    """A config.json's model_type, else the one its ``architectures[0]`` implies, else None (chapter: 1).

    A config.json written by hand may lack model_type while ``architectures`` names the family.
    """
    if "model_type" in raw:
        return raw["model_type"]
    archs = raw.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return HF_ARCHITECTURES.get(archs[0])
    return None


def _no_family(source: str, raw: dict, styles) -> str:
    """The one-line error for a config.json whose family is not read."""
    if "model_type" in raw:
        return f"{source} has model_type {raw['model_type']!r}; accepted: {', '.join(styles)}"
    archs = [a for a, t in HF_ARCHITECTURES.items() if t in styles]
    return (f"{source} has no model_type and its architectures name no family read; accepted "
            f"model_type: {', '.join(styles)}; or architectures: {', '.join(archs)}")


def config_from_hf_dict(raw, source: str = "the config", name: str | None = None,
                        styles: dict[str, str] | None = None) -> ModelConfig:
    """A :class:`ModelConfig` from a parsed config.json of a :data:`HF_STYLES` family (chapters: 1, 9).

    ``source`` names the config in the one-line errors; the model's name is the config's
    ``_name_or_path``, else ``name``, else its model_type and size. ``styles``: the families
    accepted (default :data:`HF_STYLES`).
    """
    styles = HF_STYLES if styles is None else styles
    if not isinstance(raw, dict):
        raise MemlabError(f"{source} must hold a JSON object")
    mtype = hf_model_type(raw)
    if not isinstance(mtype, str) or mtype not in styles:
        moe_families = [t for t in styles if t in HF_MOE_FIELDS]
        if mtype is None:
            raise MemlabError(_no_family(source, raw, styles))
        if moe_families and any(k in raw for k in HF_EXPERT_KEYS):  # another family's experts
            raise MemlabError(f"{source} has model_type {mtype!r}, a mixture of experts the "
                              f"book's model does not build; accepted MoE families: "
                              f"{', '.join(moe_families)} (dense: "
                              f"{', '.join(t for t in styles if t not in HF_MOE_FIELDS)})")
        raise MemlabError(_no_family(source, raw, styles))
    style = styles[mtype]
    if style == "llama":  # shapes this model cannot express are refused rather than counted wrongly
        for flag in HF_BIAS_FLAGS:
            if raw.get(flag):
                raise MemlabError(f"{source} sets {flag} to {raw[flag]!r}: biases in attention "
                                  "or MLP, which the book's Llama-style model does not have; "
                                  "accepted: false or absent")
    values, used = _hf_fields(raw, HF_FIELDS[style], source)
    C, nh, nkv = values["d_model"], values["n_head"], values.get("n_kv_head")
    if C % nh:
        raise MemlabError(f"{source}: {used['d_model']} ({C}) must be divisible by "
                          f"{used['n_head']} ({nh})")
    if nkv is not None and nh % nkv:
        raise MemlabError(f"{source}: {used['n_kv_head']} ({nkv}) must divide {used['n_head']} "
                          f"({nh})")
    if style == "llama" and raw.get("head_dim") not in (None, C // nh):
        raise MemlabError(f"{source} sets head_dim {raw['head_dim']!r}, not {used['d_model']} / "
                          f"{used['n_head']} = {C // nh}, which the book's model needs; accepted: "
                          f"{C // nh} or absent")
    if raw.get("use_sliding_window"):
        raise MemlabError(f"{source} sets use_sliding_window to {raw['use_sliding_window']!r}: "
                          f"the book's model attends to every earlier token; accepted: false or "
                          f"absent")
    own = raw.get("_name_or_path")
    if not (isinstance(own, str) and own):
        own = name or f"{mtype} ({values['n_layer']} layers, width {C})"
    return ModelConfig(name=own, style=style, **values, **HF_FIXED.get(mtype, {}),
                       moe=_hf_moe(raw, mtype, source))


def config_from_hf(path: str | Path) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (GPT-2, Llama, Mistral) from disk; never fetches (chapter: 1).

    The model is named by the config's ``_name_or_path``, else by the file's path.
    """
    path = Path(path)
    source = f"config file {str(path)!r}"
    if not path.is_file():
        raise MemlabError(f"{source} does not exist")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MemlabError(f"{source} is not valid JSON "
                          f"({exc.msg if hasattr(exc, 'msg') else exc})") from None
    return config_from_hf_dict(raw, source, name=str(path))


# Counting from the shape ---------------------------------------------------------------------
def check_dense(cfg: ModelConfig, what: str) -> ModelConfig:
    """``cfg`` if its MLPs are dense; else a one-line error: ``what`` models dense MLPs only (chapter: 9)."""
    if getattr(cfg, "moe", None) is not None:  # (the page's walk passes a stand-in config)
        raise MemlabError(f"{what} models dense MLPs; {cfg.name!r} is a mixture of experts "
                          f"({cfg.moe.experts} experts, top {cfg.moe.top_k}): trace its step "
                          f"(memlab trace) or estimate it with memlab.moe.estimate_moe instead")
    return cfg


def mlp_shapes(cfg: ModelConfig) -> list[tuple[int, ...]]:
    """Shapes of a Llama-style block's MLP parameters in ``parameters()`` order (chapters: 1, 9).

    Dense: gate, up, down. A mixture of experts (:mod:`memlab.model.moe`): the router, each
    expert's gate, up and down, the shared expert's, and its gate.
    """
    C, F = cfg.d_model, cfg.ffn_dim
    if getattr(cfg, "moe", None) is None:
        return [(F, C), (F, C), (C, F)]
    m = cfg.moe
    swiglu = [(m.d_ff, C), (m.d_ff, C), (C, m.d_ff)]
    shared = [(m.shared_d_ff, C), (m.shared_d_ff, C), (C, m.shared_d_ff)] if m.shared_d_ff else []
    return [(m.experts, C), *swiglu * m.experts, *shared, *([(1, C)] if m.shared_gate else [])]


def param_groups(cfg: ModelConfig) -> tuple[list[int], list[int], list[int]]:
    """Element counts of the parameter tensors: (embeddings, one block, head) (chapters: 1, 5).

    Tied ones are counted once.
    """
    C, F, V, kv = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.kv_heads * cfg.head_dim
    if cfg.style == "gpt2":
        embed = [V * C, cfg.max_seq_len * C]
        block = [C, C, C * C, C, C * kv, kv, C * kv, kv, C * C, C, C, C, C * F, F, F * C, C]
        head = [C, C]
    else:
        embed = [V * C]
        qkv = [C * C, C, C * kv, kv, C * kv, kv] if cfg.qkv_bias else [C * C, C * kv, C * kv]
        block = [C, *qkv, C * C, C, *(math.prod(s) for s in mlp_shapes(cfg))]
        head = [C]
    if not cfg.tied:
        head.append(V * C)
    return embed, block, head


def kv_cache_bytes(cfg: ModelConfig, *, batch_size: int, tokens: int, bytes_per_value: int = 2) -> int:
    """Bytes of a KV cache: 2 (K and V) x layers x KV heads x head size x tokens x batch (chapter: 1)."""
    return 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * tokens * batch_size * bytes_per_value
