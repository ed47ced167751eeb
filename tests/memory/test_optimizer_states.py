"""The estimator's AdamW with bf16 moments and Adafactor, held to traced and measured steps (chapter 8)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from memlab.errors import MemlabError
from memlab.measure.step import measure_step, trace_step
from memlab.memory.estimator import estimate, param_shapes, state_bytes, step_scratch_bytes
from memlab.model.config import get_config, param_groups
from memlab.model.transformer import build_model

PHASES = ("forward", "backward", "optimizer")
CHEAPER = ("adamw-bf16-moments", "adafactor")
SMALL = {"tiny": get_config("tiny"), "tiny-gpt2": get_config("tiny-gpt2"),
         "tiny-qkv-bias": replace(get_config("tiny"), name="tiny-qkv-bias", qkv_bias=True)}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_param_shapes_are_the_models_in_its_order(name):
    cfg = SMALL[name]
    listed = [shape for shape, k in param_shapes(cfg) for _ in range(k)]
    # param_shapes lists a block's tensors once with n_layer; the model repeats the block
    block = [s for s, k in param_shapes(cfg) if k == cfg.n_layer]
    n_embed = next(i for i, (_, k) in enumerate(param_shapes(cfg)) if k == cfg.n_layer)
    head = [s for s, k in param_shapes(cfg)[n_embed + len(block):]]
    in_order = listed[:n_embed] + block * cfg.n_layer + head
    assert in_order == [tuple(p.shape) for p in build_model(cfg).parameters()]
    embed, blk, hd = param_groups(cfg)
    assert sum(math.prod(s) for s in listed) == sum(embed) + cfg.n_layer * sum(blk) + sum(hd)


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("optimizer", CHEAPER)
@pytest.mark.parametrize("impl", ["foreach", "for-loop"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
def test_states_and_the_optimizer_step_are_the_traced_bytes_exactly(name, optimizer, impl,
                                                                     precision):
    step = dict(batch_size=2, seq_len=16, precision=precision, optimizer=optimizer,
                optimizer_impl=impl)
    traced = trace_step(SMALL[name], **step)
    est = estimate(SMALL[name], device="cpu", **step)
    assert est.optimizer_states_bytes == traced.optimizer_states_bytes
    got, want = est.phase_breakdown["optimizer"], traced.phase_breakdown["optimizer"]
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("model, T, precision, checkpointing, optimizer, impl", [
    ("llama3.1-8b", 2048, "bf16", False, "adafactor", "foreach"),
    ("llama3.1-8b", 4096, "fp32", True, "adafactor", "for-loop"),
    ("qwen2.5-7b", 8192, "bf16-mixed", True, "adamw-bf16-moments", "foreach"),
    ("qwen2.5-7b", 2048, "bf16", False, "adamw-bf16-moments", "for-loop"),
])
def test_a_7_8b_step_is_within_3_percent_of_the_trace_in_every_phase(model, T, precision,
                                                                      checkpointing, optimizer,
                                                                      impl):
    step = dict(batch_size=1, seq_len=T, precision=precision, checkpointing=checkpointing,
                optimizer=optimizer, optimizer_impl=impl)
    traced = trace_step(model, **step)
    est = estimate(model, device="cpu", **step)
    for phase in PHASES:
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03), phase
    assert est.optimizer_states_bytes == traced.optimizer_states_bytes


@pytest.mark.parametrize("optimizer", CHEAPER)
def test_a_real_step_holds_the_estimated_states(optimizer):
    step = dict(batch_size=2, seq_len=16, precision="fp32", optimizer=optimizer)
    measured = measure_step("tiny", device="cpu", **step)
    assert measured.optimizer_states_bytes == estimate("tiny", device="cpu",
                                                       **step).optimizer_states_bytes


def test_adafactor_states_are_sublinear_and_bf16_moments_half_of_adamw():
    cfg = get_config("llama3.1-8b")
    n = cfg.num_parameters()
    cuda = {o: estimate(cfg, batch_size=1, seq_len=2048, precision="fp32",
                        optimizer=o).optimizer_states_bytes for o in ("adamw", *CHEAPER)}
    assert cuda["adamw"] == 8 * n and cuda["adamw-bf16-moments"] == 4 * n
    assert cuda["adafactor"] < 0.01 * 4 * n  # rows + columns, not rows x columns


def test_adafactor_needs_shapes_in_one_line():
    for f in (state_bytes, step_scratch_bytes):
        with pytest.raises(MemlabError, match="give the tensors as \\(shape, how many\\)"):
            f([(4096, 2)], 4, "adafactor", "foreach")
    # element counts still serve the other optimizers, as memlab.finetune passes them
    assert state_bytes([(10, 2)], 4, "adamw-bf16-moments") == 80
    assert state_bytes([((2, 5), 2)], 4, "adamw-bf16-moments") == 80


@pytest.mark.parametrize("optimizer", CHEAPER)
def test_the_allocator_request_list_refuses_them_in_one_line(optimizer):
    from memlab.measure.allocator import model_state_requests

    with pytest.raises(MemlabError, match=f"supports optimizers adamw, adam, sgd, sgd-momentum; "
                                          f"got '{optimizer}'"):
        model_state_requests("tiny", batch_size=1, seq_len=8, optimizer=optimizer)


@pytest.mark.parametrize("optimizer", CHEAPER)
def test_the_command_line_estimates_and_traces_them(optimizer, capsys, cli_error):
    import json

    from memlab.cli import main

    step = ["--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--optimizer", optimizer,
            "--optimizer-impl", "for-loop", "--json"]
    for command, fn in (("estimate", estimate), ("trace", trace_step)):
        assert main([command, *step]) == 0
        printed = json.loads(capsys.readouterr().out)
        want = fn("tiny", batch_size=2, seq_len=32, optimizer=optimizer, optimizer_impl="for-loop")
        assert printed["optimizer_states_bytes"] == want.optimizer_states_bytes
        assert printed["setup"]["optimizer"] == optimizer
    base = ["estimate", "--model", "tiny", "--batch-size", "2", "--seq-len", "32"]
    cli_error([*base, "--optimizer", optimizer, "--optimizer-impl", "fused"],
              f"optimizer '{optimizer}' has no fused kernel", "foreach, for-loop")
    cli_error([*base, "--optimizer", "lion"], "unknown optimizer 'lion'", optimizer)
