"""The CUDA caching allocator measured on a GPU (chapter 0).

Blocks, fragmentation with expandable segments off and on, a real out-of-memory message read number
by number, and a memory snapshot of one step.

:mod:`memlab.measure.allocator` puts the allocator's rules in code; this module holds them to the
allocator itself. Everything here needs a CUDA GPU; on another device :func:`allocator_record`
returns a status saying so, and the chapter shows the rules alone.

* :func:`read_oom_message` reads the numbers out of an out-of-memory message, in the words the
  allocator prints them (``format_size``'s two decimals), so each can be set beside the
  statistic it came from;
* :func:`capture_oom` provokes a real one: a request larger than what is free, refused by
  ``cudaMalloc``, on plain device memory (never managed memory), caught, and the allocator's
  counters read at once;
* :func:`fragmentation_in_child` runs :func:`memlab.measure.allocator.fragmentation` in a fresh
  process with ``expandable_segments`` set before CUDA starts, as it must be.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass

import torch

from memlab.device import pick_device
from memlab.errors import MemlabError
from memlab.measure.allocator import (
    ALLOC_CONF_ENV,
    Fragmentation,
    format_size,
    measure_cuda_blocks,
)
from memlab.measure.timeline import MemoryTimeline, measure_timeline

# Requests on both sides of each rounding rule: 512-byte blocks, the 1 MiB pool limit, the
# 10 MiB limit of shared segments, and a large request rounded to 2 MiB.
BLOCK_REQUESTS = (1, 512, 513, 2**20, 2**20 + 1, 5 * 2**20, 10 * 2**20 - 1, 10 * 2**20,
                  100 * 2**20 + 1)

_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB)"
OOM_NUMBERS = (  # (key, the words before the number in the message)
    ("tried", r"Tried to allocate " + _SIZE),
    ("total", r"total capacity of " + _SIZE),
    ("free", r"of which " + _SIZE + r" is free"),
    ("process", r"this process has " + _SIZE + r" memory in use"),
    ("allocated", _SIZE + r" is allocated by PyTorch"),
    ("unallocated", _SIZE + r" is reserved by PyTorch but unallocated"),
)
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def read_oom_message(text: str) -> dict[str, str]:
    """The numbers of a CUDA out-of-memory message, as printed: ``{'tried': '20.00 MiB', …}`` (chapter: 0).

    A number the message does not hold (older torch words it differently) is left out.
    """
    out = {}
    for key, pattern in OOM_NUMBERS:
        m = re.search(pattern, text)
        if m:
            out[key] = f"{m.group(1)} {m.group(2)}"
    if not out:
        raise MemlabError("not a CUDA out-of-memory message: none of its numbers is there")
    return out


def printed_bytes(printed: str) -> float:
    """A size as the allocator prints it (``'20.00 MiB'``), in bytes, to its two decimals (chapter: 0)."""
    number, unit = printed.split()
    return float(number) * _UNITS[unit]


@dataclass(frozen=True)
class CapturedOOM:
    """A real out-of-memory error on this GPU and its numbers (chapter: 0).

    With the statistics read as it was raised.
    """

    message: str
    printed: dict[str, str]  # read_oom_message(message)
    request_bytes: int  # what was asked for
    stats: dict[str, int]  # the statistic each number comes from, read right after the error

    def lines(self) -> list[tuple[str, str, str, int, bool]]:
        """(key, printed, statistic, its bytes, printed == format_size(bytes)) for each number (chapter: 0)."""
        names = {"tried": "the segment asked of cudaMalloc", "total": "mem_get_info()[1]",
                 "free": "mem_get_info()[0]", "process": "NVML: this process's device memory",
                 "allocated": "allocated_bytes.all.current",
                 "unallocated": "reserved_bytes.all.current - allocated"}
        return [(k, p, names[k], self.stats[k], format_size(self.stats[k]) == p)
                for k, p in self.printed.items() if k in self.stats]


def capture_oom(device=None, keep_bytes: int = 2**30) -> CapturedOOM:
    """Ask for more than this GPU has free, catch the error, read its numbers (chapter: 0).

    ``keep_bytes`` stay allocated meanwhile, so that "allocated by PyTorch" is not zero. The
    request is plain device memory; ``cudaMalloc`` refuses it at once, and nothing is left
    allocated afterwards.
    """
    dev = pick_device(device)
    if dev.type != "cuda":
        raise MemlabError(f"capture_oom needs a CUDA GPU, got {dev.type!r}")
    keep = torch.empty(keep_bytes, dtype=torch.uint8, device=dev)
    free, total = torch.cuda.mem_get_info(dev)
    request = int(free + 4 * 2**30)  # more than is free: refused by cudaMalloc
    try:
        torch.empty(request, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as exc:
        message = str(exc)
        stats = torch.cuda.memory_stats(dev)
        free_now, total_now = torch.cuda.mem_get_info(dev)
    else:  # pragma: no cover - a GPU that serves more than it has free
        raise MemlabError(f"a request of {request:,} bytes was served on a GPU with {free:,} "
                          "free: no out-of-memory error to read")
    finally:
        del keep
        torch.cuda.empty_cache()
    allocated = int(stats["allocated_bytes.all.current"])
    reserved = int(stats["reserved_bytes.all.current"])
    from memlab.measure.allocator import cuda_segment_size

    values = {"tried": cuda_segment_size(request), "total": int(total_now),
              "free": int(free_now), "allocated": allocated,
              "unallocated": reserved - allocated}
    with contextlib.suppress(Exception):  # NVML, where it is: optional
        values["process"] = int(torch.cuda.device_memory_used(dev))
    return CapturedOOM(message=message, printed=read_oom_message(message), request_bytes=request,
                       stats=values)


_CHILD = """
import json
from memlab.measure.allocator import fragmentation
print("FRAGMENTATION " + json.dumps(fragmentation(device="cuda").as_dict()))
"""


def fragmentation_in_child(expandable: bool, timeout_s: float = 120.0) -> Fragmentation:
    """:func:`fragmentation` in a fresh process (chapter: 0).

    ``expandable_segments`` is set before CUDA starts.
    """
    from memlab.procs import run_child

    env = dict(os.environ, **{ALLOC_CONF_ENV: f"expandable_segments:{expandable}"})
    child = run_child([sys.executable, "-c", _CHILD], timeout_s=timeout_s, env=env)
    for line in child.tail.splitlines():
        if line.startswith("FRAGMENTATION "):
            return Fragmentation(**json.loads(line.removeprefix("FRAGMENTATION ")))
    raise MemlabError(f"the fragmentation run with expandable_segments:{expandable} failed: "
                      + (child.tail.strip().splitlines() or ["no output"])[-1])


@dataclass(frozen=True)
class AllocatorRecord:
    """What one GPU shows of its caching allocator (chapter: 0); on another device, its status only."""

    status: str  # "measured", or why not
    device_name: str
    blocks: list[dict]  # measure_cuda_blocks(BLOCK_REQUESTS): the rules beside the counters
    fragmentation_off: Fragmentation | None  # expandable_segments:False (the default)
    fragmentation_on: Fragmentation | None  # expandable_segments:True
    oom: CapturedOOM | None
    timeline: MemoryTimeline | None  # one training step, from the allocator's own history
    snapshot_file: str | None  # its pickle for pytorch.org/memory_viz, beside the record


SNAPSHOT_STEP = {"ci": dict(model="tiny", batch_size=4, seq_len=64),
                 "full": dict(model="gpt2", batch_size=4, seq_len=512, precision="bf16-mixed")}


def allocator_record(scale: str = "full", device=None) -> AllocatorRecord:
    """Blocks, fragmentation both ways, a captured out-of-memory error and a step's snapshot (chapter: 0)."""
    from memlab.device import device_name
    from memlab.measure.timing import not_measurable
    from memlab.results import artifact_path

    dev = pick_device(device)
    if dev.type != "cuda":
        return AllocatorRecord(not_measurable(dev, "the caching allocator is CUDA's; the "
                                                   "chapter shows its documented rules"),
                               device_name(dev), [], None, None, None, None, None)
    blocks = measure_cuda_blocks(BLOCK_REQUESTS, dev)
    off, on = fragmentation_in_child(False), fragmentation_in_child(True)
    oom = capture_oom(dev)
    step = dict(SNAPSHOT_STEP[scale])
    name = f"snapshot-{scale}.pickle"
    path = artifact_path(name)
    timeline = measure_timeline(step.pop("model"), device=dev, path=path, **step)
    return AllocatorRecord("measured", device_name(dev), blocks, off, on, oom,
                           timeline, name if path is not None else None)

