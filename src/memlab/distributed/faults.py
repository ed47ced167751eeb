"""Small rank functions for the launcher's own checks (chapter 6).

A sum, a rank that raises, a rank that hangs.

Each is a ``target(spec, device)`` for :func:`memlab.distributed.launch.launch`.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def all_reduce_sum(spec: dict, device: torch.device) -> dict:
    """Every rank adds its rank + 1: the sum is N(N+1)/2 when the group is whole (chapter: 6)."""
    t = torch.tensor([float(dist.get_rank() + 1)], device=device)
    dist.all_reduce(t)
    return dict(sum=float(t), host=spec.get("host", ""))


def raise_on_rank(spec: dict, device: torch.device) -> dict:
    """Rank ``spec['rank']`` raises ValueError before the first collective (chapter: 6).

    The others wait in it.
    """
    if dist.get_rank() == spec.get("rank", 1):
        raise ValueError(f"rank {dist.get_rank()} was told to fail")
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    return dict(sum=float(t))


def hang_on_rank(spec: dict, device: torch.device) -> dict:
    """Rank ``spec['rank']`` never joins the all-reduce (it sleeps) (chapter: 6).

    The others time out in it.
    """
    if dist.get_rank() == spec.get("rank", 1):
        time.sleep(spec.get("sleep_s", 600))
        return {}
    t = torch.ones(1, device=device)
    dist.all_reduce(t)
    return dict(sum=float(t))
