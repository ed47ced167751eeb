"""memlab trace counts fine-tuning set-ups; bad options get one line each."""

from __future__ import annotations

import json

import pytest

from memlab.cli import main
from memlab.finetune import LoraConfig, trainable_parameters

BASE = ["trace", "--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--json"]


@pytest.mark.parametrize("extra, lora, train_last", [
    (["--lora-rank", "8"], LoraConfig(r=8), None),
    (["--lora-rank", "4", "--lora-targets", "all-linear"],
     LoraConfig(r=4, target_modules="all-linear"), None),
    (["--lora-rank", "4", "--lora-targets", "q_proj,k_proj"],
     LoraConfig(r=4, target_modules=("q_proj", "k_proj")), None),
    (["--freeze", "1"], None, 1),
    ([], None, None),
])
def test_trace_reports_trainable_parameters_and_their_gradients(capsys, extra, lora, train_last):
    assert main(BASE + extra) == 0
    out = json.loads(capsys.readouterr().out)
    n = trainable_parameters("tiny", lora=lora, train_last=train_last)
    assert out["trainable_parameters"] == n
    assert out["gradients_bytes"] == 4 * n  # fp32: every trainable parameter's gradient, only


@pytest.mark.parametrize("extra, message", [
    (["--lora-rank", "0"], "LoRA rank r must be a positive integer, got 0"),
    (["--lora-rank", "4", "--lora-targets", "qkv"], "unknown LoRA target module 'qkv'"),
    (["--lora-alpha", "8"], "--lora-alpha needs --lora-rank"),
    (["--lora-rank", "4", "--freeze", "1"], "not both"),
    (["--freeze", "3"], "exceeds the model's 2 blocks"),
    (["--freeze", "0"], "--freeze needs a positive number"),
    (["--lora-rank", "4", "--lora-targets", " "], "--lora-targets needs module names"),
    (["--lora-rank", "4", "--quantize-base", "gptq-4"], "unknown base quantization 'gptq-4'"),
    (["--lora-rank", "4", "--quantize-base", "nf4"], "tensor subclasses that fake"),
])
def test_bad_fine_tuning_options_are_one_line(capsys, extra, message):
    assert main(BASE + extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("extra", [["--lora-rank", "8"], ["--freeze", "1"],
                                   ["--lora-rank", "4", "--quantize-base", "nf4-dq"]])
def test_estimate_takes_the_same_fine_tuning_options(capsys, extra):
    args = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--json"]
    assert main(args + extra) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trainable_parameters"] == out["setup"]["trainable_parameters"] > 0
    assert out["gradients_bytes"] == 4 * out["trainable_parameters"]


@pytest.mark.parametrize("extra, message", [
    (["--lora-rank", "0"], "LoRA rank r must be a positive integer, got 0"),
    (["--lora-rank", "4", "--lora-targets", "qkv"], "unknown LoRA target module 'qkv'"),
    (["--lora-rank", "4", "--quantize-base", "int4"], "unknown base quantization 'int4'"),
    (["--quantize-base", "nf4"], "--quantize-base needs --lora-rank"),
    (["--freeze", "5"], "exceeds the model's 2 blocks"),
])
def test_estimate_refuses_bad_fine_tuning_options_in_one_line(capsys, extra, message):
    args = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "32"]
    assert main(args + extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
