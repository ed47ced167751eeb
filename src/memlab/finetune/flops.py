"""FLOPs of one training step by PyTorch's counter: what freezing and LoRA remove, and what they keep.

A linear layer's backward has two matrix products: the gradient of its input (needed by every
layer before it, frozen or not) and the gradient of its weight (needed only if it trains).
Freezing removes the second; the first stays wherever a trainable layer lies below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class StepFlops:
    """Forward and backward FLOPs of one step, counted by ``FlopCounterMode`` (chapter: 5)."""

    forward: int
    backward: int

    @property
    def total(self) -> int:
        """Forward plus backward."""
        return self.forward + self.backward

    @property
    def backward_over_forward(self) -> float:
        """Backward over forward: 2 when every weight trains, less when some are frozen."""
        return self.backward / self.forward


def step_flops(model: nn.Module, idx: torch.Tensor) -> StepFlops:
    """FLOPs of the forward and of the backward of ``model(idx)``'s squared-mean loss (chapter: 5)."""
    from torch.utils.flop_counter import FlopCounterMode

    from memlab.measure.flops import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()  # else the CPU's attention kernel counts 0
    with FlopCounterMode(display=False) as fwd:
        loss = model(idx).float().pow(2).mean()
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    return StepFlops(fwd.get_total_flops(), bwd.get_total_flops())


@dataclass(frozen=True)
class FlopsRow:
    """One set-up's counted FLOPs per step (chapter: 5)."""

    name: str
    trainable_parameters: int
    flops: StepFlops


@dataclass(frozen=True)
class FlopsTable:
    """FLOPs per step of full fine-tuning, frozen blocks and LoRA on one model (chapter: 5)."""

    model: str
    batch_size: int
    seq_len: int
    rows: tuple[FlopsRow, ...]

    def row(self, name: str) -> FlopsRow:
        """The row of the set-up called ``name`` (chapter: 5)."""
        from memlab.finetune.compare import rows_named

        return rows_named(self.rows, name)[0]


def flops_table(model: str = "tiny", *, batch_size: int = 2, seq_len: int = 32,
                setups=None, frozen_by: str = "requires_grad") -> FlopsTable:
    """Forward and backward FLOPs of a step for each set-up, eager attention, counted (chapter: 5).

    ``frozen_by="optimizer"`` freezes as some training scripts do, by leaving the weights out of
    the optimizer: their ``requires_grad`` stays on, so autograd still computes their gradients.
    """
    import copy

    from memlab.errors import check_choice
    from memlab.finetune.compare import SETUPS

    check_choice("frozen_by", frozen_by, ("requires_grad", "optimizer"))
    from memlab.finetune.freeze import count_trainable
    from memlab.model.config import get_config
    from memlab.model.transformer import Transformer

    cfg = get_config(model, attention="eager")  # every matmul visible to the counter
    torch.manual_seed(0)
    base = Transformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (batch_size, seq_len),
                        generator=torch.Generator().manual_seed(0))
    chosen = [s for s in (setups or SETUPS) if s.quantize_base is None]
    rows = []
    for s in chosen:
        m = copy.deepcopy(base)
        s.prepare(m)
        trainable = count_trainable(m)
        if frozen_by == "optimizer":
            m.requires_grad_(True)
        rows.append(FlopsRow(s.name, trainable, step_flops(m, idx)))
    return FlopsTable(cfg.name, batch_size, seq_len, tuple(rows))
