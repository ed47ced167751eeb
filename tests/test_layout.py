"""The library's house rules, checked: one folder per part with the same rooms, no private
names imported across modules, and the import-linter contracts kept."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memlab.book import PARTS, ROOMS, room_modules

SRC = Path(__file__).resolve().parents[1] / "src" / "memlab"


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def test_no_private_name_is_imported_across_modules():
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memlab"):
                found += [f"{path.relative_to(SRC)}: from {node.module} import {a.name}"
                          for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not found, found


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.folder)
def test_every_part_is_a_folder_with_its_rooms(part):
    folder = SRC / part.folder
    assert (folder / "__init__.py").is_file()
    assert (folder / "experiments.py").is_file(), f"{part.folder} has no experiments.py"
    chapter = Path(__file__).resolve().parents[1] / f"{part.chapter}.ipynb"
    assert chapter.is_file(), chapter
    if part.lab is not None:
        assert (SRC / "labs" / f"{part.lab}.py").is_file()


def test_rooms_are_found_through_the_book_table():
    assert room_modules("experiments") == [f"memlab.{p.folder}.experiments" for p in PARTS]
    assert set(room_modules("claims")) <= {f"memlab.{p.folder}.claims" for p in PARTS}
    assert ROOMS == ("experiments", "claims")


def test_every_claim_is_registered_by_its_parts_claims_module():
    from memlab import claims
    from memlab.book import import_rooms, part_of_chapter

    import_rooms("claims")
    for check in claims.CHECKS.values():
        part = part_of_chapter(check.chapter)
        for fn in (check.evidence, check.decide):
            assert fn.__module__ == f"memlab.{part.folder}.claims", (check.claim, fn.__module__)


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install import-linter)")
    run = subprocess.run([exe, "--no-cache"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stdout[-3000:]


# One name, one home: each vocabulary is defined once (STYLE.md names where).
HOMES = {"OPTIMIZERS": "model/config.py", "OPTIMIZER_IMPLS": "model/config.py",
         "PRECISIONS": "model/config.py", "ATTENTION_IMPLS": "model/config.py",
         "PHASES": "model/step.py", "STEP_BYTES": "model/step.py",
         "INFERENCE_PHASES": "memory/estimator.py", "SCHEMES": "quant/schemes.py",
         "LLM_INT8_THRESHOLD": "quant/functional.py", "FLOAT_DTYPES": "dtypes.py",
         "FORMATS": "precision/formats.py"}


def test_each_vocabulary_is_defined_once():
    defined = {}
    for path, tree in _modules():
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            for t in targets:
                if isinstance(t, ast.Name) and t.id in HOMES:
                    defined.setdefault(t.id, []).append(str(path.relative_to(SRC)))
    assert defined == {name: [home] for name, home in HOMES.items()}


def test_no_module_keeps_its_own_format_to_dtype_map():
    offenders = []
    for path, tree in _modules():
        if path.name == "dtypes.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                values = {ast.unparse(v) for v in node.values}
                if {"fp16", "bf16"} <= keys and "torch.bfloat16" in values and "fp32" in keys:
                    offenders.append(str(path.relative_to(SRC)))
    assert not offenders, offenders


@pytest.mark.parametrize("old, new", [("adamw8bit", "adamw-8bit"), ("int8-row", "int8")])
def test_old_spellings_are_refused_in_one_line(old, new):
    from memlab.errors import MemlabError
    from memlab.model.train import make_optimizer
    from memlab.quant.schemes import get_scheme

    with pytest.raises(MemlabError, match=f"unknown (optimizer|scheme) '{old}'; accepted: .*{new}"):
        (make_optimizer(old, [], lr=1e-3) if old == "adamw8bit" else get_scheme(old))


MAX_SOURCE_LINES = 800


def test_no_source_file_over_800_lines():
    too_long = []
    for path in sorted(p for ext in ("py", "js") for p in SRC.rglob(f"*.{ext}")):
        name = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_SOURCE_LINES:
            too_long.append(f"{name} ({lines} lines)")
    assert not too_long, f"over {MAX_SOURCE_LINES} lines: {', '.join(too_long)}"


# Docstring first lines (the summary) may be at most this long, chapter tag included.
MAX_SUMMARY_CHARS = 100


def test_docstring_first_lines_fit():
    too_long = []
    for path, tree in _modules():
        name = path.relative_to(SRC).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node, clean=False)
            first = doc.strip().splitlines()[0] if doc and doc.strip() else ""
            where = f"{name}:{getattr(node, 'name', '<module>')}"
            if len(first) > MAX_SUMMARY_CHARS:
                too_long.append(f"{where} ({len(first)} chars)")
    assert not too_long, (f"docstring first lines over {MAX_SUMMARY_CHARS} characters: "
                          f"{', '.join(too_long)}")
