"""The student version of a lab.

Solutions stripped, mark schemes and hidden tests removed, outputs cleared.

The lab notebooks carry nbgrader's cell metadata and markers, and this module makes the same
student version as nbgrader's ``generate_assignment`` (with ``ClearSolutions.code_stub =
{"python": "# YOUR CODE HERE"}``; ``tests/labs/test_nbgrader.py`` compares the two), without
needing nbgrader or a course folder:

* each ``### BEGIN SOLUTION`` .. ``### END SOLUTION`` region of a code cell becomes one
  ``# YOUR CODE HERE`` line at the marker's indentation (``pass  # YOUR CODE HERE`` where a bare
  comment would leave a block empty), so the student version still runs to the end and every
  check reports "not attempted";
* ``### BEGIN HIDDEN TESTS`` .. ``### END HIDDEN TESTS`` regions (the autograder's asserts)
  are removed;
* ``=== BEGIN MARK SCHEME ===`` .. ``=== END MARK SCHEME ===`` regions of markdown cells are
  removed, and a cell left empty (or tagged ``solution``) is dropped.

``python -m memlab.labs.student labs --out labs/student`` (``make student``) writes them. The
book publishes these files (``labs/student/`` is committed, so that a launch button opens the
student version), and ``--check`` (``make book`` runs it first) fails when one of them is not
what the instructor version now gives.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlab.errors import MemlabError

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN_TESTS = "### BEGIN HIDDEN TESTS"
END_HIDDEN_TESTS = "### END HIDDEN TESTS"
BEGIN_MARK_SCHEME = "=== BEGIN MARK SCHEME ==="
END_MARK_SCHEME = "=== END MARK SCHEME ==="
CODE_STUB = "# YOUR CODE HERE"
SOLUTION_TAG = "solution"


# ------------------------------------------------------------------ student version


@dataclass
class StripStats:
    """What :func:`strip_solutions` removed from one notebook."""

    code_regions: int = 0
    markdown_regions: int = 0
    cells_removed: int = 0
    hidden_test_regions: int = 0


def _source_text(cell: Mapping[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _cell_name(index: int, cell: Mapping[str, Any]) -> str:
    cell_id = cell.get("id")
    return f"cell {index}" + (f" (id {cell_id})" if cell_id else "")


def _strip_regions(
    text: str, pairs: Mapping[str, str], where: str, stubs: Mapping[str, str]
) -> tuple[str, dict[str, int]]:
    """Replace each marked region (markers included) by its opening marker's stub in ``stubs``,
    at the marker's indentation, or drop it when that marker has none. Returns the text and the
    number of regions per opening marker."""
    ends = {end: begin for begin, end in pairs.items()}
    out: list[str] = []
    stub_at: list[tuple[int, str]] = []  # (index in out, indentation) of each code stub
    open_marker: str | None = None
    open_line = 0
    regions = dict.fromkeys(pairs, 0)
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker in pairs:
            if open_marker is not None:
                raise MemlabError(
                    f"{where}: line {number}: {marker!r} inside the region opened by "
                    f"{open_marker!r} on line {open_line}; close it with {pairs[open_marker]!r} first"
                )
            open_marker, open_line = marker, number
            indent = line[: len(line) - len(line.lstrip())]
            stub = stubs.get(marker)
            if stub is not None:
                stub_at.append((len(out), indent))
                out.append(f"{indent}{stub}\n")
            continue
        if marker in ends:
            if open_marker is None or pairs[open_marker] != marker:
                raise MemlabError(
                    f"{where}: line {number}: {marker!r} without a matching {ends[marker]!r} before it"
                )
            regions[open_marker] += 1
            open_marker = None
            continue
        if open_marker is None:
            out.append(line)
    if open_marker is not None:
        raise MemlabError(
            f"{where}: line {open_line}: {open_marker!r} is never closed by {pairs[open_marker]!r}"
        )
    for index, indent in stub_at:
        if indent and _block_left_empty(out, index, indent):
            out[index] = f"{indent}pass  {out[index].strip()}\n"
    result = "".join(out)
    if not text.endswith("\n") and result.endswith("\n"):
        result = result[:-1]
    return result, regions


def _is_statement(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


def _block_left_empty(lines: list[str], index: int, indent: str) -> bool:
    """True when the stub at ``lines[index]`` opens a block (the statement before it ends with
    ':') and no statement follows it at its indentation: a bare comment there is a syntax error."""
    before = next((line for line in reversed(lines[:index]) if _is_statement(line)), "")
    if not before.rstrip().endswith(":"):
        return False
    after = next((line for line in lines[index + 1:] if _is_statement(line)), None)
    return after is None or len(after) - len(after.lstrip()) < len(indent)


def strip_solutions(
    nb: Mapping[str, Any], source_name: str = "notebook", stats: StripStats | None = None
) -> dict:
    """Return the student version of a notebook dict: solutions removed, outputs cleared (chapter: labs).

    Code cells: each ``### BEGIN SOLUTION`` .. ``### END SOLUTION`` region becomes one
    ``# YOUR CODE HERE`` line at the marker's indentation (``pass  # YOUR CODE HERE`` where the
    block would otherwise be empty), and ``### BEGIN HIDDEN TESTS`` .. ``### END HIDDEN
    TESTS`` regions are removed. Markdown cells: regions between the solution markers or
    between ``=== BEGIN MARK SCHEME ===`` .. ``=== END MARK SCHEME ===`` are removed, and
    cells tagged ``solution`` are removed entirely. Unbalanced markers raise a one-line
    :class:`MemlabError` naming ``source_name`` and the cell.
    """
    stats = stats if stats is not None else StripStats()
    out = copy.deepcopy(dict(nb))
    cells = []
    for index, cell in enumerate(out.get("cells", [])):
        cell = dict(cell)
        kind = cell.get("cell_type")
        where = f"{source_name}: {_cell_name(index, cell)}"
        text = _source_text(cell)
        if kind == "code":
            pairs = {BEGIN_SOLUTION: END_SOLUTION, BEGIN_HIDDEN_TESTS: END_HIDDEN_TESTS}
            new_text, n = _strip_regions(text, pairs, where, {BEGIN_SOLUTION: CODE_STUB})
            stats.code_regions += n[BEGIN_SOLUTION]
            stats.hidden_test_regions += n[BEGIN_HIDDEN_TESTS]
            cell["source"] = new_text
            cell["outputs"] = []
            cell["execution_count"] = None
            metadata = dict(cell.get("metadata", {}))
            metadata.pop("execution", None)
            cell["metadata"] = metadata
        elif kind == "markdown":
            tags = cell.get("metadata", {}).get("tags", []) or []
            if SOLUTION_TAG in tags:
                stats.cells_removed += 1
                continue
            pairs = {BEGIN_SOLUTION: END_SOLUTION, BEGIN_MARK_SCHEME: END_MARK_SCHEME}
            new_text, regions = _strip_regions(text, pairs, where, {})
            n = sum(regions.values())
            stats.markdown_regions += n
            if n and not new_text.strip():
                stats.cells_removed += 1
                continue
            cell["source"] = new_text.rstrip() if n else new_text
        cells.append(cell)
    out["cells"] = cells
    return out


def _source_lines(cell: dict) -> dict:
    text = _source_text(cell)
    cell["source"] = text.splitlines(keepends=True)
    return cell


def _read_notebook(src: Path) -> dict:
    try:
        nb = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise MemlabError(
            f"{src}: cannot read the notebook ({type(exc).__name__}: {' '.join(str(exc).split())})"
        ) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise MemlabError(f"{src}: not a notebook (no list of cells)")
    return nb


def student_text(src: str | Path) -> tuple[str, StripStats]:
    """The student version's file text for an instructor notebook, and its stats (chapter: labs).

    The same text, byte for byte, every time: :func:`write_student_notebook` writes it and
    :func:`stale_student_versions` compares the committed files with it.
    """
    src = Path(src)
    stats = StripStats()
    student = strip_solutions(_read_notebook(src), source_name=str(src), stats=stats)
    student["cells"] = [_source_lines(c) for c in student["cells"]]
    return json.dumps(student, indent=1, sort_keys=True, ensure_ascii=False) + "\n", stats


def write_student_notebook(src: str | Path, out_dir: str | Path) -> tuple[Path, StripStats]:
    """Read an instructor notebook and write its student version into ``out_dir`` (chapter: labs).

    It returns the student version's path.
    """
    src, out_dir = Path(src), Path(out_dir)
    text, stats = student_text(src)
    dest = out_dir / src.name
    if dest.resolve() == src.resolve():
        raise MemlabError(
            f"{src}: the student version would overwrite the instructor version; pick another --out"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    dest.write_text(text, encoding="utf-8")
    return dest, stats


def stale_student_versions(notebooks: list[Path], out_dir: str | Path) -> list[str]:
    """What differs between ``out_dir`` and the student versions of ``notebooks`` (chapter: labs).

    One line per problem: a student version missing, one that is not what its instructor version
    now gives, or a notebook in ``out_dir`` with no instructor version. Empty when up to date.
    """
    out_dir = Path(out_dir)
    problems = []
    for src in notebooks:
        dest = out_dir / src.name
        if not dest.is_file():
            problems.append(f"{dest}: missing (the student version of {src})")
        elif dest.read_text(encoding="utf-8") != student_text(src)[0]:
            problems.append(f"{dest}: not the student version of {src} as it is now")
    names = {src.name for src in notebooks}
    problems += [f"{extra}: no instructor version of it among the labs"
                 for extra in sorted(out_dir.glob("*.ipynb")) if extra.name not in names]
    return problems


# ------------------------------------------------------------------ command line
def find_notebooks(sources: list[str], out_dir: Path) -> list[Path]:
    """The instructor notebooks named by files and folders (not recursive) (chapter: labs)."""
    found: list[Path] = []
    out_dir = out_dir.resolve()
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found += sorted(p for p in path.glob("*.ipynb") if p.resolve().parent != out_dir)
        elif path.is_file() and path.suffix == ".ipynb":
            found.append(path)
        else:
            raise MemlabError(f"{source!r} is neither a notebook (.ipynb) nor a folder")
    return found


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code (chapter: labs)."""
    parser = argparse.ArgumentParser(
        prog="make_student", description="Write student versions of lab notebooks."
    )
    parser.add_argument("sources", nargs="+", help="lab notebooks or folders holding them")
    parser.add_argument(
        "--out",
        default="labs/student",
        help="folder for the student versions (default: labs/student)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a file in --out is not the student version as it is now",
    )
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    try:
        notebooks = find_notebooks(args.sources, out_dir)
        if args.check:
            problems = stale_student_versions(notebooks, out_dir)
            for problem in problems:
                print(f"make_student: {problem}", file=sys.stderr)
            if problems:
                print(f"make_student: run `make student` (python -m memlab.labs.student "
                      f"{' '.join(args.sources)} --out {out_dir}) and commit {out_dir}",
                      file=sys.stderr)
                return 1
            print(f"{out_dir}: the {len(notebooks)} student version(s) are up to date")
            return 0
        if not notebooks:
            print(f"make_student: no notebooks in {', '.join(args.sources)}; nothing written")
            return 0
        for src in notebooks:
            dest, stats = write_student_notebook(src, out_dir)
            removed = f", {stats.cells_removed} cell(s) removed" if stats.cells_removed else ""
            hidden = (f", {stats.hidden_test_regions} hidden test(s) removed"
                      if stats.hidden_test_regions else "")
            print(
                f"wrote {dest} ({stats.code_regions} code solution(s), "
                f"{stats.markdown_regions} markdown region(s) stripped{hidden}{removed})"
            )
    except MemlabError as exc:
        print(f"make_student: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
