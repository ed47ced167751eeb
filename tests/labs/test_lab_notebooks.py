"""The lab notebooks' nbgrader structure, read without running them.

Every exercise is an answer cell (nbgrader solution cell, ``### BEGIN SOLUTION`` ..) followed by
a check cell (autograded test cell with points, locked, its assert hidden from students); every
other code cell is locked; every mark scheme sits in a task cell worth no points, after a question
the student version keeps; and the tolerances the prompts state are the checks' own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memlab.labs.grader import get_lab
from memlab.labs.student import (
    BEGIN_HIDDEN_TESTS,
    BEGIN_MARK_SCHEME,
    BEGIN_SOLUTION,
    END_HIDDEN_TESTS,
    END_MARK_SCHEME,
    END_SOLUTION,
    strip_solutions,
)

ROOT = Path(__file__).resolve().parents[2]
LAB_NOTEBOOKS = sorted((ROOT / "labs").glob("lab*.ipynb"))
IDS = [p.stem for p in LAB_NOTEBOOKS]

# Typed measured or derived numbers: percentages, "about 2.3", 40,441, 40.4e9, 0.37.
TYPED_NUMBER = re.compile(r"\d+(?:\.\d+)?\s*%|\babout \d|\d{1,3}(?:,\d{3})+|\d(?:\.\d+)?e[+-]?\d"
                          r"|\d+\.\d{2,}")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _nbg(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _lab(path: Path):
    return get_lab(path.stem.split("_")[0])


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=IDS)
def test_nbgrader_metadata_is_valid(path):
    pytest.importorskip("nbgrader")
    import nbformat
    from nbgrader.nbgraderformat import MetadataValidator

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    MetadataValidator().validate_nb(nb)


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=IDS)
def test_every_code_cell_is_an_answer_a_check_or_locked(path):
    cells = _cells(path)
    grade_ids = [_nbg(c)["grade_id"] for c in cells if _nbg(c)]
    assert len(grade_ids) == len(set(grade_ids)), "grade ids must be unique"
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        meta, src = _nbg(cell), _src(cell)
        assert meta, f"code cell {i} has no nbgrader metadata"
        has_solution = BEGIN_SOLUTION in src
        assert has_solution == (END_SOLUTION in src) == bool(meta["solution"]), f"cell {i}"
        if meta["solution"]:
            assert not meta["grade"] and not meta["locked"] and "lab.check(" not in src
        elif meta["grade"]:
            assert meta["locked"] and meta["points"] > 0
            assert BEGIN_HIDDEN_TESTS in src and END_HIDDEN_TESTS in src
        else:
            assert meta["locked"], f"code cell {i} is neither answer nor check and not locked"
            assert "lab.check(" not in src and BEGIN_HIDDEN_TESTS not in src


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=IDS)
def test_each_exercise_is_an_answer_then_its_check(path):
    lab = _lab(path)
    cells = _cells(path)
    checked = []
    for i, cell in enumerate(cells):
        meta = _nbg(cell)
        if not meta.get("grade"):
            continue
        src = _src(cell)
        ids = re.findall(r'lab\.check\("([^"]+)"', src)
        assert len(ids) == 1, f"cell {i} checks {ids}"
        ex = ids[0]
        assert f'assert lab.passed("{ex}")' in src.split(BEGIN_HIDDEN_TESTS)[1]
        assert meta["grade_id"] == f"check-{ex.replace('.', '_')}"
        before = _nbg(cells[i - 1])
        assert before.get("solution") and before["grade_id"] == f"answer-{ex.replace('.', '_')}"
        checked.append(ex)
    assert checked == list(lab.ids)


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=IDS)
def test_mark_schemes_are_task_cells_with_a_question(path):
    cells = _cells(path)
    tasks = 0
    for i, cell in enumerate(cells):
        src, meta = _src(cell), _nbg(cell)
        if BEGIN_MARK_SCHEME not in src:
            assert not meta.get("task"), f"task cell {i} holds no mark scheme"
            continue
        tasks += 1
        assert cell["cell_type"] == "markdown" and meta.get("task"), f"cell {i}"
        assert meta["points"] == 0 and meta["locked"]
        question, rest = src.split(BEGIN_MARK_SCHEME)
        assert question.strip(), f"cell {i}: the student version keeps the question; it is empty"
        scheme = rest.split(END_MARK_SCHEME)[0]
        typed = TYPED_NUMBER.findall(scheme)
        assert not typed, f"cell {i}: mark scheme types numbers {typed}; print them from a cell"
    assert tasks >= 1
    student = strip_solutions(json.loads(path.read_text(encoding="utf-8")))
    assert len(student["cells"]) == len(cells), "no cell of a lab is left empty for students"


@pytest.mark.parametrize("path", LAB_NOTEBOOKS, ids=IDS)
def test_stated_tolerances_are_the_checks(path):
    """A prompt's "(Within N%.)" and an exercise summary's "(within N%)" are its rtol."""
    lab = _lab(path)
    cells = _cells(path)
    for ex in lab.exercises:
        for said in re.findall(r"\(within (\d+(?:\.\d+)?)%\)", ex.summary):
            assert float(said) / 100 == pytest.approx(ex.rtol), ex.id
        answer = next(i for i, c in enumerate(cells)
                      if _nbg(c).get("grade_id") == f"answer-{ex.id.replace('.', '_')}")
        prompt = next(_src(c) for c in reversed(cells[:answer]) if c["cell_type"] == "markdown")
        for said in re.findall(r"\(Within (\d+(?:\.\d+)?)%\.\)", prompt):
            assert float(said) / 100 == pytest.approx(ex.rtol), ex.id
