"""The memory planner: its set-ups fit, its choices are held to traces, bad input is one line."""

import json
import subprocess
import sys

import pytest

from memlab.compute.plan import LORA_RANK, micro_batch_words, plan_training, step_cost
from memlab.distributed.estimate import estimate_sharded
from memlab.errors import MemlabError
from memlab.finetune import LoraConfig
from memlab.finetune.compare import Setup
from memlab.gpus import GPU, get_gpu
from memlab.measure.step import trace_step
from memlab.model.config import get_config
from memlab.units import UNITS

# A made-up 3 GiB GPU (2 GiB usable): GPT-2's 124M parameters need ZeRO or adapters on it.
SMALL_GPU = GPU("test-3GiB", 3 * UNITS["GiB"], "3 GiB", "GiB", "HBM3", bf16_tensor_cores=True,
                flash_attention_2=True, source="https://example.org/made-up",
                peak_tera_ops=(("bf16", 100.0),))


@pytest.fixture(scope="module")
def small_plan():
    return plan_training("gpt2", SMALL_GPU, global_batch=16, seq_len=512, gpu_counts=(1, 2, 4),
                         trains=("full", "lora"), device="cpu")


def test_every_row_fits_and_the_rows_are_cheapest_first(small_plan):
    rows = small_plan.rows
    assert rows and all(r.per_gpu_peak_bytes <= SMALL_GPU.usable_bytes for r in rows)
    costs = [r.gpu_seconds for r in rows]
    assert costs == sorted(costs)
    for r in rows:
        assert r.data_parallel * r.micro_batch * r.grad_accum == 16
        assert r.step_s == pytest.approx(r.compute_s + r.comm_s + r.offload_s + r.cpu_step_s
                                         + r.dequant_s)
    # Plain data parallelism on one GPU does not fit: the planner had to shard or adapt.
    assert not any(r.trains == "full" and r.zero_stage == 0 for r in rows)
    assert {r.trains for r in rows} == {"full", "lora"}


def test_the_chosen_micro_batch_is_the_largest_that_fits(small_plan):
    for r in small_plan.rows:
        if r.trains != "full" or r.offload != "none" or r.micro_batch * r.gpus == 16:
            continue
        bigger = estimate_sharded("gpt2", zero_stage=r.zero_stage, gpus=r.gpus,
                                  batch_size=2 * r.micro_batch, seq_len=512,
                                  precision=r.precision, checkpointing=r.checkpointing,
                                  device="cpu")
        assert bigger.per_gpu_peak_bytes > SMALL_GPU.usable_bytes


def test_the_plans_choices_are_held_to_traces(small_plan):
    """Each sharded choice's per-GPU peak traced with FSDP2 on a fake process group, and the
    adapters' step traced on one GPU: within 3% of the planner's figure, and under the GPU."""
    traced = pytest.importorskip("memlab.distributed.traced")
    checked = 0
    for r in small_plan.rows:
        if r.trains == "full" and r.offload == "none" and r.zero_stage in (2, 3) \
                and not (r.zero_stage == 2 and r.checkpointing):  # see tests/distributed/test_estimate.py
            t = traced.trace_sharded("gpt2", r.gpus, reshard_after_forward=r.zero_stage == 3,
                                     precision=r.precision, batch_size=r.micro_batch,
                                     seq_len=512, checkpointing=r.checkpointing,
                                     loss_chunks=r.loss_chunks, optimizer=r.optimizer)
            peak = t.peak_bytes
        elif r.trains == "lora":
            lora = LoraConfig(r=LORA_RANK, target_modules="all-linear")
            peak = trace_step("gpt2", batch_size=r.micro_batch, seq_len=512,
                              precision=r.precision, checkpointing=r.checkpointing,
                              offload_activations=r.offload == "activations",
                              loss_chunks=r.loss_chunks,
                              prepare=Setup("lora", lora=lora)).peak_bytes
        else:
            continue
        checked += 1
        assert abs(r.per_gpu_peak_bytes / peak - 1) < 0.03, (r.label, r.per_gpu_peak_bytes, peak)
        assert peak <= SMALL_GPU.usable_bytes * 1.03, r.label
    assert checked >= 3


def test_offload_costs_grow_with_accumulation():
    a = plan_training("llama2-7b", "A100-80GB", global_batch=512, seq_len=4096, trains="full")
    offloaded = [r for r in a.rows if r.offload != "none"]
    assert offloaded and all(r.offload_s > 0 for r in offloaded)
    assert all(r.offload_s == 0 for r in a.rows if r.offload == "none")
    # Gradients leave the GPU in every micro-batch: the same set-up with more micro-batches
    # per step moves more.
    from memlab.compute.plan import _host_seconds

    one = _host_seconds(10**9, "optimizer", 2, 1, "mixed", False, 1, 32e9)
    many = _host_seconds(10**9, "optimizer", 2, 1, "mixed", False, 8, 32e9)
    assert many > one > 0


def test_zero3_communicates_every_micro_batch_and_ddp_once_per_step():
    """Per optimizer step, ZeRO-2/3's collectives grow with the accumulation steps; DDP's and
    ZeRO-1's do not (no_sync: one all-reduce per optimizer step)."""
    from memlab.compute.plan import comm_seconds_per_step

    n, gpus = 10**9, 8
    for stage in (0, 1):
        one = comm_seconds_per_step(n, stage, gpus, 1)
        assert one > 0 and comm_seconds_per_step(n, stage, gpus, 16) == one
    for stage, factor in ((2, 2), (3, 3)):
        one = comm_seconds_per_step(n, stage, gpus, 1)
        assert comm_seconds_per_step(n, stage, gpus, 16) == pytest.approx(16 * one)
        assert one == pytest.approx(factor / 2 * comm_seconds_per_step(n, 0, gpus, 1))
    # In the plan: the same ZeRO-3 set-up at a smaller micro-batch (more accumulation) sends more.
    kw = dict(trains="full", zero_stage=3, gpus=2, seq_len=4096)
    few = step_cost("llama2-7b", "A100-80GB", micro_batch=8, grad_accum=2, **kw)
    many = step_cost("llama2-7b", "A100-80GB", micro_batch=1, grad_accum=16, **kw)
    assert many.comm_s == pytest.approx(8 * few.comm_s) and many.compute_s == few.compute_s
    ddp = dict(kw, zero_stage=1)
    assert step_cost("llama2-7b", "A100-80GB", micro_batch=1, grad_accum=16, **ddp).comm_s \
        == step_cost("llama2-7b", "A100-80GB", micro_batch=8, grad_accum=2, **ddp).comm_s


def test_a_4bit_base_costs_its_dequantization():
    """At the same shape, QLoRA's step costs more than LoRA's: the base is dequantized to 16 bits
    in every forward and backward (and recomputation), bytes over the GPU's bandwidth."""
    from memlab.compute.plan import DEQUANT_PASSES, dequantization_bytes, dequantization_seconds
    from memlab.finetune.counts import block_linear_shapes

    kw = dict(micro_batch=2, grad_accum=8, seq_len=4096)
    lora = step_cost("llama2-7b", "A100-80GB", trains="lora", **kw)
    qlora = step_cost("llama2-7b", "A100-80GB", trains="qlora", **kw)
    assert lora.dequant_s == 0 and qlora.dequant_s > 0
    assert qlora.step_s > lora.step_s
    assert qlora.compute_s == lora.compute_s and qlora.comm_s == lora.comm_s
    cfg = get_config("llama2-7b")
    weights = cfg.n_layer * sum(i * o for i, o, _ in block_linear_shapes(cfg).values())
    moved = dequantization_bytes(cfg)
    assert 2.5 * weights < moved < 2.6 * weights  # ~0.52 bytes read (4.127 bits) + 2 written
    bw = get_gpu("A100-80GB").bandwidth_bytes_per_s
    assert qlora.dequant_s == pytest.approx(8 * DEQUANT_PASSES * moved / bw)
    ckpt = dequantization_seconds(cfg, "A100-80GB", 8, checkpointing=True)
    assert ckpt == pytest.approx(qlora.dequant_s * (DEQUANT_PASSES + 1) / DEQUANT_PASSES)


def test_offloaded_rows_count_the_cpu_optimizer_step():
    kw = dict(trains="full", zero_stage=2, offload="optimizer", micro_batch=2, grad_accum=8,
              seq_len=4096)
    slow = step_cost("llama2-7b", "A100-80GB", cpu_step=5e-9, **kw)
    none = step_cost("llama2-7b", "A100-80GB", cpu_step=0.0, **kw)
    n = get_config("llama2-7b").num_parameters()
    assert slow.cpu_step_s == pytest.approx(5e-9 * n) and none.cpu_step_s == 0
    assert slow.step_s - none.step_s == pytest.approx(5e-9 * n)
    assert step_cost("llama2-7b", "A100-80GB", trains="full", zero_stage=2, micro_batch=2,
                     grad_accum=8, seq_len=4096, cpu_step=5e-9).cpu_step_s == 0


def test_rows_say_sequences_and_accumulation_steps(small_plan):
    for r in small_plan.rows:
        words = micro_batch_words(r.micro_batch, r.grad_accum)
        assert r.label.endswith(words)
        assert f"{r.micro_batch} x {r.grad_accum}" not in r.label
    assert micro_batch_words(2, 256) == "2 sequences × 256 accumulation steps"
    assert micro_batch_words(1, 1) == "1 sequence × 1 accumulation step"
    text = small_plan.reading()
    assert text.startswith("The cheapest set-up is " + small_plan.rows[0].label)


def test_nothing_fits_is_said_with_the_smallest_peak():
    p = plan_training("llama2-70b", "T4", global_batch=8, seq_len=4096, trains="full",
                      gpu_counts=(1,))
    assert p.rows == ()
    assert p.smallest_peak_bytes > get_gpu("T4").usable_bytes
    assert "nothing fits" in p.table() and p.reading().startswith("Nothing fits")
    with pytest.raises(MemlabError, match="no set-up training full fits T4"):
        p.best("full")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memlab", "plan", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_issue_command_lists_set_ups():
    proc = _cli("--model", "llama2-7b", "--gpu", "a100-80gb", "--global-batch", "512",
                "--seq-len", "4096", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["gpu"] == "A100-80GB" and len(plan["rows"]) >= 5
    for key in ("precision", "zero_stage", "gpus", "trains", "checkpointing", "micro_batch",
                "grad_accum", "offload", "per_gpu_peak_bytes", "flops_per_step", "gpu_seconds"):
        assert key in plan["rows"][0]
    text = _cli("--model", "llama2-7b", "--gpu", "a100-80gb", "--global-batch", "512",
                "--seq-len", "4096", "--limit", "3").stdout
    assert "cheap" not in text and text.count("\n") == 5  # the head, the columns, 3 rows


@pytest.mark.parametrize("args, message", [
    (["--gpu", "b300"], "unknown GPU 'b300'; accepted: T4"),
    (["--trains", "dora"], "trains 'dora' is not a set-up; accepted: full, lora, qlora"),
    (["--global-batch", "0"], "global_batch must be a positive integer, got 0"),
    (["--gpus", "3,x"], "--gpus must be comma-separated positive integers, got '3,x'"),
    (["--gpus", "5"], "no GPU count in (5,) divides the global batch 8"),
    (["--mfu", "1.5"], "mfu must be a number in (0, 1], got 1.5"),
    (["--host-link", "usb"], "link 'usb'"),
    (["--seq-len", "100000"], "seq_len 100000 exceeds max_seq_len"),
    (["--limit", "-1"], "--limit must be 0 (all) or a positive number of rows, got -1"),
])
def test_bad_input_is_one_line(args, message):
    base = {"--model": "llama2-7b", "--gpu": "h100", "--global-batch": "8", "--seq-len": "512"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    proc = _cli(*[x for kv in base.items() for x in kv])
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


# Chapter 8's levers in the plan ------------------------------------------------------------------
def test_the_chunked_loss_is_listed_only_where_it_fits_more(small_plan):
    chunked = [r for r in small_plan.rows if r.loss_chunks > 1]
    assert chunked
    for r in chunked:
        twins = [w for w in small_plan.rows if w.loss_chunks == 1 and (
            w.trains, w.optimizer, w.zero_stage, w.offload, w.checkpointing, w.context_parallel)
            == (r.trains, r.optimizer, r.zero_stage, r.offload, r.checkpointing,
                r.context_parallel)]
        assert all((w.gpus, -w.micro_batch) > (r.gpus, -r.micro_batch) for w in twins), r.label


def test_a_ring_row_is_one_ranks_step_held_to_the_rings_trace(small_plan):
    from memlab.longcontext.context_parallel import trace_context_parallel

    ringed = [r for r in small_plan.rows if r.context_parallel > 1]
    assert ringed and all(r.trains == "full" and r.zero_stage in (0, 1) for r in ringed)
    r = ringed[0]
    kw = dict(batch_size=r.micro_batch, seq_len=512, precision=r.precision,
              checkpointing=r.checkpointing)
    assert r.per_gpu_peak_bytes == estimate_sharded(
        "gpt2", zero_stage=r.zero_stage, gpus=r.gpus, context_parallel=r.context_parallel,
        device="cpu", **kw).per_gpu_peak_bytes
    # The same rank with the model states whole (ZeRO-0), estimated and traced over the ring.
    whole = estimate_sharded("gpt2", zero_stage=0, gpus=r.context_parallel, device="cpu",
                             context_parallel=r.context_parallel, **kw).per_gpu_peak_bytes
    traced = trace_context_parallel("gpt2", ranks=r.context_parallel, **kw).peak_bytes
    assert whole == pytest.approx(traced, rel=0.03)
    # The ring's keys and values are part of the communication's seconds.
    plain = step_cost("gpt2", SMALL_GPU, trains="full", zero_stage=r.zero_stage, gpus=r.gpus,
                      micro_batch=r.micro_batch, grad_accum=r.grad_accum, seq_len=512,
                      checkpointing=r.checkpointing)
    assert r.comm_s > plain.comm_s


def test_long_sequences_fit_only_in_rings_or_chunks():
    plan = plan_training("llama3.1-8b", "H100", global_batch=16, seq_len=131072,
                         trains=("full",))
    assert plan.rows and all(r.context_parallel > 1 or r.loss_chunks > 1 for r in plan.rows)
    assert {r.context_parallel > 1 for r in plan.rows} == {True, False}
    assert "Context parallelism's cheapest set-up" in plan.reading()


def test_optimizers_are_tried_when_named_and_offload_keeps_adam():
    plan = plan_training("gpt2", SMALL_GPU, global_batch=16, seq_len=512, gpu_counts=(1, 2, 4),
                         trains=("full",), device="cpu",
                         optimizers=("adamw", "adafactor", "adamw-bf16-moments"))
    used = {r.optimizer for r in plan.rows}
    assert used == {"adamw", "adafactor", "adamw-bf16-moments"}
    assert all(r.offload == "none" for r in plan.rows if r.optimizer != "adamw")
    # Adafactor's states are smaller: on the same set-up its peak is no higher than AdamW's.
    by = {(r.optimizer, r.zero_stage, r.gpus, r.checkpointing, r.loss_chunks,
           r.context_parallel, r.micro_batch): r for r in plan.rows if r.offload == "none"}
    pairs = [(by[k], by[("adamw", *k[1:])]) for k in by
             if k[0] == "adafactor" and ("adamw", *k[1:]) in by]
    assert pairs and all(a.per_gpu_peak_bytes < w.per_gpu_peak_bytes for a, w in pairs)
    assert "with adafactor" in next(r.label for r in plan.rows if r.optimizer == "adafactor")
    with pytest.raises(MemlabError, match="unknown optimizer 'sgd'; accepted: adamw"):
        plan_training("gpt2", SMALL_GPU, global_batch=16, seq_len=512, optimizers=("sgd",))
