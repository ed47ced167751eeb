"""The labs' checks exported to otter-grader, graded by ``otter run`` itself.

Each lab's autograder zip (:mod:`memlab.labs.otter`) grades the instructor version with full
marks, the points nbgrader gives the lab (one per exercise), and the released student version
(``labs/student/``, unanswered) with zero. ``otter run`` executes the notebook in a kernel of
this Python, with this checkout's memlab first on the path and no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.labs.grader import get_lab
from memlab.labs.otter import (
    GradedCheck,
    doctest_source,
    graded_checks,
    main,
    ok_test_text,
    requirements_text,
)

ROOT = Path(__file__).resolve().parents[2]
LAB_NOTEBOOKS = sorted((ROOT / "labs").glob("lab*.ipynb"))
IDS = [p.stem for p in LAB_NOTEBOOKS]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The labs folder exported once, as the command line does it."""
    pytest.importorskip("otter")
    out = tmp_path_factory.mktemp("autograders")
    assert main([str(ROOT / "labs"), "--out", str(out)]) == 0
    return out


def _otter_run(autograder: Path, submission: Path, out: Path) -> tuple[float, float, dict]:
    env = {**os.environ, "MEMLAB_SCALE": "ci", "MEMLAB_DEVICE": "cpu", "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("MEMLAB_LAB_REPORT", None)
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "otter", "run", "-a", str(autograder), "-o",
                           str(out), "--no-logo", str(submission)], cwd=out, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"otter run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    scored = [t for t in results["tests"] if "max_score" in t]
    return (sum(t["score"] for t in scored), sum(t["max_score"] for t in scored),
            {t["name"]: t["score"] for t in scored})


@pytest.mark.slow
@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=IDS)
def test_otter_grades_instructor_full_and_student_zero(exported, notebook, tmp_path):
    lab = get_lab(notebook.stem.split("_")[0])
    checks = graded_checks(json.loads(notebook.read_text(encoding="utf-8")), str(notebook))
    nbgrader_points = sum(c.points for c in checks)
    assert nbgrader_points == len(lab.ids)  # one point per exercise, as nbgrader gives them
    autograder = exported / f"{notebook.stem}.zip"
    with zipfile.ZipFile(autograder) as zf:
        assert sorted(n for n in zf.namelist() if n.startswith("tests/")) == sorted(
            f"tests/{c.name}.py" for c in checks)
        assert requirements_text().strip() in zf.read("environment.yml").decode()
    start = time.perf_counter()
    score, total, by_test = _otter_run(autograder, notebook, tmp_path / "instructor")
    assert total == nbgrader_points
    assert score == total, f"the instructor version scores {score}/{total}: {by_test}"
    student = ROOT / "labs" / "student" / notebook.name
    score, total, by_test = _otter_run(autograder, student, tmp_path / "student")
    assert total == nbgrader_points
    assert score == 0, f"the unanswered student version scores {score}: {by_test}"
    print(f"{notebook.stem}: graded twice in {time.perf_counter() - start:.1f} s")


def test_export_is_deterministic(tmp_path):
    pytest.importorskip("otter")
    notebook = ROOT / "labs" / "lab00_measure_step.ipynb"
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert main([str(notebook), "--out", str(out)]) == 0
    name = f"{notebook.stem}.zip"
    assert (first / name).read_bytes() == (second / name).read_bytes()


def test_a_bad_lab_path_is_refused_in_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "no_such_lab.ipynb"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no_such_lab.ipynb" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def _graded(source: str, **meta) -> dict:
    nbgrader = {"grade": True, "grade_id": "check-1", "points": 1, **meta}
    return {"cells": [{"cell_type": "code", "source": source, "metadata": {"nbgrader": nbgrader}}]}


def test_a_graded_cell_without_its_hidden_test_is_refused_in_one_line():
    with pytest.raises(MemlabError, match="BEGIN HIDDEN TESTS") as err:
        graded_checks(_graded('lab.check("1", answer)\n'), "lab.ipynb")
    assert "\n" not in str(err.value)
    with pytest.raises(MemlabError, match="points must be a positive number"):
        graded_checks(_graded("### BEGIN HIDDEN TESTS\nassert x\n### END HIDDEN TESTS\n",
                              points=0), "lab.ipynb")
    with pytest.raises(MemlabError, match="no graded cell"):
        graded_checks({"cells": []}, "lab.ipynb")


def test_hidden_tests_become_a_doctest_of_the_same_statements():
    code = 'assert lab.passed("2.1")\nfor x in (1, 2):\n    assert x\n'
    (check,) = graded_checks(_graded(f"lab.check('2.1', f)\n### BEGIN HIDDEN TESTS\n{code}"
                                     "### END HIDDEN TESTS\n"), "lab.ipynb")
    assert check == GradedCheck("check-1", 1, code.strip())
    assert doctest_source(check.test) == ('>>> assert lab.passed("2.1")\n>>> for x in (1, 2):\n'
                                          "...     assert x\n...\n")
    namespace: dict = {}
    exec(ok_test_text(check), namespace)
    assert namespace["test"]["points"] == 1 and namespace["OK_FORMAT"] is True
