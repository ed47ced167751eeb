"""memlab.compute.hardware: the accelerator table, the tried peak, step timing and MFU."""

from __future__ import annotations

import math
import time

import pytest
import torch

from memlab.compute import hardware as hw
from memlab.compute.hardware import (
    ACCELERATOR_NAMES,
    ACCELERATORS,
    N_MAX,
    N_START,
    QUOTED,
    StepMFU,
    StepTime,
    TriedPeak,
    accelerator_table,
    get_accelerator,
    mfu,
    quoted_gpu,
    quoted_peak,
    step_mfu,
    time_train_step,
    tried_peak,
)
from memlab.errors import MemlabError
from memlab.gpus import CATALOGUE, LEGACY
from memlab.model.config import get_config
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model, lm_loss

GiB = 2**30


# The table ---------------------------------------------------------------------------------
def test_nvidia_rows_are_the_catalogue_entries_not_copies():
    nvidia = [a for a in ACCELERATORS if a.vendor == "NVIDIA"]
    gpus = {g.name: g for g in CATALOGUE + LEGACY}
    assert [a.name for a in nvidia] == [g.name for g in CATALOGUE + LEGACY]
    for a in nvidia:
        g = gpus[a.name]
        assert a.memory_bytes == g.memory_bytes and a.memory_unit == g.memory_unit
        assert a.bandwidth_bytes_per_s == g.bandwidth_bytes_per_s
        assert a.dense_16bit_flops_per_s == g.peak_ops(a.dense_16bit_format)
        if a.dense_8bit_format is not None:
            assert a.dense_8bit_ops_per_s == g.peak_ops(a.dense_8bit_format)
        assert a.source == g.source
    # bf16 where the part has bf16 tensor cores, fp16 on Turing and Volta
    assert get_accelerator("T4").dense_16bit_format == "fp16"
    assert get_accelerator("V100-32GB").dense_8bit_format is None
    assert get_accelerator("H100").dense_8bit_format == "fp8"
    assert get_accelerator("A100-80GB").dense_8bit_format == "int8"


def test_quoted_rows_cover_amd_google_aws():
    assert {a.vendor for a in QUOTED} == {"AMD", "Google", "AWS"}
    assert {"MI300X", "TPU-v5e", "TPU-v5p", "Trainium", "Trainium2"} <= set(ACCELERATOR_NAMES)


def _shown(value: float) -> set[str]:
    """How a figure can appear in its quote: in GB, TB or GiB, or in tera-units."""
    return {f"{value / d:g}" for d in (1e9, 1e12, GiB)}


@pytest.mark.parametrize("acc", QUOTED, ids=[a.name for a in QUOTED])
def test_each_quoted_number_is_the_one_in_its_quote(acc):
    def has(quote: str, value: float) -> bool:
        return any(s in quote.replace(",", "") for s in _shown(value))

    assert has(acc.memory_quoted, acc.memory_bytes)
    assert has(acc.bandwidth_quoted, acc.bandwidth_bytes_per_s)
    assert has(acc.dense_16bit_quoted, acc.dense_16bit_flops_per_s)
    if acc.dense_8bit_format is not None:
        assert has(acc.dense_8bit_quoted, acc.dense_8bit_ops_per_s)
    # the label's unit is the one the number was read in
    unit = 2**30 if acc.memory_unit == "GiB" else 10**9
    assert acc.memory_bytes % unit == 0 and str(acc.memory_bytes // unit) in acc.memory_quoted


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ACCELERATOR_NAMES)
def test_every_row_has_a_source_and_dense_figures(acc):
    assert acc.source.startswith("https://")
    assert acc.memory_source == "" or acc.memory_source.startswith("https://")
    assert "dense" in acc.dense_note
    assert acc.dense_16bit_flops_per_s > 0 and acc.bandwidth_bytes_per_s > 0
    assert acc.dense_8bit_format in (None, "fp8", "int8")


def test_dense_figures_not_sparse_ones():
    """The pages' sparse figures are twice the dense ones; the table holds the dense ones."""
    assert get_accelerator("H100").dense_16bit_flops_per_s == 989.5e12  # datasheet: 1979 sparse
    assert get_accelerator("MI300X").dense_16bit_flops_per_s == 1307.4e12
    assert get_accelerator("MI300X").dense_8bit_ops_per_s == 2614.9e12
    t2 = get_accelerator("Trainium2")
    assert (t2.dense_16bit_flops_per_s, t2.dense_8bit_ops_per_s) == (667e12, 1299e12)
    assert "2,563" in t2.dense_note and "sparse" in t2.dense_note  # the sparse line, not used


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ACCELERATOR_NAMES)
def test_derived_columns_are_computed_from_the_quoted_ones(acc):
    row = acc.as_dict()
    assert row["ridge_flops_per_byte"] == acc.dense_16bit_flops_per_s / acc.bandwidth_bytes_per_s
    assert row["bf16_weight_parameters"] == acc.memory_bytes // 2
    assert row["adam_mixed_parameters"] == acc.memory_bytes // 16
    assert row["memory_read_s"] == acc.memory_bytes / acc.bandwidth_bytes_per_s
    if acc.dense_8bit_ops_per_s is None:
        assert row["ridge_8bit_ops_per_byte"] is None
    else:
        ridge8 = acc.dense_8bit_ops_per_s / acc.bandwidth_bytes_per_s
        assert row["ridge_8bit_ops_per_byte"] == ridge8


def test_derived_columns_pinned():
    mi = get_accelerator("MI300X")
    assert mi.adam_mixed_parameters == 12_884_901_888  # 192 GiB / 16 bytes
    assert mi.bf16_weight_parameters == 103_079_215_104  # 192 GiB / 2 bytes
    assert get_accelerator("TPU-v5e").memory_bytes == 16 * 10**9  # read as written, in GB
    assert get_accelerator("H100").ridge_flops_per_byte == pytest.approx(295.37, abs=0.01)
    assert get_accelerator("Trainium2").memory_read_s == pytest.approx(96 * GiB / 2.9e12)


def test_get_accelerator_any_case_and_one_line_error():
    assert get_accelerator(" mi300x ").name == "MI300X"
    assert get_accelerator(get_accelerator("H100")).name == "H100"
    with pytest.raises(MemlabError) as e:
        get_accelerator("B200")
    msg = str(e.value)
    assert "\n" not in msg and "'B200'" in msg and "MI300X" in msg and "Trainium2" in msg


def test_accelerator_table_rows_names_and_vendor():
    rows = accelerator_table()
    assert [r["name"] for r in rows] == list(ACCELERATOR_NAMES)
    assert [r["name"] for r in accelerator_table(vendor="AWS")] == ["Trainium", "Trainium2"]
    assert [r["name"] for r in accelerator_table(["h100", "MI300X"])] == ["H100", "MI300X"]
    assert [r["name"] for r in accelerator_table("TPU-v5p")] == ["TPU-v5p"]
    with pytest.raises(MemlabError, match=r"unknown vendor 'Intel'; accepted: NVIDIA, AMD"):
        accelerator_table(vendor="Intel")


def test_a_row_without_a_source_or_with_half_an_8bit_figure_is_refused():
    base = get_accelerator("MI300X")
    from dataclasses import replace

    with pytest.raises(MemlabError, match="needs a source URL"):
        replace(base, source="")
    with pytest.raises(MemlabError, match="dense_8bit_format and dense_8bit_ops_per_s together"):
        replace(base, dense_8bit_ops_per_s=None)
    with pytest.raises(MemlabError, match=r"dense_16bit_flops_per_s of MI300X must be a positive"):
        replace(base, dense_16bit_flops_per_s=0)


# The tried peak -------------------------------------------------------------------------------
def test_tried_peak_on_cpu_small_n():
    p = tried_peak("cpu", "fp32", n=128, repeats=3, warmup=1)
    assert isinstance(p, TriedPeak)
    assert (p.device, p.dtype, p.n, p.sizing) == ("cpu", "fp32", 128, "given")
    assert p.flops_per_matmul == 2 * 128**3 and len(p.times_ms) == 3
    assert p.best_flops_per_s >= p.median_flops_per_s > 0
    assert p.best_flops_per_s == p.flops_per_matmul / (min(p.times_ms) / 1e3)
    assert p.device_name.startswith("CPU")
    assert tried_peak("cpu", torch.float32, n=64, repeats=1).dtype == "fp32"


def test_tried_peak_sizes_n_for_the_scale_quickly():
    start = time.perf_counter()
    p = tried_peak("cpu", scale="ci")
    took = time.perf_counter() - start
    n_max = N_MAX["ci"]["other"]
    assert p.n in {N_START * 2**k for k in range(8) if N_START * 2**k <= n_max}
    assert p.sizing.startswith("doubled") and "ci scale on cpu" in p.sizing
    assert p.best_flops_per_s > 0
    assert took < 5.0  # about 0.2 s here; the bound leaves room for a busy machine


def test_tried_peak_refuses_what_it_cannot_multiply(monkeypatch):
    monkeypatch.setattr(hw, "_can_multiply", lambda fmt, dev: fmt != "fp16")
    with pytest.raises(MemlabError) as e:
        tried_peak("cpu", "fp16", n=8)
    msg = str(e.value)
    assert "\n" not in msg and "cannot multiply fp16 matrices on cpu" in msg
    assert "accepted there: fp32, bf16, fp8-e4m3, fp8-e5m2" in msg


def test_tried_peak_bad_input_is_one_line():
    with pytest.raises(MemlabError, match=r"unknown dtype 'int8'; accepted: fp32, fp16, bf16"):
        tried_peak("cpu", "int8", n=8)
    with pytest.raises(MemlabError, match=r"dtype torch.int32 is not a float format"):
        tried_peak("cpu", torch.int32, n=8)
    with pytest.raises(MemlabError, match="n must be a positive integer, got 0"):
        tried_peak("cpu", "fp32", n=0)
    with pytest.raises(MemlabError, match="repeats must be a positive integer, got 0"):
        tried_peak("cpu", "fp32", n=8, repeats=0)
    with pytest.raises(MemlabError, match="warmup must be a non-negative integer, got -1"):
        tried_peak("cpu", "fp32", n=8, warmup=-1)
    with pytest.raises(MemlabError, match="needs about"):
        tried_peak("cpu", "fp32", n=10**7)  # refused before allocating


# MFU arithmetic -------------------------------------------------------------------------------
def test_mfu_arithmetic():
    assert mfu(6e12, 2.0, 1e13) == pytest.approx(0.3)
    assert mfu(1, 1, 1) == 1.0
    assert mfu(3e12, 0.5, 2e12) == pytest.approx(3.0)  # arithmetic only: above 1 is not refused


@pytest.mark.parametrize("args, name", [
    ((0, 1.0, 1.0), "flops_per_step"),
    ((1.0, -1.0, 1.0), "step_seconds"),
    ((1.0, 1.0, float("nan")), "peak_flops_per_s"),
    ((1.0, float("inf"), 1.0), "step_seconds"),
    ((True, 1.0, 1.0), "flops_per_step"),
    ((1.0, 1.0, "312e12"), "peak_flops_per_s"),
])
def test_mfu_validation_is_one_line(args, name):
    with pytest.raises(MemlabError, match=rf"^{name} must be a positive finite number, got"):
        mfu(*args)


# A training step -------------------------------------------------------------------------------
def test_time_train_step_tiny_runs_the_whole_step():
    models = []
    spec = StepSpec("tiny", batch_size=2, seq_len=32, prepare=models.append)
    start = time.perf_counter()
    t = time_train_step(spec, device="cpu", repeats=2, warmup=1)
    took = time.perf_counter() - start
    assert isinstance(t, StepTime) and len(t.times_ms) == 2
    assert t.step_ms > 0 and t.best_ms == min(t.times_ms)
    assert t.tokens_per_s == pytest.approx(2 * 32 / (t.step_ms / 1e3))
    assert t.setup["model"] == "tiny" and t.setup["precision"] == "fp32"
    # three optimizer steps ran (warm-up included): the weights moved, the gradients were freed
    fresh = build_model("tiny", seed=0)
    trained = models[0]
    assert any(not torch.equal(p, q) for p, q in zip(trained.parameters(), fresh.parameters(),
                                                        strict=True))
    assert all(p.grad is None for p in trained.parameters())
    assert took < 10.0  # well under a second here after the first step's warm-up


def test_time_train_step_switches_bf16_autocast_and_accumulation():
    t = time_train_step("tiny", device="cpu", batch_size=2, seq_len=16, precision="bf16-mixed",
                        grad_accum_steps=2, checkpointing=True, repeats=1, warmup=1)
    assert t.setup["precision"] == "bf16-mixed" and t.setup["grad_accum_steps"] == 2
    assert t.tokens_per_s == pytest.approx(2 * 16 * 2 / (t.step_ms / 1e3))


def test_time_train_step_bad_input_is_one_line():
    spec = StepSpec("tiny", batch_size=2, seq_len=16)
    with pytest.raises(MemlabError, match="pass either a StepSpec or switches"):
        time_train_step(spec, batch_size=4)
    with pytest.raises(MemlabError, match="repeats must be a positive integer, got 0"):
        time_train_step(spec, repeats=0)
    with pytest.raises(MemlabError, match="seed must be a non-negative integer"):
        time_train_step(spec, seed=-1)
    with pytest.raises(MemlabError, match="needs about .* GiB"):
        time_train_step("llama2-70b", device="cpu", batch_size=1, seq_len=16)  # before building


# MFU of a step -------------------------------------------------------------------------------
def _counted_flops(cfg_name: str, batch_size: int, seq_len: int) -> int:
    """Forward + backward FLOPs of a step, by PyTorch's counter (with the CPU SDPA formula)."""
    from torch.utils.flop_counter import FlopCounterMode

    from memlab.measure.flops import register_cpu_sdpa_flops

    register_cpu_sdpa_flops()
    cfg = get_config(cfg_name)
    model = build_model(cfg, seed=0)
    idx = torch.randint(0, cfg.vocab_size, (batch_size, seq_len),
                        generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        lm_loss(model(idx), idx).backward()
    return counter.get_total_flops()


def test_step_mfu_on_cpu_against_the_tried_peak():
    """MFU against the tried peak: the step's FLOPs over its median time, over the best FLOP/s a
    large square matmul in the same format reached on this device just before. A step's
    matmuls are smaller than that one (d_model 64), and norms, attention, the loss, AdamW and
    Python overhead add time without FLOPs, so it sits well below 1 (about 0.1-0.2 here). It
    could pass 1 only if the tried peak underestimated the device: another process slowing
    every multiply of the peak run but not the step; the bound 1.5 allows for that noise."""
    flops = _counted_flops("tiny", 8, 64)
    assert flops > 6 * get_config("tiny").num_parameters() * 8 * 64 * 0.5  # about 6 N tokens
    r = step_mfu("tiny", batch_size=8, seq_len=64, flops_per_step=flops, device="cpu",
                 repeats=3, warmup=1)
    assert isinstance(r, StepMFU) and r.compute_format == "fp32"
    assert r.tried_peak.dtype == "fp32" and r.tried_peak.device == "cpu"
    assert 0 < r.mfu_tried < 1.5
    assert r.mfu_tried == flops / (r.step_ms / 1e3 * r.tried_peak.best_flops_per_s)
    assert r.achieved_flops_per_s == flops / (r.step_ms / 1e3)
    assert r.mfu_quoted is None and r.quoted_peak_flops_per_s is None
    assert "not cpu" in r.quoted_status


def test_step_mfu_reuses_a_peak_of_the_right_format_only():
    peak = tried_peak("cpu", "bf16", n=64, repeats=1)
    with pytest.raises(MemlabError, match=r"tried in bf16 on cpu; this step computes in fp32"):
        step_mfu("tiny", batch_size=2, seq_len=16, flops_per_step=1e6, device="cpu", peak=peak)
    with pytest.raises(MemlabError, match="peak must be a TriedPeak"):
        step_mfu("tiny", batch_size=2, seq_len=16, flops_per_step=1e6, device="cpu", peak=1e11)
    with pytest.raises(MemlabError, match="flops_per_step must be a positive finite number"):
        step_mfu("tiny", batch_size=2, seq_len=16, flops_per_step=0, device="cpu")
    r = step_mfu("tiny", batch_size=2, seq_len=16, flops_per_step=1e6, device="cpu",
                 precision="bf16-mixed", peak=peak, repeats=1, warmup=1)
    assert r.tried_peak is peak and r.compute_format == "bf16"


@pytest.mark.parametrize("name, gpu", [
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H100 PCIe", None),  # another part, with a lower peak
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", "A100-80GB"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", None),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-16GB", "V100-16GB"),
    ("Tesla V100S-PCIE-32GB", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_quoted_gpu_matches_device_names_exactly(name, gpu):
    found = quoted_gpu(name)
    assert (found.name if found else None) == gpu


def test_quoted_peak_per_format():
    peak, status = quoted_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert peak == 989.5e12 and "H100" in status and "dense" in status
    assert quoted_peak("NVIDIA H100 80GB HBM3", "fp8-e4m3")[0] == 1979e12
    none, why = quoted_peak("NVIDIA H100 80GB HBM3", "fp32")
    assert none is None and "not fp32" in why
    none, why = quoted_peak("Tesla V100-SXM2-16GB", "bf16")
    assert none is None and "fp16" in why
    none, why = quoted_peak("NVIDIA GeForce RTX 4090", "bf16")
    assert none is None and "matches no memlab.gpus entry" in why
    with pytest.raises(MemlabError, match="unknown format 'fp64'"):
        quoted_peak("NVIDIA H100 80GB HBM3", "fp64")


@pytest.mark.gpu
def test_step_mfu_on_cuda_has_both_peaks():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    r = step_mfu("tiny", batch_size=8, seq_len=64, flops_per_step=1e9, device="cuda",
                 precision="bf16-mixed", repeats=3, warmup=2)
    assert r.tried_peak.dtype == "bf16" and r.tried_peak.n >= 4096
    if quoted_gpu(r.device_name) is not None:
        assert r.mfu_quoted is not None and math.isfinite(r.mfu_quoted)
        assert r.tried_peak.best_flops_per_s < 1.2 * r.quoted_peak_flops_per_s
