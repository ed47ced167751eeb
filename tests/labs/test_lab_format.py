"""The lab format: autograded checks, student versions, and every lab run both ways."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.errors import MemlabError
from memlab.labs.grader import REPORT_ENV, Exercise, Lab, define_lab, get_lab
from memlab.labs.student import StripStats, strip_solutions, student_text, write_student_notebook

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "lab_fixture.ipynb"
LABS_DIR = ROOT / "labs"
SCRIPT = ROOT / "scripts" / "make_student.py"
LAB_NOTEBOOKS = sorted(LABS_DIR.glob("*.ipynb"))


@pytest.fixture
def lab():
    lab = Lab("t", "a test lab")
    lab.exercise(
        "1.1",
        "bytes of 1000 fp32 values",
        expected=lambda: 4 * 1000,
        hint="an fp32 value takes 4 bytes",
    )
    lab.exercise(
        "1.2",
        "3e9 bytes in GiB",
        expected=lambda: 3e9 / 2**30,
        rtol=1e-3,
        hint="1 GiB is 2**30 bytes",
    )
    lab.exercise("1.3", "bytes per element", expected=lambda: [4, 2, 1])
    lab.exercise(
        "2.1",
        "predict within 1% of the measured size",
        check=lambda answer, measured: (
            abs(answer - measured) <= 0.01 * measured,
            "more than 1% away from the measured size",
        ),
        hint="count the bytes",
    )
    return lab


# ------------------------------------------------------------------------ checks


def test_correct_prints_one_line(lab, printed):
    result = lab.check("1.1", 4000)
    assert result.status == "correct" and result.ok
    assert printed() == "✅ 1.1 correct" == str(result)


def test_not_yet_says_what_is_wrong_never_the_recipe(lab, printed):
    """The exercise's hint is the recipe: a wrong answer gets how far off it is instead."""
    result = lab.check("1.1", 1000)
    assert result.status == "not yet" and not result.ok
    assert printed() == "❌ 1.1 not yet: 4.0x too small"
    for wrong, words in ((4400, "10% too large"), (4001, "slightly too large"), (0, "zero"),
                         (-4000, "sign")):
        assert words in str(lab.check("1.1", wrong))
        assert "4 bytes" not in printed()


def test_off_by_never_gives_the_number():
    from memlab.labs.grader import off_by

    assert off_by(32.0, 10.0) == "3.2x too large"
    assert off_by(8.8, 10.0) == "12% too small"
    assert off_by(10.01, 10.0) == "slightly too large"
    assert off_by(float("nan"), 1.0) == "that is not a finite number"


def test_a_check_may_return_what_is_wrong_as_a_string(capsys):
    from memlab.labs.grader import number_problem

    lab = Lab("s", "a test lab")
    lab.exercise("1.1", "bytes", check=lambda a: number_problem(a, 4000, ask="a number of bytes"))
    assert lab.check("1.1", 4000).status == "correct"
    assert lab.check("1.1", 8000).status == "not yet"
    assert "2.0x too large" in capsys.readouterr().out
    lab.check("1.1", "many")
    assert "answer a number of bytes, got str" in capsys.readouterr().out


def test_reveal_waits_for_the_check(lab, capsys, printed):
    assert not lab.reveal("1.1")
    assert printed() == "🔒 shown once 1.1 is correct"
    lab.check("1.1", 4000)
    capsys.readouterr()
    assert lab.reveal("1.1")
    assert capsys.readouterr().out == ""
    from memlab.labs.grader import parse_check_line

    assert parse_check_line("🔒 shown once 1.1 is correct") is None
    from memlab.labs.grader import locked_line, revealed_ids

    assert locked_line("1.1") == "🔒 shown once 1.1 is correct"
    assert revealed_ids('if lab.reveal("4.3b"):\n    x\nif lab.reveal( \'5.1\' ):') == ("4.3b", "5.1")
    assert revealed_ids("lab.check('1.1', x)") == ()
    with pytest.raises(MemlabError, match="unknown exercise"):
        lab.reveal("9.9")


@pytest.mark.parametrize("stub", [None, ..., [None, None], (None, ...), {"a": None}])
def test_stub_answers_are_not_attempted(lab, printed, stub):
    assert lab.check("1.1", stub).status == "not attempted"
    assert printed() == "⏳ 1.1 not attempted (replace None with your answer)"


@pytest.mark.parametrize("wrong", ["4000", "4 kB", [4000], {"bytes": 4000}, object(), True])
def test_wrong_type_is_not_yet_never_a_traceback(lab, printed, wrong):
    result = lab.check("1.1", wrong)
    assert result.status == "not yet"
    assert "expected a number, got " + type(wrong).__name__ in printed()


def test_wrong_type_in_a_custom_check(lab, printed):
    result = lab.check("2.1", "3 KiB", measured=3072)
    assert result.status == "not yet"
    line = printed()
    assert line.startswith("❌ 2.1 not yet: could not check an answer of type str")
    assert "count the bytes" not in line  # the exercise's hint is never printed


def test_exact_comparison(lab):
    assert lab.check("1.1", 4000.0).ok
    assert not lab.check("1.1", 4000.5).ok
    assert not lab.check("1.1", float("nan")).ok


def test_relative_tolerance(lab):
    assert lab.check("1.2", 2.794).ok
    assert lab.check("1.2", 3e9 / 2**30 * (1 + 0.9e-3)).ok
    assert not lab.check("1.2", 3e9 / 2**30 * (1 + 1.1e-3)).ok
    assert not lab.check("1.2", 2.7).ok


def test_lists_are_compared_element_wise(lab, capsys):
    assert lab.check("1.3", (4, 2, 1)).ok
    assert not lab.check("1.3", [4, 2]).ok
    assert "value 2 is not right" in str(lab.check("1.3", [4, 2, 2]))


def test_array_and_tensor_answers(lab):
    np = pytest.importorskip("numpy")
    assert lab.check("1.1", np.int64(4000)).ok
    assert lab.check("1.3", np.array([4, 2, 1])).ok
    torch = pytest.importorskip("torch")
    assert lab.check("1.1", torch.tensor(4000)).ok
    assert not lab.check("1.1", torch.tensor([4000, 1])).ok


def test_unit_mix_ups_are_named(lab, printed):
    lab.check("1.2", 3.0)  # GB instead of GiB
    assert "GiB and GB are different units" in printed()
    lab.check("1.1", 4000 * 1024)
    assert "factor of 1024" in printed()
    lab.check("1.1", 4000 * 8)
    assert "bits and bytes" in printed()


def test_hints_stay_on_one_line(printed):
    lab = Lab("t")
    lab.exercise("a", "x", check=lambda answer: (answer == 1, "first line\nsecond line"),
                 hint="the recipe")
    assert str(lab.check("a", 2)) == "❌ a not yet: first line second line"
    printed()


def test_context_reaches_the_check_and_expected(lab, capsys):
    assert lab.check("2.1", 3072, measured=3072).ok
    result = lab.check("2.1", 4096, measured=3072)
    assert str(result) == "❌ 2.1 not yet: more than 1% away from the measured size"
    assert lab.check("2.1", 3072, measured=None).status == "not attempted"

    other = Lab("ctx")
    other.exercise("e", "twice the measured value", expected=lambda measured: 2 * measured)
    assert other.check("e", 10, measured=5, unused="ignored").ok
    other.exercise(
        "b", "bool check", check=lambda answer, expected: answer > expected, expected=lambda: 1
    )
    assert other.check("b", 2).ok and not other.check("b", 0).ok
    other.exercise("s", "stub-aware check", check=lambda answer: None if answer == 0 else True)
    assert other.check("s", 0).status == "not attempted"


def test_unknown_exercise_names_the_accepted_ids(lab):
    with pytest.raises(MemlabError) as err:
        lab.check("9.9", 1)
    message = str(err.value)
    assert "\n" not in message
    assert "'9.9'" in message and "accepted: 1.1, 1.2, 1.3, 2.1" in message


def test_bad_exercise_definitions():
    with pytest.raises(MemlabError, match="needs expected= or check="):
        Exercise("1.1", "nothing to compare with")
    with pytest.raises(MemlabError, match="must be a callable"):
        Exercise("1.1", "a typed-in value", expected=4000)
    with pytest.raises(MemlabError, match="rtol"):
        Exercise("1.1", "negative tolerance", expected=lambda: 1, rtol=-1)
    lab = Lab("t", exercises=[Exercise("1.1", "x", expected=lambda: 1)])
    with pytest.raises(MemlabError, match="already has an exercise '1.1'"):
        lab.exercise("1.1", "again", expected=lambda: 1)


def test_summary_counts_latest_results(lab, capsys, printed):
    lab.check("1.1", 1)
    lab.check("1.1", 4000)
    lab.check("1.2", 2.0)
    lab.check("1.3", None)
    capsys.readouterr()
    summary = lab.summary()
    assert printed() == "t: 1/4 correct, 1 not yet (1.2), 2 not attempted (1.3, 2.1)"
    assert (summary.correct, summary.not_yet, summary.not_attempted, summary.total) == (1, 1, 2, 4)


def test_report_file_gets_one_json_line_per_check(lab, tmp_path, monkeypatch):
    report = tmp_path / "report.jsonl"
    monkeypatch.setenv(REPORT_ENV, str(report))
    lab.check("1.1", 4000)
    lab.check("1.2", "x")
    lab.check("1.3", None)
    rows = [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]
    assert [(r["lab"], r["exercise"], r["status"]) for r in rows] == [
        ("t", "1.1", "correct"),
        ("t", "1.2", "not yet"),
        ("t", "1.3", "not attempted"),
    ]


def test_registry():
    lab = define_lab("registry-test", "x", [Exercise("a", "x", expected=lambda: 1)])
    assert get_lab("registry-test") is lab
    again = define_lab("registry-test")  # re-running a cell replaces the lab
    assert get_lab("registry-test") is again
    with pytest.raises(MemlabError, match=r"unknown lab 'no-such-lab'; accepted: .*registry-test"):
        get_lab("no-such-lab")


# --------------------------------------------------------------------- stripping


def _nb(*cells, metadata=None) -> dict:
    return {
        "cells": list(cells),
        "metadata": metadata or {"kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _code(source, **extra) -> dict:
    cell = {
        "cell_type": "code",
        "id": "c",
        "metadata": {},
        "source": source,
        "outputs": [],
        "execution_count": None,
    }
    cell.update(extra)
    return cell


def _md(source, tags=()) -> dict:
    return {
        "cell_type": "markdown",
        "id": "m",
        "metadata": {"tags": list(tags)} if tags else {},
        "source": source,
    }


def _compiles(source: str, name: str = "<cell>") -> None:
    from IPython.core.inputtransformer2 import TransformerManager

    compile(TransformerManager().transform_cell(source), name, "exec")


def test_code_regions_become_a_stub():
    src = (
        "answer = None\n### BEGIN SOLUTION\nanswer = 4 * 1000\nx = 2\n### END SOLUTION\n"
        "lab.check('1.1', answer)"
    )
    out = strip_solutions(_nb(_code(src)))
    assert out["cells"][0]["source"] == "answer = None\n# YOUR CODE HERE\nlab.check('1.1', answer)"


def test_indented_regions_keep_valid_code():
    src = (
        'def f(x):\n    """Doc."""\n    ### BEGIN SOLUTION\n    return 2 * x\n'
        "    ### END SOLUTION\n\n\nfor i in range(2):\n    for j in range(2):\n"
        "        ### BEGIN SOLUTION\n        print(i, j)\n        ### END SOLUTION\n"
    )
    stats = StripStats()
    out = strip_solutions(_nb(_code(src)), stats=stats)["cells"][0]["source"]
    # after a docstring the block has a statement: the stub is nbgrader's bare comment
    assert '    """Doc."""\n    # YOUR CODE HERE\n' in out
    # as the whole body of a block, a comment alone would not compile: `pass` is added
    assert "        pass  # YOUR CODE HERE\n" in out
    assert "return 2 * x" not in out and "print(i, j)" not in out
    assert stats.code_regions == 2
    _compiles(out)


@pytest.mark.parametrize(
    ("src", "needs_pass"),
    [
        ("if True:\n    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION\n", True),
        ("if True:\n    ### BEGIN SOLUTION\n    x = 1\n    ### END SOLUTION\n    y = 2\n", False),
        ("def f():\n    # a comment is no statement\n    ### BEGIN SOLUTION\n    return 1\n"
         "    ### END SOLUTION\nprint(f())\n", True),
    ],
)
def test_pass_only_where_the_block_would_be_empty(src, needs_pass):
    out = strip_solutions(_nb(_code(src)))["cells"][0]["source"]
    assert ("pass  # YOUR CODE HERE" in out) == needs_pass
    _compiles(out)


def test_hidden_tests_are_removed():
    src = ('lab.check("1.1", answer)\n### BEGIN HIDDEN TESTS\nassert lab.passed("1.1")\n'
           "### END HIDDEN TESTS")
    stats = StripStats()
    out = strip_solutions(_nb(_code(src)), stats=stats)["cells"][0]["source"]
    assert out == 'lab.check("1.1", answer)'
    assert stats.hidden_test_regions == 1 and stats.code_regions == 0
    with pytest.raises(MemlabError, match="never closed"):
        strip_solutions(_nb(_code("### BEGIN HIDDEN TESTS\nassert False\n")))


def test_passed_is_the_autograder_test(lab, capsys):
    assert not lab.passed("1.1")  # never checked
    lab.check("1.1", 1)
    assert not lab.passed("1.1")
    lab.check("1.1", 4000)
    assert lab.passed("1.1")
    capsys.readouterr()
    with pytest.raises(MemlabError, match="unknown exercise"):
        lab.passed("9.9")


def test_dimensionless_answers_get_no_unit_hint(capsys):
    lab = Lab("t")
    lab.exercise("share", "a share", expected=lambda: 0.5, rtol=0.02, dimensionless=True)
    lab.exercise("bytes", "bytes", expected=lambda: 0.5, rtol=0.02)
    wrong = 0.5 * 2**20 / 10**6
    assert "units" not in str(lab.check("share", wrong))
    assert "MiB and MB" in str(lab.check("bytes", wrong))
    capsys.readouterr()
    with pytest.raises(MemlabError, match="dimensionless must be True or False"):
        Exercise("x", "y", expected=lambda: 1, dimensionless="yes")


def test_custom_checks_get_the_exercise_tolerance():
    lab = Lab("t")
    lab.exercise("c", "within the exercise's rtol", rtol=0.1,
                 check=lambda answer, rtol: abs(answer - 1) <= rtol)
    assert lab.check("c", 1.05).ok and not lab.check("c", 1.2).ok


def test_named_slip_fires_only_within_the_tolerance():
    from memlab.labs.grader import named_slip

    slips = [(100.0, "a"), (200.0, "b", "label b")]
    assert named_slip(101.0, slips, 0.02) == "a"
    assert named_slip(199.0, slips, 0.02) == "b"
    assert named_slip(150.0, slips, 0.02) == ""
    assert named_slip(float("nan"), slips, 0.02) == ""


def test_source_as_list_of_lines_and_input_untouched():
    lines = ["a = None\n", "### BEGIN SOLUTION\n", "a = 1\n", "### END SOLUTION\n", "a"]
    nb = _nb(_code(lines))
    out = strip_solutions(nb)
    assert out["cells"][0]["source"] == "a = None\n# YOUR CODE HERE\na"
    assert nb["cells"][0]["source"] == lines


def test_outputs_cleared_and_metadata_kept():
    cell = _code(
        "print(1)",
        outputs=[{"output_type": "stream", "name": "stdout", "text": "1\n"}],
        execution_count=7,
        metadata={"tags": ["keep-me"], "execution": {"t": 1}},
    )
    meta = {"kernelspec": {"name": "python3"}, "title": "Lab"}
    out = strip_solutions(_nb(cell, metadata=meta))
    got = out["cells"][0]
    assert got["outputs"] == [] and got["execution_count"] is None
    assert got["metadata"] == {"tags": ["keep-me"]}
    assert out["metadata"] == meta and out["nbformat"] == 4


def test_markdown_solutions_and_mark_schemes_removed():
    nb = _nb(
        _md("Why?\n\n=== BEGIN MARK SCHEME ===\nBecause.\n=== END MARK SCHEME ===\n"),
        _md("Q.\n### BEGIN SOLUTION\nA.\n### END SOLUTION\nAfter."),
        _md("Only for instructors.", tags=["solution"]),
        _md("=== BEGIN MARK SCHEME ===\nall of it\n=== END MARK SCHEME ==="),
        _md("The markers are `### BEGIN SOLUTION` and `### END SOLUTION`."),
    )
    stats = StripStats()
    out = strip_solutions(nb, stats=stats)
    assert [c["source"] for c in out["cells"]] == [
        "Why?",
        "Q.\nAfter.",
        "The markers are `### BEGIN SOLUTION` and `### END SOLUTION`.",
    ]
    assert (stats.markdown_regions, stats.cells_removed) == (3, 2)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
        ("x = 1\n### END SOLUTION\n", "without a matching"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside the region"),
    ],
)
def test_unbalanced_markers_are_one_line_errors(source, problem):
    nb = _nb(_code("ok = 1"), _code(source, id="bad-cell"))
    with pytest.raises(MemlabError) as err:
        strip_solutions(nb, source_name="labs/x.ipynb")
    message = str(err.value)
    assert "\n" not in message and problem in message
    assert message.startswith("labs/x.ipynb: cell 1 (id bad-cell): line ")


def test_mismatched_markdown_markers_are_an_error():
    with pytest.raises(MemlabError, match="without a matching"):
        strip_solutions(_nb(_md("=== BEGIN MARK SCHEME ===\nx\n### END SOLUTION")))


def test_fixture_student_version_compiles(tmp_path):
    dest, stats = write_student_notebook(FIXTURE, tmp_path)
    nb = json.loads(dest.read_text(encoding="utf-8"))
    assert stats.code_regions == 4 and stats.cells_removed == 1
    text = dest.read_text(encoding="utf-8")
    assert "BEGIN SOLUTION" not in text and "MARK SCHEME" not in text
    assert "Solution notes" not in text and "answer = 4 * 1000" not in text
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            _compiles("".join(cell["source"]), f"cell {i}")
            assert cell["outputs"] == [] and cell["execution_count"] is None


def _run_script(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def make_student():
    spec = importlib.util.spec_from_file_location("make_student", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_script_writes_student_versions(tmp_path, make_student, capsys):
    src = tmp_path / "labs"
    src.mkdir()
    (src / "lab_a.ipynb").write_text(FIXTURE.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "student"
    assert make_student([str(src), "--out", str(out)]) == 0
    assert f"wrote {out / 'lab_a.ipynb'} (4 code solution(s)" in capsys.readouterr().out
    assert (out / "lab_a.ipynb").exists()
    # the output folder may sit inside the source folder (labs/student): it is not re-read
    inner = src / "student"
    assert make_student([str(src), "--out", str(inner)]) == 0
    assert make_student([str(src), "--out", str(inner)]) == 0
    assert sorted(p.name for p in inner.iterdir()) == ["lab_a.ipynb"]


def test_script_unbalanced_markers_exit_2(tmp_path):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(json.dumps(_nb(_code("### BEGIN SOLUTION\nx = 1\n", id="c7"))), encoding="utf-8")
    proc = _run_script(bad, "--out", tmp_path / "student")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("make_student: error: ") and str(bad) in err and "cell 0 (id c7)" in err
    assert not (tmp_path / "student" / "bad.ipynb").exists()


def test_script_other_bad_input(tmp_path, make_student, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_student([str(empty), "--out", str(tmp_path / "s")]) == 0
    assert "nothing written" in capsys.readouterr().out
    assert make_student([str(tmp_path / "missing.ipynb"), "--out", str(tmp_path / "s")]) == 2
    assert "neither a notebook" in capsys.readouterr().err
    (tmp_path / "junk.ipynb").write_text("{not json", encoding="utf-8")
    assert make_student([str(tmp_path / "junk.ipynb"), "--out", str(tmp_path / "s")]) == 2
    assert "cannot read the notebook" in capsys.readouterr().err
    assert make_student([str(FIXTURE), "--out", str(FIXTURE.parent)]) == 2
    assert "overwrite" in capsys.readouterr().err


# ------------------------------------------------------------- labs, both ways


def _execute(path: Path, cwd: Path, report: Path, monkeypatch) -> list[dict]:
    """Run a notebook top to bottom in a fresh kernel; return the checks it reported."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv(REPORT_ENV, str(report))
    monkeypatch.setenv("MEMLAB_SCALE", "ci")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()  # a cell error raises CellExecutionError
    if not report.exists():
        return []
    return [json.loads(line) for line in report.read_text(encoding="utf-8").splitlines()]


def _executed_checks(instructor: Path) -> list[dict] | None:
    """The checks of the book build's execution of a notebook (jupyter-cache), or None if none."""
    from memlab.labs.grader import parse_check_line

    cache_dir = ROOT / "_build" / ".jupyter_cache"
    if instructor.parent.name == "data" or not (cache_dir / "global.db").is_file():
        return None
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_dir))
    try:
        record = cache.get_cached_project_nb(str(instructor.resolve()))
    except (KeyError, ValueError):
        record = None
    if record is None:  # not built, or its code changed since the build
        return None
    checks = []
    for cell in cache.get_cache_bundle(record.pk).nb.cells:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream")
        for line in text.splitlines():
            parsed = parse_check_line(line)
            if parsed:
                checks.append({"exercise": parsed[0], "status": parsed[1]})
    return checks


def _check_both_versions(instructor: Path, tmp_path: Path, monkeypatch) -> None:
    cwd = instructor.parent
    # The instructor version: the book build's execution when there is one, else run it here.
    checks = _executed_checks(instructor)
    if checks is None:
        checks = _execute(instructor, cwd, tmp_path / "instructor.jsonl", monkeypatch)
    assert checks, f"{instructor.name} has no lab.check call"
    wrong = [c for c in checks if c["status"] != "correct"]
    assert not wrong, f"the instructor version of {instructor.name} must pass every check: {wrong}"

    # The student version: the book build's execution of the published one (labs/student) when
    # it is the student version of this instructor version, else written and run here.
    published = cwd / "student" / instructor.name
    student_checks = None
    if published.is_file() and published.read_text(encoding="utf-8") == student_text(instructor)[0]:
        student_checks = _executed_checks(published)
    if student_checks is None:
        student, _ = write_student_notebook(instructor, tmp_path / "student")
        student_checks = _execute(student, cwd, tmp_path / "student.jsonl", monkeypatch)
    attempted = [c for c in student_checks if c["status"] != "not attempted"]
    assert not attempted, (
        f"the student version of {instructor.name} must attempt nothing: {attempted}"
    )
    assert [c["exercise"] for c in student_checks] == [c["exercise"] for c in checks]


def test_fixture_lab_end_to_end(tmp_path, monkeypatch):
    _check_both_versions(FIXTURE, tmp_path, monkeypatch)


@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_every_lab_runs_as_instructor_and_student(notebook, tmp_path, monkeypatch):
    _check_both_versions(notebook, tmp_path, monkeypatch)


def test_answer_number_takes_real_scalars_only():
    import numpy as np
    import torch

    from memlab.labs.grader import answer_number

    assert answer_number(3) == 3.0 and answer_number(np.float32(0.5)) == 0.5
    assert answer_number(torch.tensor(2.5)) == 2.5 and answer_number(torch.tensor([4.0])) == 4.0
    for bad in (True, "1", None, torch.tensor([1.0, 2.0]), torch.tensor(1 + 2j), np.bool_(True)):
        assert answer_number(bad) is None


def test_answer_keys_problem_names_what_is_wrong():
    from memlab.labs.grader import answer_keys_problem

    keys = ("a", "b")
    assert answer_keys_problem({"a": 1, "b": 2}, keys, "CASES") is None
    assert answer_keys_problem([1, 2], keys, "CASES") == "answer a dict with the keys of CASES, got list"
    assert answer_keys_problem({"a": 1}, keys, "CASES") == "missing keys ['b']"
    assert answer_keys_problem({"a": 1, "b": 2, "c": 3}, keys, "CASES") == "unknown keys ['c']"
    assert answer_keys_problem({"a": None, "b": ...}, keys, "CASES") == "fill in 'a', 'b'"


def test_check_lines_parse_back(lab, capsys):
    from memlab.labs.grader import parse_check_line

    lab.check("1.1", 4000)
    lab.check("1.1", 4001)
    lab.check("1.1", None)
    lines = capsys.readouterr().out.splitlines()
    assert [parse_check_line(line) for line in lines] == [
        ("1.1", "correct"), ("1.1", "not yet"), ("1.1", "not attempted")]
    assert parse_check_line("1/1 correct") is None and parse_check_line("correct") is None
