"""Bytes, GB and GiB: the book keeps them apart.

1 GB = 10**9 bytes (what GPU vendors and most blog posts say); 1 GiB = 2**30 bytes
(what ``nvidia-smi`` and PyTorch's allocator report). The two differ by 7.4%.
"""

from __future__ import annotations

from memlab.errors import check_choice

UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def to_unit(n_bytes: float, unit: str = "GiB") -> float:
    """Convert a byte count to ``unit`` (one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) (chapter: all)."""
    check_choice("unit", unit, UNITS)
    return n_bytes / UNITS[unit]


def fmt_bytes(n_bytes: float | None, unit: str | None = None, digits: int = 2) -> str:
    """Format a byte count, e.g. ``'25.10 GiB'``; picks a binary unit when none is given (chapter: all)."""
    if n_bytes is None:
        return "n/a"
    if unit is None:
        unit = "B"
        for u in ("KiB", "MiB", "GiB", "TiB"):
            if abs(n_bytes) >= UNITS[u]:
                unit = u
    if unit == "B":
        return f"{int(n_bytes):,} B"
    return f"{to_unit(n_bytes, unit):,.{digits}f} {unit}"
