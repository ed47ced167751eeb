"""Freezing: train only chosen parameters, and count what trains."""

from __future__ import annotations

import torch.nn as nn

from memlab.errors import MemlabError, check_positive_int


def count_trainable(model: nn.Module) -> int:
    """Parameters with ``requires_grad``, each shared tensor once (chapter: 5)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def freeze_all_but(model: nn.Module, prefixes) -> int:
    """Freeze every parameter whose qualified name starts with none of ``prefixes`` (chapter: 5).

    It returns the trainable count.
    """
    prefixes = (prefixes,) if isinstance(prefixes, str) else tuple(prefixes)
    if not prefixes:
        raise MemlabError("name at least one module to keep trainable")
    names = [n for n, _ in model.named_parameters()]
    for pre in prefixes:
        if not any(n == pre or n.startswith(pre + ".") for n in names):
            raise MemlabError(f"no parameter of the model is under {pre!r}; accepted: module names "
                              f"such as {', '.join(sorted({n.split('.')[0] for n in names}))}")
    for n, p in model.named_parameters():
        p.requires_grad_(any(n == pre or n.startswith(pre + ".") for pre in prefixes))
    return count_trainable(model)


def freeze_all_but_last(model: nn.Module, k: int) -> int:
    """Train only the last ``k`` blocks; everything else frozen; returns the trainable count (chapter: 5)."""
    check_positive_int("k", k)
    if not hasattr(model, "blocks"):
        raise MemlabError(f"expected a memlab Transformer with .blocks, got {type(model).__name__}")
    n = len(model.blocks)
    if k > n:
        raise MemlabError(f"k ({k}) exceeds the model's {n} blocks")
    return freeze_all_but(model, [f"blocks.{i}" for i in range(n - k, n)])
