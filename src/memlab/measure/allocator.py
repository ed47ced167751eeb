"""The CUDA caching allocator's rules in code, and the out-of-memory message they produce (chapter 0).

* What does the allocator do with a request? :func:`cuda_block_size`, :func:`cuda_pool` and
  :func:`cuda_segment_size` put its documented rounding rules in code (see :data:`ALLOCATOR_SOURCE`),
  and :func:`measure_cuda_blocks` checks them against the allocator's own counters on a GPU;
  :func:`fragmentation` shows reserved memory too fragmented for one request.
* What does the error message say? :func:`first_oom` replays a list of requests through those
  rules on a catalogue GPU (:mod:`memlab.gpus`) and composes the message the allocator would
  print at the first request that does not fit (:class:`OutOfMemory`), each number named by the
  statistic it comes from; :func:`model_state_requests` lists a step's model-state requests.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from memlab.device import pick_device
from memlab.errors import MemlabError
from memlab.gpus import GPU, RESERVED_BYTES, get_gpu
from memlab.measure.step import default_dtype, param_dtype
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model

# The CUDA caching allocator's constants ------------------------------------------------------
# c10/core/AllocatorConfig.h in the installed torch (2.13) defines the first five; the
# large-pool segment is AcceleratorAllocatorConfig's large_segment_size (20 MiB by default).
# How they are used (round_size, get_pool, get_allocation_size, should_split, and the
# out-of-memory message in malloc) is in c10/cuda/CUDACachingAllocator.cpp.
ALLOCATOR_SOURCE = ("torch 2.13: c10/core/AllocatorConfig.h (constants), c10/core/Allocator.h "
                    "(format_size); pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (round_size, "
                    "get_allocation_size, should_split, the out-of-memory message)")
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_REQUEST_BYTES = 2**20  # kSmallSize: requests up to 1 MiB go to the small pool
SMALL_SEGMENT_BYTES = 2 * 2**20  # kSmallBuffer: the small pool's segments, 2 MiB
MIN_LARGE_ALLOC_BYTES = 10 * 2**20  # kMinLargeAlloc: below 10 MiB, a large request shares a segment
LARGE_SEGMENT_BYTES = 20 * 2**20  # kLargeBuffer: the shared large segments, 20 MiB
ROUND_LARGE_BYTES = 2 * 2**20  # kRoundLarge: from 10 MiB, a segment of the request rounded to 2 MiB
OOM_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables"
# The allocator's settings; PYTORCH_CUDA_ALLOC_CONF, the older name, is still read
# (c10/core/AllocatorConfig.h), and the message names the newer one since torch 2.10.
ALLOC_CONF_ENV = "PYTORCH_ALLOC_CONF"


def _check_request(request_bytes) -> int:
    if isinstance(request_bytes, bool) or not isinstance(request_bytes, int) or request_bytes < 0:
        raise MemlabError(f"request_bytes must be a non-negative integer, got {request_bytes!r}")
    return request_bytes


def cuda_block_size(request_bytes: int) -> int:
    """Bytes of the block the CUDA caching allocator hands out for a request (chapter: 0).

    A multiple of 512.

    ``round_size``: at least 512 bytes, rounded up to a multiple of 512 (the default setting,
    without ``roundup_power2_divisions``). A request of 0 bytes allocates nothing.
    """
    n = _check_request(request_bytes)
    if n == 0:
        return 0
    return MIN_BLOCK_BYTES * -(-n // MIN_BLOCK_BYTES)


def cuda_pool(request_bytes: int) -> str:
    """The pool a request is served from: 'small' up to 1 MiB, else 'large' (chapter: 0)."""
    return "small" if cuda_block_size(request_bytes) <= SMALL_REQUEST_BYTES else "large"


def cuda_segment_size(request_bytes: int) -> int:
    """Bytes the allocator asks cudaMalloc for when no cached block fits a request (chapter: 0).

    ``get_allocation_size``: a 2 MiB segment for the small pool; a 20 MiB one, shared by later
    requests, below 10 MiB; from 10 MiB, the block rounded up to a multiple of 2 MiB. This is
    the number an out-of-memory message prints after "Tried to allocate".
    """
    block = cuda_block_size(request_bytes)
    if block == 0:
        return 0
    if block <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if block < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return ROUND_LARGE_BYTES * -(-block // ROUND_LARGE_BYTES)


def cuda_allocated_size(request_bytes: int) -> int:
    """Bytes ``memory_allocated()`` grows by when a request opens a new segment (chapter: 0).

    The block; or the whole segment, when the large pool would keep a remainder of 1 MiB or
    less and so does not split it (``should_split``).
    """
    block, segment = cuda_block_size(request_bytes), cuda_segment_size(request_bytes)
    if block <= SMALL_REQUEST_BYTES or segment - block > SMALL_REQUEST_BYTES:
        return block
    return segment


def format_size(n_bytes: int) -> str:
    """A byte count as the allocator prints it (chapter: 0).

    'bytes' up to 1 KiB, then KiB, MiB, GiB, 2 decimals.
    """
    n = _check_request(n_bytes)
    if n <= 1024:
        return f"{n} bytes"
    for unit, size in (("KiB", 2**10), ("MiB", 2**20)):
        if n <= size * 1024:
            return f"{n / size:.2f} {unit}"
    return f"{n / 2**30:.2f} GiB"


def measure_cuda_blocks(requests: Sequence[int], device=None) -> list[dict]:
    """Allocated and reserved bytes the CUDA allocator adds for each request alone, measured (chapter: 0).

    Each request is a ``uint8`` tensor of that many bytes, allocated into an emptied cache and
    freed again; the rows hold the rules' block, allocated and segment bytes beside the
    allocator's counters. A segment that other live tensors keep can serve a request without a
    new one: in a fresh process the measured columns match the rules.
    """
    dev = pick_device(device)
    if dev.type != "cuda":
        raise MemlabError(f"measure_cuda_blocks needs device 'cuda' (the caching allocator is "
                          f"CUDA's), got {dev.type!r}")
    rows = []
    for n in requests:
        _check_request(n)
        gc.collect()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_stats(dev)
        t = torch.empty(n, dtype=torch.uint8, device=dev)
        after = torch.cuda.memory_stats(dev)
        del t
        rows.append({
            "request": n, "pool": cuda_pool(n), "block": cuda_block_size(n),
            "allocated": cuda_allocated_size(n), "segment": cuda_segment_size(n),
            "measured allocated": after["allocated_bytes.all.current"]
            - before["allocated_bytes.all.current"],
            "measured reserved": after["reserved_bytes.all.current"]
            - before["reserved_bytes.all.current"],
        })
    torch.cuda.empty_cache()
    return rows


@dataclass(frozen=True)
class Fragmentation:
    """The large pool after a pattern that fragments it, and a request it cannot serve (chapter: 0)."""

    segments: int  # segments opened, each keeping one live block
    keep_bytes: int  # the request that stays alive in each segment
    allocated_bytes: int  # held by live tensors
    reserved_bytes: int  # held from CUDA
    largest_free_bytes: int  # the biggest cached piece, each wedged beside a live block
    next_request_bytes: int  # a request larger than every piece
    next_new_segment_bytes: int  # what serving it adds to reserved: a new segment
    measured: bool  # True: the allocator's counters on CUDA; False: computed from the rules

    @property
    def unallocated_bytes(self) -> int:
        """Reserved but unallocated bytes (chapter: 0)."""
        return self.reserved_bytes - self.allocated_bytes

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 0)."""
        return asdict(self)


def fragmentation(segments: int = 16, keep_bytes: int = 2 * 2**20, device=None) -> Fragmentation:
    """Fragment the large pool: keep one small tensor per shared segment, free the rest (chapter: 0).

    ``segments`` times, a ``keep_bytes`` tensor (between 1 and 10 MiB: it opens a shared 20 MiB
    segment) is allocated, then a temporary that fills the rest of its segment; the temporaries
    are freed. Each segment then holds a live block and a free piece that cannot go back to
    CUDA, and a request one segment long fits in none of them. Measured on CUDA with
    ``torch.cuda.memory_stats``; elsewhere computed from the allocator's rules.
    """
    if isinstance(segments, bool) or not isinstance(segments, int) or segments <= 0:
        raise MemlabError(f"segments must be a positive integer, got {segments!r}")
    block = cuda_block_size(_check_request(keep_bytes))
    if not SMALL_REQUEST_BYTES < block < MIN_LARGE_ALLOC_BYTES:
        raise MemlabError(f"keep_bytes must be above {SMALL_REQUEST_BYTES} and below "
                          f"{MIN_LARGE_ALLOC_BYTES} (a shared large segment), got {keep_bytes!r}")
    segment = cuda_segment_size(keep_bytes)
    dev = pick_device(device)
    if dev.type != "cuda":
        return Fragmentation(segments, keep_bytes, segments * block, segments * segment,
                             segment - block, segment, cuda_segment_size(segment), measured=False)
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_stats(dev)
    keep, temps = [], []
    for _ in range(segments):
        keep.append(torch.empty(keep_bytes, dtype=torch.uint8, device=dev))
        temps.append(torch.empty(segment - block, dtype=torch.uint8, device=dev))
    del temps
    mid = torch.cuda.memory_stats(dev)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    largest = max((b["size"] for seg in torch.cuda.memory_snapshot() if seg["device"] == index
                   for b in seg["blocks"] if b["state"] == "inactive"), default=0)
    big = torch.empty(segment, dtype=torch.uint8, device=dev)
    after = torch.cuda.memory_stats(dev)
    del big, keep
    torch.cuda.empty_cache()

    def grew(a, b, key):
        return b[f"{key}.all.current"] - a[f"{key}.all.current"]

    return Fragmentation(
        segments, keep_bytes, grew(before, mid, "allocated_bytes"),
        grew(before, mid, "reserved_bytes"), largest, segment,
        grew(mid, after, "reserved_bytes"), measured=True,
    )


# An out-of-memory error, composed ----------------------------------------------------------
@dataclass(frozen=True)
class OutOfMemory:
    """The numbers of a CUDA out-of-memory error on one GPU, and the message they make (chapter: 0).

    Composed from the allocator's rules and its message format, not captured from a GPU.
    """

    gpu: str  # catalogue name, e.g. 'H100'
    label: str  # the request that failed, e.g. 'exp_avg of layers.3.mlp.up.weight'
    request_bytes: int  # what the tensor asked for
    tried_bytes: int  # "Tried to allocate": the segment cudaMalloc was asked for
    total_bytes: int  # "total capacity" (cudaMemGetInfo's total; here the nvidia-smi total)
    free_bytes: int  # "of which ... is free" (cudaMemGetInfo's free)
    process_bytes: int  # "this process has ... in use" (NVML): reserved + non-PyTorch memory
    allocated_bytes: int  # "allocated by PyTorch": allocated_bytes.all.current
    reserved_bytes: int  # reserved_bytes.all.current; the message prints reserved - allocated
    expandable_segments: bool = False
    requests_served: int = 0  # requests that fitted before the failing one

    @property
    def unallocated_bytes(self) -> int:
        """Reserved by PyTorch but unallocated, bytes (chapter: 0)."""
        return self.reserved_bytes - self.allocated_bytes

    def message(self) -> str:
        """The error text, in the format of CUDACachingAllocator.cpp's malloc (chapter: 0).

        As torch 2.10+ prints it.
        """
        f = format_size
        return (
            f"CUDA out of memory. Tried to allocate {f(self.tried_bytes)}. GPU 0 has a total "
            f"capacity of {f(self.total_bytes)} of which {f(self.free_bytes)} is free. "
            f"Including non-PyTorch memory, this process has {f(self.process_bytes)} memory in "
            f"use. Of the allocated memory {f(self.allocated_bytes)} is allocated by PyTorch, and "
            f"{f(self.unallocated_bytes)} is reserved by PyTorch but unallocated. If reserved but "
            f"unallocated memory is large try setting {ALLOC_CONF_ENV}=expandable_segments:True "
            "to avoid fragmentation.  See "
            f"documentation for Memory Management  ({OOM_DOCS})"
        )

    def anatomy(self) -> list[tuple[str, int, str]]:
        """Each number of the message: (its words, bytes, the statistic it comes from) (chapter: 0)."""
        return [
            ("Tried to allocate", self.tried_bytes,
             f"the segment for a {self.request_bytes:,}-byte request (cuda_segment_size)"),
            ("total capacity", self.total_bytes, "torch.cuda.mem_get_info()[1]"),
            ("is free", self.free_bytes, "torch.cuda.mem_get_info()[0]"),
            ("this process has ... in use", self.process_bytes,
             "NVML per process: reserved + CUDA context and other non-PyTorch memory"),
            ("allocated by PyTorch", self.allocated_bytes,
             "memory_stats()['allocated_bytes.all.current']"),
            ("reserved by PyTorch but unallocated", self.unallocated_bytes,
             "memory_stats()['reserved_bytes.all.current'] - allocated"),
        ]

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 0)."""
        return asdict(self)


@dataclass
class _Pool:
    """One pool of the allocator model: the free tails of its segments, or one growing segment."""

    page: int  # expandable segments: bytes mapped at a time
    tails: list[int] = field(default_factory=list)  # free bytes at the end of each segment


def _serve(pool: _Pool, request: int, reserved: int, capacity: int,
           expandable: bool) -> tuple[int, int] | None:
    """Bytes allocated and newly reserved for a request, or None when the GPU has no room."""
    block = cuda_block_size(request)
    small = block <= SMALL_REQUEST_BYTES
    if expandable:  # one segment per pool; blocks always split; pages mapped at its end
        tail = pool.tails[0] if pool.tails else 0
        need = max(block - tail, 0)
        new = pool.page * -(-need // pool.page)
        if reserved + new > capacity:
            return None
        pool.tails[:] = [tail + new - block]
        return block, new
    fits = [t for t in pool.tails if t >= block]
    if fits:  # best fit: the smallest cached block that holds the request
        tail = min(fits)
        pool.tails.remove(tail)
        new, seg = 0, tail
    else:
        seg = cuda_segment_size(request)
        if reserved + seg > capacity:
            return None
        new = seg
    rest = seg - block
    # should_split: the small pool splits any rest; the large pool only a rest above 1 MiB,
    # otherwise the request takes (and counts as allocated) the whole block.
    split = rest >= MIN_BLOCK_BYTES if small else rest > SMALL_REQUEST_BYTES
    if split:
        pool.tails.append(rest)
        return block, new
    return seg, new


def first_oom(requests: Sequence[tuple[str, int]], gpu: GPU | str, *,
              non_pytorch_bytes: int = RESERVED_BYTES,
              expandable_segments: bool = False) -> OutOfMemory | None:
    """Replay ``(label, bytes)`` requests, never freed, through the allocator's rules (chapter: 0).

    It returns the first that fails.

    The GPU's nvidia-smi total is its capacity; ``non_pytorch_bytes`` (the book's stated
    reserve, :data:`memlab.gpus.RESERVED_BYTES`) is held by the CUDA context and everything
    that is not a tensor, so segments can take ``gpu.usable_bytes``. Returns ``None`` when every
    request fits. A model of the documented rules (best fit, splitting, 2/20 MiB segments;
    ``expandable_segments``: one segment per pool that maps 2 or 20 MiB pages at a time), not
    the allocator itself.
    """
    g = get_gpu(gpu)
    if isinstance(non_pytorch_bytes, bool) or not isinstance(non_pytorch_bytes, int) \
            or not 0 <= non_pytorch_bytes < g.total_bytes:
        raise MemlabError(f"non_pytorch_bytes must be an integer from 0 to the GPU's total "
                          f"({g.total_bytes}), got {non_pytorch_bytes!r}")
    if not isinstance(expandable_segments, bool):
        raise MemlabError(f"expandable_segments must be True or False, got {expandable_segments!r}")
    capacity = g.total_bytes - non_pytorch_bytes
    pools = {"small": _Pool(SMALL_SEGMENT_BYTES), "large": _Pool(LARGE_SEGMENT_BYTES)}
    allocated = reserved = 0
    for i, (label, n) in enumerate(requests):
        served = _serve(pools[cuda_pool(n)], n, reserved, capacity, expandable_segments)
        if served is None:
            return OutOfMemory(
                gpu=g.name, label=label, request_bytes=n, tried_bytes=cuda_segment_size(n),
                total_bytes=g.total_bytes, free_bytes=g.total_bytes - non_pytorch_bytes - reserved,
                process_bytes=reserved + non_pytorch_bytes, allocated_bytes=allocated,
                reserved_bytes=reserved, expandable_segments=expandable_segments,
                requests_served=i,
            )
        allocated += served[0]
        reserved += served[1]
    return None




def model_state_requests(config_or_spec: StepSpec | str, **switches) -> list[tuple[str, int]]:
    """The model states' device requests in the order a first step makes them (chapter: 0).

    As ``(label, bytes)``.

    Parameters, then their gradients, then the optimizer's states as ``torch.optim`` creates
    them in its first step (Adam: a step counter on the device only when fused, then ``exp_avg``
    and ``exp_avg_sq`` per tensor; SGD with momentum: a buffer per tensor). The model is built
    on the meta device: nothing is allocated.
    """
    spec = StepSpec.of(config_or_spec, **switches)
    if spec.optimizer == "adamw-8bit":
        raise MemlabError("model_state_requests supports optimizers adamw, adam, sgd, "
                          "sgd-momentum; 'adamw-8bit' keeps its states in bitsandbytes")
    if spec.optimizer not in ("adamw", "adam", "sgd", "sgd-momentum"):
        raise MemlabError(f"model_state_requests supports optimizers adamw, adam, sgd, "
                          f"sgd-momentum; got {spec.optimizer!r}")
    with default_dtype(param_dtype(spec.precision)):
        model = build_model(spec.config, device="meta")
    params = [(name, p.numel() * p.element_size()) for name, p in model.named_parameters()]
    out = [(f"parameter {name}", n) for name, n in params]
    out += [(f"gradient of {name}", n) for name, n in params]
    for name, n in params:
        if spec.optimizer in ("adamw", "adam"):
            if spec.optimizer_impl == "fused":
                out.append((f"step of {name}", 4))
            out += [(f"exp_avg of {name}", n), (f"exp_avg_sq of {name}", n)]
        elif spec.optimizer == "sgd-momentum":
            out.append((f"momentum_buffer of {name}", n))
    return out
