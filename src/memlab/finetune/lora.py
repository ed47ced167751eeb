"""LoRA from scratch, in peft's shape (Hu et al. 2021, arXiv:2106.09685).

A frozen linear layer W (out x in) gets a trainable low-rank update: y = x W^T + b +
(alpha / r) * dropout(x) A^T B^T, with A (r x in) drawn like a linear layer's weight and B (out x r)
zero, so the model starts exactly where the base model is. ``merge`` folds B A (alpha / r) into W
(no extra work at inference), ``unmerge`` takes it out again, and :func:`adapters_disabled`
switches every adapter off: the base model, without a second copy of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.errors import MemlabError, check_positive_int
from memlab.model.transformer import block_linears, replace_module

ALL_LINEAR = "all-linear"  # peft's spelling: every linear layer of the blocks


@dataclass(frozen=True)
class LoraConfig:
    """Rank, scale, dropout and the linear layers LoRA adapts, by module name (chapter: 5)."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = ("q_proj", "v_proj")  # names, or "all-linear"

    def __post_init__(self) -> None:
        check_positive_int("LoRA rank r", self.r)
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) \
                or not 0 < self.alpha < math.inf:
            raise MemlabError(f"LoRA alpha must be a positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) \
                or not 0 <= self.dropout < 1:
            raise MemlabError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, str):
            if targets.strip() == ALL_LINEAR:
                targets = ALL_LINEAR
            else:  # the command line's spelling: comma-separated names
                targets = tuple(t.strip() for t in targets.split(",") if t.strip())
        elif isinstance(targets, (list, tuple)):
            targets = tuple(targets)
        else:
            targets = ()
        if not targets or (not isinstance(targets, str)
                           and not all(isinstance(t, str) and t for t in targets)):
            raise MemlabError(f"LoRA target_modules must name module names or {ALL_LINEAR!r}, "
                              f"got {self.target_modules!r}")
        object.__setattr__(self, "target_modules", targets)

    @property
    def scaling(self) -> float:
        """alpha / r: the factor on B A (chapter: 5)."""
        return self.alpha / self.r

    def selects(self, name: str) -> bool:
        """Whether the block linear at qualified ``name`` gets an adapter (chapter: 5).

        It is matched on its last name part.
        """
        return self.target_modules == ALL_LINEAR or name.rsplit(".", 1)[-1] in self.target_modules


def lora_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 A: torch.Tensor, B: torch.Tensor, scaling: float) -> torch.Tensor:
    """x W^T + b + scaling * (x A^T) B^T: a frozen linear layer plus its low-rank update (chapter: 5)."""
    return F.linear(x, weight, bias) + F.linear(F.linear(x, A), B) * scaling  # (..., out)


class LoraLinear(nn.Module):
    """A frozen linear layer with a LoRA adapter; ``merged`` and ``disabled`` say how it runs (chapter: 5)."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        LoraConfig(r=r, alpha=alpha, dropout=dropout)  # the same checks, one line each
        out_features, in_features = base.out_features, base.in_features  # a 4-bit weight is packed
        self.base = base
        self.r, self.scaling = r, alpha / r
        dev = base.weight.device
        # Adapters in fp32 whatever the base's format (16-bit, 4-bit), as peft keeps them
        # (get_peft_model's autocast_adapter_dtype): small, and updated in full precision.
        self.lora_A = nn.Linear(in_features, r, bias=False, device=dev, dtype=torch.float32)
        self.lora_B = nn.Linear(r, out_features, bias=False, device=dev, dtype=torch.float32)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # as nn.Linear and peft
        nn.init.zeros_(self.lora_B.weight)  # the update starts at zero
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False
        self.disabled = False
        for p in self.base.parameters():
            p.requires_grad_(False)

    def delta_weight(self) -> torch.Tensor:
        """B A * scaling, the update as an (out, in) matrix, fp32 (chapter: 5)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def forward(self, x):
        y = self.base(x)  # (..., out)
        if self.merged or self.disabled:
            return y
        a = self.lora_A(self.dropout(x.to(self.lora_A.weight.dtype)))  # (..., r)
        return (y + self.lora_B(a) * self.scaling).to(y.dtype)  # added in fp32, as peft adds

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into the base weight (chapter: 5)."""
        if not self.base.weight.dtype.is_floating_point:
            raise MemlabError(f"cannot merge into a quantized base ({type(self.base).__name__}, "
                              f"{self.base.weight.dtype}): dequantize it first, or keep the "
                              "adapters separate")
        if not self.merged:
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """Take the update out of the base weight again (chapter: 5)."""
        if self.merged:
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False


def lora_layers(model: nn.Module) -> dict[str, LoraLinear]:
    """The model's LoRA layers by qualified name (chapter: 5)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLinear)}


def inject_lora(model: nn.Module, config: LoraConfig) -> dict[str, LoraLinear]:
    """Freeze the model and wrap every targeted block linear in a :class:`LoraLinear` (chapter: 5).

    It returns them by name.
    """
    if not isinstance(config, LoraConfig):
        raise MemlabError(f"config must be a LoraConfig, got {type(config).__name__}")
    if lora_layers(model):
        raise MemlabError("the model has LoRA adapters already: inject into a fresh model")
    linears = block_linears(model)
    available = sorted({n.rsplit(".", 1)[-1] for n in linears})
    if config.target_modules != ALL_LINEAR:
        unknown = [t for t in config.target_modules if t not in available]
        if unknown:
            raise MemlabError(f"unknown LoRA target module {unknown[0]!r}; accepted: "
                              f"{', '.join(available)}, {ALL_LINEAR}")
    for p in model.parameters():
        p.requires_grad_(False)
    out = {}
    for name, lin in linears.items():
        if config.selects(name):
            out[name] = LoraLinear(lin, config.r, config.alpha, config.dropout)
            replace_module(model, name, out[name])
    return out


def merge_lora(model: nn.Module) -> None:
    """Merge every adapter into its base weight (chapter: 5)."""
    for m in lora_layers(model).values():
        m.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Take every merged adapter out of its base weight (chapter: 5)."""
    for m in lora_layers(model).values():
        m.unmerge()


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """Run the base model: every adapter off inside the block, as peft's ``disable_adapter`` (chapter: 5)."""
    layers = list(lora_layers(model).values())
    before = [(m.disabled, m.merged) for m in layers]
    for m in layers:
        m.unmerge()  # a merged update is in the base weight: take it out first, as peft does
        m.disabled = True
    try:
        yield model
    finally:
        for m, (disabled, merged) in zip(layers, before, strict=True):
            m.disabled = disabled
            if merged:
                m.merge()
