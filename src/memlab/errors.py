"""One error type for bad input, so callers print one line instead of a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterable


class MemlabError(ValueError):
    """Bad input to memlab: the message names the bad value and the accepted ones."""


def check_choice(what: str, value, accepted: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``accepted`` (chapter: all).

    Else raise a one-line :class:`MemlabError`.
    """
    accepted = tuple(accepted)
    if value not in accepted:
        raise MemlabError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def check_positive_int(what: str, value) -> int:
    """Return ``value`` if it is a positive integer (chapter: all).

    Else raise a one-line :class:`MemlabError`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MemlabError(f"{what} must be a positive integer, got {value!r}")
    return value


def check_positive_number(what: str, value) -> float:
    """Return ``value`` as a float if it is a finite positive number (chapter: all).

    Else raise a one-line :class:`MemlabError`.
    """
    import math
    from numbers import Real

    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) \
            or value <= 0:
        raise MemlabError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def require(package: str, purpose: str, extra: str | None = None):
    """Import an optional package, or raise a one-line error saying how to install it (chapter: 3)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        hint = f"pip install 'memlab[{extra}]'" if extra else f"pip install {package}"
        raise MemlabError(f"{purpose} needs the optional package {package!r}; install it with: {hint}") from exc


# Notices from optional packages ------------------------------------------------------------------
# Messages an optional package logs that say nothing about the experiment: the book prints what
# matters once, in prose. Keyed by logger name; a record is dropped if its text contains one.
QUIET_NOTICES = {
    # Linear8bitLt casts fp32 inputs to fp16, and says so on every call.
    "bitsandbytes.autograd._functions": ("will be cast from",),
    # On CPUs with AVX512-BF16, importing bitsandbytes looks for an optional Hub kernel package
    # and logs a warning when it is not installed; the built-in CPU kernels are used instead.
    "bitsandbytes.backends.cpu.ops": ("from kernels-community",),
}


class _DropNotices(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(f in text for f in self.fragments)


for _name, _fragments in QUIET_NOTICES.items():
    # A filter can be set before the package is imported: the logger is created here.
    logging.getLogger(_name).addFilter(_DropNotices(_fragments))
