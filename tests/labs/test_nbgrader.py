"""The labs with nbgrader itself: generate_assignment and autograde in a temporary course folder.

The labs form one assignment. nbgrader's own command line (``python -m nbgrader``) makes the
student versions (``generate_assignment``) and autogrades two submissions: the instructor
versions, which must score full marks, and the released student versions, which must run to the
end and score 0 (their checks say "not attempted"; the autograder's hidden asserts are what
fail). A cell under ``lab.reveal`` shows its numbers in the instructor's run, equal to the
outputs saved in cells tagged ``nbval-check-output``, and only its lock line in the student's run. A released version must also be, cell for cell, what :mod:`memlab.labs.student`
(``make student``) writes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.labs.grader import get_lab, locked_line, parse_check_line, revealed_ids
from memlab.labs.student import strip_solutions

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LAB_NOTEBOOKS = sorted((ROOT / "labs").glob("lab*.ipynb"))

CONFIG = """\
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = "memlab"
c.Exchange.root = {exchange!r}
c.ClearSolutions.code_stub = {{"python": "# YOUR CODE HERE"}}
c.Execute.timeout = 600
"""


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMLAB_SCALE": "ci", "MEMLAB_DEVICE": "cpu"}  # PATH: see the fixture
    env.pop("MEMLAB_LAB_REPORT", None)
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _lab_name(notebook: Path) -> str:
    return notebook.stem.split("_")[0]  # lab00_measure_step -> lab00


def _outputs_text(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream")


def _errors(cell: dict) -> list[dict]:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _source(cell: dict) -> str:
    src = cell["source"]
    return "".join(src) if isinstance(src, list) else src


ASSIGNMENT = "labs"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """One course with the labs as one assignment: generated once, then the instructor version
    and the released student version each submitted and autograded once."""
    pytest.importorskip("nbgrader")
    tmp = tmp_path_factory.mktemp("nbgrader")
    course = tmp / "course"
    source = course / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    (tmp / "exchange").mkdir()
    (course / "nbgrader_config.py").write_text(
        CONFIG.format(root=str(course), exchange=str(tmp / "exchange")), encoding="utf-8")
    for notebook in LAB_NOTEBOOKS:
        shutil.copy(notebook, source / notebook.name)
    # nbgrader's gradebook runs the `alembic` command: find it beside this Python (the venv).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", path)
        _nbgrader(course, "generate_assignment", ASSIGNMENT, "--force")
        for student, folder in (("instructor", source), ("student", course / "release" / ASSIGNMENT)):
            dest = course / "submitted" / student / ASSIGNMENT
            dest.mkdir(parents=True)
            for notebook in LAB_NOTEBOOKS:
                shutil.copy(folder / notebook.name, dest / notebook.name)
            _nbgrader(course, "autograde", ASSIGNMENT, "--student", student, "--force")
        yield course


@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_released_student_version_is_make_students(course, notebook):
    released = course / "release" / ASSIGNMENT / notebook.name
    instructor = json.loads(notebook.read_text(encoding="utf-8"))
    ours = strip_solutions(instructor, source_name=str(notebook))
    theirs = json.loads(released.read_text(encoding="utf-8"))
    assert [c["cell_type"] for c in theirs["cells"]] == [c["cell_type"] for c in ours["cells"]]
    for i, (a, b) in enumerate(zip(theirs["cells"], ours["cells"], strict=True)):
        assert _source(a).rstrip() == _source(b).rstrip(), f"cell {i} differs"
        if a["cell_type"] == "code":
            assert a["outputs"] == [] and a["execution_count"] is None


@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_autograde_scores(course, notebook, monkeypatch):
    from nbgrader.api import Gradebook

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                os.environ.get("PATH", "")]))
    lab = get_lab(_lab_name(notebook))
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        full = gb.find_submission_notebook(notebook.stem, ASSIGNMENT, "instructor")
        none = gb.find_submission_notebook(notebook.stem, ASSIGNMENT, "student")
        assert full.max_score == len(lab.ids)  # one point per exercise
        assert full.score == full.max_score, f"the instructor version scores {full.score}"
        assert none.score == 0


@pytest.mark.parametrize("student", ["instructor", "student"])
@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_autograded_notebooks_run_to_the_end(course, notebook, student):
    lab = get_lab(_lab_name(notebook))
    graded = json.loads((course / "autograded" / student / ASSIGNMENT / notebook.name)
                        .read_text(encoding="utf-8"))
    cells = [c for c in graded["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] is not None for c in cells), "a cell was not run"
    checks = [parse_check_line(line) for c in cells
              for line in _outputs_text(c).splitlines() if parse_check_line(line)]
    assert [ex for ex, _ in checks] == list(lab.ids)
    summary = _outputs_text(cells[-1])
    if student == "instructor":
        assert all(status == "correct" for _, status in checks)
        assert not [c for c in cells if _errors(c)]
        assert f"{len(lab.ids)}/{len(lab.ids)} correct" in summary
    else:
        assert all(status == "not attempted" for _, status in checks)
        failing = [c for c in cells if _errors(c)]
        # only the autograder's hidden asserts fail, one in each check cell
        assert len(failing) == len(lab.ids)
        for c in failing:
            assert c["metadata"]["nbgrader"]["grade"]
            assert [e["ename"] for e in _errors(c)] == ["AssertionError"]
        assert f"0/{len(lab.ids)} correct" in summary


@pytest.mark.parametrize("student", ["instructor", "student"])
@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_revealed_cells_show_their_numbers_only_after_the_check(course, notebook, student):
    saved = [c for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"]
             if c["cell_type"] == "code"]
    graded = [c for c in json.loads((course / "autograded" / student / ASSIGNMENT / notebook.name)
                                    .read_text(encoding="utf-8"))["cells"]
              if c["cell_type"] == "code"]
    for i, (ours, ran) in enumerate(zip(saved, graded, strict=True)):
        ids = revealed_ids(_source(ours))
        if not ids:
            continue
        if student == "student":
            assert _outputs_text(ran) == "".join(locked_line(x) + "\n" for x in ids), f"cell {i}"
        elif "nbval-check-output" in ours.get("metadata", {}).get("tags", []):
            assert _outputs_text(ran) == _outputs_text(ours), f"cell {i}: saved outputs are stale"
        else:
            assert not any(locked_line(x) in _outputs_text(ran) for x in ids), f"cell {i}"
