"""One error type for bad input, so callers print one line instead of a traceback."""

from __future__ import annotations

from collections.abc import Iterable


class MemlabError(ValueError):
    """Bad input to memlab: the message names the bad value and the accepted ones."""


def check_choice(what: str, value, accepted: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``accepted``, else raise a one-line :class:`MemlabError` (chapter: all)."""
    accepted = tuple(accepted)
    if value not in accepted:
        raise MemlabError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def check_positive_int(what: str, value) -> int:
    """Return ``value`` if it is a positive integer, else raise a one-line :class:`MemlabError` (chapter: all)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MemlabError(f"{what} must be a positive integer, got {value!r}")
    return value


def require(package: str, purpose: str, extra: str | None = None):
    """Import an optional package, or raise a one-line error saying how to install it (chapter: 3)."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as exc:
        hint = f"pip install 'memlab[{extra}]'" if extra else f"pip install {package}"
        raise MemlabError(f"{purpose} needs the optional package {package!r}; install it with: {hint}") from exc
