"""``memlab check-records``: every stored record held to the registry (chapter: all).

Also to its own hash and the code it names.

A record under ``results/`` is what a page shows in place of a number this machine cannot
measure, so it must be what it says it is. For each ``<experiment>/<scale>-<device>.json``:

* **where it sits**: a registered experiment, in its folder, named by its scale and device;
* **what it ran on and at what size**: a known scale, a device the experiment can record on
  (a GPU-only experiment on a GPU, a device-independent one on the CPU), and the sizes the
  registry gives that scale today;
* **what it holds**: the fields of the experiment's result dataclass today, recursively, none
  missing and none unknown;
* **that nobody edited it**: its result hashes to the ``result_sha256`` written with it;
* **which code made it**: its provenance carries the version, the commit, whether the tree was
  dirty, the source hash, the packages and the seconds; and when it names a clean commit this
  repository has, the source hash is that commit's.

A record made before records carried something (a provenance field, a result field added
since) can be kept when it says so: ``provenance["lacks"]`` lists exactly what it lacks, and
its page label shows the list (``memlab check-records --label`` writes it). What a label cannot
excuse (an edited result, a wrong place, another size, a field no dataclass has, a source hash
that is not its commit's) is a problem: one line naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from memlab.device import DEVICES, SCALES
from memlab.errors import MemlabError
from memlab.experiments import experiments
from memlab.results import (
    SOURCE_SUFFIXES,
    hash_sources,
    jsonable,
    package_root,
    record_name,
    result_sha256,
)

# What a record's provenance carries today; a record without one of them must say it lacks it.
REQUIRED_PROVENANCE = ("device", "device_name", "date", "memlab_version", "git_commit",
                       "git_dirty", "source_sha256", "packages", "wall_s", "result_sha256")


@dataclass(frozen=True)
class RecordCheck:
    """One record file checked: what it lacks (excusable by a label) and what is wrong (chapter: all)."""

    path: str
    lacks: tuple[str, ...]  # missing things a label may excuse
    labelled: tuple[str, ...]  # what its label says it lacks
    problems: tuple[str, ...]  # what no label excuses

    @property
    def ok(self) -> bool:
        """No problem, and a label that says exactly what it lacks."""
        return not self.problems and set(self.lacks) == set(self.labelled)

    def line(self) -> str:
        """One line: the file and everything wrong with it, or 'ok' (with its label)."""
        issues = list(self.problems)
        missing = [x for x in self.lacks if x not in self.labelled]
        if missing:
            issues.append(f"lacks {', '.join(missing)} (re-record it, or label it with "
                          "memlab check-records --label)")
        extra = [x for x in self.labelled if x not in self.lacks]
        if extra:
            issues.append(f"its label says it lacks {', '.join(extra)}, which it has")
        if issues:
            return f"{self.path}: {'; '.join(issues)}"
        return f"{self.path}: ok" + (f" (lacks: {', '.join(self.labelled)})" if self.labelled else "")


# The result's fields against the dataclass ------------------------------------------------------
def _field_issues(value, tp, where: str, lacks: list[str], problems: list[str]) -> None:
    """Walk ``value`` (JSON) along the type ``tp``: dataclass fields missing or unknown, recursively."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return
        for arm in arms:  # the first arm the value can be (a dict for a dataclass)
            if not (dataclasses.is_dataclass(arm) and not isinstance(value, dict)):
                _field_issues(value, arm, where, lacks, problems)
                return
        return
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            problems.append(f"{where} is a {type(value).__name__}, not a {tp.__name__}")
            return
        hints = typing.get_type_hints(tp)
        names = [f.name for f in dataclasses.fields(tp)]
        for name in names:
            if name not in value:
                lacks.append(f"{where}.{name}")
            else:
                _field_issues(value[name], hints[name], f"{where}.{name}", lacks, problems)
        unknown = [k for k in value if k not in names]
        if unknown:
            problems.append(f"{where} has {', '.join(unknown)}, which {tp.__name__} no longer "
                            "has (renamed or removed since it was recorded)")
        return
    args = typing.get_args(tp)
    if origin in (list, tuple) and isinstance(value, list) and args:
        item = args[0]
        for i, v in enumerate(value):  # items are named together: result.runs[].x
            _field_issues(v, args[i] if origin is tuple and args[-1] is not Ellipsis
                          and i < len(args) else item, f"{where}[]", lacks, problems)
    elif origin is dict and isinstance(value, dict) and len(args) == 2:
        for v in value.values():
            _field_issues(v, args[1], f"{where}[]", lacks, problems)


# The source a commit names ------------------------------------------------------------------------
def _repo_root() -> Path | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=package_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


@functools.cache
def commit_source_sha256(commit: str) -> str | None:
    """:func:`memlab.results.source_sha256` of the library at ``commit`` (chapter: all).

    The library as committed at ``commit``; None if unknown here.
    """
    root = _repo_root()
    if root is None:
        return None
    prefix = package_root().relative_to(root).as_posix()
    try:
        listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "--", prefix],
                                 cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if listing.returncode != 0:
        return None  # a commit this clone does not have
    names = [n for n in listing.stdout.splitlines() if Path(n).suffix in SOURCE_SUFFIXES
             and "__pycache__" not in n]
    blobs = subprocess.run(["git", "cat-file", "--batch"], cwd=root, capture_output=True,
                           input="".join(f"{commit}:{n}\n" for n in names).encode(), timeout=60)
    data, files, pos = blobs.stdout, [], 0
    for name in names:
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        start = header_end + 1
        files.append((name[len(prefix) + 1:], data[start:start + size]))
        pos = start + size + 1
    return hash_sources(files)


# One record ----------------------------------------------------------------------------------------
def check_record(path: str | Path, *, root: str | Path | None = None) -> RecordCheck:
    """Check one record file against the registry, its hash and its commit (chapter: all)."""
    path = Path(path)
    shown = str(path if root is None else path.relative_to(root) if path.is_relative_to(root)
                else path)
    lacks: list[str] = []
    problems: list[str] = []

    def done(labelled=()) -> RecordCheck:
        once = lambda xs: tuple(dict.fromkeys(xs))  # noqa: E731 - in order, each once
        return RecordCheck(shown, once(lacks), tuple(labelled), once(problems))

    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"not a JSON record ({type(exc).__name__})")
        return done()
    missing = [k for k in ("experiment", "scale", "result", "provenance") if k not in body]
    if not isinstance(body, dict) or missing:
        problems.append(f"not a record: no {', '.join(missing) or 'object'}")
        return done()
    prov = body["provenance"] if isinstance(body["provenance"], dict) else {}
    labelled = tuple(prov.get("lacks") or ())
    name, scale = body["experiment"], body["scale"]
    known = experiments()
    if name not in known:
        problems.append(f"experiment {name!r} is not registered")
        return done(labelled)
    exp = known[name]
    if path.parent.name != name:
        problems.append(f"it records {name!r} but sits in the folder {path.parent.name!r}")
    if scale not in SCALES:
        problems.append(f"scale {scale!r} is not one of {', '.join(SCALES)}")
    device = prov.get("device")
    if device not in DEVICES:
        problems.append(f"device {device!r} is not one of {', '.join(DEVICES)}")
    elif exp.needs == "cuda" and device != "cuda":
        problems.append(f"{name} measures on a CUDA GPU only, and this record is from {device}")
    elif exp.needs == "cpu" and device != "cpu":
        problems.append(f"{name} runs on the CPU wherever it is run, and this record says "
                        f"{device}")
    expected = record_name(scale, str(prov.get("device_name") or device or "device"))
    if path.name != expected:
        problems.append(f"its file name should be {expected} (scale and device)")
    if "sizes" not in body:
        lacks.append("sizes")
    elif scale in exp.sizes and body["sizes"] != jsonable(exp.sizes[scale], "sizes"):
        problems.append(f"made at other sizes than {name}'s {scale} scale has today "
                        "(re-record it)")
    _field_issues(body["result"], exp.result, "result", lacks, problems)
    lacks += [key for key in REQUIRED_PROVENANCE if prov.get(key) is None]
    if prov.get("memlab_version") == "unknown":
        lacks.append("memlab_version")
    if prov.get("result_sha256") and prov["result_sha256"] != result_sha256(body["result"]):
        problems.append("its result was edited after it was recorded (result_sha256 differs)")
    commit, source = prov.get("git_commit"), prov.get("source_sha256")
    if commit and source and prov.get("git_dirty") is False:
        at_commit = commit_source_sha256(commit)
        if at_commit is not None and at_commit != source:
            problems.append(f"its source_sha256 is not the source of commit {commit[:12]}, "
                            "which it names as clean")
    return done(labelled)


def record_files(folder: str | Path) -> list[Path]:
    """The record files under ``folder``: ``<experiment>/<file>.json`` (chapter: all).

    A folder whose name starts with ``_`` holds no records (``_notebooks``: the notebooks' runs
    on a GPU).
    """
    return sorted(p for p in Path(folder).glob("*/*.json")
                  if p.is_file() and not p.parent.name.startswith("_"))


def check_records(folder: str | Path) -> list[RecordCheck]:
    """Every record under ``folder`` checked, in path order (chapter: all)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MemlabError(f"no folder of records at {str(folder)!r}")
    return [check_record(p, root=folder) for p in record_files(folder)]


def label_record(path: str | Path) -> RecordCheck:
    """Write into a record's provenance what it lacks, so that its page says so (chapter: all).

    Only what is missing is written; a record with a problem no label excuses is refused in one
    line, unchanged.
    """
    path = Path(path)
    check = check_record(path)
    if check.problems:
        raise MemlabError(f"{path}: not labelled: {'; '.join(check.problems)}")
    body = json.loads(path.read_text())
    if check.lacks:
        body["provenance"]["lacks"] = list(check.lacks)
    else:
        body["provenance"].pop("lacks", None)
    path.write_text(json.dumps(body, indent=2) + "\n")
    return check_record(path)
