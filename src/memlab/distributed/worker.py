"""The code every rank runs: join the group, call the target, write the answer (chapter 6).

``python -m memlab.distributed.worker module:function spec.json out/`` is what
:func:`memlab.distributed.launch.launch` starts under torchrun. The same file runs on a CPU
(gloo) and on GPUs (NCCL, one process per GPU, ``LOCAL_RANK`` picks the GPU).

Tear-down is part of the job: every rank meets at a barrier and destroys the process group,
so no rank leaves while another still sends; a rank that raises writes its error first, so
the parent can name the rank and the exception in one line.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def rank_device(kind: str | None = None) -> torch.device:
    """This rank's device (chapter: 6).

    Its own GPU (``LOCAL_RANK``) when the launch uses GPUs, else the CPU.
    """
    if kind != "cpu" and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def launched() -> bool:
    """Whether a launcher described a process group in the environment (chapter: 6).

    It reads RANK, WORLD_SIZE and MASTER_ADDR.
    """
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init(backend: str | None = None, timeout_s: float = 30.0,
         device: str | None = None) -> torch.device:
    """Join the process group the launcher described in the environment (chapter: 6).

    It returns this rank's device.

    A process started without one (``accelerate launch`` asked for FSDP on a CPU-only machine
    starts such copies) forms a group of one, so that the parent sees and reports it.
    """
    device = rank_device(device)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kw = dict(timeout=datetime.timedelta(seconds=timeout_s),
              device_id=device if device.type == "cuda" else None)
    if launched():
        dist.init_process_group(backend, **kw)
    else:
        dist.init_process_group(backend, init_method=f"file://{_alone_file()}", rank=0,
                                world_size=1, **kw)
    return device


def _alone_file() -> str:
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="memlab-alone-"), "store")


def _resolve(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    """Run one rank: ``argv`` is ``[target, spec_path, out_dir]`` (chapter: 6)."""
    target, spec_path, out = argv
    out = Path(out)
    rank = int(os.environ.get("RANK", "0"))
    spec = json.loads(Path(spec_path).read_text())
    try:
        torch.set_num_threads(1)
        device = init(spec.get("_backend"), spec.get("_collective_timeout_s", 30.0),
                      spec.get("_device"))
        rank = dist.get_rank()
        answer = _resolve(target)(spec, device)
        answer = dict(answer or {}, rank=rank, world_size=dist.get_world_size(),
                      backend=dist.get_backend(), device=str(device))
        (out / f"answer-{os.getpid()}.json").write_text(json.dumps(answer))
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then re-raised
        line = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        (out / f"error-{rank}-{os.getpid()}.error").write_text(traceback.format_exc() + line + "\n")
        raise


if __name__ == "__main__":  # pragma: no cover - run by torchrun
    sys.exit(main(sys.argv[1:]))
