import json
import subprocess
import sys

import pytest

from memlab.cli import main


def test_unknown_experiment(capsys, cli_error):
    cli_error(["run", "nope"], "'nope'", "step-memory", "trace-7b")


def test_bad_scale(capsys, cli_error):
    cli_error(["run", "step-memory", "--scale", "huge"], "'huge'", "ci, full")


def test_bad_scale_from_environment(capsys, cli_error, monkeypatch):
    monkeypatch.setenv("MEMLAB_SCALE", "medium")
    cli_error(["run", "step-memory"], "'medium'", "ci, full")


def test_unknown_command_and_missing_argument(capsys, cli_error):
    cli_error(["frobnicate"], "'frobnicate'", "env", "list", "run")
    from memlab.experiments import experiments

    cli_error(["run"], "run needs an experiment; accepted: " + ", ".join(sorted(experiments())))


def test_list_and_env(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "step-memory" in out and "trace-7b" in out
    assert main(["env"]) == 0
    assert "scale" in capsys.readouterr().out


def test_python_dash_m_exit_code():
    proc = subprocess.run([sys.executable, "-m", "memlab", "run", "nope"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    from memlab.experiments import experiments

    assert proc.stderr.strip().splitlines() == [
        "memlab: error: unknown experiment 'nope'; accepted: " + ", ".join(sorted(experiments()))
    ]
    assert proc.stdout == ""


def test_run_writes_record_with_provenance(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    assert main(["run", "step-memory", "--scale", "ci", "--out", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    files = list((tmp_path / "step-memory").glob("ci-*.json"))
    assert len(files) == 1
    body = json.loads(files[0].read_text())
    assert body == printed
    prov = body["provenance"]
    for key in ("device", "device_name", "torch_version", "cuda_version", "date", "command"):
        assert key in prov
    assert prov["device"] == "cpu"
    assert prov["command"].startswith("python -m memlab run step-memory")
    assert body["result"]["peak_bytes"] > 0
    assert body["result"]["mode"] == "measured"


@pytest.mark.parametrize("scale", ["ci"])
def test_trace_experiment_runs(scale, capsys):
    assert main(["run", "trace-7b", "--scale", scale]) == 0
    assert "trace-7b at scale ci" in capsys.readouterr().out


@pytest.mark.parametrize("out, message", [
    ("", "--out needs a folder name"),
    ("/proc/forbidden", "cannot create the --out folder '/proc/forbidden'"),
    ("/dev/null", "cannot create the --out folder '/dev/null'"),
])
def test_bad_out_folder_is_refused_before_running(capsys, cli_error, monkeypatch, out, message):
    monkeypatch.setattr("memlab.experiments.run_experiment",
                        lambda *a, **k: pytest.fail("the experiment ran"))
    cli_error(["run", "step-memory", "--out", out], message)


def test_scale_is_case_insensitive_everywhere(capsys, cli_error, monkeypatch):
    from memlab.errors import MemlabError

    seen = {}

    def fake_run(name, scale, out, command):
        seen["scale"] = scale
        raise MemlabError("stopped before running")

    monkeypatch.setattr("memlab.experiments.run_experiment", fake_run)
    cli_error(["run", "step-memory", "--scale", "CI"], "stopped before running")
    assert seen["scale"] == "ci"


@pytest.mark.parametrize("argv, needles", [
    (["estimate", "--model", "llama9", "--batch-size", "1", "--seq-len", "8"],
     ["unknown model 'llama9'", "llama2-7b"]),
    (["estimate", "--model", "tiny", "--batch-size", "-1", "--seq-len", "8"],
     ["batch_size must be a positive integer, got -1"]),
    (["trace", "--model", "tiny", "--batch-size", "1", "--seq-len", "0"],
     ["seq_len must be a positive integer, got 0"]),
    (["estimate", "--model", "tiny", "--batch-size", "1", "--seq-len", "8", "--precision", "fp8"],
     ["unknown precision 'fp8'", "bf16-mixed"]),
    (["trace", "--model", "tiny", "--batch-size", "1", "--seq-len", "8", "--optimizer", "lion"],
     ["unknown optimizer 'lion'", "adamw"]),
    (["estimate", "--model", "tiny", "--batch-size", "two", "--seq-len", "8"],
     ["--batch-size", "invalid int value: 'two'"]),
])
def test_estimate_and_trace_bad_input(capsys, cli_error, argv, needles):
    cli_error(argv, *needles)


def test_estimate_malformed_config_file(capsys, cli_error, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    cli_error(["estimate", "--model", str(bad), "--batch-size", "1",
                             "--seq-len", "8"], "is not valid JSON")


def test_estimate_and_trace_json_speak_one_vocabulary(capsys):
    """The same names for the same bytes: an estimate (CPU conventions) and a trace, field by field."""
    from memlab.model.step import CATEGORIES, PHASES, STEP_BYTES

    argv = ["--model", "tiny", "--batch-size", "2", "--seq-len", "16", "--json"]
    out = {}
    for cmd, extra in (("estimate", ["--device", "cpu"]), ("trace", [])):
        assert main([cmd, *argv, *extra]) == 0
        out[cmd] = json.loads(capsys.readouterr().out)
    est, tr = out["estimate"], out["trace"]
    assert (est["mode"], tr["mode"]) == ("estimated", "traced")
    assert est["conventions"] == tr["conventions"] == "cpu"
    assert not {"weights_bytes", "optimizer_bytes", "activations_bytes"} & (set(est) | set(tr))
    for key in (*STEP_BYTES, "parameters", "trainable_parameters", "peak_phase"):
        if key == "saved_activations_bytes":  # the trace sees 4 bytes more (a scalar kept)
            assert est[key] == pytest.approx(tr[key], rel=1e-3), key
        else:
            assert est[key] == tr[key], key
    for phase in PHASES:
        assert set(CATEGORIES) <= set(est["phase_breakdown"][phase])
        assert set(CATEGORIES) == set(tr["phase_breakdown"][phase])
    assert main(["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "16"]) == 0
    assert "peak" in capsys.readouterr().out


def test_estimate_names_a_config_json_by_its_own_name_or_its_path(capsys, tmp_path):
    folder = tmp_path / "gpt2-medium"
    folder.mkdir()
    path = folder / "config.json"
    raw = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
           "n_positions": 1024, "vocab_size": 50257}
    path.write_text(json.dumps(raw))
    argv = ["estimate", "--model", str(path), "--batch-size", "1", "--seq-len", "8"]
    assert main(argv) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith(f"estimated train memory: {path} (354,823,168 parameters)"), head
    path.write_text(json.dumps(dict(raw, _name_or_path="gpt2-medium")))
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["model"] == "gpt2-medium"


@pytest.mark.parametrize("model, per_token", [("llama2-7b", 512 * 1024), ("llama2-70b", 320 * 1024)])
def test_estimate_inference_json_gives_the_kv_cache_per_token(capsys, model, per_token):
    assert main(["estimate", "--inference", "--model", model, "--batch-size", "2",
                 "--seq-len", "1024", "--new-tokens", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kv_cache_bytes_per_token"] == per_token  # 16-bit: 2 x layers x kv heads x hs x 2
    assert d["kv_cache_bytes"] == per_token * 2 * 1024
    assert d["peak_bytes"] >= d["parameters_bytes"] + d["kv_cache_bytes"]
    assert main(["estimate", "--inference", "--model", model, "--batch-size", "2",
                 "--seq-len", "1024", "--new-tokens", "16", "--kv-precision", "fp32",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_cache_bytes_per_token"] == 2 * per_token


def test_estimate_inference_is_held_to_the_trace(capsys):
    from memlab.memory.inference import trace_inference

    assert main(["estimate", "--inference", "--model", "tiny", "--batch-size", "2",
                 "--seq-len", "48", "--new-tokens", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    traced = trace_inference("tiny", batch_size=2, prompt_len=40, new_tokens=8, dtype="bf16")
    assert d["kv_cache_bytes"] == traced.kv_cache_bytes
    assert d["parameters_bytes"] == traced.parameters_bytes
    assert abs(d["peak_bytes"] / traced.peak_bytes - 1) < 0.03


@pytest.mark.parametrize("extra, match", [
    (["--optimizer", "sgd"], "--optimizer is for a training step"),
    (["--checkpointing"], "--checkpointing is for a training step"),
    (["--new-tokens", "64"], "must be below --seq-len"),
    (["--kv-precision", "int3"], "kv_precision"),
])
def test_estimate_inference_bad_input_is_one_line(capsys, cli_error, extra, match):
    cli_error(["estimate", "--inference", "--model", "tiny", "--batch-size", "1",
               "--seq-len", "64", *extra], match)


def test_inference_options_need_inference(capsys, cli_error):
    cli_error(["estimate", "--model", "tiny", "--batch-size", "1", "--seq-len", "64",
               "--new-tokens", "4"], "need --inference")


@pytest.mark.parametrize("argv", [
    ["estimate", "--model", "llama2-7b", "--batch-size", "1", "--seq-len", "2048"],
    ["list"],
    ["bits", "3.14159"],
])
def test_a_closed_pipe_ends_quietly(argv):
    """``memlab … | head``: the reader has gone before memlab writes; no traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "memlab", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    _, err = proc.communicate(timeout=120)
    assert err.decode() == "" and proc.returncode == 0


def test_a_plain_estimate_does_not_touch_fine_tuning():
    """`memlab estimate` for a plain step runs the plain estimator; fine-tuning loads for a set-up only."""
    code = ("import sys; from memlab.cli import main; "
            "main(['estimate', '--model', 'tiny', '--batch-size', '1', '--seq-len', '8', '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith('memlab.finetune')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
