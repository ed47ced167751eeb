"""Quantization from scratch: pure functions that return ``(q, state)`` (chapters: 2, 3).

Chapter 2 uses symmetric absmax quantization to show what "pi in int8" means once a scale is
involved; chapter 3 builds the other schemes on the same pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memlab.errors import MemlabError, check_positive_int


@dataclass(frozen=True)
class AbsmaxState:
    """What dequantization needs: the scale (max|x| over the block) and the code range."""

    absmax: torch.Tensor  # float32, one per block (a 0-d tensor for per-tensor)
    bits: int
    qmax: int  # the largest code: 2^(bits-1) - 1, e.g. 127 for 8 bits


def _as_tensor(x) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float32)
    if not t.is_floating_point():
        t = t.float()
    if not torch.isfinite(t).all():
        raise MemlabError("absmax quantization needs finite values (got inf or NaN)")
    return t


def absmax_quantize(x, bits: int = 8) -> tuple[torch.Tensor, AbsmaxState]:
    """Symmetric per-tensor absmax: q = round(qmax * x / max|x|), codes in [-qmax, qmax] (chapters: 2, 3)."""
    check_positive_int("bits", bits)
    if not 2 <= bits <= 8:
        raise MemlabError(f"bits must be between 2 and 8 for int8 storage, got {bits}")
    t = _as_tensor(x).float()
    qmax = 2 ** (bits - 1) - 1
    absmax = t.abs().max()
    scale = torch.where(absmax > 0, qmax / absmax, torch.ones_like(absmax))
    q = torch.round(t * scale).clamp(-qmax, qmax).to(torch.int8)  # round half to even
    return q, AbsmaxState(absmax=absmax, bits=bits, qmax=qmax)


def dequantize(q: torch.Tensor, state: AbsmaxState) -> torch.Tensor:
    """The float32 values the codes ``q`` stand for: q * absmax / qmax (chapters: 2, 3)."""
    if not isinstance(state, AbsmaxState):
        raise MemlabError(f"state must be an AbsmaxState, got {type(state).__name__}")
    return q.float() * (state.absmax / state.qmax)
