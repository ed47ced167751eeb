"""Start N processes with ``torchrun`` and collect what each rank reports (chapter 6).

One code path for every device: the parent calls :func:`launch`, which runs

    python -m torch.distributed.run --nproc-per-node N ... -m memlab.distributed.worker TARGET SPEC OUT

``memlab.distributed.worker`` joins the process group (gloo on a CPU, NCCL on GPUs), calls
``TARGET(spec, device)`` on every rank and writes that rank's answer to
``OUT/answer-<pid>.json``. The parent reads the answers back, one dict per process, in rank
order.

What can go wrong is turned into one line each:

* a rank raises: torchrun stops the others; the error names the rank and its exception;
* a collective never completes: the process group's timeout fires on the waiting ranks;
* the launch does not finish in ``timeout_s``: the whole process group is killed;
* the processes did not form one group (each thinks it is alone, as ``accelerate launch``
  does on a CPU-only machine when asked for FSDP): :func:`check_group` says so.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from memlab.errors import MemlabError
from memlab.procs import stop_tree

BACKENDS = ("gloo", "nccl")
DEFAULT_TIMEOUT_S = 120.0  # a whole launch: start-up is 15-20 s on 2 cores
COLLECTIVE_TIMEOUT_S = 30.0  # one collective that never completes


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on now (chapter: 6)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Launch:
    """What one launch did: every rank's answer, the command, and its wall time in seconds."""

    ranks: tuple[dict, ...]
    command: tuple[str, ...]
    wall_s: float
    nnodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        """Processes in the launch (chapter: 6)."""
        return self.nnodes * self.nproc_per_node


def _check_count(name: str, value, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise MemlabError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def torchrun_command(target: str, spec_path: str | Path, out: str | Path, *, nproc: int,
                     nnodes: int = 1, node_rank: int = 0, endpoint: str) -> list[str]:
    """The ``torchrun`` command line that starts one node's ranks (chapter: 6)."""
    return [sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node_rank}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=memlab",
            "--max-restarts=0", "--monitor-interval=0.2",
            "-m", "memlab.distributed.worker", target, str(spec_path), str(out)]


def _failure(out: Path, rc: int, stderr: str) -> str:
    """The first rank's error, as the worker wrote it, else the end of torchrun's output."""
    errors = sorted(out.glob("error-*.error"), key=lambda p: p.stat().st_mtime)
    if errors:
        first = errors[0]  # the first to fail; the others often fail because of it
        rank = first.stem.split("-")[1]
        return f"rank {rank} failed: {first.read_text().strip().splitlines()[-1]}"
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-3:]
    return f"torchrun exited with {rc}: " + " | ".join(tail)


def launch_device(nproc: int, nnodes: int = 1) -> str:
    """``'cuda'`` when this machine has a GPU for every rank it starts, else ``'cpu'`` (chapter: 6).

    NCCL needs one GPU per rank.
    """
    import torch

    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc * nnodes \
        else "cpu"


def accelerate_command(target: str, spec_path: str | Path, out: str | Path, *, nproc: int,
                       args: tuple[str, ...] = ()) -> list[str]:
    """The ``accelerate launch`` command line that starts the same worker (chapter: 6).

    ``args`` are accelerate's own options, e.g. ``("--config_file", "configs/accelerate/fsdp2.yaml")``.
    """
    return [sys.executable, "-m", "accelerate.commands.launch", f"--num_processes={nproc}",
            *args, "-m", "memlab.distributed.worker", target, str(spec_path), str(out)]


def launch(target: str, spec: dict | None = None, *, nproc: int = 4, nnodes: int = 1,
           backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
           collective_timeout_s: float = COLLECTIVE_TIMEOUT_S, env: dict | None = None,
           accelerate_args: tuple[str, ...] | None = None) -> Launch:
    """Run ``target(spec)`` on ``nnodes x nproc`` ranks through torchrun; every rank's answer (chapter: 6).

    ``target`` is ``"module:function"``. ``nnodes > 1`` starts that many torchrun "nodes" on
    this machine, joined by the c10d rendezvous on the loopback address, as separate
    machines would be. The ranks use GPUs only when there is one for each
    (:func:`launch_device`), else the CPU with gloo. The launch is stopped, every process
    with it, after ``timeout_s``. ``accelerate_args`` (a tuple, possibly empty) starts the
    ranks with ``accelerate launch`` and those options instead of torchrun.
    """
    from memlab.errors import check_choice

    _check_count("nproc", nproc)
    _check_count("nnodes", nnodes)
    if not isinstance(target, str) or ":" not in target:
        raise MemlabError(f"target must be 'module:function', got {target!r}")
    if backend is not None:
        check_choice("backend", backend, BACKENDS)
    if not timeout_s > 0 or not collective_timeout_s > 0:
        raise MemlabError(f"timeouts must be positive seconds, got timeout_s={timeout_s!r} and "
                          f"collective_timeout_s={collective_timeout_s!r}; accepted: numbers > 0")
    work = Path(tempfile.mkdtemp(prefix="memlab-launch-"))
    try:
        spec_path = work / "spec.json"
        spec_path.write_text(json.dumps(dict(spec or {}, _backend=backend,
                                             _collective_timeout_s=collective_timeout_s,
                                             _device=launch_device(nproc, nnodes))))
        endpoint = f"127.0.0.1:{free_port()}"
        if accelerate_args is not None:
            if nnodes != 1:
                raise MemlabError(f"accelerate launch here starts one node, got nnodes={nnodes}; "
                                  "accepted: nnodes=1 (torchrun for several)")
            cmds = [accelerate_command(target, spec_path, work, nproc=nproc,
                                       args=tuple(accelerate_args))]
        else:
            cmds = [torchrun_command(target, spec_path, work, nproc=nproc, nnodes=nnodes,
                                     node_rank=n, endpoint=endpoint) for n in range(nnodes)]
        run_env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
                       PYTHONUNBUFFERED="1", **(env or {}))
        start = time.perf_counter()
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=run_env, start_new_session=True) for c in cmds]
        outputs = []
        try:
            for p in procs:
                left = max(timeout_s - (time.perf_counter() - start), 0.1)
                outputs.append(p.communicate(timeout=left))
        except subprocess.TimeoutExpired:
            stop_tree(procs)
            raise MemlabError(f"the launch of {target} on {nnodes * nproc} processes did not "
                              f"finish in {timeout_s:g} s and was stopped") from None
        finally:
            stop_tree(procs)  # a no-op when all have exited
        wall = time.perf_counter() - start
        bad = [(p.returncode, err) for p, (_, err) in zip(procs, outputs, strict=True)
               if p.returncode != 0]
        if bad:
            raise MemlabError(_failure(work, bad[0][0], bad[0][1]))
        ranks = read_answers(work)
        check_group(ranks, nnodes * nproc)
        return Launch(ranks=tuple(ranks), command=tuple(cmds[0]), wall_s=wall, nnodes=nnodes,
                      nproc_per_node=nproc)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_answers(out: str | Path) -> list[dict]:
    """Every process's answer in ``out``, by rank (chapter: 6)."""
    answers = [json.loads(p.read_text()) for p in Path(out).glob("answer-*.json")]
    return sorted(answers, key=lambda a: a.get("rank", -1))


def check_group(answers: list[dict], expected: int, *, quiet: bool = False) -> str:
    """Raise unless ``answers`` come from one process group of ``expected`` ranks (chapter: 6).

    Each answer carries the ``rank`` and ``world_size`` its process saw. N copies that each
    saw a world of one (``accelerate launch`` on a CPU-only machine, asked for FSDP) are N
    separate trainings, not one sharded training.
    """
    worlds = sorted({a.get("world_size") for a in answers}, key=str)
    ranks = sorted(a.get("rank") for a in answers if a.get("rank") is not None)
    if worlds == [expected] and ranks == list(range(expected)):
        return "one process group"
    msg = (f"the launch did not form one process group of {expected}: the processes saw "
           f"world sizes {worlds} and ranks {ranks}; they trained separately")
    if quiet:
        return msg
    raise MemlabError(msg)
