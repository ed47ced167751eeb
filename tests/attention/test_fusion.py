"""torch.compile of one block against eager: kernel counts, the no-compiler status, storable results."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from memlab.attention import fusion
from memlab.attention.fusion import (
    FUSION_SIZES,
    FusionComparison,
    count_kernels,
    fusion_comparison,
    has_cpu_kernel,
    writes_values,
)
from memlab.errors import MemlabError
from memlab.model.config import get_config
from memlab.model.transformer import Block, rope_cache
from memlab.results import make_record, writable_type

TINY = dict(batch_size=1, seq_len=16, repeats=1, warmup=0, device="cpu")


def _block_step(attention: str):
    cfg = replace(get_config("tiny"), attention=attention)
    torch.manual_seed(0)
    block = Block(cfg)
    x = torch.randn(2, 16, cfg.d_model, requires_grad=True)  # (B, T, C)
    rope = rope_cache(16, cfg.head_dim, cfg.rope_theta)
    return lambda: block(x, rope).sum().backward()


def test_the_result_is_storable_and_its_sizes_name_every_scale():
    writable_type(FusionComparison)
    assert set(FUSION_SIZES) == {"ci", "full"}
    r = fusion_comparison("tiny", compile_block=False, **TINY)
    body = json.loads(make_record("fusion-block", "ci", r, command="test").to_json())
    assert body["result"]["status"] == "not compiled: compile_block=False"
    assert body["result"]["compiled_kernels"] is None


@pytest.mark.parametrize("attention, bmm", [("eager", 6), ("sdpa", 0)])
def test_eager_kernels_of_a_block_are_counted_without_compiling(attention, bmm):
    names = count_kernels(_block_step(attention), "cpu")
    # 7 linear layers, each one mm forward and two backward (input and weight gradients)
    assert names["aten::mm"] == 21
    # eager attention: q @ k^T and att @ v forward, two matmuls backward for each
    assert names.get("aten::bmm", 0) == bmm
    if attention == "sdpa":  # one fused attention kernel each way
        assert names["aten::_scaled_dot_product_flash_attention_for_cpu"] == 1
        assert names["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 1
    assert not any(n in names for n in ("aten::view", "aten::t", "aten::linear", "aten::empty"))


def test_which_events_count_as_kernels():
    assert writes_values("aten::mm") and writes_values("aten::add_")
    assert writes_values("graph_0_cpp_fused_add_mean_mul_pow_rsqrt_0")
    for name in ("aten::view", "aten::t", "aten::resolve_conj", "aten::empty",
                 "aten::result_type", "CompiledFunction"):
        assert not writes_values(name), name
    assert has_cpu_kernel("aten::mm") and not has_cpu_kernel("aten::linear")


def test_eager_only_comparison_fills_the_eager_fields():
    r = fusion_comparison("tiny", compile_block=False, **TINY)
    assert not r.compiled and r.speedup is None and r.kernel_ratio is None
    assert r.eager_kernels == sum(r.eager_kernel_names.values()) > 21
    assert 0 < r.eager_saved_bytes <= r.eager_peak_bytes * 4
    assert r.eager_step_ms > 0 and len(r.eager_times_ms) == 1 and r.threads >= 1


def test_without_a_cpp_compiler_the_result_carries_a_status(monkeypatch):
    monkeypatch.setattr(fusion, "cpp_compiler", lambda: None)
    r = fusion_comparison("tiny", **TINY)
    assert r.status.startswith("not compiled: Inductor needs a C++ compiler")
    assert r.compiled_kernels is r.compiled_step_ms is r.compile_s is r.speedup is None
    assert r.eager_kernels > 0


def test_a_failing_compile_becomes_a_status(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no backend\nsecond line")

    monkeypatch.setattr(torch, "compile", broken)
    r = fusion_comparison("tiny", **TINY)
    assert r.status == "not compiled: RuntimeError: no backend"
    assert r.compiled_saved_bytes is None and r.eager_step_ms > 0


def test_bad_input_is_a_one_line_error():
    with pytest.raises(MemlabError, match="attention"):
        fusion_comparison("tiny", attention="flash", compile_block=False)
    with pytest.raises(MemlabError, match="exceeds max_seq_len"):
        fusion_comparison("tiny", seq_len=4096, compile_block=False)
    with pytest.raises(MemlabError, match="float format"):
        fusion_comparison("tiny", dtype="int8", compile_block=False)
    with pytest.raises(MemlabError, match="repeats"):
        fusion_comparison("tiny", repeats=0, compile_block=False)


@pytest.mark.slow
def test_compiling_a_block_fuses_its_elementwise_kernels():
    if fusion.cpp_compiler() is None:
        pytest.skip("no C++ compiler for Inductor here")
    r = fusion_comparison("tiny", batch_size=1, seq_len=32, repeats=3, warmup=1, device="cpu")
    assert r.status == "measured", r.status
    assert r.generated_kernels > 0 and r.compiled_kernels < r.eager_kernels
    # matrix products stay library calls: as many as eager runs
    assert r.compiled_kernel_names["aten::mm"] == r.eager_kernel_names["aten::mm"]
    assert r.kernel_ratio > 1 and r.speedup is not None and r.compile_s > 0
    assert r.max_abs_diff < 1e-4
