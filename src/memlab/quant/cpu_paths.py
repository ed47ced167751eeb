"""bitsandbytes' two CPU paths for a 4-bit layer, chosen by CPU feature (chapter: 3).

And how to force each.

On the CPU, bitsandbytes' ``Linear4bit`` multiplies in one of two ways:

* ``dequantize``: the codes and their absmax are expanded to the compute dtype and multiplied
  with ``F.linear`` (``bitsandbytes::gemm_4bit``). Every CPU can take it, and its output is bit
  for bit ``F.linear`` of the input and the dequantized weight.
* ``packed``: on a CPU with AVX512-BF16 (AMD Zen 4, Intel Sapphire Rapids and later), the first
  forward in eval mode without gradients **rewrites the layer's weight in place**: the 4-bit
  codes are regrouped in tiles of 32 output rows (``_convert_weight_packed_for_cpu``, which
  asserts that the output features are a multiple of 32), the absmax is rounded to bf16 (a
  double-quantized absmax is expanded first), and a fused kernel
  (``bitsandbytes::gemv_4bit``) multiplies in bf16 whatever the compute dtype.

bitsandbytes decides per layer from ``Linear4bit.support_avx512bf16_for_cpu``, which it sets from
``has_avx512bf16()``. :func:`use_cpu_path` sets that flag, so memlab's 4-bit layers take the
``dequantize`` path on every CPU unless asked otherwise: the same arithmetic everywhere, and the
arithmetic of bitsandbytes' CUDA layers (dequantize, then multiply in the compute dtype).

:func:`packed_reference` is the packed path's arithmetic written in torch (unpack the tiles,
dequantize with the bf16 absmax, multiply bf16 inputs by bf16 weights with fp32 sums). On a CPU
without AVX512-BF16 it stands in for the fused kernel, which would stop there with an illegal
instruction; on a CPU with it, the tests hold it to the kernel.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from memlab.errors import MemlabError, check_choice, require

CPU_PATHS = ("dequantize", "packed")
PACK_BLOCK_N = 32  # output rows per tile of the packed layout (bitsandbytes' block_n)


def cpu_has_avx512bf16() -> bool:
    """Whether bitsandbytes finds AVX512-BF16 on this CPU (its own test, ``has_avx512bf16``) (chapter: 3)."""
    bnb = require("bitsandbytes", "bitsandbytes' CPU paths", extra="quant")
    return bool(bnb.functional.has_avx512bf16())


def packable(out_features: int, in_features: int) -> bool:
    """Whether bitsandbytes' packed layout can hold a weight of this shape (chapter: 3).

    The tiles are 32 output rows by pairs of input columns: ``out_features`` a multiple of 32,
    ``in_features`` even.
    """
    return out_features % PACK_BLOCK_N == 0 and in_features % 2 == 0


def bnb_default_path() -> str:
    """The path bitsandbytes' ``Linear4bit`` takes on this CPU in eval mode without gradients (chapter: 3).

    ``packed`` on a CPU with AVX512-BF16, else ``dequantize``, whatever the layer's shape: on
    such a CPU a layer the packed layout cannot hold stops with bitsandbytes' assertion ("N
    must be divisible by block_n").
    """
    return "packed" if cpu_has_avx512bf16() else "dequantize"


def use_cpu_path(module: nn.Module, path: str = "dequantize") -> nn.Module:
    """Set which CPU path every bitsandbytes 4-bit layer in ``module`` takes (chapter: 3).

    It returns ``module``.

    ``dequantize`` works on every CPU and shape. ``packed`` needs every 4-bit layer's shape to
    fit the packed layout (:func:`packable`); it is refused in one line otherwise. On a CPU
    without AVX512-BF16 a packed layer cannot run bitsandbytes' kernel:
    :func:`memlab.quant.weight_only.matmul_path` computes its product with
    :func:`packed_reference` there.
    """
    check_choice("CPU path", path, CPU_PATHS)
    bnb = require("bitsandbytes", "bitsandbytes' CPU paths", extra="quant")
    layers = [m for m in module.modules() if isinstance(m, bnb.nn.Linear4bit)]
    if path == "packed":
        for m in layers:
            if not packable(m.out_features, m.in_features):
                raise MemlabError(
                    f"the packed CPU path needs out_features a multiple of {PACK_BLOCK_N} and "
                    f"in_features even; this layer is {m.out_features} x {m.in_features}; "
                    "accepted path for it: dequantize")
    for m in layers:
        m.support_avx512bf16_for_cpu = path == "packed"
    return module


def is_packed(layer: nn.Module) -> bool:
    """Whether a 4-bit layer's weight is in bitsandbytes' packed CPU layout now (chapter: 3)."""
    state = getattr(getattr(layer, "weight", None), "quant_state", None)
    return bool(getattr(state, "packing_format_for_cpu", False))


def pack(layer: nn.Module) -> None:
    """Rewrite a 4-bit layer's weight in the packed CPU layout, as bitsandbytes' forward does (chapter: 3).

    bitsandbytes' own conversion (``_convert_weight_packed_for_cpu``), called where its forward
    would call it; it is plain torch, so it runs on any CPU.
    """
    bnbf = require("bitsandbytes.functional", "bitsandbytes' packed CPU layout", extra="quant")
    if not is_packed(layer):
        layer.weight.data, layer.weight.quant_state = bnbf._convert_weight_packed_for_cpu(
            layer.weight.data, layer.weight.quant_state)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes, one per weight, ``(N, K)`` uint8, from the packed ``(N, K/2)`` layout (chapter: 3).

    The layout, read from bitsandbytes' conversion: rows in tiles of 32; within a tile, for each
    pair of columns, 64 codes (32 rows x 2 columns) in 32 bytes, the first 32 codes in the low
    nibbles and the last 32 in the high ones.
    """
    n, k_half = packed.shape  # (N, K/2)
    b = PACK_BLOCK_N
    flat = packed.reshape(-1, b)  # (N/32 * K/2, 32): one tile-row of 32 bytes
    codes = torch.cat([flat & 0xF, flat >> 4], dim=-1)  # (.., 64): low nibbles first
    codes = codes.reshape(n // b, k_half, b, 2)  # (N/32, K/2, 32 rows, 2 columns)
    return codes.transpose(1, 2).reshape(n, 2 * k_half).to(torch.uint8)  # (N, K)


def packed_reference(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """The packed path's product written in torch (chapter: 3).

    bf16 inputs, sums per block scaled by a bf16 absmax.

    ``layer`` is a 4-bit layer already in the packed layout (:func:`pack`). For each block of
    ``blocksize`` input columns, the bf16 input times the code values is summed in fp32, then
    scaled by the block's absmax (rounded to bf16 by the packing); the blocks' sums are added
    in fp32 and rounded to bf16. The result is returned in ``x``'s dtype (the layer's compute
    dtype), the bias added there, as bitsandbytes does. The tests hold it to bitsandbytes'
    kernel on a CPU with AVX512-BF16.
    """
    if not is_packed(layer):
        raise MemlabError("packed_reference needs a layer in the packed CPU layout; call pack() first")
    state = layer.weight.quant_state
    bs = state.blocksize
    q = unpack_codes(layer.weight.data)  # (N, K) codes
    n, k = q.shape
    codes = state.code.to(torch.bfloat16).float()[q.long()].reshape(n, k // bs, bs)  # (N, K/bs, bs)
    xb = x.reshape(-1, k).to(torch.bfloat16).float().reshape(-1, k // bs, bs)  # (M, K/bs, bs)
    per_block = torch.einsum("mjb,njb->mnj", xb, codes)  # (M, N, K/bs): fp32 sums per block
    absmax = state.absmax.float().t()  # (N, K/bs), stored transposed in bf16
    out = (per_block * absmax).sum(-1).to(torch.bfloat16).to(x.dtype)  # (M, N)
    out = out.reshape(*x.shape[:-1], n)
    if layer.bias is not None:  # added after the kernel, in the input's dtype
        out = out + layer.bias.to(x.dtype)
    return out
