"""The nbval replay (conftest.py at the root): notebooks checked against executed copies."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def _notebook(path: Path, cells: list[tuple[str, str | None]]) -> None:
    nb = nbformat.v4.new_notebook()
    for i, (source, text) in enumerate(cells, 1):
        cell = nbformat.v4.new_code_cell(source, execution_count=i)
        if text is not None:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


@pytest.fixture
def book(pytester):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    _notebook(pytester.path / "chapters" / "nb.ipynb",
              [("# NBVAL_CHECK_OUTPUT\nprint(4)", "4\n"), ("print('time')", "1.0 s\n")])
    return pytester


def _executed(pytester, cells):
    _notebook(pytester.path / "_build" / "jupyter_execute" / "chapters" / "nb.ipynb", cells)


def test_matching_outputs_pass_and_unchecked_cells_may_differ(book):
    _executed(book, [("# NBVAL_CHECK_OUTPUT\nprint(4)", "4\n"), ("print('time')", "2.5 s\n")])
    result = book.runpytest("--nbval-executed", "_build/jupyter_execute", "chapters", "-p",
                            "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_a_checked_cell_that_differs_fails(book):
    _executed(book, [("# NBVAL_CHECK_OUTPUT\nprint(4)", "5\n"), ("print('time')", "1.0 s\n")])
    result = book.runpytest("--nbval-executed", "_build/jupyter_execute", "chapters", "-p",
                            "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*Cell outputs differ*"])


def test_a_stale_copy_and_an_error_fail(book):
    _executed(book, [("# NBVAL_CHECK_OUTPUT\nprint(3 + 1)", "4\n"), ("print('time')", None)])
    nb = nbformat.read(str(book.path / "_build/jupyter_execute/chapters/nb.ipynb"), as_version=4)
    nb.cells[1].source = "print('time')"
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="x",
                                                  traceback=["ValueError: x"])]
    nbformat.write(nb, str(book.path / "_build/jupyter_execute/chapters/nb.ipynb"))
    result = book.runpytest("--nbval-executed", "_build/jupyter_execute", "chapters", "-p",
                            "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*stale*", "*exception*"])


def test_no_executed_copy_is_a_usage_error(book):
    result = book.runpytest("--nbval-executed", "_build/jupyter_execute", "chapters", "-p",
                            "no:cacheprovider")
    assert result.ret != 0
    assert "no executed copy" in result.stdout.str() + result.stderr.str()


REVEAL = '# NBVAL_CHECK_OUTPUT\nif lab.reveal("1.1"):\n    print(4)'


@pytest.mark.parametrize(("published", "passes"), [("🔒 shown once 1.1 is correct\n", True),
                                                    ("4\n", False)])
def test_a_labs_revealed_cell_shows_only_its_lock_line_when_published(pytester, published, passes):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    _notebook(pytester.path / "labs" / "lab09_x.ipynb", [(REVEAL, "4\n")])  # the instructor's
    _notebook(pytester.path / "labs" / "student" / "lab09_x.ipynb", [(REVEAL, None)])
    _notebook(pytester.path / "_build" / "jupyter_execute" / "labs" / "student" / "lab09_x.ipynb",
              [(REVEAL, published)])
    result = pytester.runpytest("--nbval-executed", "_build/jupyter_execute", "labs/lab09_x.ipynb",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1) if passes else result.assert_outcomes(failed=1)
    if not passes:
        result.stdout.fnmatch_lines(["*shows what a check reveals*"])
