"""Offload (chapter 7): host-link bytes, transfer and compute seconds, the offloaded AdamW."""

from __future__ import annotations

import pytest
import torch

from memlab.compute.cpu_step import measure_cpu_step_rate
from memlab.compute.flops import rule_flops
from memlab.compute.offload import (
    DEFAULT_STAGES,
    HOST_LINKS,
    OffloadedAdamW,
    adamw_init,
    adamw_update,
    compute_seconds,
    host_link_bytes,
    measure_offload,
    offload_table,
    offload_verdict,
    paged_optimizer_status,
    recorded_cpu_step_rate,
    transfer_seconds,
)
from memlab.distributed.estimate import estimate_sharded
from memlab.errors import MemlabError
from memlab.gpus import get_gpu
from memlab.model.config import ModelConfig, get_config
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, lm_loss

SMALL = ModelConfig(name="offload-test", vocab_size=96, n_layer=2, n_head=2, d_model=32, d_ff=64,
                    max_seq_len=32)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


# Bytes over the host link --------------------------------------------------------------------
def test_host_link_bytes_exact_for_a_small_config():
    n = get_config("tiny").num_parameters()
    assert n == 158_016
    # Optimizer offload, one GPU, mixed precision: 2 bytes of gradient down, 2 of parameter up.
    t = host_link_bytes(n, offload="optimizer", zero_stage=2, gpus=1, layout="mixed")
    assert (t.device_to_host_bytes, t.host_to_device_bytes) == (2 * n, 2 * n)
    assert t.total_bytes == 4 * n
    # fp32 layout: 4 and 4.
    t = host_link_bytes(n, offload="optimizer", zero_stage=1, layout="fp32")
    assert (t.device_to_host_bytes, t.host_to_device_bytes) == (4 * n, 4 * n)
    # Parameter offload on 3 GPUs: each fetches its partition twice, sends its gradient shard once;
    # partitions rounded up (158016 * 2 / 3 = 105344 exactly, so round a 7-parameter case too).
    t = host_link_bytes(n, offload="params", zero_stage=3, gpus=3, layout="mixed")
    assert (t.host_to_device_bytes, t.device_to_host_bytes) == (2 * 105_344, 105_344)
    assert t.parameter_fetches == 2
    t = host_link_bytes(7, offload="params", zero_stage=3, gpus=2, layout="mixed",
                        checkpointing=True)
    assert (t.host_to_device_bytes, t.device_to_host_bytes, t.parameter_fetches) == (21, 7, 3)
    assert host_link_bytes(n, offload="none", zero_stage=0).total_bytes == 0


def test_offloaded_adamw_moves_what_the_formula_counts():
    """The teaching optimizer's counted bytes per step equal host_link_bytes' optimizer row."""
    for dtype, layout in ((torch.float32, "fp32"), (torch.bfloat16, "mixed")):
        net = build_model(SMALL, seed=0, dtype=dtype)
        n = sum(p.numel() for p in net.parameters())
        opt = OffloadedAdamW(net.parameters(), lr=1e-3)
        idx = torch.randint(0, SMALL.vocab_size, (2, 2, 8), generator=torch.Generator().manual_seed(0))
        lm_loss(net(idx[0]), idx[1]).backward()
        moved = opt.step()
        want = host_link_bytes(n, offload="optimizer", zero_stage=2, layout=layout)
        assert moved == want
        assert opt.host_state_bytes == 12 * n  # fp32 master + two fp32 moments, on the host


# Seconds and the verdict --------------------------------------------------------------------
def test_transfer_seconds_is_bytes_over_one_way_bandwidth():
    for name, link in HOST_LINKS.items():
        assert link.source.startswith("https://") and link.quoted
        assert transfer_seconds(10**9, name) == 10**9 / link.bytes_per_s
    assert HOST_LINKS["pcie4-x16"].bytes_per_s < HOST_LINKS["pcie5-x16"].bytes_per_s \
        < HOST_LINKS["nvlink-c2c"].bytes_per_s


def test_compute_seconds_formula():
    peak = get_gpu("H100").peak_ops("bf16")
    assert rule_flops(1000, 10) == 60_000 and rule_flops(1000, 10, recompute=True) == 80_000
    assert compute_seconds(10**9, 4096, gpu="H100", mfu=0.5) == 6 * 10**9 * 4096 / (peak * 0.5)


def test_table_rows_use_the_sharded_estimate_and_the_traffic():
    t = offload_table("tiny", batch_size=2, seq_len=32, link="pcie4-x16", cpu_step=0.0)
    assert [r.offload for r in t.rows] == list(DEFAULT_STAGES)
    n = t.parameters
    for r in t.rows:
        est = estimate_sharded("tiny", zero_stage=r.zero_stage, gpus=1, offload=r.offload,
                               batch_size=2, seq_len=32, precision="bf16-mixed")
        assert r.per_gpu_peak_bytes == est.per_gpu_peak_bytes
        assert r.gpu_bytes_saved == t.rows[0].per_gpu_peak_bytes - r.per_gpu_peak_bytes
        assert r.transfer_s == r.link_bytes / HOST_LINKS["pcie4-x16"].bytes_per_s
        assert r.compute_s == compute_seconds(n, 64, gpu="H100", mfu=0.4)
    # PyTorch's layout for bf16-mixed: fp32 gradients out, fp32 parameters back
    assert t.row("optimizer").link_bytes == (4 + 4) * n
    assert t.row("params").link_bytes == 12 * n  # 2 fetches of 4 bytes + 4 bytes of gradient
    assert t.row("optimizer").gpu_bytes_saved > 0 and t.row("params").gpu_bytes_saved > 0
    assert "estimated" in t.table()


def test_nearly_free_or_dominates_depends_on_the_inputs():
    # The link alone (a CPU step taking no time): a small batch on PCIe 4, the transfers take
    # longer than the compute.
    small = offload_table("llama2-7b", batch_size=1, seq_len=128, link="pcie4-x16", cpu_step=0.0)
    assert small.row("optimizer").verdict == "dominates"
    assert small.row("params").transfer_over_compute > 1
    # Many tokens per step: the same bytes hide behind the compute.
    large = offload_table("llama2-7b", batch_size=64, seq_len=4096, link="pcie4-x16",
                          cpu_step=0.0)
    assert large.row("optimizer").verdict == "nearly free"
    assert large.row("optimizer").link_bytes == small.row("optimizer").link_bytes
    # The same step, only the link changes: comparable over PCIe 4, nearly free over NVLink-C2C.
    mid = {link: offload_table("llama-1b", batch_size=16, seq_len=2048, link=link, cpu_step=0.0)
           for link in ("pcie4-x16", "nvlink-c2c")}
    assert mid["pcie4-x16"].row("optimizer").verdict == "comparable"
    assert mid["nvlink-c2c"].row("optimizer").verdict == "nearly free"
    assert small.row("none").verdict == "nothing moved"


def test_the_cpu_optimizer_step_is_counted():
    """The CPU step scales with the parameters, not the tokens, and turns 'nearly free' into
    'dominates' where it is large beside the compute."""
    rate = recorded_cpu_step_rate()
    assert rate is not None and rate.kind == "recorded" and "recorded on" in rate.label
    small = offload_table("tiny", batch_size=32, seq_len=4096 // 32, link="pcie4-x16")
    big = offload_table("llama2-7b", batch_size=64, seq_len=4096, link="pcie4-x16")
    assert big.cpu_step_s_per_parameter == rate.seconds_per_parameter
    for off in ("optimizer", "params"):
        assert big.row(off).cpu_step_s == pytest.approx(rate.seconds_per_parameter
                                                        * big.parameters)
        assert big.row(off).cpu_step_s / small.row(off).cpu_step_s == pytest.approx(
            big.parameters / small.parameters)
        assert big.row(off).added_s == big.row(off).transfer_s + big.row(off).cpu_step_s
    assert big.row("none").cpu_step_s == 0
    link_only = offload_table("llama2-7b", batch_size=64, seq_len=4096, link="pcie4-x16",
                              cpu_step=0.0)
    assert link_only.row("optimizer").verdict == "nearly free"
    assert big.row("optimizer").verdict == "dominates"  # the CPU step, not the link
    assert big.row("optimizer").transfer_s < big.row("optimizer").compute_s \
        < big.row("optimizer").cpu_step_s
    # It does not grow with the tokens: enough tokens per step make it nearly free again.
    tokens = big.tokens_for("optimizer")
    seq = 4096
    enough = offload_table("llama2-7b", batch_size=-(-tokens // seq), seq_len=seq,
                           link="pcie4-x16")
    assert enough.row("optimizer").verdict == "nearly free"
    assert enough.row("optimizer").cpu_step_s == big.row("optimizer").cpu_step_s


def test_the_recorded_rate_gives_back_the_records_step():
    """Applied to the record's own run, the cost model's offload terms equal the seconds the
    offload added there."""
    from memlab.results import recorded

    rec = recorded("distributed-memory", device="cuda")
    runs = {r["strategy"]: r for r in rec.result["runs"]}
    rate = recorded_cpu_step_rate()
    n = rec.result["parameters"]
    moved = host_link_bytes(n, offload="params", zero_stage=3, layout=rec.result["layout"])
    added = moved.total_bytes / HOST_LINKS["pcie5-x16"].bytes_per_s + rate.seconds(n)
    assert added == pytest.approx(runs["offload"]["step_seconds"] - runs["zero3"]["step_seconds"])


def test_a_cpu_step_measured_here():
    r = measure_cpu_step_rate(2**16, tensors=4, repeats=1)
    assert r.kind == "measured" and r.seconds_per_parameter > 0 and r.parameters == 2**16
    assert "measured here" in r.label


def test_offload_verdict_thresholds():
    assert offload_verdict(0.0, 1.0) == "nothing moved"
    assert offload_verdict(0.1, 1.0) == "nearly free"
    assert offload_verdict(0.5, 1.0) == "comparable"
    assert offload_verdict(0.5, 1.0, free_below=0.5) == "nearly free"
    assert offload_verdict(1.5, 1.0) == "dominates"


# The offloaded AdamW -------------------------------------------------------------------------
def test_offloaded_adamw_matches_torch_adamw():
    torch.manual_seed(0)
    a = build_model(SMALL, seed=0)
    b = build_model(SMALL, seed=0)
    ref = make_optimizer("adamw", a.parameters(), lr=1e-2, impl="for-loop", weight_decay=0.1)
    off = OffloadedAdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        idx = torch.randint(0, SMALL.vocab_size, (2, 2, 16), generator=gen)
        for net, opt in ((a, ref), (b, off)):
            lm_loss(net(idx[0]), idx[1]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        changed = max(float((p - q).abs().max()) for p, q in
                      zip(a.parameters(), build_model(SMALL, seed=0).parameters(), strict=True))
    assert changed > 1e-3  # the weights moved
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_adamw_update_is_pure():
    p = torch.ones(3)
    s = adamw_init(p)
    new_p, new_s = adamw_update(p, torch.full((3,), 2.0), s, lr=0.1)
    assert torch.equal(p, torch.ones(3)) and s.step == 0 and torch.equal(s.exp_avg, torch.zeros(3))
    assert new_s.step == 1
    torch.testing.assert_close(new_p, torch.full((3,), 0.9))  # first step: lr x sign(g)


def test_measure_offload_on_cpu_counts_bytes_and_says_not_measurable():
    r = measure_offload("tiny", batch_size=1, seq_len=16, steps=1, device="cpu")
    n = get_config("tiny").num_parameters()
    assert r.status.startswith("not measurable on cpu: ")
    assert r.peak_adamw_bytes is None and r.gpu_bytes_saved is None
    assert r.host_to_device_bytes_per_step == r.device_to_host_bytes_per_step == 4 * n


def test_paged_optimizer_status_on_cpu(capfd):
    r = paged_optimizer_status("cpu")
    assert r.status.startswith("not measurable on cpu: ")
    assert r.peak_paged_bytes is None and r.paged_state_bytes is None
    out, err = capfd.readouterr()
    assert err == "" and out == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_offload_saves_gpu_memory_on_cuda():
    r = measure_offload("tiny", batch_size=2, seq_len=32, device="cuda")
    n = get_config("tiny").num_parameters()
    assert r.status.startswith("measured on ")
    assert r.gpu_bytes_saved >= 8 * n * 0.9  # AdamW's two fp32 moments left the GPU
    p = paged_optimizer_status("cuda")
    assert p.paged_state_bytes > 0 and p.peak_paged_bytes < p.peak_adamw_bytes


# One-line errors -----------------------------------------------------------------------------
def test_errors_are_one_line():
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, link="pcie3")
    assert "pcie3" in _one_line(e) and "pcie4-x16" in str(e.value)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, stages={"none": 0, "params": 2})
    assert "stage 3" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        host_link_bytes(100, offload="optimizer", zero_stage=0)
    assert "stage 1, 2 or 3" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=0, seq_len=32)
    assert "batch_size" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, stages={"disk": 3})
    assert "disk" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, precision="fp32")
    assert "bf16-mixed" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, mfu=1.5)
    assert "mfu" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_table("tiny", batch_size=2, seq_len=32, cpu_step=-1.0)
    assert "cpu_step" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        offload_verdict(1.0, 1.0, free_below=2)
    assert "free_below" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        OffloadedAdamW(build_model(SMALL).parameters(), lr=0)
    assert "lr" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        measure_offload("tiny", precision="fp16", device="cpu")
    assert "fp16" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        paged_optimizer_status("cpu", optimizer="adamw")
    assert "paged-adamw" in _one_line(e)


def test_the_link_rate_is_the_bytes_over_the_time_offloading_adds():
    from memlab.compute.offload import OffloadMeasurement

    base = dict(model="m", parameters=1, precision="bf16", batch_size=1, seq_len=1, steps=3,
                device="cuda", status="measured", host_to_device_bytes_per_step=6 * 10**9,
                device_to_host_bytes_per_step=2 * 10**9, host_state_bytes=1,
                peak_adamw_bytes=10, peak_offloaded_bytes=5, gpu_bytes_saved=5)
    m = OffloadMeasurement(**base, step_ms_adamw=100.0, step_ms_offloaded=600.0)
    assert m.moved_gb_per_extra_s == 16.0  # 8 GB in 0.5 s more
    assert OffloadMeasurement(**base).moved_gb_per_extra_s is None
    assert OffloadMeasurement(**base, step_ms_adamw=100.0,
                              step_ms_offloaded=90.0).moved_gb_per_extra_s is None
