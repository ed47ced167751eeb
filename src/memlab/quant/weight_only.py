"""How a quantized layer multiplies: the dtype its matmul runs in, seen at the dispatcher (chapter: 3).

bitsandbytes' 4-bit layers (``Linear4bit``: NF4, FP4) quantize the **weight only**. For each
forward they expand the 4-bit codes and their absmax back to the compute dtype and multiply
in that dtype: the stored weight is a quarter of bf16's, the multiply-adds are the same as a
bf16 layer's. On the CPU's ``dequantize`` path the expansion writes the whole weight out in the
compute dtype and then calls ``F.linear``; bitsandbytes' CUDA kernels may instead expand the
codes tile by tile inside a fused matmul for a few tokens, still multiplying in the compute
dtype. A CPU with AVX512-BF16 may take a ``packed`` path instead (:mod:`memlab.quant.cpu_paths`):
the weight regrouped in place, and the product in bf16 whatever the compute dtype.
``Linear8bitLt`` (int8, LLM.int8()) is different: it quantizes the input too and multiplies
int8 by int8 into int32.

:func:`matmul_path` runs one layer on real tensors under a ``TorchDispatchMode`` and lists the
operators the dispatcher sees with their dtypes (measured, not traced: nothing is faked).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.quant.compare import bnb_linear
from memlab.quant.cpu_paths import CPU_PATHS, cpu_has_avx512bf16, pack, packed_reference

MATMUL_SCHEMES = ("nf4", "fp4", "nf4-dq", "int8", "llm-int8")  # bitsandbytes' own layers
COMPUTE_FORMATS = ("bf16", "fp16", "fp32")  # what a 4-bit layer may dequantize to


@dataclass(frozen=True)
class DispatchedOp:
    """One operator the dispatcher ran: its name and the dtype and shape of each tensor (chapter: 3)."""

    op: str
    inputs: tuple[str, ...]  # "dtype (shape)" of each tensor argument
    output: str

    def __str__(self) -> str:
        return f"{self.op}({', '.join(self.inputs)}) -> {self.output}"


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}"
    if isinstance(t, (tuple, list)):
        return ", ".join(_describe(x) for x in t if isinstance(x, torch.Tensor)) or "-"
    return "-"


class _OpLog(TorchDispatchMode):
    """Records every non-view operator with the dtypes of its tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[DispatchedOp] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            tensors = [a for a in list(args) + list((kwargs or {}).values())
                       if isinstance(a, torch.Tensor)]
            name = str(func).removesuffix(".default")
            self.ops.append(DispatchedOp(name, tuple(_describe(t) for t in tensors), _describe(out)))
        return out


@dataclass(frozen=True)
class MatmulPath:
    """How one bitsandbytes layer computed a forward: stored weight, compute dtype, operators (chapter: 3)."""

    scheme: str
    compute_dtype: str  # 4-bit: the dtype the input is cast to and the matmul runs in
    stored_bytes: int  # the weight as stored: codes and absmax (and the second level's)
    ops: list[DispatchedOp]  # what the dispatcher ran, views left out
    dequantized_dtype: str | None  # 4-bit: the weight as the matmul reads it
    dequantized_bytes: int | None  # its bytes (the bf16 weight's bytes in bf16)
    equals_dequantize_then_linear: bool | None  # 4-bit: output == F.linear(x, dequantized W)
    cpu_path: str | None = None  # 4-bit: "dequantize" or "packed" (memlab.quant.cpu_paths)
    kernel: str | None = None  # 4-bit packed: "bitsandbytes" or "reference" (no AVX512-BF16 here)
    max_abs_diff: float | None = None  # 4-bit packed: |output - the dequantize path's output|, max

    def summary(self) -> str:
        """A few lines: stored bytes, the CPU path, what the matmul read, and the operators (chapter: 3)."""
        lines = [f"{self.scheme}: weight stored in {self.stored_bytes:,} bytes"]
        if self.cpu_path == "packed":
            lines[0] += f"; compute dtype {self.compute_dtype}; CPU path packed"
            by = ("bitsandbytes' AVX512-BF16 kernel" if self.kernel == "bitsandbytes"
                  else "memlab's reference of that kernel (this CPU lacks AVX512-BF16)")
            lines.append(f"  weight regrouped in tiles of 32 rows, absmax rounded to bf16, product "
                         f"in bf16 by {by}; largest difference from the dequantize path: "
                         f"{self.max_abs_diff:.3g}")
        elif self.dequantized_dtype is not None:
            lines[0] += f"; compute dtype {self.compute_dtype}; CPU path dequantize"
            lines.append(f"  the matmul reads the weight as {self.dequantized_dtype}, "
                         f"{self.dequantized_bytes:,} bytes; output equals F.linear(x, "
                         f"dequantized weight): {self.equals_dequantize_then_linear}")
        lines += [f"  {op}" for op in self.ops]
        return "\n".join(lines)


@torch.no_grad()
def matmul_path(linear: nn.Linear, scheme: str = "nf4", *, compute_dtype: str = "bf16",
                tokens: int = 8, seed: int = 0, cpu_path: str = "dequantize") -> MatmulPath:
    """Run ``linear`` as bitsandbytes' ``scheme`` layer on the CPU (chapter: 3).

    It records how the layer multiplies.

    ``compute_dtype`` is the 4-bit layer's (``bf16``, ``fp16``, ``fp32``); the input is
    ``tokens`` random rows in that dtype. ``cpu_path`` picks the 4-bit layer's CPU path
    (:mod:`memlab.quant.cpu_paths`): ``dequantize``, the same on every CPU, whose output is
    compared with ``F.linear`` of the input and the weight dequantized by bitsandbytes; or
    ``packed``, the AVX512-BF16 path, whose output is compared with the dequantize path's
    (bitsandbytes' kernel where this CPU has the instruction set, else
    :func:`~memlab.quant.cpu_paths.packed_reference`). ``linear`` itself is never changed.
    """
    check_choice("scheme", scheme, MATMUL_SCHEMES)
    check_choice("compute_dtype", compute_dtype, COMPUTE_FORMATS)
    check_choice("cpu_path", cpu_path, CPU_PATHS)
    check_positive_int("tokens", tokens)
    if not isinstance(linear, nn.Linear):
        raise MemlabError(f"linear must be an nn.Linear, got {type(linear).__name__}")
    four_bit = scheme in ("nf4", "fp4", "nf4-dq")
    if cpu_path == "packed" and not four_bit:
        raise MemlabError(f"cpu_path 'packed' is a 4-bit layer's; scheme {scheme!r} has one "
                          "CPU path, accepted: dequantize")
    from memlab.quant.compare import layer_bytes

    dtype = to_dtype(compute_dtype, COMPUTE_FORMATS)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, linear.in_features, generator=g).to(dtype)  # (N, in)

    def layer(path: str) -> nn.Module:  # a fresh bitsandbytes layer: the caller's stays as it is
        lin = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        lin.load_state_dict({k: v.detach().float().cpu() for k, v in linear.state_dict().items()})
        return bnb_linear(lin, scheme, torch.device("cpu"), compute_dtype=dtype, cpu_path=path)

    m = layer("dequantize")
    stored = layer_bytes(m, linear.weight.numel()).weight_bytes
    log = _OpLog()
    with log:
        y = m(x)  # (N, out)
    if not four_bit:
        return MatmulPath(scheme, compute_dtype, stored, log.ops, None, None, None)
    import bitsandbytes.functional as bnbf

    w = bnbf.dequantize_4bit(m.weight.data, m.weight.quant_state).to(dtype)  # (out, in)
    bias = None if m.bias is None else m.bias.to(dtype)
    dq_dtype, dq_bytes = str(w.dtype).removeprefix("torch."), w.numel() * w.element_size()
    if cpu_path == "dequantize":
        return MatmulPath(scheme, compute_dtype, stored, log.ops, dq_dtype, dq_bytes,
                          torch.equal(y, F.linear(x, w, bias)), cpu_path="dequantize")
    p = layer("packed")
    kernel = "bitsandbytes" if cpu_has_avx512bf16() else "reference"
    log = _OpLog()
    if kernel == "bitsandbytes":
        with log:
            y_packed = p(x)  # bitsandbytes packs the weight here, then runs its fused kernel
    else:
        pack(p)
        with log:
            y_packed = packed_reference(x, p)
    return MatmulPath(scheme, compute_dtype, stored, log.ops, None, None, None,
                      cpu_path="packed", kernel=kernel,
                      max_abs_diff=float((y_packed.float() - y.float()).abs().max()))
