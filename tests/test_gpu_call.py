"""The GPU call, rehearsed on the CPU: scripts/gpu_pass.sh, scripts/gpu_prepare.py, make gpu-unpack's pieces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script(out: Path, work: Path, budget: int = 200, **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHON=sys.executable, MEMLAB_GPU_WORK=str(work), **env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_pass.sh"), str(budget), str(out)],
                          capture_output=True, text=True, env=full, cwd=ROOT, timeout=600)


def test_the_call_rehearsed_on_a_cpu_writes_its_four_files(tmp_path):
    out = tmp_path / "out"
    run = _script(out, tmp_path / "work", MEMLAB_PASS_DEVICE="cpu", MEMLAB_PASS_SCALE="ci",
                  MEMLAB_PASS_ONLY="trace-7b,finetune-20b",
                  MEMLAB_PASS_NOTEBOOKS="labs/lab02_number_formats.ipynb")
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu-pass.tar.gz", "notebook-logs.tar.gz",
                                                     "notebooks.json", "preflight.txt"]
    assert "bitsandbytes" in (out / "preflight.txt").read_text()
    with tarfile.open(out / "gpu-pass.tar.gz") as tar:
        assert "summary.json" in tar.getnames()
    report = json.loads((out / "notebooks.json").read_text())
    assert report["counts"]["ok"] == 1 and report["device"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_call_without_a_gpu_stops_at_the_preflight_in_one_line(tmp_path):
    run = _script(tmp_path / "out", tmp_path / "work", budget=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == ("gpu_pass: error: torch sees no CUDA GPU on "
                                                   "this machine")


def test_prepare_prunes_bitsandbytes_to_what_the_gpu_loads(tmp_path):
    pytest.importorskip("bitsandbytes")
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_prepare import prune_bitsandbytes

    size = prune_bitsandbytes(tmp_path / "site")
    libs = sorted(p.name for p in (tmp_path / "site" / "bitsandbytes").glob("*.so"))
    assert libs == ["libbitsandbytes_cpu.so", "libbitsandbytes_cuda130.so",
                    "libbitsandbytes_cuda132.so"]
    assert any(p.name.endswith(".dist-info") for p in (tmp_path / "site").iterdir())
    assert size < 16 * 2**20  # it travels with the tree (64 MiB in all)
    check = subprocess.run([sys.executable, "-c", "import bitsandbytes, importlib.metadata as m; "
                            "print(bitsandbytes.__file__, m.version('bitsandbytes'))"],
                           capture_output=True, text=True, env=dict(
                               os.environ, PYTHONPATH=str(tmp_path / "site")), cwd=tmp_path)
    assert str(tmp_path / "site") in check.stdout


def test_prepare_refuses_a_budget_without_margin():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_prepare.py"), "--budget",
                          "580"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 2 and "less than 60 s of margin" in run.stderr


def test_notebook_reports_merge_keeping_the_latest_real_run(tmp_path):
    from memlab.nbexec import merge_reports

    def report(path, rows):
        path.write_text(json.dumps({"device": "cuda", "notebooks": [
            dict(notebook=n, status=s, seconds=1.0, cell=None, error="") for n, s in rows]}))

    report(tmp_path / "old.json", [("a", "ok"), ("b", "timed out")])
    report(tmp_path / "new.json", [("a", "skipped"), ("b", "ok"), ("c", "failed")])
    body = merge_reports(tmp_path / "old.json", tmp_path / "new.json")
    assert {r["notebook"]: r["status"] for r in body["notebooks"]} == {"a": "ok", "b": "ok",
                                                                        "c": "failed"}
    assert body["counts"]["ok"] == 2
