"""FLOPs of attention as PyTorch's own counter sees them, with the CPU kernel's formula added.

``torch.utils.flop_counter.FlopCounterMode`` counts 0 FLOPs for SDPA on a CPU; the formulas
for that kernel are registered by :func:`memlab.measure.flops.register_cpu_sdpa_flops` (one
place for every part that counts FLOPs) before counting.
"""

from __future__ import annotations

import torch

from memlab.measure.flops import register_cpu_sdpa_flops


def attention_flops(fn, *args, backward: bool = True, **kwargs) -> dict[str, int]:
    """FLOPs that FlopCounterMode counts for ``fn(*args, **kwargs)``, forward and backward (chapter: 4)."""
    from torch.utils.flop_counter import FlopCounterMode

    register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as fwd:
        out = fn(*args, **kwargs)
    counts = {"forward": fwd.get_total_flops()}
    if backward:
        with FlopCounterMode(display=False) as bwd:
            out.backward(torch.ones_like(out))
        counts["backward"] = bwd.get_total_flops()
    return counts
