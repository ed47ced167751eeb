"""Execute notebooks without Jupyter, one Python process per notebook (chapter: all).

The code cells run in order.

The book's notebooks are executed by Jupyter when the book is built, on a CPU. A GPU machine
lent for a few minutes has Python and torch but no Jupyter, and its GPU branches are the code
a student on Colab meets first. This executor runs a notebook as a script would:

* the code cells, in order, in one namespace, with the notebook's folder as the working folder;
* IPython's own syntax turned into Python: a line magic (``%pip …``) or a shell escape
  (``!ls``) becomes ``pass`` at its indentation, a cell magic (``%%…``) skips its cell;
* ``display`` prints what it is given, the last expression of a cell is printed as Jupyter
  would show it, and figures are drawn off screen (matplotlib's Agg);
* each notebook in a process of its own (:func:`memlab.procs.run_child`), with a time limit;
  the report gives, per notebook, ok / failed / timed out / skipped, the seconds, and for a
  failure the cell and the one line that says why.

``python -m memlab.nbexec chapters labs --device cuda --report report.json`` runs every
notebook of those folders; the tests run the same executor over every notebook on the CPU.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("ok", "failed", "timed out", "skipped")
MAGIC = re.compile(r"^(\s*)[%!]")  # a line magic or a shell escape, at any indentation
CELL_MAGIC = re.compile(r"^\s*%%")


def cell_source(source: str) -> str | None:
    """A code cell's text as Python; None for a cell magic (chapter: all).

    Magics and shell escapes become ``pass``.
    """
    if CELL_MAGIC.match(source):
        return None
    return "\n".join(MAGIC.sub(r"\1pass  # ", line) if MAGIC.match(line) else line
                     for line in source.splitlines())


def code_cells(path: str | Path) -> list[str | None]:
    """The notebook's code cells, in order, as Python (None for a skipped cell magic) (chapter: all).

    The ``.ipynb`` file is read as the JSON it is: no Jupyter package is needed.
    """
    nb = json.loads(Path(path).read_text())
    return [cell_source("".join(c["source"]) if isinstance(c["source"], list) else c["source"])
            for c in nb.get("cells", []) if c.get("cell_type") == "code"]


def _display(*objs, **_kw) -> None:
    for obj in objs:
        print(repr(obj))


def _run_cell(source: str, namespace: dict, name: str) -> None:
    """Run one cell as Jupyter does: every statement, then the last one printed if it is an expression."""
    tree = ast.parse(source, filename=name)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body = tree.body[:-1]
    exec(compile(tree, name, "exec"), namespace)  # noqa: S102 - the notebook's own code
    if last is not None:
        value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)  # noqa: S307
        if value is not None and not source.rstrip().endswith(";"):  # ";" hides it in Jupyter
            print(repr(value))


def run_notebook(path: str | Path) -> None:
    """Execute one notebook's code cells in this process; raises where a cell fails (chapter: all)."""
    import matplotlib

    matplotlib.use("Agg")
    path = Path(path).resolve()
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    namespace = {"__name__": "__main__", "display": _display}
    for i, source in enumerate(code_cells(path), 1):
        if source is None or not source.strip():
            continue
        print(f"# --- cell {i}", flush=True)
        try:
            _run_cell(source, namespace, f"<{path.name} cell {i}>")
        except Exception as exc:
            traceback.print_exc()
            line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"nbexec: cell {i} failed: {type(exc).__name__}: {line}", flush=True)
            raise SystemExit(1) from None
        import matplotlib.pyplot as plt

        plt.close("all")  # as Jupyter shows each cell's figures and lets them go
    top = sorted({name.partition(".")[0] for name in sys.modules} - set(sys.stdlib_module_names))
    print(f"nbexec: imported: {','.join(n for n in top if not n.startswith('_'))}", flush=True)


# Many notebooks, each in a process of its own -----------------------------------------------------
@dataclass(frozen=True)
class NotebookRun:
    """How one notebook's execution ended (chapter: all)."""

    notebook: str
    status: str  # one of STATUSES
    seconds: float
    cell: int | None  # the failing cell (1-based, counting code cells)
    error: str  # one line: why it failed, timed out or was skipped; "" if ok
    imported: tuple[str, ...] = ()  # the packages the notebook's run imported (ok runs)


def _failure(tail: str) -> tuple[int | None, str]:
    for line in reversed(tail.splitlines()):
        m = re.match(r"nbexec: cell (\d+) failed: (.*)", line)
        if m:
            return int(m.group(1)), m.group(2)
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    return None, lines[-1].strip() if lines else "no output"


def _imported(tail: str) -> tuple[str, ...]:
    for line in reversed(tail.splitlines()):
        if line.startswith("nbexec: imported: "):
            return tuple(n for n in line.removeprefix("nbexec: imported: ").split(",") if n)
    return ()


def notebooks_under(paths) -> list[Path]:
    """Every ``.ipynb`` named or in the folders named, sorted, checkpoints left out (chapter: all)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.glob("*.ipynb"))
        elif p.suffix == ".ipynb" and p.is_file():
            found.append(p)
        else:
            from memlab.errors import MemlabError

            raise MemlabError(f"{str(p)!r} is not a notebook or a folder of notebooks")
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def run_notebooks(paths, *, device: str | None = None, scale: str = "ci",
                  timeout_s: float = 600.0, budget_s: float | None = None,
                  logs: str | Path | None = None, skip=(), echo=print,
                  report: str | Path | None = None) -> list[NotebookRun]:
    """Execute each notebook in a process of its own; how each one ended (chapter: all).

    ``device`` and ``scale`` are passed on as ``$MEMLAB_DEVICE`` and ``$MEMLAB_SCALE``;
    ``budget_s`` stops the whole run (a notebook that would start after it is skipped, one that
    runs is stopped at it); ``skip`` names notebooks to leave out (as an earlier report lists
    them). ``report``, if given, is rewritten after each notebook.
    """
    from memlab.procs import run_child

    env = dict(os.environ, MEMLAB_SCALE=scale, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    if device is not None:
        env["MEMLAB_DEVICE"] = device
    src = str(Path(__file__).resolve().parents[1])  # the folder that holds the memlab package
    env["PYTHONPATH"] = os.pathsep.join(x for x in (src, env.get("PYTHONPATH")) if x)
    logs = Path(logs) if logs is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    start, runs = time.monotonic(), []
    skip = {Path(s).as_posix() for s in skip}
    for path in notebooks_under(paths):
        name = path.as_posix()
        left = None if budget_s is None else budget_s - (time.monotonic() - start)
        if name in skip:
            runs.append(NotebookRun(name, "skipped", 0.0, None, "done in an earlier run"))
        elif left is not None and left < 5:
            runs.append(NotebookRun(name, "skipped", 0.0, None, "over budget"))
        else:
            limit = timeout_s if left is None else min(timeout_s, left)
            log = None if logs is None else logs / f"{path.stem}.log"
            child = run_child([sys.executable, "-m", "memlab.nbexec", "--one", str(path)],
                              timeout_s=limit, env=env, log=log)
            if child.timed_out:
                runs.append(NotebookRun(name, "timed out", round(child.seconds, 1), None,
                                        f"stopped after {limit:.0f} s"))
            elif child.returncode == 0:
                runs.append(NotebookRun(name, "ok", round(child.seconds, 1), None, "",
                                        _imported(child.tail)))
            else:
                cell, error = _failure(child.tail)
                runs.append(NotebookRun(name, "failed", round(child.seconds, 1), cell, error))
        r = runs[-1]
        echo(f"{r.status:<10}{r.seconds:>7.1f} s  {r.notebook}"
             + (f"  (cell {r.cell}) " if r.cell else "  ") + r.error, flush=True)
        if report is not None:
            write_report(runs, report, device=device, scale=scale)
    return runs


def write_report(runs: list[NotebookRun], path: str | Path, **about) -> None:
    """The runs as JSON, written atomically (chapter: all)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = dict(about, counts={s: sum(r.status == s for r in runs) for s in STATUSES},
                notebooks=[asdict(r) for r in runs])
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)


def merge_reports(old: str | Path, new: str | Path) -> dict:
    """One report from an earlier one and a later one that skipped what the earlier did (chapter: all).

    Each notebook keeps its latest run that was not skipped; the result is written to ``old``.
    """
    old, new = Path(old), Path(new)
    later = json.loads(new.read_text())
    runs = {r["notebook"]: r for r in json.loads(old.read_text())["notebooks"]} \
        if old.is_file() else {}
    for r in later["notebooks"]:
        if r["status"] != "skipped" or r["notebook"] not in runs:
            runs[r["notebook"]] = r
    body = dict(later, notebooks=sorted(runs.values(), key=lambda r: r["notebook"]))
    body["counts"] = {s: sum(r["status"] == s for r in body["notebooks"]) for s in STATUSES}
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text(json.dumps(body, indent=2) + "\n")
    return body


def done_in(report: str | Path) -> list[str]:
    """The notebooks an earlier report says ran to the end (chapter: all)."""
    body = json.loads(Path(report).read_text())
    return [r["notebook"] for r in body["notebooks"] if r["status"] == "ok"]


def main(argv: list[str] | None = None) -> int:
    """``python -m memlab.nbexec NOTEBOOKS… [options]``; exit 1 if any notebook failed (chapter: all)."""
    from memlab.errors import MemlabError

    p = argparse.ArgumentParser(prog="python -m memlab.nbexec", description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # the child's side
    p.add_argument("--device", default=None, help="cuda or cpu (passed as MEMLAB_DEVICE)")
    p.add_argument("--scale", default="ci", help="ci (default) or full")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per notebook")
    p.add_argument("--budget", type=float, default=None, help="seconds for all of them")
    p.add_argument("--logs", default=None, help="a folder for each notebook's output")
    p.add_argument("--report", default=None, help="a JSON report, rewritten after each notebook")
    p.add_argument("--skip-done", default=None, metavar="REPORT",
                   help="leave out the notebooks an earlier report ran to the end")
    args = p.parse_args(argv)
    if args.one:
        run_notebook(args.paths[0])
        return 0
    try:
        skip = done_in(args.skip_done) if args.skip_done else ()
        runs = run_notebooks(args.paths, device=args.device, scale=args.scale,
                             timeout_s=args.timeout, budget_s=args.budget, logs=args.logs,
                             skip=skip, report=args.report)
    except (MemlabError, OSError, json.JSONDecodeError, KeyError) as exc:
        print(f"nbexec: error: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{sum(r.status == s for r in runs)} {s}" for s in STATUSES)
    print(counts)
    return 1 if any(r.status in ("failed", "timed out") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
