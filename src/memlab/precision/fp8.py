"""fp8 on a GPU: an e4m3 matmul through ``torch._scaled_mm`` against bf16 (chapter: 2).

Timed and checked.

:func:`fp8_matmul` needs a CUDA GPU of compute capability 8.9 or newer; elsewhere it returns a
result whose ``status`` says why nothing was measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from memlab.device import device_name, pick_device
from memlab.errors import MemlabError, check_positive_int
from memlab.measure.timing import not_measurable, time_ms


@dataclass(frozen=True)
class Fp8Matmul:
    """An fp8 (e4m3) matmul through ``torch._scaled_mm`` against bf16, timed and checked against fp64."""

    status: str  # 'measured on <GPU>' or 'not measurable on <device>: <reason>'
    device: str
    m: int
    n: int
    k: int
    fp8_ms: float | None = None  # median over the timed repeats, CUDA events
    bf16_ms: float | None = None
    fp8_tflops: float | None = None  # 2 m n k / time
    bf16_tflops: float | None = None
    speedup: float | None = None  # bf16_ms / fp8_ms
    fp8_rel_error: float | None = None  # ||C - C_ref||_F / ||C_ref||_F, C_ref in fp64
    bf16_rel_error: float | None = None
    repeats: int = 0

    def table(self) -> str:
        """The status, and where measured the times, TFLOP/s and errors, as text (chapter: 2)."""
        lines = [f"fp8 (e4m3) vs bf16 matmul, {self.m} x {self.k} x {self.n}: {self.status}"]
        if self.fp8_ms is not None:
            lines += [
                f"fp8  {self.fp8_ms:.3f} ms, {self.fp8_tflops:.1f} TFLOP/s, relative error "
                f"{self.fp8_rel_error:.2e}",
                f"bf16 {self.bf16_ms:.3f} ms, {self.bf16_tflops:.1f} TFLOP/s, relative error "
                f"{self.bf16_rel_error:.2e}",
                f"fp8 is {self.speedup:.2f}x the speed of bf16 (median of {self.repeats})",
            ]
        return "\n".join(lines)


def fp8_matmul(m: int = 8192, n: int = 8192, k: int = 8192, *, repeats: int = 20,
               warmup: int = 5, device=None) -> Fp8Matmul:
    """Time ``torch._scaled_mm`` on float8_e4m3fn against bf16 (chapter: 2).

    It gives ``fp8_tflops``, ``bf16_tflops`` and relative errors.

    Inputs are standard-normal, scaled per tensor so their largest magnitude maps to e4m3's
    448; the second operand is column-major, as ``_scaled_mm`` requires; the output is bf16.
    Needs a CUDA GPU of compute capability 8.9 or newer; elsewhere ``status`` says why not.
    """
    for what, v in (("m", m), ("n", n), ("k", k), ("repeats", repeats)):
        check_positive_int(what, v)
        if what != "repeats" and v % 16:
            raise MemlabError(f"fp8 matmul {what} must be a multiple of 16, got {v}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    dev = pick_device(device)
    base = dict(device=dev.type, m=m, n=n, k=k)
    if dev.type != "cuda":
        return Fp8Matmul(status=not_measurable(
            dev, "fp8 matmuls (torch._scaled_mm) are timed with CUDA events on a GPU of compute "
                 "capability 8.9 or newer"), **base)
    cc = torch.cuda.get_device_capability(dev)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if cc < (8, 9) or fp8 is None or not hasattr(torch, "_scaled_mm"):
        return Fp8Matmul(status=not_measurable(
            dev, f"compute capability {cc[0]}.{cc[1]} has no fp8 tensor cores (8.9 or newer "
                 "needed)"), **base)
    from memlab.device import refuse_if_too_big

    # a, b in fp32 and fp64 references, fp8 and bf16 copies, fp64 output: about 30 bytes/element.
    refuse_if_too_big(30 * (m * k + k * n + m * n), dev, f"an fp8 matmul of {m}x{k}x{n}")
    a, b, a8, b8, scale_a, scale_b = _fp8_operands(m, n, k, dev)
    a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)  # b16 keeps b's column-major layout

    def run_fp8():
        return _fp8_mm(a8, b8, scale_a, scale_b)

    def run_bf16():
        return a16 @ b16

    try:
        c8 = run_fp8()
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Fp8Matmul(status=not_measurable(dev, f"torch._scaled_mm failed ({msg})"), **base)
    ref = a.double() @ b.double()
    fp8_err, bf16_err = _rel_error(c8, ref), _rel_error(run_bf16(), ref)
    del ref, c8
    fp8_ms = statistics.median(time_ms(run_fp8, warmup=warmup, repeats=repeats, device=dev))
    bf16_ms = statistics.median(time_ms(run_bf16, warmup=warmup, repeats=repeats, device=dev))
    flop = 2 * m * n * k
    return Fp8Matmul(status=f"measured on {device_name(dev)}", fp8_ms=fp8_ms, bf16_ms=bf16_ms,
                     fp8_tflops=flop / (fp8_ms * 1e-3) / 1e12,
                     bf16_tflops=flop / (bf16_ms * 1e-3) / 1e12, speedup=bf16_ms / fp8_ms,
                     fp8_rel_error=fp8_err, bf16_rel_error=bf16_err, repeats=repeats, **base)


def _fp8_operands(m: int, n: int, k: int, dev: torch.device):
    """Standard-normal a (m, k) row-major and b (k, n) column-major, their e4m3 copies and scales.

    Per-tensor scaling: x8 = x / s with s = amax(x) / 448 (e4m3's largest value), so the
    dequantized value is x8 * s; ``_scaled_mm`` takes these s as ``scale_a`` and ``scale_b``.
    """
    fp8 = torch.float8_e4m3fn
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(m, k, device=dev, generator=g)  # row-major (m, k)
    b = torch.randn(n, k, device=dev, generator=g).t()  # (k, n), column-major
    fmax = torch.finfo(fp8).max
    scale_a = (a.abs().max() / fmax).float()  # 0-d fp32 tensors on the device
    scale_b = (b.abs().max() / fmax).float()
    a8 = (a / scale_a).to(fp8)
    b8 = (b.t() / scale_b).to(fp8).t()  # cast the row-major (n, k), then view it as (k, n)
    return a, b, a8, b8, scale_a, scale_b


def _fp8_mm(a8, b8, scale_a, scale_b) -> torch.Tensor:
    """``a8 @ b8`` on fp8 inputs with their dequantization scales, bf16 out (torch 2.13 signature)."""
    return torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)


def _rel_error(c: torch.Tensor, ref: torch.Tensor) -> float:
    """||c - ref||_F / ||ref||_F, in fp64."""
    return float(torch.linalg.vector_norm(c.double() - ref) / torch.linalg.vector_norm(ref))
