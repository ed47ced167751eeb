"""The published labs: the book shows each lab's student version, committed under labs/student.

The instructor versions (``labs/*.ipynb``: solutions, mark schemes, hidden tests) stay in the
repository for instructors and nbgrader; the book's pages, the launch buttons (Colab, Binder)
and the chapters' links all open ``labs/student/<lab>.ipynb``, which ``make student`` writes
and ``make book`` refuses to build from when it is not what its lab now gives. The built pages
themselves are checked by ``tests/test_browser.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from memlab.labs.student import (
    BEGIN_MARK_SCHEME,
    BEGIN_SOLUTION,
    CODE_STUB,
    main,
    stale_student_versions,
    student_text,
)

ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "labs"
STUDENT = LABS / "student"
LAB_NOTEBOOKS = sorted(LABS.glob("lab*.ipynb"))
CHAPTERS = sorted((ROOT / "chapters").glob("0*.ipynb"))
LAB_LINK = re.compile(r"Lab (\d) grades these skills: \[([^\]]+)\]\(\.\./labs/([^)]+)\.ipynb\)\.")


def _toc_files(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["file"]] if "file" in node else []) + [
            f for value in node.values() for f in _toc_files(value)]
    if isinstance(node, list):
        return [f for item in node for f in _toc_files(item)]
    return []


def _lab_title(notebook: Path) -> tuple[int, str]:
    heading = json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]["source"][0]
    number, title = re.fullmatch(r"# Lab (\d)\. (.+)", heading.strip()).groups()
    return int(number), title


def test_the_committed_student_versions_are_the_labs_as_they_are_now():
    assert LAB_NOTEBOOKS, "no labs found"
    problems = stale_student_versions(LAB_NOTEBOOKS, STUDENT)
    assert not problems, "run `make student` and commit labs/student:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("notebook", LAB_NOTEBOOKS, ids=[p.stem for p in LAB_NOTEBOOKS])
def test_a_student_version_keeps_no_solution_and_no_mark_scheme(notebook):
    text = (STUDENT / notebook.name).read_text(encoding="utf-8")
    for marker in (BEGIN_SOLUTION, "### BEGIN HIDDEN TESTS", BEGIN_MARK_SCHEME):
        assert marker in notebook.read_text(encoding="utf-8") and marker not in text, marker
    cells = json.loads(text)["cells"]
    assert any(CODE_STUB in "".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert all(not c["outputs"] for c in cells if c["cell_type"] == "code"), "outputs kept"


def test_check_mode_names_a_missing_a_stale_and_an_extra_version(tmp_path, capsys):
    labs = tmp_path / "labs"
    labs.mkdir()
    for notebook in LAB_NOTEBOOKS[:2]:
        shutil.copy(notebook, labs / notebook.name)
    out = labs / "student"
    assert main([str(labs), "--out", str(out)]) == 0
    assert main([str(labs), "--out", str(out), "--check"]) == 0
    assert "the 2 student version(s) are up to date" in capsys.readouterr().out

    first, second = (out / n.name for n in LAB_NOTEBOOKS[:2])
    first.write_text(first.read_text(encoding="utf-8").replace(CODE_STUB, "x = 1"),
                     encoding="utf-8")
    second.unlink()
    (out / "lab99_gone.ipynb").write_text("{}", encoding="utf-8")
    assert main([str(labs), "--out", str(out), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{first}: not the student version of" in err
    assert f"{second}: missing" in err
    assert f"{out / 'lab99_gone.ipynb'}: no instructor version" in err
    assert "run `make student`" in err
    assert student_text(labs / first.name)[0] != first.read_text(encoding="utf-8")


def test_the_book_publishes_the_student_versions_only():
    toc = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8")))
    labs = [f for f in toc if f.startswith("labs/")]
    assert labs == [f"labs/student/{p.stem}" for p in LAB_NOTEBOOKS]
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert "labs/*.ipynb" in config["exclude_patterns"]  # never built, even if listed by mistake
    assert not any("student" in p for p in config["exclude_patterns"])


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_links_its_published_lab(chapter):
    cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    links = LAB_LINK.findall(text)
    number = int(chapter.name[:2])
    lab = next(p for p in LAB_NOTEBOOKS if p.name.startswith(f"lab{number:02d}_"))
    assert links == [(str(number), _lab_title(lab)[1], f"student/{lab.stem}")], links
    assert (STUDENT / lab.name).is_file()
    assert "../labs/lab" not in text, "a chapter links an instructor version"
