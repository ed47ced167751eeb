"""TF32: fp32 matrix products on tensor cores, with 10 mantissa bits, on and off (chapter 2).

On Ampere and later GPUs an fp32 matrix product may round its inputs to TF32 (fp32's 8 exponent
bits, 10 mantissa bits) and use the tensor cores; ``torch.set_float32_matmul_precision("high")``
allows it, ``"highest"`` forbids it (PyTorch's default). :func:`tf32_matmul` times the same
product both ways with CUDA events and measures each one's error against the product in fp64.
A CPU has no TF32: its status says so.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from memlab.device import pick_device
from memlab.errors import check_positive_int

MODES = {"fp32": "highest", "tf32": "high"}  # what torch.set_float32_matmul_precision is given


@dataclass(frozen=True)
class Tf32Row:
    """One mode of an fp32 matrix product: its time and its error against fp64 (chapter: 2)."""

    mode: str  # "fp32" (IEEE) or "tf32"
    ms: float  # median of the timed products
    tflops: float
    max_rel_error: float  # max |C - C64| / max |C64|


@dataclass(frozen=True)
class Tf32Matmul:
    """An n x n x n fp32 product with TF32 off and on, or the reason it cannot be timed here (chapter: 2)."""

    status: str  # "measured", or why not
    device_name: str
    n: int
    rows: list[Tf32Row]

    @property
    def speedup(self) -> float | None:
        """fp32's time over TF32's (chapter: 2)."""
        by = {r.mode: r for r in self.rows}
        return by["fp32"].ms / by["tf32"].ms if len(by) == 2 else None


def tf32_matmul(n: int = 4096, *, repeats: int = 20, warmup: int = 5, device=None) -> Tf32Matmul:
    """Time and error of an fp32 product with TF32 off and on, on this GPU (chapter: 2)."""
    from memlab.device import device_name
    from memlab.measure.timing import not_measurable, time_ms

    for name, v in (("n", n), ("repeats", repeats), ("warmup", warmup)):
        check_positive_int(name, v)
    dev = pick_device(device)
    if dev.type != "cuda":
        return Tf32Matmul(not_measurable(dev, "TF32 is a mode of NVIDIA's tensor cores"),
                          device_name(dev), n, [])
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=g)
    b = torch.randn(n, n, device=dev, generator=g)
    exact = a.double() @ b.double()
    scale = exact.abs().max()
    old = torch.get_float32_matmul_precision()
    rows = []
    try:
        for mode, setting in MODES.items():
            torch.set_float32_matmul_precision(setting)
            err = float(((a @ b).double() - exact).abs().max() / scale)
            ms = statistics.median(time_ms(lambda: a @ b, warmup=warmup, repeats=repeats,
                                           device=dev))
            rows.append(Tf32Row(mode, ms, 2 * n**3 / (ms * 1e-3) / 1e12, err))
    finally:
        torch.set_float32_matmul_precision(old)
    return Tf32Matmul("measured", device_name(dev), n, rows)
