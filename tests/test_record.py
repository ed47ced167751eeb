"""memlab record (the GPU pass, rehearsed on the CPU) and memlab check-records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from memlab.errors import MemlabError
from memlab.experiments import experiments
from memlab.record import Plan, PlanRow, plan_pass, run_pass, unpack_archive
from memlab.record_check import check_record, check_records, commit_source_sha256, label_record
from memlab.results import make_record, result_sha256, save_record, source_sha256

ROOT = Path(__file__).resolve().parents[1]


def memlab(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "memlab", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


# The plan -----------------------------------------------------------------------------------------
def test_registry_declares_needs_cost_and_priority():
    for exp in experiments().values():
        assert exp.needs in ("cuda", "cpu", "any") and exp.cost_s > 0
        assert isinstance(exp.priority, int) and exp.gpus >= 1


def test_dry_run_for_a_gpu_fits_its_budget_on_any_machine():
    out = memlab("record", "--dry-run", "--device", "cuda", "--budget", "540", "--json",
                 timeout=120)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    runs = [r for r in plan["rows"] if r["runs"]]
    assert runs and sum(r["cost_s"] for r in runs) <= 540
    assert [r["priority"] for r in plan["rows"]] == sorted(r["priority"] for r in plan["rows"])
    assert all(r["needs"] in ("cuda", "any") for r in plan["rows"])  # nothing a CPU shows alone
    assert {r["reason"] for r in plan["rows"] if not r["runs"]} <= {
        "over budget", "needs 2 GPUs, this pass has 1"}
    assert "quant-speed" in {r["name"] for r in runs}  # a placeholder the reader meets early


def test_plan_reads_costs_from_records_and_skips_recorded(tmp_path):
    exp = experiments()["trace-7b"]
    rec = make_record("trace-7b", "ci", {"x": 1}, device=torch.device("cpu"), wall_s=2.5)
    save_record(rec, tmp_path)
    plan = plan_pass(device="cpu", scale="ci", budget_s=100, only="trace-7b,finetune-20b",
                     out=tmp_path, results=tmp_path)
    row = {r.name: r for r in plan.rows}
    assert row["trace-7b"].cost_from == "recorded" and row["trace-7b"].cost_s == 12.5
    assert row["finetune-20b"].cost_from == "estimated"
    assert exp.cost_s > 0
    again = plan_pass(device="cpu", scale="ci", budget_s=100, only="trace-7b,finetune-20b",
                      skip_recorded=True, out=tmp_path, results=tmp_path)
    assert {r.name: r.reason for r in again.rows} == {"trace-7b": "recorded", "finetune-20b": ""}


def test_plan_leaves_out_what_does_not_fit_and_keeps_what_does():
    plan = plan_pass(device="cuda", budget_s=30, gpus=1, only="step-memory,fp8-matmul,offload")
    assert [(r.name, r.runs) for r in plan.rows] == [
        ("step-memory", True), ("fp8-matmul", False), ("offload", False)]
    assert plan.rows[1].reason == "over budget"


@pytest.mark.parametrize(("argv", "needle"), [
    (["record", "--dry-run", "--budget", "-5"], "--budget must be a positive number of seconds"),
    (["record", "--dry-run", "--budget", "0"], "--budget must be a positive number of seconds"),
    (["record", "--dry-run", "--budget", "60", "--only", "nope"], "unknown experiment 'nope'"),
    (["record", "--dry-run", "--budget", "60", "--only", ","], "--only needs experiment names"),
    (["record", "--dry-run", "--budget", "60", "--device", "mps"],
     "unknown device 'mps'; accepted: cuda, cpu"),
    (["record", "--dry-run", "--budget", "60", "--scale", "huge"], "unknown scale 'huge'"),
    (["record", "--budget", "60"], "record needs --out DIR"),
    (["record", "--dry-run"], "the following arguments are required: --budget"),
    (["check-records", "/nonexistent/records"], "no folder of records"),
    (["unpack-records", "/nonexistent.tar.gz"], "no archive at"),
])
def test_record_bad_input_is_one_line(capsys, cli_error, argv, needle):
    cli_error(argv, needle)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_a_cuda_pass_without_a_gpu_is_refused_in_one_line(tmp_path):
    out = memlab("record", "--budget", "60", "--device", "cuda", "--out", str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "memlab: error: --device cuda was asked for, but torch sees no CUDA GPU here; use "
        "--dry-run to print the plan, or --device cpu"]


# The pass, rehearsed on the CPU ------------------------------------------------------------------
@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """One CPU pass at CI scale through the command line, as the GPU call runs it."""
    out = tmp_path_factory.mktemp("pass")
    proc = memlab("record", "--scale", "ci", "--device", "cpu", "--budget", "240", "--out",
                  str(out), "--only", "step-memory,trace-7b,quant-speed,finetune-20b")
    return out, proc


def test_rehearsal_records_each_experiment_in_its_own_process(rehearsal):
    out, proc = rehearsal
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    status = {r["name"]: r["status"] for r in summary["rows"]}
    assert status == {"step-memory": "ok", "quant-speed": "skipped", "trace-7b": "ok",
                      "finetune-20b": "ok"}
    assert summary["counts"] == {"ok": 3, "failed": 0, "skipped": 1, "timed out": 0}
    skipped = next(r for r in summary["rows"] if r["name"] == "quant-speed")
    assert skipped["error"] == "needs cuda"
    for row in summary["rows"]:
        if row["status"] == "ok":
            assert (out / row["record"]).is_file() and (out / "logs" / f"{row['name']}.log").is_file()
    assert all(c.ok for c in check_records(out))


def test_rehearsal_archive_holds_records_summary_and_logs(rehearsal, tmp_path):
    out, _ = rehearsal
    with tarfile.open(out / "record-pass.tar.gz") as tar:
        names = set(tar.getnames())
    assert "summary.json" in names and "logs/trace-7b.log" in names
    assert any(n.startswith("trace-7b/ci-cpu-") for n in names)
    written = unpack_archive(out / "record-pass.tar.gz", tmp_path)
    assert sorted(Path(p).parent.name for p in written) == ["finetune-20b", "step-memory",
                                                            "trace-7b"]


def test_a_device_independent_record_is_a_cpu_record(rehearsal):
    out, _ = rehearsal
    body = json.loads(next((out / "trace-7b").glob("*.json")).read_text())
    prov = body["provenance"]
    assert prov["device"] == "cpu" and body["sizes"] == {"model": "llama2-7b", "batch_size": 1,
                                                         "seq_len": 256}
    for key in ("memlab_version", "git_commit", "git_dirty", "source_sha256", "packages",
                "wall_s", "result_sha256"):
        assert prov[key] is not None, key
    assert prov["memlab_version"] != "unknown" and prov["source_sha256"] == source_sha256()
    assert set(prov["packages"]) >= {"torch", "cuda", "bitsandbytes", "peft", "accelerate",
                                     "triton"}


def _row(name, cost=15.0):
    exp = experiments()[name]
    return PlanRow(name, exp.chapter, exp.needs, exp.priority, cost, "estimated", True, "", 0.0)


def test_a_failure_and_a_timeout_end_in_one_line_and_the_pass_goes_on(tmp_path):
    """quant-speed cannot be recorded on a CPU (one line); attention-flops is stopped at 1 s.

    One second is less than a child takes to import torch, so the stop never races the end.
    """
    plan = Plan(device="cpu", scale="ci", budget_s=300.0, gpus=0,
                rows=(_row("quant-speed"), _row("attention-flops", cost=1.0),
                      _row("finetune-20b", cost=2.0)))
    import memlab.record as R

    limits = []
    real = R.child_timeout
    # attention-flops's child gets 1 s, the others two minutes
    R.child_timeout = lambda cost: (limits.append(cost), 1.0 if cost == 1.0 else 120.0)[1]
    try:
        rows = run_pass(plan, tmp_path, echo=lambda *a, **k: None)
    finally:
        R.child_timeout = real
    got = {r.name: (r.status, r.error) for r in rows}
    assert got["quant-speed"][0] == "failed"
    assert got["quant-speed"][1].startswith("quant-speed measures on a CUDA GPU only")
    assert got["attention-flops"] == ("timed out", "stopped after 1 s")
    assert got["finetune-20b"][0] == "ok"  # the pass went on after both
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["name"] for r in summary["rows"]] == ["quant-speed", "attention-flops",
                                                    "finetune-20b"]


def test_the_budget_stops_the_pass(tmp_path):
    plan = Plan(device="cpu", scale="ci", budget_s=1.5, gpus=0,  # less than a child's start
                rows=(_row("attention-flops", cost=1.0), _row("finetune-20b", cost=1.0)))
    rows = run_pass(plan, tmp_path, echo=lambda *a, **k: None)
    assert rows[0].status == "timed out" and rows[0].seconds < 8
    assert rows[1].status == "skipped" and rows[1].error.startswith("over budget")


# check-records -----------------------------------------------------------------------------------
def test_stored_records_check_out():
    checks = check_records(ROOT / "results")
    assert checks and [c.line() for c in checks if not c.ok] == []


def test_check_records_command_passes_on_results():
    out = memlab("check-records", "results", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "records in results check out" in out.stdout


@pytest.fixture
def fresh_record(tmp_path):
    """A record of trace-7b made now, in a folder of its own."""
    from memlab.experiments import run_experiment

    _, _, path = run_experiment("trace-7b", "ci", tmp_path, command="test")
    return tmp_path, path


def _edit(path, fn):
    body = json.loads(path.read_text())
    fn(body)
    path.write_text(json.dumps(body, indent=2))


def test_a_tampered_copy_fails_in_one_line(tmp_path):
    copy = tmp_path / "results"
    shutil.copytree(ROOT / "results", copy)
    target = next(p for p in sorted(copy.glob("*/*.json"))
                  if json.loads(p.read_text())["provenance"].get("result_sha256"))
    text = target.read_text()
    body = json.loads(text)

    def bump(d):  # the first integer in the result, plus one
        for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
            if isinstance(v, int) and not isinstance(v, bool):
                d[k] = v + 1
                return True
            if isinstance(v, (dict, list)) and bump(v):
                return True
        return False

    assert bump(body["result"])
    target.write_text(json.dumps(body, indent=2))
    out = memlab("check-records", str(copy), timeout=120)
    assert out.returncode == 1
    rel = target.relative_to(copy).as_posix()
    assert out.stderr.strip().splitlines() == [
        f"{rel}: its result was edited after it was recorded (result_sha256 differs)"]


@pytest.mark.parametrize(("change", "needle"), [
    (lambda b: b["result"].update(extra=1), "result has extra, which StepMemory no longer has"),
    (lambda b: b["result"].pop("peak_bytes"), "lacks result.peak_bytes"),
    (lambda b: b.update(sizes={"model": "gpt2"}), "made at other sizes"),
    (lambda b: b.update(experiment="step-memory"), "sits in the folder 'trace-7b'"),
    (lambda b: b["provenance"].update(device="cuda"), "runs on the CPU wherever it is run"),
    (lambda b: b["provenance"].pop("source_sha256"), "lacks source_sha256"),
    (lambda b: b["provenance"].update(lacks=["wall_s"]), "its label says it lacks wall_s"),
])
def test_each_problem_is_named(fresh_record, change, needle):
    folder, path = fresh_record

    def change_and_rehash(b):
        change(b)
        b["provenance"]["result_sha256"] = result_sha256(b["result"])

    _edit(path, change_and_rehash)
    (check,) = check_records(folder)
    assert not check.ok and needle in check.line()


def test_a_record_named_after_another_device_is_refused(fresh_record):
    folder, path = fresh_record
    moved = path.with_name("ci-nvidia-h100.json")
    path.rename(moved)
    assert "its file name should be ci-cpu-" in check_record(moved).line()


def test_a_label_excuses_what_is_missing_and_the_page_shows_it(fresh_record):
    from memlab.results import load_record

    folder, path = fresh_record
    _edit(path, lambda b: [b.pop("sizes"), b["provenance"].pop("wall_s")])
    assert not check_record(path).ok
    assert label_record(path).ok
    assert load_record(path).label.endswith("; lacks: sizes, wall_s")
    _edit(path, lambda b: b["result"].update(peak_bytes=1))  # a label excuses no edit
    assert "edited after it was recorded" in check_record(path).line()
    with pytest.raises(MemlabError, match="not labelled: its result was edited"):
        label_record(path)


def test_a_clean_commit_is_held_to_its_source(fresh_record):
    folder, path = fresh_record
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    at_head = commit_source_sha256(head)
    assert at_head is not None and len(at_head) == 64
    _edit(path, lambda b: b["provenance"].update(git_commit=head, git_dirty=False,
                                                 source_sha256=at_head))
    assert check_record(path).ok
    _edit(path, lambda b: b["provenance"].update(source_sha256="0" * 64))
    assert f"not the source of commit {head[:12]}" in check_record(path).line()


# A new record reaches the pages ------------------------------------------------------------------
def test_a_changed_record_makes_the_build_execute_its_readers_again(tmp_path):
    """scripts/records_changed.py forgets the cached run of each notebook that reads records."""
    from jupyter_cache import get_cache

    sys.path.insert(0, str(ROOT / "scripts"))
    from records_changed import main as records_changed
    from records_changed import reads_records

    assert reads_records(ROOT / "chapters" / "03_quantization.ipynb")
    assert reads_records(ROOT / "labs" / "lab06_distributed.ipynb")  # through its lab module
    assert not reads_records(ROOT / "labs" / "lab02_number_formats.ipynb")
    book = tmp_path / "book"
    book.mkdir()
    for name, code in (("reader", "from memlab.results import recorded\nrecorded('x')"),
                       ("other", "x = 1")):
        nb = {"cells": [{"cell_type": "code", "source": code, "metadata": {}, "outputs": [],
                         "execution_count": 1}], "metadata": {}, "nbformat": 4,
              "nbformat_minor": 5}
        (book / f"{name}.ipynb").write_text(json.dumps(nb))
    cache = get_cache(str(tmp_path / "cache"))
    for name in ("reader", "other"):
        cache.cache_notebook_file(book / f"{name}.ipynb", check_validity=False)
    assert records_changed([str(tmp_path / "cache"), str(book)]) == 0
    assert [Path(r.uri).name for r in cache.list_cache_records()] == ["other.ipynb"]


def test_an_archive_over_its_limit_leaves_out_snapshots_then_logs(tmp_path):
    import memlab.record as R

    plan = Plan(device="cpu", scale="ci", budget_s=60.0, gpus=0, rows=())
    out = tmp_path / "pass"
    (out / "x").mkdir(parents=True)
    (out / "x" / "ci-cpu.json").write_text("{}")
    (out / "x" / "snapshot-ci.pickle").write_bytes(os.urandom(200_000))  # does not compress
    (out / "logs").mkdir()
    (out / "logs" / "x.log").write_text("ok\n")
    state = R._Pass(plan, out, out / "a.tar.gz", "test", limit=100_000)
    state.save()
    with tarfile.open(out / "a.tar.gz") as tar:
        names = set(tar.getnames())
    assert names == {"summary.json", "x/ci-cpu.json", "logs/x.log"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["left_out_of_archive"] == ["x/snapshot-ci.pickle"]
