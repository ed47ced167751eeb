"""nbval over notebooks the book build already executed: each notebook runs once per `make test`.

`jupyter-book build` executes every notebook (and keeps its widgets' state for the HTML) and
stores each executed notebook, outputs as the kernel sent them, in its jupyter-cache
(``_build/.jupyter_cache``). With ``--nbval-executed DIR`` (that cache, or a folder of executed
copies laid out like the sources), nbval's own collector, cell tags (``nbval-check-output``
...), sanitizers and output comparison check each notebook against those outputs instead of
starting a kernel to run it a second time. Without the option, ``--nbval-lax`` runs the
notebooks itself as usual.

A lab's instructor version (``labs/labNN_*.ipynb``) is not in the book: the book executes its
student version (``labs/student/``, solutions and hidden tests out). The instructor version is
checked against that execution cell for cell (a student version keeps every code cell, in
order): each cell the two versions share is checked as above (no error; ``nbval-check-output``
outputs equal the instructor version's; a cell under ``lab.reveal`` must print only its lock
line, since no check passes there), and the answer and check cells, which differ, are not
collected here: ``tests/labs/test_nbgrader.py`` autogrades the instructor version (every check
correct, full marks) and the student version (every check "not attempted").
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest


def pytest_addoption(parser):
    parser.getgroup("nbval").addoption(
        "--nbval-executed", default=None, metavar="DIR",
        help="check notebooks against the outputs of their executed copies in DIR "
             "(e.g. _build/jupyter_execute) instead of running them")


def pytest_collect_file(file_path, parent):
    executed = parent.config.option.nbval_executed
    if executed and file_path.suffix == ".ipynb" and not parent.config.option.nbval_lax:
        return _replay_file_class().from_parent(parent, path=file_path)
    return None


@functools.cache
def _replay_file_class():
    from nbformat import read
    from nbval.plugin import IPyNbCell, IPyNbFile, coalesce_streams

    class ExecutedCell(IPyNbCell):
        """A cell whose outputs come from the executed copy, compared as nbval compares them."""

        def runtest(self):
            if self.options["skip"]:
                pytest.skip()
            executed = self.parent.executed_cells[self.cell_num]
            if executed.source != self.parent.executed_source(self.cell_num, self.cell.source):
                self.raise_cell_error("the executed copy is stale: its source differs; build the "
                                      "book again (a lab: `make student` first)")
            outs = coalesce_streams(executed.get("outputs", []))
            self.test_outputs = outs
            errors = [o for o in outs if o.get("output_type") == "error"]
            if errors and not self.options["check_exception"]:
                self.raise_cell_error("Cell execution caused an exception",
                                      "\n".join(errors[0].get("traceback", [])))
            unrun = self.cell.execution_count is None
            if unrun and self.cell.outputs:
                self.raise_cell_error("Unrun reference cell has outputs")
            locked = self.parent.locked_text(self.cell.source)
            if locked is not None:
                shown = "".join(o.get("text", "") for o in outs if o.get("output_type") == "stream")
                if shown != locked or any(o.get("output_type") != "stream" for o in outs):
                    self.raise_cell_error(
                        "the published student version shows what a check reveals",
                        f"expected only:\n{locked}got:\n{shown}")
                return  # the revealed outputs: tests/labs/test_nbgrader.py, the instructor's run
            if self.options["check"] and not unrun and not self.compare_outputs(
                    outs, coalesce_streams(self.cell.outputs)):
                self.raise_cell_error("Cell outputs differ", "\n".join(self.comparison_traceback))

    class ExecutedNotebook(IPyNbFile):
        """A notebook checked against its executed copy; no kernel is started."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.compare_outputs = False  # lax: only cells tagged nbval-check-output

        def setup(self):
            root = Path(self.config.rootpath)
            folder = Path(self.config.option.nbval_executed)
            folder = folder if folder.is_absolute() else root / folder
            built = _published_version(Path(self.path)) or Path(self.path)
            nb = _from_jupyter_cache(folder, built) if (folder / "global.db").is_file() \
                else _from_folder(folder, root, built, read)
            self.executed_cells = [c for c in nb.cells if c.cell_type == "code"]
            self.setup_sanitize_files()

        def teardown(self):
            pass

        @functools.cached_property
        def published_sources(self) -> list[str] | None:
            """The code cells' sources in the published student version; None for other notebooks."""
            if _published_version(Path(self.path)) is None:
                return None
            from memlab.labs.student import strip_solutions

            nb = strip_solutions(read(str(self.path), as_version=4), source_name=str(self.path))
            return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]

        def locked_text(self, source: str) -> str | None:
            """What a lab's ``lab.reveal`` cell prints in the student version; None elsewhere."""
            if self.published_sources is None:
                return None
            from memlab.labs.grader import locked_line, revealed_ids

            ids = revealed_ids(source)
            return "".join(locked_line(i) + "\n" for i in ids) if ids else None

        def executed_source(self, cell_num: int, source: str) -> str:
            """The source the executed copy's cell must have: the published version's for a lab."""
            return source if self.published_sources is None else self.published_sources[cell_num]

        def collect(self):
            for item in super().collect():
                if self.executed_source(item.cell_num, item.cell.source) != item.cell.source:
                    continue  # a lab's answer or check cell: autograded by nbgrader's test
                yield ExecutedCell.from_parent(self, name=item.name, cell_num=item.cell_num,
                                               cell=item.cell, options=item.options)

    return ExecutedNotebook


def _published_version(notebook: Path) -> Path | None:
    """``labs/student/<name>`` for a lab's instructor version ``labs/<name>``, else None."""
    published = notebook.parent / "student" / notebook.name
    if notebook.parent.name == "labs" and published.is_file():
        return published
    return None


def _from_jupyter_cache(cache_dir: Path, notebook: Path):
    """The executed notebook jupyter-cache holds for ``notebook``'s current code cells."""
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_dir))
    try:
        record = cache.get_cached_project_nb(str(notebook.resolve()))
    except (KeyError, ValueError):
        record = None
    if record is None:
        raise pytest.UsageError(f"no executed copy of {notebook} in the jupyter-cache at "
                                f"{cache_dir} (or its code changed since); build the book first "
                                "(make book)")
    return cache.get_cache_bundle(record.pk).nb


def _from_folder(folder: Path, root: Path, notebook: Path, read):
    """The executed copy at the same relative path under ``folder``."""
    copy = folder / notebook.relative_to(root)
    if not copy.is_file():
        raise pytest.UsageError(f"no executed copy of {notebook} at {copy}; build the book "
                                "first (make book)")
    return read(str(copy), as_version=4)
