"""Activation offloading: the blocks' saved tensors kept in the host's memory (chapter: 8).

While the forward pass runs, every tensor the transformer blocks save for the backward pass is
copied to the host and its device copy freed; the backward pass copies each one back when it
needs it. With activation checkpointing the blocks save only each checkpointed unit's input
(:func:`torch.utils.checkpoint.checkpoint` saves its inputs as saved tensors, so they pass
through these hooks, while the tensors inside a unit go to the checkpoint's own hooks), and what
moves is exactly those inputs: L x B x T x C elements of the activation dtype. Without
checkpointing it is every tensor the blocks save.

This is PyTorch's ``torch.autograd.graph.save_on_cpu`` with two differences. A parameter saved
for the backward pass (a linear layer's weight: a leaf that requires a gradient, or a view of
one) stays where it is, since it lives on the device anyway and copying it would move the whole
model every step; torchtune's ``OffloadActivations`` (which TRL adapts) leaves parameters too, and
also tensors under 1 KiB. And copies are made per storage: views of one storage (q, k and v cut
from one projection) share one copy, and a copy brought back is shared by the operations that
read it while it is alive. The copies run in line; torchtune's run on a second CUDA stream, so
they overlap the computation. :class:`ActivationOffload` is held to ``save_on_cpu`` in the tests:
the same loss and gradients.

Where the host copy lives depends on where the step runs:

* on CUDA, a pinned CPU tensor, copied with ``non_blocking`` as ``save_on_cpu`` does;
* on a CPU, the device is the host, so a copy in CPU memory would not leave it: the bytes are
  kept outside PyTorch's allocator (a NumPy array), so the step's tracked bytes are the
  device's alone, as on a GPU;
* in a trace (fake tensors), a ``meta`` tensor of the same shape: no bytes on the traced device.

Every copy is counted (:class:`OffloadStats`): the bytes on the host at the end of the forward
pass, and the bytes moved each way.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass
class OffloadStats:
    """Bytes kept on the host and moved over the host link in one step (chapter: 8)."""

    tensors: int = 0  # tensors offloaded
    host_bytes: int = 0  # bytes offloaded (on the host once the forward pass ends)
    to_host_bytes: int = 0  # bytes copied device -> host
    to_device_bytes: int = 0  # bytes copied host -> device (each copy-back counted)

    def as_dict(self) -> dict:
        return asdict(self)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


class _HostStorage:
    """One device storage's bytes on the host, and its copy on the device while one is alive."""

    __slots__ = ("device", "dtype", "numel", "host", "back")

    def __init__(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        self.device, self.dtype = t.device, t.dtype
        self.numel = st.nbytes() // t.element_size()
        self.back = None  # a weak reference to the copy on the device, once made
        if _is_fake(t):  # no bytes to copy: a stand-in of the storage's size
            self.host = torch.empty(self.numel, dtype=t.dtype, device="meta")
            return
        whole = torch.empty(0, dtype=t.dtype, device=t.device).set_(st, 0, (self.numel,), (1,))
        if t.device.type == "cpu":
            self.host = whole.view(torch.uint8).numpy().copy()
        else:
            self.host = torch.empty(self.numel, dtype=t.dtype, device="cpu",
                                    pin_memory=torch.cuda.is_available())
            self.host.copy_(whole, non_blocking=True)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty(0, dtype=self.dtype, device="meta").element_size()

    def to_device(self) -> tuple[torch.Tensor, bool]:
        """The storage on the device as a 1-D tensor, and whether it was copied now."""
        alive = self.back() if self.back is not None else None
        if alive is not None:
            return alive, False
        if self.host.__class__ is np.ndarray:
            whole = torch.from_numpy(self.host.copy()).view(self.dtype)
        elif self.host.device.type == "meta":
            whole = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        else:
            whole = self.host.to(self.device, non_blocking=True)
        self.back = weakref.ref(whole)
        return whole, True


class _Packed:
    """One saved tensor: the host copy of its storage and where in it the tensor lies."""

    __slots__ = ("storage", "size", "stride", "offset")

    def __init__(self, storage: _HostStorage, t: torch.Tensor) -> None:
        self.storage = storage
        self.size, self.stride, self.offset = t.size(), t.stride(), t.storage_offset()


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved tensors to the host in the forward pass, back in the backward (chapter: 8).

    Use it as a context manager around the part of the forward pass whose saved tensors should
    move; ``stats`` counts the bytes. One object may serve many steps: ``reset()`` starts the
    counts again.
    """

    def __init__(self) -> None:
        self.stats = OffloadStats()
        # device storage's address -> a weak reference to the storage and its host copy (PyTorch
        # keeps one Python object per storage while it lives, so the reference says whether the
        # address still names the same storage)
        self._seen: dict[int, tuple[weakref.ref, _HostStorage]] = {}

        def pack(t: torch.Tensor):
            base = t if t._base is None else t._base
            if base.is_leaf and base.requires_grad:
                return t  # a parameter or a view of one (its transpose): on the device anyway
            st = t.untyped_storage()
            hit = self._seen.get(st._cdata)  # views of one storage share one host copy
            if hit is not None and hit[0]() is st:
                storage = hit[1]
            else:
                storage = _HostStorage(t)
                self.stats.tensors += 1
                self.stats.host_bytes += storage.nbytes
                self.stats.to_host_bytes += storage.nbytes
                self._seen[st._cdata] = (weakref.ref(st), storage)
            return _Packed(storage, t)

        def unpack(packed):
            if not isinstance(packed, _Packed):
                return packed
            whole, copied = packed.storage.to_device()
            if copied:
                self.stats.to_device_bytes += packed.storage.nbytes
            return whole.as_strided(packed.size, packed.stride, packed.offset)

        super().__init__(pack, unpack)

    def __exit__(self, *args) -> None:
        super().__exit__(*args)
        self._seen.clear()  # one copy per tensor within a forward pass; the graph holds the rest

    def reset(self) -> None:
        """Start counting a new step."""
        self.stats = OffloadStats()
        self._seen.clear()
