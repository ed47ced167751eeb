"""The book's names for torch's float dtypes, in one place (chapters: all).

``fp32``, ``fp16``, ``bf16``, ``fp8-e4m3`` and ``fp8-e5m2`` are the float formats of
:data:`memlab.precision.formats.FORMATS` that torch stores natively; every part that turns a
format name into a dtype uses :func:`dtype`.
"""

from __future__ import annotations

import torch

from memlab.errors import check_choice

FLOAT_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8-e4m3": torch.float8_e4m3fn,
    "fp8-e5m2": torch.float8_e5m2,
}
FLOAT_FORMATS = tuple(FLOAT_DTYPES)


def dtype(fmt: str, among: tuple[str, ...] = FLOAT_FORMATS) -> torch.dtype:
    """The torch dtype that stores a float format, e.g. ``torch.bfloat16`` for ``'bf16'`` (chapters: all).

    ``among`` narrows the accepted formats (a one-line error names them).
    """
    check_choice("float format", fmt, among)
    return FLOAT_DTYPES[fmt]
