"""Memory of one attention call: bytes saved for backward and the peak of forward + backward.

Each implementation is named: ``naive`` and ``flash`` (this part's, :mod:`memlab.attention.flash`)
and PyTorch's SDPA backends ``sdpa-math``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``,
each forced with ``torch.nn.attention.sdpa_kernel``. A backend this device lacks gets a status
instead of numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memlab.device import pick_device
from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.peak import measure_peak
from memlab.model.flash import flash_attention, naive_attention

SDPA_BACKENDS = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION"}
IMPLS = ("naive", "flash", *SDPA_BACKENDS)

# Quoted, not measured: FlashAttention against PyTorch's standard attention, as the
# FlashAttention repository's README reports it (github.com/Dao-AILab/flash-attention, "Speedup
# and Memory Savings", the alpha release's benchmark): an A100, fp16, batch 8, 12 heads of 64,
# forward + backward. "10X memory savings at sequence length 2K, and 20X at 4K"; "2-4X speedup
# at sequence lengths between 128 and 4K". The paper (arXiv:2205.14135, section 4.3) says "up
# to 20x more memory efficient".
QUOTED_SOURCE = ("FlashAttention repository README (Dao-AILab/flash-attention): A100, fp16, "
                 "batch 8, 12 heads of 64, forward + backward")
QUOTED_SHAPE = dict(batch_size=8, n_head=12, head_size=64, dtype="fp16")
QUOTED_MEMORY_REDUCTION = {2048: 10, 4096: 20}  # sequence length -> times less memory
QUOTED_SPEEDUP = dict(low=2, high=4, lengths=(128, 4096))  # times faster, over these lengths


@dataclass(frozen=True)
class AttentionMemory:
    """One implementation at one shape: bytes saved for backward and peak bytes (chapter: 4)."""

    impl: str
    T: int
    status: str  # "measured", or why nothing was measured
    saved_bytes: int | None  # what autograd keeps between forward and backward
    peak_bytes: int | None  # above the inputs, over forward + backward


def attend(impl: str, q, k, v):
    """Causal attention by one implementation: naive, ours, or an SDPA backend (chapter: 4)."""
    if impl == "naive":
        return naive_attention(q, k, v)
    if impl == "flash":
        return flash_attention(q, k, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = q.size(1) // k.size(1)
    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[impl])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=g > 1)


def saved_storage_bytes(fn, exclude=()) -> int:
    """Bytes of the tensors autograd saves for backward during ``fn()`` (chapter: 4).

    Each storage is counted once, and those of ``exclude`` are left out.

    One storage saved under two shapes (a tensor and its view) counts once.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def saved_bytes(impl: str, q, k, v) -> int:
    """Bytes autograd saves for backward in one attention call, each storage counted once (chapter: 4)."""
    check_choice("attention implementation", impl, IMPLS)
    return saved_storage_bytes(lambda: attend(impl, q, k, v))


def attention_memory(impl: str, T: int, *, batch_size: int = 1, n_head: int = 8,
                     n_kv_head: int | None = None, head_size: int = 64, dtype: str = "fp32",
                     device=None) -> AttentionMemory:
    """Saved bytes and peak bytes of causal self-attention at sequence length T (chapter: 4)."""
    check_choice("attention implementation", impl, IMPLS)
    for name, n in (("T", T), ("batch_size", batch_size), ("n_head", n_head),
                    ("head_size", head_size)):
        check_positive_int(name, n)
    nkv = n_head if n_kv_head is None else n_kv_head
    check_positive_int("n_kv_head", nkv)
    if n_head % nkv:
        raise MemlabError(f"n_head ({n_head}) must be a multiple of n_kv_head ({nkv})")
    dev = pick_device(device)
    dt = to_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch_size, n_head, T, head_size, generator=g).to(dev, dt).requires_grad_()
    k = torch.randn(batch_size, nkv, T, head_size, generator=g).to(dev, dt).requires_grad_()
    v = torch.randn(batch_size, nkv, T, head_size, generator=g).to(dev, dt).requires_grad_()
    try:
        kept = saved_bytes(impl, q, k, v)
    except RuntimeError as exc:
        return AttentionMemory(impl, T, f"not measurable on {dev.type}: {str(exc).splitlines()[0]}",
                               None, None)

    def step():
        attend(impl, q, k, v).sum().backward()

    _, peak = measure_peak(step, device=dev)
    q.grad = k.grad = v.grad = None
    return AttentionMemory(impl, T, "measured", kept, peak.peak_allocated_bytes)


def fit_exponent(xs, ys) -> float:
    """Least-squares slope of log y against log x: the power of a growth law (chapter: 4)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y and y > 0]
    if len(pts) < 2:
        raise MemlabError(f"fit_exponent needs at least two positive points, got {len(pts)}")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return (sum((x - mx) * (y - my) for x, y in pts)
            / sum((x - mx) ** 2 for x, _ in pts))
