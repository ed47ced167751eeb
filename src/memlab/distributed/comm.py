"""Bytes each rank communicates, by collective (chapter 6).

PyTorch's ``CommDebugMode`` counts collectives but not their bytes. :class:`CommCounter` is a
dispatch mode over the ``c10d`` operators, so it sees every collective issued from Python
(FSDP2's all-gathers and reduce-scatters, ``ZeroRedundancyOptimizer``'s broadcasts), and over
the functional ``_c10d_functional`` ones DTensor issues (tensor parallelism's all-reduces). DDP's gradient all-reduce is issued by its C++ reducer, which no
dispatch mode sees; :func:`python_allreduce_hook` issues it from Python instead, where the
counter sees it.

What is counted for one call is its *payload*: the bytes of the full tensor the collective is
about (an all-reduce's tensor, an all-gather's output, a reduce-scatter's input, a broadcast's
tensor). The ZeRO paper's volumes are in these units: a ring all-reduce of Ψ elements moves
2Ψ (a reduce-scatter and an all-gather of Ψ each, each rank sending (N-1)/N of the payload),
so :meth:`CommCounter.volume_bytes` counts an all-reduce twice.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# c10d operator -> (collective, which argument holds the payload: 'out' = the first tensor
# list/tensor of the output side, 'in' = the input side). Read against torch 2.13's
# torch/distributed/distributed_c10d.py, which calls these ops.
_OPS = {
    "allreduce_": ("all-reduce", "in"),
    "allreduce_coalesced_": ("all-reduce", "in"),
    "_allgather_base_": ("all-gather", "out"),
    "allgather_": ("all-gather", "out"),
    "allgather_into_tensor_coalesced_": ("all-gather", "out"),
    "_reduce_scatter_base_": ("reduce-scatter", "in"),
    "reduce_scatter_": ("reduce-scatter", "in"),
    "reduce_scatter_tensor_coalesced_": ("reduce-scatter", "in"),
    "broadcast_": ("broadcast", "in"),
    "send": ("send", "in"),
    "recv_": ("recv", "in"),
    "alltoall_base_": ("all-to-all", "in"),
}
# DTensor (tensor parallelism) issues functional collectives, which return a new tensor
# instead of writing in place; their group is named by a string: op -> (collective, side)
_FUNCTIONAL_OPS = {
    "all_reduce": ("all-reduce", "in"),
    "all_reduce_coalesced": ("all-reduce", "in"),
    "all_gather_into_tensor": ("all-gather", "out"),
    "all_gather_into_tensor_coalesced": ("all-gather", "out"),
    "reduce_scatter_tensor": ("reduce-scatter", "in"),
    "reduce_scatter_tensor_coalesced": ("reduce-scatter", "in"),
    "broadcast": ("broadcast", "in"),
    "all_to_all_single": ("all-to-all", "in"),
}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "broadcast", "send", "recv",
               "all-to-all")
VOLUME_FACTOR = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "broadcast": 1,
                 "send": 1, "recv": 0, "all-to-all": 1}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _group_size(args) -> int:
    """The size of the process group among a c10d op's arguments (1 if none is found)."""
    from torch.distributed import ProcessGroup

    for a in args:
        if isinstance(a, ProcessGroup):
            return int(a.size())
        # inside the dispatcher the group arrives boxed as a TorchScript object
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            return int(ProcessGroup.unbox(a).size())
    return 1


def _named_group_size(args) -> int:
    """The size of the group a functional collective names by string (its last str argument)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    names = [a for a in args if isinstance(a, str)]
    return int(_resolve_process_group(names[-1]).size()) if names else 1


def ring_sent_bytes(collective: str, payload: int, group_size: int) -> float:
    """Bytes one rank sends in a collective of ``payload`` bytes, ring algorithms (chapter: 6).

    The collective runs over ``group_size`` ranks.

    All-gather and reduce-scatter: each rank sends (g-1)/g of the payload; all-reduce is both:
    2(g-1)/g; a broadcast's root sends it once (counted on every rank: 1/g on average). A group
    of one rank sends nothing.
    """
    g = max(group_size, 1)
    share = (g - 1) / g
    return payload * {"all-reduce": 2 * share, "all-gather": share, "reduce-scatter": share,
                      "broadcast": 1 / g if g > 1 else 0.0, "send": 1.0, "recv": 0.0,
                      "all-to-all": share}[collective]


def _nbytes(ts: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


class CommCounter(TorchDispatchMode):
    """Count calls and payload bytes of every ``c10d`` collective run inside it (chapter: 6)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.sent: dict[str, float] = defaultdict(float)
        self.probe = None  # called with "<collective> issued" before each one, if set

    def add(self, collective: str, nbytes: int, group_size: int) -> None:
        """Record one collective of ``nbytes`` payload over ``group_size`` ranks (chapter: 6)."""
        self.calls[collective] += 1
        self.bytes[collective] += int(nbytes)
        self.sent[collective] += ring_sent_bytes(collective, nbytes, group_size)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "_c10d_functional":
            entry = _FUNCTIONAL_OPS.get(func._schema.name.split("::")[-1])
            if entry is not None:
                out = func(*args, **kwargs)
                collective, side = entry
                payload = _tensors(out if side == "out" else args[0])
                self.add(collective, _nbytes(payload), _named_group_size(args))
                return out
        if func.namespace == "c10d":
            name = func._schema.name.split("::")[-1]
            entry = _OPS.get(name)
            if entry is not None:
                collective, side = entry
                if side == "out" and name.startswith("allgather") and name != "_allgather_base_":
                    payload = _tensors(args[0])  # output lists come first
                elif side == "out":
                    payload = _tensors(args[0])  # _allgather_base_(output, input, ...)
                elif name.startswith("_reduce_scatter") or name.startswith("reduce_scatter"):
                    payload = _tensors(args[1])  # (output, input, ...)
                else:
                    payload = _tensors(args[0])
                self.add(collective, _nbytes(payload), _group_size(args))
                if self.probe is not None:
                    self.probe(f"{collective} issued")
        return func(*args, **kwargs)

    def summary(self) -> dict[str, dict[str, int]]:
        """``{collective: {"calls", "bytes" (payload), "sent_bytes" (this rank, ring)}}`` (chapter: 6)."""
        return {c: dict(calls=self.calls[c], bytes=self.bytes[c], sent_bytes=round(self.sent[c]))
                for c in COLLECTIVES if self.calls.get(c)}

    def volume_bytes(self) -> int:
        """The ZeRO paper's communication volume: payloads, an all-reduce counted twice (chapter: 6)."""
        return sum(VOLUME_FACTOR[c] * n for c, n in self.bytes.items())


def python_allreduce_hook():
    """A DDP communication hook that all-reduces each gradient bucket from Python (chapter: 6).

    There a :class:`CommCounter` sees it.

    It is PyTorch's own default hook (``default_hooks.allreduce_hook``: sum, then divide by the
    world size); DDP's built-in path issues the same all-reduce from C++, unseen.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook
