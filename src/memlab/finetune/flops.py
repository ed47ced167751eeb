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
