"""Checkpointing plans: the model runs them, the estimator and the FLOP formula are held to the trace."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from memlab.compute.flops import counted_flops, step_flops
from memlab.distributed.estimate import estimate_sharded
from memlab.errors import MemlabError
from memlab.finetune import LoraConfig
from memlab.finetune.estimate import estimate_finetune
from memlab.measure.step import measure_step, trace_step
from memlab.memory.estimator import estimate
from memlab.model.checkpoint import Checkpointing, parse_checkpointing, sqrt_segments
from memlab.model.config import get_config
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model, lm_loss

PLANS = (False, True, "selective", "every-2", "segments-2")


@pytest.mark.parametrize("value, name, label", [
    (False, "none", False), (True, "full", True), ("none", "none", False), ("FULL", "full", True),
    ("selective", "selective", "selective"), ("every-3", "every-3", "every-3"),
    ("every-1", "full", True), ("segments-1", "full", True), ("segments-4", "segments-4", "segments-4"),
])
def test_plans_parse_to_one_name(value, name, label):
    plan = parse_checkpointing(value)
    assert plan.name == name and plan.label == label
    assert parse_checkpointing(plan.label) == plan


@pytest.mark.parametrize("value", ["yes", "every-0", "every-x", "segments-", "every", 1, 2.0])
def test_bad_plans_are_refused_in_one_line(value):
    with pytest.raises(MemlabError) as exc:
        parse_checkpointing(value)
    msg = str(exc.value)
    assert "\n" not in msg and "every-K" in msg and "selective" in msg


def test_units_of_each_plan():
    assert Checkpointing("none").units(3) == [(0, 1, False), (1, 2, False), (2, 3, False)]
    assert Checkpointing("full").units(2) == [(0, 1, True), (1, 2, True)]
    assert Checkpointing("every", 2).units(5) == [(i, i + 1, i % 2 == 0) for i in range(5)]
    assert Checkpointing("segments", 2).units(5) == [(0, 2, True), (2, 4, True), (4, 5, True)]
    assert Checkpointing("every", 3).checkpointed_blocks(7) == 3
    assert sqrt_segments(32) == Checkpointing("segments", 6)
    assert sqrt_segments(2) == Checkpointing("full")


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt2"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_every_plan_gives_the_same_gradients(model, attention):
    idx, tgt = torch.randint(0, 200, (2, 2, 24))
    grads = {}
    cfg = replace(get_config(model), attention=attention)
    for plan in PLANS:
        m = build_model(cfg, seed=1, checkpointing=plan)
        lm_loss(m(idx), tgt).backward()
        grads[plan] = torch.cat([p.grad.flatten() for p in m.parameters()])
    for plan in PLANS[1:]:
        torch.testing.assert_close(grads[plan], grads[False], rtol=0, atol=1e-6)


def test_checkpointing_has_no_effect_without_gradients():
    m = build_model("tiny", checkpointing="segments-2")
    idx = torch.randint(0, 200, (1, 16))
    with torch.no_grad():
        out = m(idx)
    assert out.shape == (1, 16, m.cfg.vocab_size)


# The estimator against the trace -------------------------------------------------------------
GRID = [(model, prec, attn, plan) for model, B, T in [("tiny", 2, 64)]
        for prec in ("fp32", "bf16-mixed", "bf16") for attn in ("sdpa", "eager")
        for plan in PLANS]


@pytest.mark.parametrize("model, precision, attention, plan", GRID)
def test_estimate_is_within_3_percent_of_the_trace(model, precision, attention, plan):
    kw = dict(batch_size=2, seq_len=64, precision=precision, attention=attention,
              checkpointing=plan)
    traced = trace_step(model, **kw)
    est = estimate(model, device="cpu", **kw)
    assert abs(est.saved_activations_bytes / traced.saved_activations_bytes - 1) < 0.03
    for phase in ("forward", "backward"):
        assert abs(est.phase_peak_bytes[phase] / traced.phase_peak_bytes[phase] - 1) < 0.03, phase
    assert abs(est.peak_bytes / traced.peak_bytes - 1) < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("plan", ["none", "full", "selective", "every-4", "segments-6"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_llama2_7b_estimate_is_within_3_percent_of_the_trace(plan, attention):
    kw = dict(batch_size=1, seq_len=4096, precision="bf16-mixed", attention=attention,
              checkpointing=plan)
    traced = trace_step("llama2-7b", **kw)
    est = estimate("llama2-7b", device="cpu", **kw)
    assert abs(est.saved_activations_bytes / traced.saved_activations_bytes - 1) < 0.03
    for phase in ("forward", "backward", "optimizer"):
        assert abs(est.phase_peak_bytes[phase] / traced.phase_peak_bytes[phase] - 1) < 0.03


def test_a_real_step_saves_what_the_estimate_says():
    for plan in ("selective", "every-2"):
        kw = dict(batch_size=2, seq_len=64, checkpointing=plan, attention="eager")
        measured = measure_step("tiny", device="cpu", **kw)
        est = estimate("tiny", device="cpu", **kw)
        assert abs(est.saved_activations_bytes / measured.saved_activations_bytes - 1) < 0.03


def test_plans_order_the_saved_bytes():
    saved = {p: estimate("gpt2", batch_size=2, seq_len=256, attention="eager",
                         checkpointing=p).saved_activations_bytes for p in
             ("none", "selective", "every-3", "every-2", "full", "segments-4")}
    assert saved["none"] > saved["selective"] > saved["full"]
    assert saved["none"] > saved["every-3"] > saved["every-2"] > saved["full"]
    assert saved["segments-4"] < saved["full"]  # fewer inputs kept, recomputed 4 at a time
    # With SDPA the kernel keeps no T x T matrix: selective recomputation saves little.
    sdpa = {p: estimate("gpt2", batch_size=2, seq_len=256, checkpointing=p).saved_activations_bytes
            for p in ("none", "selective")}
    assert (sdpa["none"] - sdpa["selective"]) < 0.01 * sdpa["none"]
    assert (saved["none"] - saved["selective"]) > 0.1 * saved["none"]


def test_estimators_that_model_full_checkpointing_only_refuse_the_other_plans():
    with pytest.raises(MemlabError, match="estimate_sharded models checkpointing none, full; got 'every-2'"):
        estimate_sharded("tiny", zero_stage=3, gpus=2, batch_size=1, seq_len=16,
                         checkpointing="every-2")
    with pytest.raises(MemlabError, match="got 'selective'"):
        estimate_finetune("tiny", lora=LoraConfig(r=4), batch_size=1, seq_len=16,
                          checkpointing="selective")
    # Full fine-tuning is the one-GPU estimate: every plan.
    assert estimate_finetune("tiny", batch_size=1, seq_len=16, checkpointing="every-2").peak_bytes



# FLOPs -------------------------------------------------------------------------------------------
FLOP_GRID = ([(m, a, p, True, 1) for m in ("tiny", "tiny-gpt2") for a in ("sdpa", "eager")
              for p in PLANS]
             + [("tiny", a, p, False, 1) for a in ("sdpa", "eager") for p in PLANS[1:]]
             + [("tiny-gpt2", "eager", "every-2", False, 2), ("tiny", "sdpa", "selective", True, 3)])


@pytest.mark.parametrize("model, attention, plan, early_stop, accum", FLOP_GRID)
def test_step_flops_is_the_counters_count(model, attention, plan, early_stop, accum):
    spec = StepSpec(model, batch_size=2, seq_len=16, attention=attention, checkpointing=plan,
                    grad_accum_steps=accum)
    f, c = step_flops(spec, early_stop=early_stop), counted_flops(spec, early_stop=early_stop)
    assert (f.forward, f.backward, 0) == (c["forward"], c["backward"], c["optimizer"])


@pytest.mark.parametrize("model, chunks, plan", [("tiny", 4, "none"), ("tiny-gpt2", 3, "full"),
                                                 ("tiny", 5, "selective")])
def test_the_chunked_loss_counts_the_heads_forward_again(model, chunks, plan):
    spec = StepSpec(model, batch_size=2, seq_len=16, checkpointing=plan, loss_chunks=chunks)
    f, c = step_flops(spec), counted_flops(spec)
    assert (f.forward, f.backward) == (c["forward"], c["backward"])
    whole = step_flops(StepSpec(model, batch_size=2, seq_len=16, checkpointing=plan))
    assert f.recompute - whole.recompute == 2 * 2 * 16 * get_config(model).d_model \
        * get_config(model).vocab_size


def test_early_stop_skips_the_last_linear_of_each_unit():
    spec = StepSpec("gpt2", batch_size=1, seq_len=64, checkpointing=True)
    none = step_flops(StepSpec("gpt2", batch_size=1, seq_len=64))
    stop, whole = step_flops(spec), step_flops(spec, early_stop=False)
    cfg = spec.config
    head = 2 * 64 * cfg.d_model * cfg.vocab_size
    assert whole.recompute == none.forward - head  # every block's forward again
    assert whole.recompute - stop.recompute == cfg.n_layer * 2 * 64 * cfg.ffn_dim * cfg.d_model
    assert stop.recompute_share < whole.recompute_share < 1 / 3 + 1e-9


def test_flash_attention_is_left_to_the_counter():
    with pytest.raises(MemlabError, match="counts attention sdpa, eager; got 'flash'"):
        step_flops("tiny", batch_size=1, seq_len=16, attention="flash")
    assert counted_flops("tiny", batch_size=1, seq_len=16, attention="flash")["total"] > 0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memlab", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_trace_and_estimate_report_the_same_flops_and_plan():
    args = ["--model", "tiny", "--batch-size", "2", "--seq-len", "32", "--json",
            "--checkpointing", "every-2"]
    trace = json.loads(_cli("trace", *args).stdout)
    est = json.loads(_cli("estimate", *args, "--device", "cpu").stdout)
    assert trace["flops"] == est["flops"] > 0
    assert trace["flops_by_phase"] == est["flops_by_phase"]
    assert trace["setup"]["checkpointing"] == est["setup"]["checkpointing"] == "every-2"
    alone = json.loads(_cli("trace", *args[:-1]).stdout)  # --checkpointing alone: full
    assert alone["setup"]["checkpointing"] is True


@pytest.mark.parametrize("args, message", [
    (["--checkpointing", "every-0"], "checkpointing 'every-0' is not a plan"),
    (["--checkpointing", "selective", "--inference"], "--checkpointing is for a training step"),
    (["--checkpointing", "every-2", "--zero-stage", "3", "--gpus", "2"],
     "estimate_sharded models checkpointing none, full"),
])
def test_cli_refuses_bad_plans_in_one_line(args, message):
    proc = _cli("estimate", "--model", "tiny", "--batch-size", "1", "--seq-len", "16", *args)
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_saved_bytes_per_btc_against_korthikanti():
    """The estimator's bytes per B T C: GPT-2 in 16 bits with SDPA is Korthikanti et al.'s 34
    less their two dropout masks (one byte per element each), which the book's GPT-2 has not;
    Llama-2-7B's does not depend on the length with SDPA."""
    from memlab.compute.checkpointing import KORTHIKANTI_BYTES_PER_BTC, saved_bytes_per_btc

    gpt2 = saved_bytes_per_btc("gpt2", precision="bf16", attention="sdpa")
    assert abs(gpt2 - (KORTHIKANTI_BYTES_PER_BTC - 2)) < 0.2
    llama = saved_bytes_per_btc("llama2-7b", attention="sdpa")
    assert llama == pytest.approx(saved_bytes_per_btc("llama2-7b", attention="sdpa",
                                                      seq_len=2048), rel=1e-3)
    assert 50 < llama < 60  # bf16 autocast: fp32 residual stream and norms, SwiGLU's wide MLP


def test_quoted_figures_carry_their_sources():
    from memlab.compute.checkpointing import KORTHIKANTI_SOURCE
    from memlab.compute.flops import QUOTED_MFU

    assert KORTHIKANTI_SOURCE.startswith("https://arxiv.org/")
    for q in QUOTED_MFU:
        assert 0 < q.mfu < 1 and q.source.startswith("https://") and "quoted" in q.label
