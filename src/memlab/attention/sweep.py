"""Attention against sequence length: memory, FLOPs and time of each implementation.

Each function sweeps T for every implementation this device offers (naive, the book's tiled
FlashAttention, and the SDPA backends) and returns frozen rows; plotting is in
:mod:`memlab.plot.attention`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from memlab.attention.flops import attention_flops
from memlab.attention.memory import IMPLS, AttentionMemory, attend, attention_memory, fit_exponent
from memlab.device import device_name, pick_device
from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.timing import time_ms


@dataclass(frozen=True)
class MemorySweep:
    """Saved and peak bytes of each implementation at each T, and their log-log exponents (chapter: 4)."""

    shape: dict  # batch_size, n_head, head_size, dtype
    rows: tuple[AttentionMemory, ...]

    def of(self, impl: str) -> list[AttentionMemory]:
        """The measured rows of one implementation, by T."""
        return sorted((r for r in self.rows if r.impl == impl and r.status == "measured"),
                      key=lambda r: r.T)

    def status(self, impl: str) -> str:
        """'measured', or why this device measured nothing for ``impl``."""
        rows = [r for r in self.rows if r.impl == impl]
        return "measured" if any(r.status == "measured" for r in rows) else rows[0].status

    def exponent(self, impl: str, what: str = "saved_bytes") -> float | None:
        """Slope of log bytes against log T (2 for a T x T matrix, 1 for linear), or None."""
        rows = self.of(impl)
        if len(rows) < 2:
            return None
        return fit_exponent([r.T for r in rows], [getattr(r, what) for r in rows])

    def ratio(self, num: str, den: str, what: str = "saved_bytes") -> dict[int, float]:
        """``num`` bytes over ``den`` bytes at each T both measured."""
        a = {r.T: getattr(r, what) for r in self.of(num)}
        b = {r.T: getattr(r, what) for r in self.of(den)}
        return {T: a[T] / b[T] for T in sorted(set(a) & set(b))}


def _lengths(name, lengths) -> tuple[int, ...]:
    out = tuple(lengths)
    if not out:
        raise MemlabError(f"{name} must list at least one length")
    for T in out:
        check_positive_int(name, T)
    return out


def memory_sweep(lengths=(256, 512, 1024, 2048, 4096, 8192), *, flash_lengths=None,
                 impls=IMPLS, batch_size: int = 1, n_head: int = 1, head_size: int = 64,
                 dtype: str = "fp32", device=None) -> MemorySweep:
    """:func:`attention_memory` for every implementation at every T (chapter: 4).

    The Python-level tiled loop runs only up to ``flash_lengths``.
    """
    lengths = _lengths("lengths", lengths)
    flash_lengths = lengths if flash_lengths is None else _lengths("flash_lengths", flash_lengths)
    for impl in impls:
        check_choice("attention implementation", impl, IMPLS)
    rows = []
    for impl in impls:
        for T in (flash_lengths if impl == "flash" else lengths):
            rows.append(attention_memory(impl, T, batch_size=batch_size, n_head=n_head,
                                         head_size=head_size, dtype=dtype, device=device))
    return MemorySweep(dict(batch_size=batch_size, n_head=n_head, head_size=head_size,
                            dtype=dtype), tuple(rows))


@dataclass(frozen=True)
class FlopRow:
    """FLOPs the counter sees for one implementation at one T (chapter: 4)."""

    impl: str
    T: int
    causal: bool
    forward: int
    backward: int

    @property
    def backward_over_forward(self) -> float:
        """Backward FLOPs over forward FLOPs."""
        return self.backward / self.forward


@dataclass(frozen=True)
class FlopSweep:
    """FlopCounterMode's counts for each implementation and T (chapter: 4)."""

    rows: tuple[FlopRow, ...]

    def of(self, impl: str, causal: bool = False) -> list[FlopRow]:
        """One implementation's rows, by T."""
        return sorted((r for r in self.rows if r.impl == impl and r.causal == causal),
                      key=lambda r: r.T)

    def exponent(self, impl: str, what: str = "forward") -> float:
        """Slope of log FLOPs against log T: 2 for every exact attention."""
        rows = self.of(impl)
        return fit_exponent([r.T for r in rows], [getattr(r, what) for r in rows])


@dataclass(frozen=True)
class TimeSweep:
    """Median milliseconds of each implementation at each T on one device (chapter: 4)."""

    device: str
    rows: tuple[TimeRow, ...]

    def of(self, impl: str) -> list[TimeRow]:
        """The measured rows of one implementation, by T."""
        return sorted((r for r in self.rows if r.impl == impl and r.status == "measured"),
                      key=lambda r: r.T)

    def by_length(self) -> dict[str, dict[int, float]]:
        """Median milliseconds by implementation, then T: the measured ones (chapter: 4)."""
        impls = dict.fromkeys(r.impl for r in self.rows)
        return {impl: {r.T: round(r.median_ms, 3) for r in self.of(impl)} for impl in impls
                if self.of(impl)}

    def ratio(self, num: str, den: str) -> dict[int, float]:
        """``num`` time over ``den`` time at each T both measured."""
        a = {r.T: r.median_ms for r in self.of(num)}
        b = {r.T: r.median_ms for r in self.of(den)}
        return {T: a[T] / b[T] for T in sorted(set(a) & set(b))}


FLOP_IMPLS = ("naive", "flash", "sdpa-math", "sdpa-flash")


def flop_sweep(lengths=(256, 512, 1024), *, impls=FLOP_IMPLS, batch_size: int = 1,
               n_head: int = 1, head_size: int = 64, causal: bool = False) -> FlopSweep:
    """Forward and backward FLOPs for each implementation and T, on the CPU (chapter: 4).

    They are counted by ``FlopCounterMode``.
    """
    from memlab.model.flash import flash_attention, naive_attention

    lengths = _lengths("lengths", lengths)
    out = []
    for impl in impls:
        check_choice("attention implementation", impl, IMPLS)
        for T in lengths:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(batch_size, n_head, T, head_size, generator=g).requires_grad_()
                       for _ in range(3))
            if impl == "naive":
                c = attention_flops(naive_attention, q, k, v, causal=causal)
            elif impl == "flash":
                c = attention_flops(flash_attention, q, k, v, causal=causal)
            else:
                from torch.nn.attention import SDPBackend, sdpa_kernel

                from memlab.attention.memory import SDPA_BACKENDS

                def run(q, k, v, impl=impl):
                    with sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[impl])):
                        return torch.nn.functional.scaled_dot_product_attention(
                            q, k, v, is_causal=causal)

                c = attention_flops(run, q, k, v)
            out.append(FlopRow(impl, T, causal, c["forward"], c["backward"]))
    return FlopSweep(tuple(out))


@dataclass(frozen=True)
class TimeRow:
    """Median milliseconds of one forward + backward of one implementation at one T (chapter: 4)."""

    impl: str
    T: int
    status: str
    median_ms: float | None


def time_sweep(lengths=(256, 512, 1024), *, impls=IMPLS, batch_size: int = 1, n_head: int = 1,
               head_size: int = 64, dtype: str = "fp32", repeats: int = 3,
               device=None) -> TimeSweep:
    """Forward + backward time of each implementation at each T on this device (chapter: 4).

    Each time is the median of ``repeats``.
    """
    lengths = _lengths("lengths", lengths)
    check_positive_int("repeats", repeats)
    dev = pick_device(device)
    dt = to_dtype(dtype)
    out = []
    for impl in impls:
        check_choice("attention implementation", impl, IMPLS)
        for T in lengths:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(batch_size, n_head, T, head_size, generator=g)
                       .to(dev, dt).requires_grad_() for _ in range(3))

            def step(q=q, k=k, v=v, impl=impl):
                attend(impl, q, k, v).sum().backward()

            try:
                ms = time_ms(step, warmup=1, repeats=repeats, device=dev)
            except RuntimeError as exc:
                out.append(TimeRow(impl, T, f"not measurable on {dev.type}: "
                                   f"{str(exc).splitlines()[0]}", None))
                continue
            out.append(TimeRow(impl, T, "measured", statistics.median(ms)))
    return TimeSweep(device_name(dev), tuple(out))


def traffic_rows(lengths=(256, 1024, 4096, 16384), *, head_size: int = 64,
                 sram_elements=(16384, 65536, 262144)) -> list[dict]:
    """Elements moved per head by the standard algorithm and the tiled forward (chapter: 4).

    The tiled forward uses query blocks of M / 4d rows; both are set beside T^2 d^2 / M.

    The paper's bound needs the outer loop's blocks as large as fast memory allows (M / 4d
    rows, its B_c); this module's loop has the queries outside, so they get that size.
    """
    from memlab.model.flash import sram_blocks, standard_traffic, tiled_traffic

    out = []
    for M in sram_elements:
        check_positive_int("sram_elements", M)
        _, block_q = sram_blocks(M, head_size)
        for T in _lengths("lengths", lengths):
            out.append(dict(T=T, M=M, block_q=block_q,
                            standard=standard_traffic(T, T, head_size),
                            tiled=tiled_traffic(T, T, head_size, block_q=block_q),
                            bound=T * T * head_size * head_size / M))
    return out
