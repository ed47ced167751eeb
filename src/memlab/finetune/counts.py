"""Trainable parameters from a configuration alone: full, frozen, LoRA (no weights are built)."""

from __future__ import annotations

from memlab.errors import MemlabError, check_positive_int
from memlab.finetune.lora import LoraConfig
from memlab.model.config import ModelConfig, check_dense, get_config


def block_linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int, bool]]:
    """(in features, out features, bias) of each linear layer in one block, by module name (chapter: 5)."""
    check_dense(cfg, "fine-tuning")
    C, F, kv = cfg.d_model, cfg.ffn_dim, cfg.kv_heads * cfg.head_dim
    q = cfg.n_head * cfg.head_dim
    bias = cfg.style == "gpt2"
    out = {"q_proj": (C, q, bias), "k_proj": (C, kv, bias), "v_proj": (C, kv, bias),
           "o_proj": (q, C, bias)}
    if cfg.style == "gpt2":
        out |= {"up_proj": (C, F, True), "down_proj": (F, C, True)}
    else:
        out |= {"gate_proj": (C, F, False), "up_proj": (C, F, False), "down_proj": (F, C, False)}
    return out


def block_parameters(cfg: ModelConfig) -> int:
    """Parameters of one block: its linear layers and its norms (chapter: 5)."""
    lin = sum(i * o + (o if b else 0) for i, o, b in block_linear_shapes(cfg).values())
    norms = 2 * 2 * cfg.d_model if cfg.style == "gpt2" else 2 * cfg.d_model
    return lin + norms


def adapted_linears(cfg: ModelConfig, lora: LoraConfig) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear of a block that LoRA adapts, by name (chapter: 5).

    An unknown target is refused.
    """
    shapes = block_linear_shapes(cfg)
    if lora.target_modules != "all-linear":
        unknown = [t for t in lora.target_modules if t not in shapes]
        if unknown:
            raise MemlabError(f"unknown LoRA target module {unknown[0]!r}; accepted: "
                              f"{', '.join(shapes)}, all-linear")
    return {name: (i, o) for name, (i, o, _) in shapes.items() if lora.selects(name)}


def lora_parameters(cfg: ModelConfig, lora: LoraConfig) -> int:
    """Adapter parameters: r x (in + out) for every targeted linear of every block (chapter: 5)."""
    return cfg.n_layer * sum(lora.r * (i + o) for i, o in adapted_linears(cfg, lora).values())


def trainable_parameters(model: ModelConfig | str, *, lora: LoraConfig | None = None,
                         train_last: int | None = None) -> int:
    """Parameters a fine-tuning set-up trains (chapter: 5).

    All of them, the last ``train_last`` blocks, or LoRA's adapters.
    """
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    if lora is not None and not isinstance(lora, LoraConfig):
        raise MemlabError(f"lora must be a LoraConfig, got {type(lora).__name__}")
    if lora is not None and train_last is not None:
        raise MemlabError("choose LoRA or training the last blocks, not both")
    if lora is not None:
        return lora_parameters(cfg, lora)
    if train_last is not None:
        check_positive_int("train_last", train_last)
        if train_last > cfg.n_layer:
            raise MemlabError(f"train_last ({train_last}) exceeds the model's {cfg.n_layer} blocks")
        return train_last * block_parameters(cfg)
    return cfg.num_parameters()
