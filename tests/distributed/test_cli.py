"""memlab estimate --zero-stage / --gpus / --offload: one GPU of a data-parallel step."""

from __future__ import annotations

import json

import pytest

from memlab.cli import main
from memlab.distributed.estimate import estimate_sharded

BASE = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "32"]


def _json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra, stage, gpus, offload", [
    (["--zero-stage", "3", "--gpus", "8"], 3, 8, "none"),
    (["--gpus", "4"], 0, 4, "none"),  # --gpus alone: DDP
    (["--zero-stage", "2", "--gpus", "4", "--offload", "optimizer"], 2, 4, "optimizer"),
    (["--zero-stage", "3", "--gpus", "2", "--offload", "params", "--precision", "bf16-mixed"],
     3, 2, "params"),
])
def test_json_adds_the_per_gpu_bytes(capsys, extra, stage, gpus, offload):
    out = _json(capsys, BASE + extra)
    plain = _json(capsys, BASE + [a for a in extra if a in ("--precision", "bf16-mixed")])
    for key in plain:  # the one-GPU estimate's keys stay as they were
        assert out[key] == plain[key], key
    precision = "bf16-mixed" if "bf16-mixed" in extra else "fp32"
    est = estimate_sharded("tiny", zero_stage=stage, gpus=gpus, offload=offload,
                           precision=precision, batch_size=2, seq_len=32)
    assert (out["zero_stage"], out["gpus"], out["offload"]) == (stage, gpus, offload)
    assert out["per_gpu_model_state_bytes"] == est.per_gpu_model_state_bytes
    assert out["per_gpu_peak_bytes"] == est.per_gpu_peak_bytes
    assert out["cpu_offloaded_bytes"] == est.cpu_offloaded_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_one_byte_layout_with_and_without_zero_stage(capsys, precision):
    """--precision alone and with --zero-stage 0 --gpus 1 split a parameter's bytes alike."""
    plain = _json(capsys, BASE + ["--precision", precision])
    ddp = _json(capsys, BASE + ["--precision", precision, "--zero-stage", "0", "--gpus", "1"])
    n = plain["trainable_parameters"]
    states = plain["parameters_bytes"] + plain["gradients_bytes"] + n * (8 if precision != "bf16"
                                                                         else 4)
    assert ddp["per_gpu_model_state_bytes"] == states
    assert ddp["per_gpu_peak_bytes"] == plain["peak_bytes"]
    assert ddp["layout"] == ("bf16" if precision == "bf16" else "fp32")


def test_layout_names_the_zero_papers_split(capsys):
    out = _json(capsys, BASE + ["--precision", "bf16-mixed", "--layout", "mixed"])
    assert (out["zero_stage"], out["gpus"], out["layout"]) == (0, 1, "mixed")
    assert out["per_gpu_model_state_bytes"] == 16 * out["trainable_parameters"]
    assert main(BASE + ["--precision", "bf16-mixed", "--layout", "fp32", "--json"]) == 0
    assert "zero_stage" not in json.loads(capsys.readouterr().out)  # the default: the plain one


def test_text_prints_the_table(capsys):
    assert main(BASE + ["--zero-stage", "3", "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "one of 8 GPUs, ZeRO stage 3" in out and "16Ψ/N" in out and "peak" in out


@pytest.mark.parametrize("extra, needles", [
    (["--zero-stage", "4", "--gpus", "8"], ["ZeRO stage must be one of 0, 1, 2, 3, got 4"]),
    (["--gpus", "0"], ["the number of GPUs must be a positive integer, got 0"]),
    (["--gpus", "two"], ["--gpus", "'two'"]),
    (["--zero-stage", "0", "--gpus", "8", "--offload", "optimizer"],
     ["offload 'optimizer' needs ZeRO stage 1, 2 or 3"]),
    (["--gpus", "8", "--offload", "optimizer"], ["offload 'optimizer' needs ZeRO stage 1, 2 or 3"]),
    (["--zero-stage", "1", "--gpus", "8", "--offload", "params"],
     ["offload 'params' needs ZeRO stage 3", "none, optimizer"]),
    (["--zero-stage", "3", "--gpus", "8", "--offload", "bogus"],
     ["unknown offload 'bogus'; accepted: none, optimizer, params"]),
    (["--offload", "optimizer"], ["--offload needs --zero-stage"]),
    (["--layout", "mixed"], ["layout 'mixed' with precision fp32; accepted: fp32"]),
    (["--precision", "bf16-mixed", "--layout", "zero"],
     ["layout 'zero' with precision bf16-mixed; accepted: fp32, mixed"]),
    (["--zero-stage", "3"], ["--zero-stage needs --gpus"]),
    (["--zero-stage", "3", "--gpus", "8", "--lora-rank", "8"], ["--lora-rank", "not modelled"]),
    (["--zero-stage", "3", "--gpus", "8", "--freeze", "1"], ["--freeze", "not modelled"]),
    (["--zero-stage", "3", "--gpus", "8", "--lora-rank", "8", "--quantize-base", "nf4"],
     ["not modelled"]),
    (["--gpus", "8", "--inference"], ["sharded inference is not modelled"]),
    (["--zero-stage", "3", "--gpus", "8", "--optimizer", "sgd"], ["accepted: adamw, adam"]),
])
def test_bad_input_is_one_line(capsys, cli_error, extra, needles):
    cli_error(BASE + extra, *needles)


def test_trace_has_no_sharding_options(capsys, cli_error):
    cli_error(["trace", "--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--gpus", "8"],
              "--gpus")
