"""Context parallelism: one rank's share of a long-context step, traced and tabled (chapter: 8).

N ranks each hold T/N tokens of every sequence and the whole model (weights, gradients and
optimizer states replicated: context parallelism shards none of them). Attention is the one
layer that needs the other ranks' tokens; ring attention (:mod:`memlab.longcontext.ring`) passes
their keys and values around. Everything else in a block works token by token, so it runs on the
rank's T/N tokens as if the sequence were that short.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from memlab.errors import MemlabError, check_positive_int
from memlab.longcontext.ring import ring_attention


class RingCore:
    """A block's attention core replaced by ring attention over the default group (chapter: 8).

    Called as :meth:`memlab.model.transformer.Attention.core` is, with q (B, nh, Tl, hs) and k, v
    (B, nkv, Tl, hs) of this rank's tokens.
    """

    def __init__(self, layout: str = "zigzag", stats: dict | None = None):
        self.layout, self.stats = layout, stats

    def __call__(self, q, k, v, pos: int = 0):
        return ring_attention(q, k, v, causal=True, layout=self.layout, stats=self.stats)


def use_ring_attention(model, layout: str = "zigzag", stats: dict | None = None):
    """Make every block of a built model attend through the ring: a step's ``prepare`` hook (chapter: 8).

    The rotary tables stay those of positions 0..Tl-1: the same bytes as the rank's own
    positions, which a real run would pass instead.
    """
    core = RingCore(layout, stats)
    for block in model.blocks:
        block.attn.core = core
    return model


use_ring_attention.name = "ring attention"


@contextlib.contextmanager
def fake_ring(world: int):
    """A fake process group of ``world`` ranks in this process, as rank 0 (chapter: 8).

    Sends and receives return at once and move nothing: under FakeTensorMode one rank's step is
    traced, the ring's buffers included, without the other ranks.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    check_positive_int("context_parallel", world)
    if dist.is_initialized():
        raise MemlabError("a process group is already initialized: trace context parallelism "
                          "in a process without one")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
