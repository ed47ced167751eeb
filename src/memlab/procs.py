"""Child processes that can be stopped whole (chapter: all).

Each in a session of its own, with a time limit.

memlab starts other Python processes for work that needs a fresh process (an allocator
setting read once at CUDA's start, a sticky CUDA error, a rank of a distributed run, a notebook)
or a hard time limit. Two rules hold for every one of them:

* a child runs in a **session of its own** (``start_new_session``), so a signal meant for it
  never reaches its parent, and its process group can be signalled as one;
* stopping it stops **everything below it**, including processes that started sessions of their
  own (torchrun's ranks do), found by walking ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (empty where there is no /proc) (chapter: all)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, dead and waiting to be reaped, does not) (chapter: all)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_tree(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop each child and every process below it; returns when they are gone (chapter: all).

    Each child is asked to stop (SIGTERM, so that torchrun can stop its ranks), killed after
    ``grace_s``, and whatever was below it is then killed by pid: processes that started a
    session of their own are out of reach of a signal to the child's group.
    """
    below = [c for p in procs if p.poll() is None for c in descendants(p.pid)]
    for p in procs:
        if p.poll() is None:
            _signal(p, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL)
            p.wait()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    for pid in below:
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)


def _signal(p: subprocess.Popen, sig: int) -> None:
    """Signal a child's whole group where it leads one (a session of its own), else the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)


@dataclass(frozen=True)
class ChildRun:
    """How a child process ended: exit status, whether its time ran out, seconds, its output's end."""

    returncode: int | None  # None when it was stopped at its time limit
    timed_out: bool
    seconds: float
    tail: str  # the last lines it wrote (stdout and stderr together)


def run_child(cmd: list[str], *, timeout_s: float, env: dict | None = None,
              log: str | Path | None = None, cwd: str | Path | None = None,
              tail_lines: int = 40) -> ChildRun:
    """Run ``cmd`` in a session of its own, stopped whole after ``timeout_s``; how it ended (chapter: all).

    Its standard output and error go, together, to ``log`` (a file, written as it runs, so that
    a pass stopped from outside still leaves them) or are kept in memory.
    """
    start = time.perf_counter()
    sink = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 - closed below
    try:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=cwd, start_new_session=True)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_tree([proc])
            out = None
        else:
            stop_tree([proc])  # what it left running below it
    finally:
        if log is not None:
            sink.close()
    text = Path(log).read_text(errors="replace") if log is not None else (out or "")
    tail = "\n".join(text.splitlines()[-tail_lines:])
    return ChildRun(returncode=None if timed_out else proc.returncode, timed_out=timed_out,
                    seconds=time.perf_counter() - start, tail=tail)
