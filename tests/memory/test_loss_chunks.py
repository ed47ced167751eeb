"""The estimator's chunked head and loss, held to traced steps (memlab.model.loss, chapter 8)."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.measure.step import trace_step
from memlab.memory.estimator import estimate
from memlab.model.config import ModelConfig

PHASES = ("forward", "backward", "optimizer")


@pytest.mark.parametrize("seed", range(10))
def test_chunked_loss_estimate_is_within_3_percent_of_the_trace(seed, random_step, held_to_trace):
    cfg, step = random_step(seed, checkpointing=[False, True],
                            loss_chunks=lambda n, rng: rng.randrange(2, min(n, 16) + 1))
    held_to_trace(cfg, step)


def test_chunks_save_the_log_softmax_and_lower_the_forward_and_backward():
    cfg = ModelConfig(name="wide-vocab", vocab_size=8000, n_layer=2, n_head=4, d_model=64,
                      max_seq_len=256)
    step = dict(batch_size=2, seq_len=256, precision="bf16-mixed", checkpointing=True)
    whole = trace_step(cfg, **step)
    chunked = trace_step(cfg, loss_chunks=8, **step)
    BT, V, C = 2 * 256, cfg.vocab_size, cfg.d_model
    # log-softmax (B*T, V) fp32, the head's 16-bit weight and input copies and the loss out;
    # the norm's fp32 output and a log-sum-exp per token in
    dropped = BT * V * 4 + V * C * 2 + BT * C * 2 + 4 - BT * C * 4 - BT * 4
    assert whole.saved_activations_bytes - chunked.saved_activations_bytes == dropped
    for phase in ("forward", "backward"):
        assert chunked.phase_peak_bytes[phase] < whole.phase_peak_bytes[phase]
    assert chunked.setup["loss_chunks"] == 8 and "loss_chunks" not in whole.setup


def test_bad_chunk_counts_are_refused_in_one_line():
    for bad in (0, 2 * 64 + 1, 1.5, None):
        with pytest.raises(MemlabError, match=r"loss_chunks must be a whole number from 1 to 128"):
            estimate("tiny", batch_size=2, seq_len=64, loss_chunks=bad)


def test_the_command_line_estimates_and_traces_a_chunked_loss(capsys, cli_error):
    import json

    from memlab.cli import main

    step = ["--model", "tiny", "--batch-size", "2", "--seq-len", "64", "--precision",
            "bf16-mixed", "--loss-chunks", "4", "--json"]
    assert main(["estimate", *step]) == 0
    printed = json.loads(capsys.readouterr().out)
    est = estimate("tiny", batch_size=2, seq_len=64, precision="bf16-mixed", loss_chunks=4)
    assert printed["peak_bytes"] == est.peak_bytes and printed["setup"]["loss_chunks"] == 4
    assert main(["trace", *step]) == 0
    assert json.loads(capsys.readouterr().out)["peak_bytes"] == trace_step(
        "tiny", batch_size=2, seq_len=64, precision="bf16-mixed", loss_chunks=4).peak_bytes
    base = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "64"]
    cli_error([*base, "--loss-chunks", "0"], "loss_chunks must be a whole number from 1 to 128",
              "got 0")
    cli_error([*base, "--loss-chunks", "129"], "from 1 to 128", "got 129")
    cli_error([*base, "--loss-chunks", "2", "--inference"], "--loss-chunks is for a training step")
    for stage in ("1", "3"):  # the sharded estimate takes it (tests/distributed)
        assert main([*base, "--loss-chunks", "2", "--zero-stage", stage, "--gpus", "4"]) == 0
    cli_error([*base, "--loss-chunks", "200", "--lora-rank", "4"], "from 1 to 128", "got 200")


def test_the_command_line_estimates_a_chunked_loss_with_lora(capsys):
    import json

    from memlab.cli import main
    from memlab.finetune import LoraConfig
    from memlab.finetune.estimate import estimate_finetune

    step = ["--model", "tiny", "--batch-size", "2", "--seq-len", "64", "--precision",
            "bf16-mixed", "--loss-chunks", "8", "--lora-rank", "16", "--json"]
    assert main(["estimate", *step]) == 0
    printed = json.loads(capsys.readouterr().out)
    est = estimate_finetune("tiny", batch_size=2, seq_len=64, precision="bf16-mixed",
                            loss_chunks=8, lora=LoraConfig(r=16, alpha=32))
    assert printed["peak_bytes"] == est.peak_bytes and printed["setup"]["loss_chunks"] == 8
