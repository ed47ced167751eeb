"""The estimator's activation offloading, held to traced steps (memlab.model.offload, chapter 8)."""

from __future__ import annotations

import pytest

from memlab.finetune import LoraConfig, Setup
from memlab.finetune.estimate import estimate_finetune
from memlab.measure.step import measure_step, trace_step
from memlab.memory.activations import offloaded_activation_bytes
from memlab.model.config import ModelConfig
from memlab.model.step import StepSpec

PHASES = ("forward", "backward", "optimizer")


@pytest.mark.parametrize("seed", range(10))
def test_offload_estimate_is_within_3_percent_of_the_trace(seed, random_step, held_to_trace):
    cfg, step = random_step(1000 + seed, checkpointing=[False, True, True],
                            loss_chunks=[1, 1, 4], offload_activations=[True])
    held_to_trace(cfg, step)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_checkpointed_offload_moves_exactly_the_units_inputs(precision):
    """L x B x T x C elements of the residual stream's dtype leave the device, measured."""
    cfg = ModelConfig(name="offload", n_layer=3, n_head=4, d_model=64, vocab_size=1000,
                      max_seq_len=128)
    step = dict(batch_size=2, seq_len=96, precision=precision, checkpointing=True)
    kept = measure_step(cfg, **step)
    moved = measure_step(cfg, offload_activations=True, **step)
    resid = 2 if precision == "bf16" else 4
    inputs = cfg.n_layer * 2 * 96 * cfg.d_model * resid
    assert moved.offloaded["host_bytes"] == inputs
    assert moved.offloaded["to_device_bytes"] == inputs  # each copied back once
    assert kept.saved_activations_bytes - moved.saved_activations_bytes == inputs
    assert offloaded_activation_bytes(cfg, precision=precision, checkpointing=True,
                                      **{k: step[k] for k in ("batch_size", "seq_len")}) == inputs


def test_offload_without_checkpointing_moves_the_blocks_saved_tensors():
    cfg = ModelConfig(name="offload", n_layer=2, n_head=4, d_model=64, vocab_size=1000,
                      max_seq_len=128)
    step = dict(batch_size=2, seq_len=64, precision="bf16-mixed")
    kept = trace_step(cfg, **step)
    moved = trace_step(cfg, offload_activations=True, **step)
    freed = kept.saved_activations_bytes - moved.saved_activations_bytes
    # the host also keeps copies of a few tensors the step holds anyway (the rotary tables)
    assert freed <= moved.offloaded["host_bytes"] <= 1.05 * freed
    assert moved.phase_peak_bytes["backward"] < kept.phase_peak_bytes["backward"]


def test_cli_refuses_offload_where_it_is_not_modelled(cli_error):
    base = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "64",
            "--offload-activations"]
    cli_error([*base, "--inference"], "--offload-activations is for a training step")
    cli_error([*base, "--zero-stage", "2", "--gpus", "4"],
              "offload_activations at ZeRO stage 2 is modelled with full checkpointing only")
    cli_error([*base, "--lora-rank", "4"], "memlab trace", "or add checkpointing")


@pytest.mark.parametrize("setup", [Setup("LoRA q,v", lora=LoraConfig(r=8)),
                                   Setup("LoRA all", lora=LoraConfig(r=4, target_modules="all-linear")),
                                   Setup("last 2", train_last=2)], ids=lambda s: s.name)
@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_fine_tuning_offload_estimate_is_held_to_the_trace(setup, precision):
    spec = StepSpec("tiny", batch_size=2, seq_len=48, precision=precision, prepare=setup,
                    checkpointing=True, offload_activations=True)
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    for phase in PHASES:
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03), phase
    assert est.setup["offloaded_bytes"] == traced.offloaded["host_bytes"]


def test_a_8b_lora_step_with_offload_matches_its_trace():
    spec = StepSpec("llama3.1-8b", batch_size=1, seq_len=4096, precision="bf16",
                    prepare=Setup("LoRA all", lora=LoraConfig(r=16, target_modules="all-linear")),
                    checkpointing=True, offload_activations=True, loss_chunks=1)
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    for phase in PHASES:
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03), phase
