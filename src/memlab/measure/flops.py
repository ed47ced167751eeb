"""FLOP counting with PyTorch's own counter, and the one formula it lacks on a CPU.

``torch.utils.flop_counter.FlopCounterMode`` has formulas for the CUDA SDPA kernels (flash,
memory-efficient, cuDNN) but none for the CPU one (``aten._scaled_dot_product_flash_attention_for_cpu``
and its backward), so it counts 0 FLOPs for SDPA on a CPU. :func:`register_cpu_sdpa_flops`
registers torch's own SDPA formulas for that kernel, once per process, for every part that
counts FLOPs (chapters 4, 5, 7). Like torch's formulas for the CUDA kernels, they count the full
T x S score matrix, causal or not.
"""

from __future__ import annotations

import torch

CPU_SDPA_OPS = ("_scaled_dot_product_flash_attention_for_cpu",
                "_scaled_dot_product_flash_attention_for_cpu_backward")


def register_cpu_sdpa_flops() -> list[str]:
    """Register torch's SDPA FLOP formulas for the CPU kernel (chapters: 4, 5).

    It returns the op names newly registered.
    """
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
