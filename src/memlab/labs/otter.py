"""A lab's checks as an otter-grader autograder: one zip per lab, for ``otter run`` or Gradescope.

The checks are the ones nbgrader grades: each graded cell of an instructor notebook (nbgrader
metadata ``grade: true`` with its ``points``) holds a hidden test between ``### BEGIN HIDDEN
TESTS`` and ``### END HIDDEN TESTS`` (``assert lab.passed("2.1")``). The export turns each into
one OK-format test file (``tests/<grade_id>.py``, a doctest of the same statements, worth the
cell's points), so that otter grades the same assertions on the notebook's final state, and
:func:`autograder_zip` packs them with ``otter generate`` into the zip that ``otter run -a
<zip> <submission>.ipynb`` grades without Docker and that Gradescope takes as a programming
assignment's autograder. Its requirements install the released ``memlab-book`` of this version.

``python -m memlab.labs.otter labs --out DIR`` writes ``DIR/<lab>.zip`` for each lab. The
bytes depend only on the notebook and the version: every entry is written in name order with
one fixed date.
"""

from __future__ import annotations

import argparse
import ast
import json
import pprint
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memlab._version import __version__
from memlab.errors import MemlabError
from memlab.labs.student import BEGIN_HIDDEN_TESTS, END_HIDDEN_TESTS, find_notebooks

DISTRIBUTION = "memlab-book"  # the released wheel the grading machine installs
PYTHON_VERSION = "3.11"
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can carry
EXECUTABLES = ("run_autograder", "setup.sh")  # Gradescope runs these two
OTTER_CONFIG = {"lang": "python", "pdf": False, "show_stdout": True, "show_hidden": True}


@dataclass(frozen=True)
class GradedCheck:
    """One graded cell of a lab: nbgrader's ``grade_id``, its points and its hidden test."""

    name: str
    points: float
    test: str


def _source(cell: Mapping[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _hidden_test(source: str, where: str) -> str:
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN_HIDDEN_TESTS]
    ends = [i for i, line in enumerate(lines) if line.strip() == END_HIDDEN_TESTS]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise MemlabError(f"{where}: a graded cell needs one {BEGIN_HIDDEN_TESTS} .. "
                          f"{END_HIDDEN_TESTS} region, got {len(starts)} begin and {len(ends)} end")
    test = "\n".join(lines[starts[0] + 1:ends[0]]).strip()
    if not test:
        raise MemlabError(f"{where}: the hidden tests are empty; an assert such as "
                          f"`assert lab.passed(...)` is what is graded")
    return test


def graded_checks(notebook: Mapping[str, Any], source_name: str = "<notebook>") -> list[GradedCheck]:
    """The graded cells of an instructor notebook with their points and hidden tests (chapter: labs)."""
    checks = []
    for index, cell in enumerate(notebook.get("cells", [])):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("grade"):
            continue
        where = f"{source_name} cell {index}"
        name, points = meta.get("grade_id"), meta.get("points")
        if not isinstance(name, str) or not name:
            raise MemlabError(f"{where}: a graded cell needs a grade_id, got {name!r}")
        if isinstance(points, bool) or not isinstance(points, int | float) or points <= 0:
            raise MemlabError(f"{where}: points must be a positive number, got {points!r}")
        checks.append(GradedCheck(name, points, _hidden_test(_source(cell), where)))
    if not checks:
        raise MemlabError(f"{source_name}: no graded cell (nbgrader grade: true); "
                          f"an instructor version of a lab has one per exercise")
    return checks


def doctest_source(code: str) -> str:
    """Python statements as a doctest that prints nothing when they pass (chapter: labs)."""
    lines = code.splitlines()
    out = []
    for stmt in ast.parse(code).body:
        first, last = stmt.lineno - 1, stmt.end_lineno
        out += [f">>> {lines[first]}"] + [f"... {line}" for line in lines[first + 1:last]]
        if isinstance(stmt, ast.If | ast.For | ast.While | ast.With | ast.Try | ast.FunctionDef):
            out.append("...")
    return "\n".join(out) + "\n"


def ok_test_text(check: GradedCheck) -> str:
    """One graded check as an otter OK-format test file (chapter: labs)."""
    test = {
        "name": check.name,
        "points": check.points,
        "suites": [{
            "cases": [{"code": doctest_source(check.test), "hidden": False, "locked": False}],
            "scored": True, "setup": "", "teardown": "", "type": "doctest",
        }],
    }
    return "OK_FORMAT = True\n\ntest = " + pprint.pformat(test, sort_dicts=False) + "\n"


def requirements_text(version: str = __version__) -> str:
    """The grading machine's requirements: the released memlab of this version (chapter: labs)."""
    return f"{DISTRIBUTION}=={version}\n"


def _normalized_zip(raw: Path, dest: Path) -> None:
    with zipfile.ZipFile(raw) as src:
        entries = {info.filename: src.read(info) for info in src.infolist()}
    with zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if name in EXECUTABLES else 0o100644) << 16
            out.writestr(info, entries[name])


def autograder_zip(notebook: Path, dest: Path) -> list[GradedCheck]:
    """Write the otter autograder zip of one instructor lab notebook; returns its checks (chapter: labs)."""
    try:
        from otter.generate import main as otter_generate
    except ImportError as exc:
        raise MemlabError(f"otter-grader is needed to write an autograder ({exc}); install it "
                          f"with pip install '{DISTRIBUTION}[grading]'") from None
    nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
    checks = graded_checks(nb, source_name=str(notebook))
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        raise MemlabError(f"{notebook}: grade_ids repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        tests = tmp_dir / "tests"
        tests.mkdir()
        for check in checks:
            (tests / f"{check.name}.py").write_text(ok_test_text(check), encoding="utf-8")
        (tmp_dir / "requirements.txt").write_text(requirements_text(), encoding="utf-8")
        (tmp_dir / "otter_config.json").write_text(json.dumps(OTTER_CONFIG, indent=2),
                                                   encoding="utf-8")
        raw = tmp_dir / "autograder.zip"
        otter_generate(tests_dir=str(tests), output_path=str(raw),
                       config=str(tmp_dir / "otter_config.json"),
                       requirements=str(tmp_dir / "requirements.txt"), no_environment=True,
                       python_version=PYTHON_VERSION)
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        _normalized_zip(raw, Path(dest))
    return checks


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit code (chapter: labs)."""
    parser = argparse.ArgumentParser(
        prog="memlab.labs.otter",
        description="Write each lab's checks as an otter-grader autograder zip (otter run, Gradescope).")
    parser.add_argument("sources", nargs="+", help="instructor lab notebooks or folders holding them")
    parser.add_argument("--out", default="autograders",
                        help="folder for the zips, one <lab>.zip per notebook (default: autograders)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    try:
        notebooks = find_notebooks(args.sources, out_dir)
        if not notebooks:
            raise MemlabError(f"no notebooks in {', '.join(args.sources)}")
        for src in notebooks:
            dest = out_dir / f"{src.stem}.zip"
            checks = autograder_zip(src, dest)
            print(f"wrote {dest} ({len(checks)} test(s), "
                  f"{sum(c.points for c in checks):g} point(s))")
    except MemlabError as exc:
        print(f"memlab.labs.otter: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
