"""The chapter's sweeps: memory, FLOPs, time and traffic against T, and the step comparison."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.attention import (  # noqa: E402
    attention_in_step,
    flop_sweep,
    memory_sweep,
    time_sweep,
    traffic_rows,
)
from memlab.errors import MemlabError  # noqa: E402


def test_memory_sweep_exponents_ratios_and_statuses():
    m = memory_sweep((128, 256, 512), flash_lengths=(128, 256), n_head=1, head_size=16)
    assert m.exponent("sdpa-flash") == pytest.approx(1, abs=0.05)
    assert m.exponent("naive") > 1.5
    assert m.ratio("flash", "sdpa-flash") == {128: 1.0, 256: 1.0}  # the same tensors kept
    ratios = list(m.ratio("naive", "sdpa-flash").values())
    assert ratios == sorted(ratios)  # grows with T
    assert m.status("sdpa-cudnn").startswith("not measurable on cpu")
    assert m.exponent("sdpa-cudnn") is None
    mplot.attention_memory(m)


def test_flop_sweep_same_forward_more_backward_and_causal_skips():
    f = flop_sweep((64, 128), impls=("naive", "flash", "sdpa-flash"), head_size=16)
    for impl in ("naive", "flash", "sdpa-flash"):
        assert f.exponent(impl) == pytest.approx(2)
    assert {r.forward for r in f.of("naive")} == {r.forward for r in f.of("flash")}
    assert f.of("flash")[0].backward_over_forward == pytest.approx(2.5)
    assert f.of("naive")[0].backward_over_forward == pytest.approx(2.0)
    causal = flop_sweep((128,), impls=("flash",), head_size=16, causal=True).rows[0]
    assert causal.forward < f.of("flash")[-1].forward


def test_time_sweep_measures_what_runs_and_names_what_does_not():
    t = time_sweep((64,), impls=("naive", "sdpa-flash", "sdpa-cudnn"), head_size=16, repeats=1)
    assert [r.status for r in t.rows][:2] == ["measured", "measured"]
    assert t.rows[2].median_ms is None and "not measurable" in t.rows[2].status
    assert set(t.ratio("naive", "sdpa-flash")) == {64}


def test_traffic_rows_approach_eight_times_the_bound():
    rows = traffic_rows((1024, 16384), sram_elements=(16384,))
    assert rows[-1]["tiled"] / rows[-1]["bound"] == pytest.approx(8, rel=0.01)
    assert all(r["tiled"] < r["standard"] for r in rows)
    mplot.traffic(rows)


def test_attention_in_step_small_rows_and_estimates():
    s = attention_in_step("tiny", (64,), "llama2-7b", (2048,), precision="bf16-mixed")
    small = {r.attention: r for r in s.small}
    assert small["eager"].activations_bytes > small["sdpa"].activations_bytes
    assert all(r.how == "measured" and r.peak_ratio == pytest.approx(1, abs=0.03)
               for r in s.small)
    assert all(r.how == "estimated" and r.peak_ratio == 1 for r in s.large)
    mplot.attention_in_step(s.large)
    mplot.tiling(100, 32, offset=20)


@pytest.mark.parametrize("call, match", [
    (lambda: memory_sweep(()), "at least one length"),
    (lambda: memory_sweep((0,)), "lengths"),
    (lambda: flop_sweep((64,), impls=("xformers",)), "attention implementation"),
    (lambda: time_sweep((64,), repeats=0), "repeats"),
    (lambda: traffic_rows((64,), sram_elements=(0,)), "sram_elements"),
    (lambda: attention_in_step(attentions=("fast",)), "attention"),
])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(MemlabError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
