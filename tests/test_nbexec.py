"""The notebook executor the GPU call uses, run here over every notebook on the CPU."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import tomllib

import memlab
from memlab.nbexec import cell_source, code_cells, done_in, notebooks_under, run_notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = notebooks_under([ROOT / "chapters", ROOT / "labs", ROOT / "appendix"])
_EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# The packages each extra installs; "notebook" (ipywidgets, pandas, ipykernel) is Colab's own,
# and installing it there would replace Colab's ipywidgets 7 with 8.
EXTRA_PACKAGES = {extra: {re.split(r"[<>=\[; ]", r, maxsplit=1)[0].lower() for r in reqs}
                  for extra, reqs in _EXTRAS.items() if extra not in ("notebook", "dev")}
OPTIONAL = set().union(*EXTRA_PACKAGES.values())


def gpu_imports(path: Path) -> set[str]:
    """What a notebook imported in its recorded run on a GPU (results/_notebooks/cuda.json), if any."""
    report = ROOT / "results" / "_notebooks" / "cuda.json"
    if not report.is_file():
        return set()
    name = path.relative_to(ROOT).as_posix()
    return {p for r in json.loads(report.read_text())["notebooks"] if r["notebook"] == name
            for p in r.get("imported", [])}


COLAB_INSTALL = re.compile(r'pip install -q "memlab-book(?:\[([a-z,]+)\])?==([^"]+)"')


def colab_install(path: Path) -> tuple[set[str], str] | None:
    """The extras and version a notebook's Colab cell installs, or None without a Colab cell."""
    for source in code_cells(path):
        if source and "google.colab" in source:
            m = COLAB_INSTALL.search(source)
            assert m and "git+" not in source, f"{path.name}: {source!r}"
            return set(m.group(1).split(",")) if m.group(1) else set(), m.group(2)
    return None


def colab_extras(path: Path) -> set[str] | None:
    """The extras a notebook's Colab cell installs, or None if it has no Colab cell."""
    found = colab_install(path)
    return None if found is None else found[0]


def _notebook(path: Path, *cells: str) -> Path:
    body = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [],
                       "execution_count": None} for c in cells],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(body))
    return path


def test_ipython_syntax_becomes_python():
    src = 'import sys\nif "google.colab" in sys.modules:\n    %pip install -q memlab\n!ls\nx = 1'
    assert cell_source(src) == ('import sys\nif "google.colab" in sys.modules:\n'
                                '    pass  # pip install -q memlab\npass  # ls\nx = 1')
    assert cell_source("%%time\nx = 1") is None
    assert cell_source("y = 10 % 3") == "y = 10 % 3"  # a modulo is not a magic


def test_cells_run_in_order_in_one_namespace_and_print_their_last_value(tmp_path):
    nb = _notebook(tmp_path / "a.ipynb", "%pip install nothing\nx = 2", "x * 21",
                   "x * 3;", "%%bash\nexit 1", "display(x + 1)")
    assert len(code_cells(nb)) == 5
    (run,) = run_notebooks([nb], logs=tmp_path / "logs", echo=lambda *a, **k: None)
    assert run.status == "ok" and run.error == ""
    out = (tmp_path / "logs" / "a.log").read_text()
    assert "42" in out and "6" not in out.replace("cell", "") and "3" in out


def test_a_failing_cell_is_named_with_its_one_line(tmp_path):
    nb = _notebook(tmp_path / "bad.ipynb", "x = 1", "raise ValueError('the bad value')")
    (run,) = run_notebooks([nb], echo=lambda *a, **k: None)
    assert (run.status, run.cell, run.error) == ("failed", 2, "ValueError: the bad value")


def test_time_limit_budget_and_skipping(tmp_path):
    slow = _notebook(tmp_path / "a_slow.ipynb", "import time\ntime.sleep(120)")
    fast = _notebook(tmp_path / "b_fast.ipynb", "x = 1")
    runs = run_notebooks([tmp_path], timeout_s=20, echo=lambda *a, **k: None,  # a busy CPU's start
                         report=tmp_path / "report.json")
    assert [(r.notebook, r.status) for r in runs] == [(slow.as_posix(), "timed out"),
                                                      (fast.as_posix(), "ok")]
    assert done_in(tmp_path / "report.json") == [fast.as_posix()]
    again = run_notebooks([tmp_path], skip=[fast.as_posix()], budget_s=0.5,
                          echo=lambda *a, **k: None)
    assert [(r.status, r.error) for r in again] == [("skipped", "over budget"),
                                                    ("skipped", "done in an earlier run")]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_has_a_colab_cell(notebook):
    found = colab_install(notebook)
    assert found is not None, f"{notebook.name} has no Colab cell"
    extras, version = found
    assert extras <= set(EXTRA_PACKAGES), extras
    # the released wheel of the book's own version, not the repository's main branch
    assert version == memlab.__version__, (notebook.name, version)


def test_every_notebook_is_found():
    names = {p.name for p in NOTEBOOKS}
    assert "00_toolkit.ipynb" in names and "lab07_compute_for_memory.ipynb" in names
    assert "claims.ipynb" in names and len(NOTEBOOKS) >= 17


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_executor_runs_every_notebook_on_the_cpu(notebook, tmp_path, monkeypatch):
    """The GPU call's executor over each chapter and lab, here on the CPU at CI scale.

    Results the book build kept (``_build/.memlab-cache``) are reused, as the appendix reuses
    the chapters': the executor, not the training, is what is tested here.
    """
    cache = ROOT / "_build" / ".memlab-cache"
    if cache.is_dir() and not os.environ.get("MEMLAB_CACHE_DIR"):
        monkeypatch.setenv("MEMLAB_CACHE_DIR", str(cache))
    (run,) = run_notebooks([notebook], device="cpu", scale="ci", logs=tmp_path,
                           echo=lambda *a, **k: None)
    assert run.status == "ok", f"{run.notebook}: cell {run.cell}: {run.error}"
    # What the run imported decides what the Colab cell installs (Colab has torch, numpy,
    # matplotlib, pandas and ipywidgets of its own); so does the recorded run on a GPU, whose
    # branches (a paged optimizer, QLoRA's CUDA layers) a CPU does not take.
    installed = colab_extras(notebook)
    ran = set(run.imported) | gpu_imports(notebook)
    missing = {p for p in ran & OPTIONAL if not any(p in EXTRA_PACKAGES[e] for e in installed)}
    assert not missing, (f"{notebook.name} runs {sorted(missing)}; its Colab cell installs "
                         f"memlab[{','.join(sorted(installed))}]")
