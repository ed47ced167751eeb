"""``memlab record``: one pass that records, on this device (chapter: all).

It records every experiment only this device can show.

GPU time is scarce and comes in one call at a time, so a pass must do the most a reader will
see first, never overrun, and bring back whatever it finished, whatever happens:

* **a plan** (:func:`plan_pass`): the experiments that measure something on this device (the
  registry's ``needs``: ``cuda`` or ``any`` on a GPU, ``cpu`` or ``any`` on a CPU), in the
  registry's ``priority`` order, each with its cost (the measured ``wall_s`` of a record on this
  kind of device and scale where one exists, else the registry's estimate) and whether it fits
  what is left of the budget. ``--dry-run`` prints it on any machine for any device;
* **one process per experiment** (:func:`run_pass`), each in a session of its own with its own
  time limit (:func:`memlab.procs.run_child`): an allocator setting read once at CUDA's start
  needs a fresh process, a sticky CUDA error must not end the pass, and memory returns between
  experiments;
* **what is done comes back**: the child writes its record the moment it ends, and after each
  experiment the pass rewrites ``summary.json`` (name, status, seconds, the one-line error) and
  one archive of everything (records, summary, logs), each atomically;
* **the budget is a hard stop**: no experiment starts whose cost exceeds what is left, and a
  running one is stopped when the budget runs out.

``--only`` and ``--skip-recorded`` let a later pass continue where one stopped; ``--scale ci
--device cpu`` rehearses the whole machinery on a CPU in seconds (the tests do).
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from memlab.device import SCALES
from memlab.errors import MemlabError, check_choice
from memlab.experiments import Experiment, experiments, get_experiment

PASS_DEVICES = ("cuda", "cpu")
STATUSES = ("ok", "failed", "skipped", "timed out")
START_S = 10.0  # a child's start (Python, torch, the registry) on top of a record's wall_s
ARCHIVE_NAME = "record-pass.tar.gz"
SUMMARY_NAME = "summary.json"
KEPT_SUFFIXES = (".json", ".pickle")  # a record, and a file written beside it (a snapshot)


def child_timeout(cost_s: float) -> float:
    """The time limit of one experiment's process: three times its cost, and a minute more (chapter: all)."""
    return 3.0 * cost_s + 60.0


@dataclass(frozen=True)
class PlanRow:
    """One experiment in a pass: its cost, where the cost comes from, and whether it runs (chapter: all)."""

    name: str
    chapter: str
    needs: str
    priority: int
    cost_s: float
    cost_from: str  # "estimated" (the registry) or "recorded" (a record's wall_s)
    runs: bool
    reason: str  # why it does not run: "over budget", "recorded", "needs cuda", …; "" if it runs
    starts_at_s: float | None  # seconds into the pass, by the costs before it


@dataclass(frozen=True)
class Plan:
    """What a pass will run on a device, in order, within a budget (chapter: all)."""

    device: str
    scale: str
    budget_s: float
    gpus: int
    rows: tuple[PlanRow, ...]

    @property
    def planned_s(self) -> float:
        """Seconds the experiments that run are expected to take, together."""
        return sum(r.cost_s for r in self.rows if r.runs)

    def table(self) -> str:
        """The plan as a table: order, name, cost and its source, start, and what is left out."""
        lines = [f"pass on {self.device} at scale {self.scale}, budget {self.budget_s:.0f} s: "
                 f"{sum(r.runs for r in self.rows)} of {len(self.rows)} experiments, "
                 f"{self.planned_s:.0f} s planned",
                 f"  {'priority':>8}  {'experiment':<24} {'needs':<5} {'cost s':>7}  "
                 f"{'from':<9} {'starts':>7}  runs"]
        for r in self.rows:
            start = "-" if r.starts_at_s is None else f"{r.starts_at_s:.0f}"
            lines.append(f"  {r.priority:>8}  {r.name:<24} {r.needs:<5} {r.cost_s:>7.0f}  "
                         f"{r.cost_from:<9} {start:>7}  {'yes' if r.runs else 'no: ' + r.reason}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        """The plan as JSON-ready data."""
        return asdict(self)


def _check_budget(budget_s) -> float:
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise MemlabError(f"--budget must be a positive number of seconds, got {budget_s!r}")
    return float(budget_s)


def _recorded(name: str, device: str, scale: str, folders) -> list:
    from memlab.results import load_records

    out = []
    for folder in folders:
        if folder is not None and Path(folder).is_dir():
            out += [r for r in load_records(name, folder)
                    if r.provenance.get("device") == device and r.scale == scale]
    return out


def cost_of(exp: Experiment, device: str, scale: str, folders=()) -> tuple[float, str]:
    """An experiment's cost in seconds on ``device`` at ``scale``, and where it comes from (chapter: all).

    A record of it on this kind of device at this scale gives its measured ``wall_s`` (plus
    :data:`START_S` for the process's start); else the registry's estimate, which is for a full
    scale run on one GPU (a CI-scale run is counted at a tenth of it, at least 15 s).
    """
    walls = [r.provenance["wall_s"] for r in _recorded(exp.name, device, scale, folders)
             if isinstance(r.provenance.get("wall_s"), (int, float))]
    if walls:
        return max(walls) + START_S, "recorded"
    return (exp.cost_s if scale == "full" else max(exp.cost_s / 10, 15.0)), "estimated"


def plan_pass(*, device: str, budget_s: float, scale: str = "full", only=None,
              skip_recorded: bool = False, out: str | Path | None = None,
              results: str | Path | None = None, gpus: int | None = None) -> Plan:
    """The experiments a pass runs on ``device`` at ``scale`` within ``budget_s``, in order (chapter: all).

    ``only`` names the experiments (any order; the pass keeps the priority order); those
    this device cannot record are listed with the reason. ``skip_recorded`` leaves out an
    experiment with a complete record (none labelled with what it lacks) on this kind of device
    at this scale in ``out`` or ``results``.
    ``gpus`` is how many GPUs the pass has (default: those torch sees, at least one for a plan
    made elsewhere).
    """
    from memlab.results import results_dir

    check_choice("device", device, PASS_DEVICES)
    check_choice("scale", scale, SCALES)
    budget_s = _check_budget(budget_s)
    known = experiments()
    if only is not None:
        names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only)
                 if n.strip()]
        if not names:
            raise MemlabError("--only needs experiment names, comma-separated; accepted: "
                              + ", ".join(sorted(known)))
        for n in names:
            get_experiment(n)
    else:
        names = [n for n, e in known.items() if e.needs in (device, "any")]
    if gpus is None:
        gpus = max(_cuda_count(), 1) if device == "cuda" else 0
    folders = (out, results if results is not None else results_dir())
    rows, clock = [], 0.0
    for exp in sorted((known[n] for n in names), key=lambda e: (e.priority, e.name)):
        cost, source = cost_of(exp, device, scale, folders)
        reason = ""
        if exp.needs not in (device, "any"):
            reason = f"needs {exp.needs}"
        elif device == "cuda" and scale == "full" and exp.gpus > gpus:
            reason = f"needs {exp.gpus} GPUs, this pass has {gpus}"
        elif skip_recorded and any(not r.provenance.get("lacks")
                                   for r in _recorded(exp.name, device, scale, folders)):
            reason = "recorded"  # a record that lacks something is made again
        elif clock + cost > budget_s:
            reason = "over budget"
        runs = not reason
        rows.append(PlanRow(exp.name, exp.chapter, exp.needs, exp.priority, cost, source, runs,
                            reason, clock if runs else None))
        if runs:
            clock += cost
    return Plan(device=device, scale=scale, budget_s=budget_s, gpus=gpus, rows=tuple(rows))


def check_cuda_pass() -> None:
    """Refuse, in one line, a pass on CUDA where torch sees no GPU (chapter: all)."""
    if _cuda_count() == 0:
        raise MemlabError("--device cuda was asked for, but torch sees no CUDA GPU here; "
                          "use --dry-run to print the plan, or --device cpu")


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Running a pass ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassRow:
    """How one experiment of a pass ended (chapter: all)."""

    name: str
    status: str  # one of STATUSES
    seconds: float
    error: str  # the one line that says why it failed, timed out or was skipped; "" if ok
    record: str | None  # the record it wrote, relative to the pass's folder


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _error_line(tail: str) -> str:
    """The line of a child's output that says why it failed: memlab's one line, else the exception's."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("memlab: error:"):
            return ln.removeprefix("memlab: error:").strip()
    for ln in reversed(lines):
        if ":" in ln and not ln.startswith(("File ", "^", "~")) and (
                ln.split(":", 1)[0].replace(".", "").replace("_", "").isalnum()):
            return ln
    return lines[-1] if lines else "no output"


class _Pass:
    """The files a pass keeps up to date: the summary and the archive, rewritten after each step."""

    def __init__(self, plan: Plan, out: Path, archive: Path, command: str,
                 limit: int | None = None):
        self.plan, self.out, self.archive, self.limit = plan, out, archive, limit
        self.rows: list[PassRow] = []
        self.left_out: list[str] = []  # files the archive could not hold within the limit
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.command = command

    def summary(self) -> dict:
        from memlab.results import code_provenance  # no device query: CUDA stays untouched here

        return {"device": self.plan.device, "scale": self.plan.scale,
                "budget_s": self.plan.budget_s, "started": self.started,
                "command": self.command,
                "counts": {s: sum(r.status == s for r in self.rows) for s in STATUSES},
                "rows": [asdict(r) for r in self.rows],
                "left_out_of_archive": list(self.left_out),
                "provenance": code_provenance()}

    def _tar(self, leave_out: set[Path]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for path in self.files():
                if path not in leave_out:
                    tar.add(path, arcname=path.relative_to(self.out).as_posix())
        return buf.getvalue()

    def files(self) -> list[Path]:
        return [p for p in sorted(self.out.rglob("*")) if p.is_file()
                and p.resolve() != self.archive.resolve() and not p.name.startswith(".")]

    def save(self) -> None:
        """The summary, then the archive; over ``limit`` bytes, the archive leaves out the files
        beside the records (snapshots), then the logs, largest first, and the summary says so."""
        self.left_out = []
        body = json.dumps(self.summary(), indent=2).encode() + b"\n"
        _atomic_write(self.out / SUMMARY_NAME, body)
        data = self._tar(set())
        if self.limit is not None and len(data) > self.limit:
            keep = {self.out / SUMMARY_NAME}
            spare = sorted((p for p in self.files() if p.suffix != ".json" and p not in keep),
                           key=lambda p: (p.suffix != ".pickle", -p.stat().st_size))
            dropped: set[Path] = set()
            for path in spare:
                dropped.add(path)
                self.left_out.append(path.relative_to(self.out).as_posix())
                _atomic_write(self.out / SUMMARY_NAME,
                              json.dumps(self.summary(), indent=2).encode() + b"\n")
                data = self._tar(dropped)
                if len(data) <= self.limit:
                    break
        _atomic_write(self.archive, data)


def run_pass(plan: Plan, out: str | Path, *, archive: str | Path | None = None,
             python: str | None = None, command: str = "memlab record",
             archive_limit: int | None = None, echo=print) -> list[PassRow]:
    """Run a plan: each experiment in a process of its own (chapter: all).

    The summary and archive are kept current.

    Records go to ``out/<experiment>/``, each experiment's output to ``out/logs/<name>.log``;
    ``out/summary.json`` and the archive (default ``out/record-pass.tar.gz``) are rewritten
    after every experiment; ``archive_limit`` (bytes) keeps the archive under what the way back
    can carry, leaving out snapshots, then logs (the summary lists them). Returns how each one
    ended.
    """
    if plan.device == "cuda":
        check_cuda_pass()
    out = Path(out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    archive = Path(archive) if archive is not None else out / ARCHIVE_NAME
    archive.parent.mkdir(parents=True, exist_ok=True)
    state = _Pass(plan, out, archive, command, archive_limit)
    start = time.monotonic()
    env = dict(os.environ, MEMLAB_DEVICE=plan.device, PYTHONUNBUFFERED="1")
    env.pop("MEMLAB_SCALE", None)  # the scale is passed on the command line
    for row in plan.rows:
        left = plan.budget_s - (time.monotonic() - start)
        if not row.runs:
            state.rows.append(PassRow(row.name, "skipped", 0.0, row.reason, None))
            continue
        if row.cost_s > left:
            state.rows.append(PassRow(row.name, "skipped", 0.0,
                                      f"over budget: {left:.0f} s left, costs {row.cost_s:.0f} s",
                                      None))
            state.save()
            continue
        limit = min(child_timeout(row.cost_s), left)
        before = set((out / row.name).glob("*.json"))
        echo(f"[{time.monotonic() - start:6.0f} s] {row.name} (limit {limit:.0f} s)", flush=True)
        cmd = [python or sys.executable, "-m", "memlab", "run", row.name, "--scale", plan.scale,
               "--out", str(out)]
        try:
            child = _run(cmd, limit, env, out / "logs" / f"{row.name}.log")
        except KeyboardInterrupt:
            state.rows.append(PassRow(row.name, "failed", time.monotonic() - start,
                                      "the pass was interrupted", None))
            state.save()
            raise
        written = sorted(set((out / row.name).glob("*.json")) - before) or \
            sorted((out / row.name).glob(f"{plan.scale}-*.json"))
        record = written[-1].relative_to(out).as_posix() if written and child.returncode == 0 \
            else None
        if child.timed_out:
            status, error = "timed out", f"stopped after {limit:.0f} s"
        elif child.returncode == 0:
            status, error = "ok", ""
        else:
            status, error = "failed", _error_line(child.tail)
        state.rows.append(PassRow(row.name, status, round(child.seconds, 1), error, record))
        state.save()
        echo(f"         {status}" + (f": {error}" if error else "") + f" ({child.seconds:.0f} s)",
             flush=True)
    state.save()
    return state.rows


def _run(cmd, limit, env, log):
    from memlab.procs import run_child

    return run_child(cmd, timeout_s=limit, env=env, log=log)


def summary_table(rows: list[PassRow]) -> str:
    """How a pass ended, one line per experiment (chapter: all)."""
    lines = [f"  {'experiment':<24} {'status':<10} {'s':>6}  error"]
    lines += [f"  {r.name:<24} {r.status:<10} {r.seconds:>6.0f}  {r.error}" for r in rows]
    counts = ", ".join(f"{sum(r.status == s for r in rows)} {s}" for s in STATUSES)
    return "\n".join([counts, *lines])


def unpack_archive(archive: str | Path, results: str | Path) -> list[str]:
    """Copy the records of a pass's archive into ``results/``; the paths written (chapter: all).

    Only ``<experiment>/<file>.json`` members (and the ``.pickle`` files written beside a record)
    are taken, for registered experiments; the summary and logs stay in the archive.
    """
    archive, results = Path(archive), Path(results)
    if not archive.is_file():
        raise MemlabError(f"no archive at {str(archive)!r}")
    known = experiments()
    written = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, OSError) as exc:
        raise MemlabError(f"{archive} is not a pass archive ({exc})") from None
    for member, data in members:
        parts = Path(member.name).parts
        if len(parts) != 2 or parts[0] not in known or Path(parts[1]).suffix not in KEPT_SUFFIXES:
            continue
        target = results / parts[0] / parts[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target.as_posix())
    return written
