"""QLoRA (Dettmers et al. 2023, arXiv:2305.14314): a frozen 4-bit base, LoRA adapters on top.

The base's block linears become bitsandbytes' ``Linear4bit`` (NF4, with double quantization of
the block scales for ``nf4-dq``); each dequantizes its weight to ``compute_dtype`` and multiplies
there. The adapters stay in fp32, as peft keeps them. Chapter 3 builds NF4 and double
quantization from scratch; here the lesson is the memory, so the real layers are used.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from memlab.errors import check_choice
from memlab.finetune.lora import LoraConfig, LoraLinear, inject_lora
from memlab.model.transformer import block_linears, replace_module
from memlab.quant.compare import bnb_linear

BASE_SCHEMES = ("nf4", "nf4-dq", "fp4", "int8")  # what a frozen base can be stored in


def compute_dtype_for(device: torch.device) -> torch.dtype:
    """QLoRA's compute dtype: bf16 on a GPU, fp32 on a CPU (chapter: 5).

    On a CPU a 16-bit 4-bit backward is far slower.
    """
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def quantize_base(model: nn.Module, scheme: str = "nf4-dq", *,
                  compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every block linear by bitsandbytes' layer of ``scheme`` (chapter: 5).

    Each is frozen, on the model's device.

    A ``Linear4bit`` quantizes its weight when it is moved to its device (``.to(device)``,
    ``"cpu"`` included) before its first forward; unmoved, it would run on the full-precision
    weight. ``compute_dtype`` defaults to :func:`compute_dtype_for` the device.
    """
    check_choice("base quantization", scheme, BASE_SCHEMES)
    device = next(model.parameters()).device
    compute_dtype = compute_dtype or compute_dtype_for(device)
    for name, lin in block_linears(model).items():
        replace_module(model, name, bnb_linear(lin, scheme, device, compute_dtype).train())
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def qlora(model: nn.Module, lora: LoraConfig, scheme: str = "nf4-dq", *,
          compute_dtype: torch.dtype | None = None) -> dict[str, LoraLinear]:
    """A 4-bit (or 8-bit) frozen base with LoRA adapters on the targeted linears (chapter: 5)."""
    quantize_base(model, scheme, compute_dtype=compute_dtype)
    layers = inject_lora(model, lora)
    model.train()
    return layers
