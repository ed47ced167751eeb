"""Recorded runs: JSON files with the result and the provenance that produced it.

A record is what lets a page show a GPU number that this machine did not measure:
``results/<experiment>/<scale>-<device-slug>.json`` holds the experiment's result
dataclass as a dict and where, when and how it was produced (device, versions,
date, command, git commit).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from memlab.device import device_memory_bytes, device_name, pick_device
from memlab.errors import MemlabError

RESULTS_DIR_ENV = "MEMLAB_RESULTS_DIR"
REPOSITORY_URL = "https://github.com/memlab-book/memlab"  # where results/ is published (_config.yml)


def results_dir() -> Path:
    """Folder of recorded runs: ``$MEMLAB_RESULTS_DIR`` or the repository's ``results/`` (chapter: all)."""
    env = os.environ.get(RESULTS_DIR_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "results"


# Which code made a record ----------------------------------------------------------------------
SOURCE_SUFFIXES = (".py", ".js")  # the library's source: its Python and the pages' scripts
PACKAGES = ("torch", "bitsandbytes", "peft", "accelerate", "triton", "numpy")  # versions recorded
GIT_COMMIT_ENV = "MEMLAB_GIT_COMMIT"  # where the tree has no .git (a copy sent to a GPU machine)
GIT_DIRTY_ENV = "MEMLAB_GIT_DIRTY"


def package_root() -> Path:
    """The folder of the memlab package (chapter: all)."""
    return Path(__file__).resolve().parent


def source_files(root: Path | None = None) -> list[Path]:
    """The library's source files, sorted: what :func:`source_sha256` hashes (chapter: all)."""
    root = root or package_root()
    return sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()
                  and "__pycache__" not in p.parts)


def hash_sources(files: list[tuple[str, bytes]]) -> str:
    """sha256 over ``(path relative to the package, bytes)`` pairs, in path order (chapter: all)."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


@functools.cache
def source_sha256() -> str:
    """A hash of the library's source as it is on disk: every ``.py`` and ``.js`` file (chapter: all).

    Two records with the same hash were made by the same code, whatever git said; with
    :func:`git_state` it lets ``memlab check-records`` hold a record to the commit it names.
    """
    root = package_root()
    return hash_sources([(p.relative_to(root).as_posix(), p.read_bytes())
                         for p in source_files(root)])


def _git(*args: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd or package_root(), capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None]:
    """The commit the library's tree is at and whether tracked files differ from it (chapter: all).

    From git when the tree is a checkout; else from ``$MEMLAB_GIT_COMMIT`` and
    ``$MEMLAB_GIT_DIRTY`` (``0`` or ``1``), which the GPU call sets for the copy it sends;
    else ``(None, None)``.
    """
    commit = _git("rev-parse", "HEAD")
    if commit:
        status = _git("status", "--porcelain", "--untracked-files=no", "--", ".")
        return commit, None if status is None else bool(status)
    commit = os.environ.get(GIT_COMMIT_ENV) or None
    dirty = os.environ.get(GIT_DIRTY_ENV)
    return commit, None if dirty not in ("0", "1") else dirty == "1"


def memlab_version() -> str:
    """memlab's version (chapter: all).

    The imported package's own ``__version__``: the code that ran, whether installed (the
    distribution ``memlab-book``) or run from a source tree (PYTHONPATH=src).
    """
    from memlab._version import __version__

    return __version__


def package_versions() -> dict[str, str | None]:
    """Versions of the packages a record's numbers depend on, and CUDA's; None where absent (chapter: all)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    out["torch"] = torch.__version__  # the one imported, whatever the metadata on the path says
    out["cuda"] = torch.version.cuda
    return out


def code_provenance() -> dict:
    """Which code this process runs (chapter: all).

    memlab's version, the commit and whether it was dirty, the source hash, the packages.
    """
    commit, dirty = git_state()
    return {
        "python_version": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "memlab_version": memlab_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "source_sha256": source_sha256(),
        "packages": package_versions(),
    }


def provenance(device: torch.device | None = None, command: str | None = None,
               wall_s: float | None = None) -> dict:
    """Where, when, how and by which code a result was produced (chapter: all).

    ``device`` is where the work ran (a trace on fake tensors ran on the CPU, whatever the
    machine has); ``wall_s`` is how long the experiment took.
    """
    device = device or pick_device()
    return {
        "device": device.type,
        "device_name": device_name(device),
        "device_memory_bytes": device_memory_bytes(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda if device.type == "cuda" else None,
        **code_provenance(),
        "wall_s": None if wall_s is None else round(float(wall_s), 3),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or " ".join(shlex.quote(a) for a in sys.argv),
    }


_JSON_SCALARS = (str, int, float, bool, type(None))


def jsonable(obj, where: str = "result"):
    """``obj`` as JSON-safe Python (chapter: all).

    Dataclasses and dicts by field, tensors and arrays as lists.

    Anything else is refused with a one-line :class:`MemlabError` naming where it sits.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name), f"{where}.{f.name}")
                for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.device.type == "meta" or obj.is_complex():
            raise MemlabError(f"cannot write {where}: a {obj.layout}/{obj.device.type}/{obj.dtype} "
                              "tensor; accepted: dense real tensors")
        return jsonable(obj.detach().cpu().tolist(), where)
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    if type(obj).__module__ == "numpy":  # numpy scalars and arrays, without importing numpy
        return jsonable(obj.tolist(), where)
    if isinstance(obj, float) and obj != obj:  # NaN is not JSON
        return None
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return str(obj)  # 'inf' / '-inf': JSON has no infinity
    if isinstance(obj, _JSON_SCALARS):
        return obj
    raise MemlabError(f"cannot write {where}: a {type(obj).__name__}; accepted: dataclasses, "
                      "dicts, lists, tensors, numbers, strings, None")


def writable_type(tp, where: str = "result") -> None:
    """Refuse, in one line, a result type holding a field no record can store (chapter: all).

    Walks a result dataclass's annotated fields before an experiment runs, so that a result
    that could not be written fails in milliseconds, not after the run.
    """
    import types
    import typing

    if tp in (typing.Any, object):
        raise MemlabError(f"cannot write {where}: its type is {getattr(tp, '__name__', tp)}, "
                          "which a record cannot check; annotate it with a concrete type")
    if isinstance(tp, str):
        raise MemlabError(f"cannot check {where}: unresolved annotation {tp!r}")
    origin = typing.get_origin(tp)
    if origin is not None:
        if origin is typing.Literal:
            return
        for i, arg in enumerate(a for a in typing.get_args(tp) if a is not Ellipsis):
            writable_type(arg, f"{where}<{i}>" if origin in (typing.Union, types.UnionType)
                          else f"{where}[]")
        return
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            writable_type(hints[f.name], f"{where}.{f.name}")
        return
    if isinstance(tp, type) and issubclass(tp, (*_JSON_SCALARS, torch.Tensor, torch.dtype,
                                                 torch.device, Path, dict, list, tuple)):
        return
    raise MemlabError(f"cannot write {where}: a {getattr(tp, '__name__', tp)}; accepted: "
                      "dataclasses, dicts, lists, tensors, numbers, strings, None")


@dataclass(frozen=True)
class Record:
    """One stored run of an experiment: its result (as a dict) and its provenance."""

    experiment: str
    scale: str
    result: dict
    provenance: dict
    path: Path | None = field(default=None, compare=False)
    sizes: object = None  # the experiment's sizes at this scale, as JSON (None: not recorded)

    @property
    def label(self) -> str:
        """How a page labels this record, e.g. ``'recorded on NVIDIA H100 80GB HBM3, 2026-11-22'``.

        The device is the record's own, a GPU or a CPU (``'recorded on CPU: AMD EPYC, …'``); a
        record without a device name gives its device's kind (``'recorded on cpu, …'``). A
        record that lacks something a record now carries says so:
        ``'…; lacks: source_sha256, wall_s'``.
        """
        day = str(self.provenance.get("date", ""))[:10]
        lacks = self.provenance.get("lacks")
        tail = f"; lacks: {', '.join(lacks)}" if lacks else ""
        device = self.provenance.get("device_name") or self.provenance.get("device") or "?"
        return f"recorded on {device}, {day}{tail}"

    def value(self, tp: type | None = None):
        """The result this record records: the frozen result dataclass its experiment returns (chapter: all).

        The type is ``tp`` when given, else the one the experiment declared at registration
        (:func:`result_type`). The JSON is rebuilt by :func:`rebuild`: keys the type no
        longer has are ignored, a field the JSON lacks takes its default, a field the record's
        label says it lacks (``provenance["lacks"]``) is None, and any other missing field is
        a one-line :class:`MemlabError` naming it.
        """
        tp = tp or result_type(self.experiment)
        try:
            return rebuild(self.result, tp, "result", tuple(self.provenance.get("lacks") or ()))
        except (TypeError, KeyError, ValueError) as exc:
            raise MemlabError(f"the record {self.experiment}/{self.scale} "
                              f"({self.label}) cannot be read as a {tp.__name__}: {exc}") from None

    def to_json(self) -> str:
        """The record as the JSON text stored in ``results/``."""
        body = {"experiment": self.experiment, "scale": self.scale}
        if self.sizes is not None:
            body["sizes"] = self.sizes
        body |= {"result": self.result, "provenance": self.provenance}
        return json.dumps(body, indent=2, sort_keys=False) + "\n"


RESULT_TYPES: dict[str, type] = {}  # experiment -> its result dataclass, filled by the registry


def declare_result_type(experiment: str, tp: type) -> None:
    """Say which dataclass ``experiment``'s records hold (chapter: all).

    The registry calls it for each experiment.
    """
    RESULT_TYPES[experiment] = tp


def result_type(experiment: str) -> type:
    """The result dataclass ``experiment`` declared (chapter: all).

    Found by importing the parts' experiments.

    The registry (:mod:`memlab.experiments`) declares each experiment's type here when it
    registers it (:func:`declare_result_type`); an experiment not declared yet is looked for
    by importing every part's ``experiments`` module, as the registry's discovery does.
    """
    if experiment not in RESULT_TYPES:
        from memlab.book import import_rooms

        import_rooms("experiments")
    if experiment not in RESULT_TYPES:
        raise MemlabError(f"no experiment {experiment!r} declares a result type; declared: "
                          + ", ".join(sorted(RESULT_TYPES)))
    return RESULT_TYPES[experiment]


def result_sha256(result: dict) -> str:
    """A hash of a record's result as JSON, keys sorted (chapter: all).

    A number edited later no longer matches.
    """
    text = json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def make_record(experiment: str, scale: str, result, *, device=None, command=None,
                wall_s: float | None = None, sizes=None) -> Record:
    """Wrap an experiment's result dataclass with its sizes and provenance (chapter: all)."""
    body = jsonable(result)
    prov = provenance(device, command, wall_s) | {"result_sha256": result_sha256(body)}
    return Record(experiment=experiment, scale=scale, result=body, provenance=prov,
                  sizes=None if sizes is None else jsonable(sizes, "sizes"))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def record_name(scale: str, device_name: str) -> str:
    """A record's file name: ``<scale>-<device, lower case, dashes>.json`` (chapter: all)."""
    return f"{scale}-{_slug(device_name)}.json"


def save_record(record: Record, out_dir: str | Path | None = None) -> Path:
    """Write a record and return the path (chapter: all).

    The record goes to ``<out_dir>/<experiment>/<scale>-<device>.json``.
    """
    out_dir = Path(out_dir) if out_dir is not None else results_dir()
    dev = record.provenance.get("device_name") or record.provenance.get("device", "device")
    path = out_dir / record.experiment / record_name(record.scale, dev)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(record.to_json())
    except OSError as exc:
        raise MemlabError(f"cannot write the record {str(path)!r}: {exc.strerror}") from None
    return path


ARTIFACTS_ENV = "MEMLAB_ARTIFACTS_DIR"  # set while an experiment runs for a record


def artifact_path(name: str) -> Path | None:
    """Where an experiment being recorded may write a file beside its record (chapter: all).

    None if it may not.

    ``memlab run … --out DIR`` sets ``$MEMLAB_ARTIFACTS_DIR`` to ``DIR/<experiment>/``; a file
    written there (a memory snapshot, say) travels with the record (the pass's archive carries
    it, ``memlab unpack-records`` copies it). Outside a recording nothing is kept.
    """
    folder = os.environ.get(ARTIFACTS_ENV)
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder) / name


def awaiting(experiment: str, device: str = "cuda") -> str:
    """What a page prints where a record of ``experiment`` on ``device`` is not stored yet (chapter: all).

    It names the experiment and the command that fills the place.
    """
    where = "a GPU" if device == "cuda" else f"a {device}"
    return (f"no {device.upper() if device == 'cuda' else device} record of {experiment} is "
            f"stored yet: `memlab record --only {experiment} --out DIR` on {where} fills this "
            f"place (or `python -m memlab run {experiment} --scale full --out results/`)")


def rebuild(value, tp, where: str = "result", lacks=()):
    """A record's JSON value as the type it was written from (chapter: all).

    Dataclasses, tuples, lists, dicts.

    The inverse of :func:`jsonable` for the shapes records hold, so that a page can call a
    result's own methods on a stored record (what :meth:`Record.value` does with the
    experiment's declared type). Tensors stay lists and dtypes stay strings; the keys of a
    ``dict[int, ...]`` become ints again and a float written as ``'inf'`` (or NaN, written as
    None) a float. A dataclass field the JSON lacks takes its default, or None where ``lacks``
    names it the way a record's label does (``result.runs[].built_bytes``); keys the dataclass
    has no field for are ignored, except the old names it lists in ``RENAMED_FIELDS``, which are
    refused in one line.
    """
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        arms = [a for a in args if a is not type(None)]
        pick = next((a for a in arms if dataclasses.is_dataclass(a) and isinstance(value, dict)),
                    arms[0])
        return rebuild(value, pick, where, lacks)
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        renamed = getattr(tp, "RENAMED_FIELDS", {})  # old names a record may still carry
        old = next((k for k in renamed if k in value), None)
        if old is not None:
            raise MemlabError(f"{where}: {old!r} is an old name, now {renamed[old]!r}; accepted "
                              f"fields of {tp.__name__}: "
                              f"{', '.join(f.name for f in dataclasses.fields(tp))}")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            here = f"{where}.{f.name}"
            if not f.init:
                continue
            if f.name in value:
                kwargs[f.name] = rebuild(value[f.name], hints[f.name], here, lacks)
            elif here in lacks:
                kwargs[f.name] = None
        return tp(**kwargs)
    if origin is tuple and isinstance(value, list):
        if args and args[-1] is not Ellipsis:
            return tuple(rebuild(v, a, f"{where}[]", lacks)
                         for v, a in zip(value, args, strict=False))
        return tuple(rebuild(v, args[0], f"{where}[]", lacks) if args else v for v in value)
    if origin is list and isinstance(value, list):
        return [rebuild(v, args[0], f"{where}[]", lacks) if args else v for v in value]
    if origin is dict and isinstance(value, dict):
        if len(args) != 2:
            return dict(value)
        key = args[0] if args[0] in (int, float) else None
        return {key(k) if key and isinstance(k, str) else k: rebuild(v, args[1], f"{where}[]", lacks)
                for k, v in value.items()}
    if tp is float and (value is None or value in ("inf", "-inf")):
        return float("nan") if value is None else float(value)
    return value


def record_file_url(record: Record, name: str) -> str:
    """The published address of a file kept beside a record in ``results/`` (chapter: all).

    A snapshot, say.
    """
    return f"{REPOSITORY_URL}/raw/main/results/{record.experiment}/{name}"


def load_record(path: str | Path) -> Record:
    """Read one record file (chapter: all)."""
    path = Path(path)
    body = json.loads(path.read_text())
    return Record(
        experiment=body["experiment"],
        scale=body["scale"],
        result=body["result"],
        provenance=body["provenance"],
        path=path,
        sizes=body.get("sizes"),
    )


def load_records(experiment: str, results: str | Path | None = None) -> list[Record]:
    """All stored records of an experiment, newest first (chapter: all)."""
    folder = (Path(results) if results is not None else results_dir()) / experiment
    records = [load_record(p) for p in sorted(folder.glob("*.json"))]
    return sorted(records, key=lambda r: str(r.provenance.get("date", "")), reverse=True)


def recorded(experiment: str, *, device: str = "cuda", scale: str | None = "full",
             results: str | Path | None = None) -> Record | None:
    """The newest record of an experiment on a device type (``'cuda'``), or ``None`` (chapter: all)."""
    for rec in load_records(experiment, results):
        if rec.provenance.get("device") == device and (scale is None or rec.scale == scale):
            return rec
    return None


# Results kept on disk between processes -----------------------------------------------------------
CACHE_DIR_ENV = "MEMLAB_CACHE_DIR"


@functools.cache
def library_fingerprint() -> str:
    """A hash of memlab's source (:func:`source_sha256`) and torch's version (chapter: all).

    It is what a kept result depends on.
    """
    return hashlib.sha256(f"{torch.__version__}|{source_sha256()}".encode()).hexdigest()[:16]


def kept_on_disk(fn):
    """Decorator: keep ``fn``'s result in ``$MEMLAB_CACHE_DIR`` between processes (chapter: all).

    The key is the function, its arguments' ``repr`` and :func:`library_fingerprint`, so a change
    to any source file starts afresh. Without ``$MEMLAB_CACHE_DIR`` nothing is kept. The book
    build sets it, so the claims appendix reuses what the chapters trained instead of training
    again; the tests leave it unset.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        folder = os.environ.get(CACHE_DIR_ENV)
        if not folder:
            return fn(*args, **kwargs)
        key = repr((fn.__module__, fn.__qualname__, args, sorted(kwargs.items())))
        digest = hashlib.sha256(f"{key}|{library_fingerprint()}".encode()).hexdigest()[:24]
        path = Path(folder) / f"{fn.__qualname__}-{digest}.pt"
        if path.is_file():
            return torch.load(path, weights_only=False)
        out = fn(*args, **kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(out, tmp)
        os.replace(tmp, path)  # atomic: a reader never sees half a file
        return out

    return wrapper
