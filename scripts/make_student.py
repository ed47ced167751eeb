#!/usr/bin/env python3
"""Write the student versions of lab notebooks: solutions stripped, outputs cleared.

    python scripts/make_student.py labs --out labs/student
    python scripts/make_student.py labs/lab00_measure_step.ipynb --out /tmp/student

Each ``### BEGIN SOLUTION`` .. ``### END SOLUTION`` region of a code cell becomes one
``# YOUR CODE HERE`` line (``pass  # YOUR CODE HERE`` inside an indented block); mark
schemes, solution regions and cells tagged ``solution`` are removed from markdown cells.
The work is done by :func:`memlab.lab.strip_solutions`. Bad input (unbalanced markers, a
file that is not a notebook) prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from memlab.errors import MemlabError
    from memlab.lab import write_student_notebook
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from memlab.errors import MemlabError
    from memlab.lab import write_student_notebook


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
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    try:
        notebooks = find_notebooks(args.sources, out_dir)
        if not notebooks:
            print(f"make_student: no notebooks in {', '.join(args.sources)}; nothing written")
            return 0
        for src in notebooks:
            dest, stats = write_student_notebook(src, out_dir)
            removed = f", {stats.cells_removed} cell(s) removed" if stats.cells_removed else ""
            print(
                f"wrote {dest} ({stats.code_regions} code solution(s), "
                f"{stats.markdown_regions} markdown region(s) stripped{removed})"
            )
    except MemlabError as exc:
        print(f"make_student: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
