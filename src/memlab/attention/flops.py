"""FLOPs of attention as PyTorch's own counter sees them, with the CPU kernel's formula added.

``torch.utils.flop_counter.FlopCounterMode`` has formulas for the CUDA SDPA kernels (flash,
memory-efficient, cuDNN) but none for the CPU one (``aten._scaled_dot_product_flash_attention_for_cpu``
and its backward), so it counts 0 FLOPs for SDPA on a CPU. :func:`register_cpu_sdpa_flops`
registers torch's own SDPA formulas for that kernel, once per process. Like torch's formulas
for the CUDA kernels, they count the full T x S score matrix, causal or not.
"""

from __future__ import annotations

import torch

CPU_SDPA_OPS = ("_scaled_dot_product_flash_attention_for_cpu",
                "_scaled_dot_product_flash_attention_for_cpu_backward")


def register_cpu_sdpa_flops() -> list[str]:
    """Register torch's SDPA FLOP formulas for the CPU kernel; the op names newly registered (chapter: 4)."""
    from torch.utils import flop_counter as fc

    formulas = {CPU_SDPA_OPS[0]: fc.sdpa_flop, CPU_SDPA_OPS[1]: fc.sdpa_backward_flop}
    added = []
    for name, formula in formulas.items():
        op = getattr(torch.ops.aten, name, None)
        if op is None or op in fc.flop_registry:
            continue  # another torch: no such kernel, or it has a formula already
        fc.register_flop_formula(op, get_raw=True)(formula)  # already shape-wrapped by torch
        added.append(name)
    return added


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
