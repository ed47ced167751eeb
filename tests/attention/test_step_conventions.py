"""A step's attention bytes by the CPU's and by CUDA's autocast conventions (chapter 4).

Eager attention under bf16 autocast: on a CPU the softmax stays in 16 bits and one bf16 P is
kept; on CUDA the softmax runs in fp32 (P kept in fp32) and P @ V takes its own bf16 copy of P,
which it keeps for its backward. The estimator's CUDA convention must count both.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memlab.attention import (
    CONVENTIONS,
    attention_in_step,
    autocast_casts,
    recorded_cuda_eager,
    square_bytes_per_score,
)
from memlab.errors import MemlabError
from memlab.memory.activations import P_COPY
from memlab.memory.estimator import estimate
from memlab.model import get_config


def _eager(name="llama2-7b", T=4096):
    cfg = get_config(name)
    return replace(cfg, attention="eager", max_seq_len=max(cfg.max_seq_len, T))


def test_pytorchs_autocast_lists_are_the_conventions():
    """The softmax is on CUDA autocast's fp32 list and on no CPU list; matmul on both 16-bit lists."""
    assert autocast_casts("aten::softmax.int", "cuda")
    assert not autocast_casts("aten::softmax.int", "cpu")
    assert autocast_casts("aten::matmul", "cuda") and autocast_casts("aten::matmul", "cpu")
    with pytest.raises(MemlabError, match="device"):
        autocast_casts("aten::matmul", "xla")


def test_cuda_keeps_fp32_p_and_its_bf16_copy_three_times_the_cpu_bytes():
    T = 4096
    cfg = _eager(T=T)
    by_device = {}
    for device in CONVENTIONS:
        saved = estimate(cfg, device=device, batch_size=1, seq_len=T,
                         precision="bf16-mixed").saved
        by_device[device] = {(t.name, t.dtype): t.bytes for t in saved
                             if t.scope == "layer" and t.shape == "(B, nh, T, T)"}
    per_head = cfg.n_head * T * T
    assert by_device["cpu"] == {("softmax probabilities", "bf16"): 2 * per_head}
    assert by_device["cuda"] == {("softmax probabilities", "fp32"): 4 * per_head,
                                 (P_COPY, "bf16"): 2 * per_head}
    assert square_bytes_per_score(cfg, T, device="cpu") == 2
    assert square_bytes_per_score(cfg, T, device="cuda") == 6  # fp32 P + bf16 copy
    for attention in ("sdpa", "flash"):  # no T x T tensor kept by either convention
        c = replace(cfg, attention=attention)
        assert square_bytes_per_score(c, T, device="cpu") == 0
        assert square_bytes_per_score(c, T, device="cuda") == 0
    # fp32 training keeps one fp32 P either way: no autocast, no copy
    assert square_bytes_per_score(cfg, T, precision="fp32", device="cuda") == 4
    assert square_bytes_per_score(cfg, T, precision="fp32", device="cpu") == 4


def test_the_step_table_shows_both_conventions():
    s = attention_in_step("tiny", (64,), "llama2-7b", (2048, 8192), precision="bf16-mixed")
    rows = {(r["attention"], r["T"]): r for r in s.conventions()}
    assert len(rows) == 6
    for T in (2048, 8192):
        eager = rows[("eager", T)]
        # the T x T part triples; the rest of the step is the same
        extra = eager["saved GiB, CUDA"] - eager["saved GiB, CPU"]
        assert extra * 2**30 == 4 * 32 * 32 * T * T  # 32 layers, 32 heads, 4 more bytes each
        assert eager["attention share, CUDA"] > eager["attention share, CPU"]
        assert rows[("flash", T)]["saved GiB, CUDA"] == rows[("flash", T)]["saved GiB, CPU"]
    assert all(r.cuda_peak_bytes >= r.estimated_peak_bytes for r in s.large
               if r.attention == "eager")


def test_held_to_a_gpu_record_where_one_is_stored():
    got = recorded_cuda_eager()
    if got is None:
        pytest.skip("no estimator-cuda record under results/: "
                    "`memlab run estimator-cuda --scale full --out results/` on a GPU makes one")
    label, rows = got
    assert rows, label
    for r in rows:
        assert r["saved_ratio"] == pytest.approx(1, abs=0.05), (label, r)


@pytest.mark.parametrize("kw, match", [
    (dict(device="tpu"), "device"),
    (dict(T=0), "T"),
])
def test_bad_input_is_one_line(kw, match):
    with pytest.raises(MemlabError, match=match) as e:
        square_bytes_per_score("llama2-7b", **kw)
    assert "\n" not in str(e.value)
