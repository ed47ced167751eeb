"""Gradient accumulation (chapter 7): peaks against the estimator, the same update, the fp32 buffer."""

from __future__ import annotations

import pytest
import torch

from memlab.compute.accumulation import (
    MAIN_GRAD_BYTES_PER_PARAMETER,
    accumulated_step,
    accumulated_update,
    accumulation_buffer,
    accumulation_experiment,
    accumulation_sweep,
    divisors,
    gamma,
    micro_batch_trade,
)
from memlab.errors import MemlabError
from memlab.model.config import get_config
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.fixture(scope="module")
def experiment():
    return accumulation_experiment(scale="ci", device="cpu")


def test_sweep_peaks_fall_with_the_micro_batch_and_match_the_estimate(experiment):
    sweep = experiment.sweep
    assert [r.micro_batch for r in sweep.rows] == [4, 2, 1]
    assert [r.grad_accum_steps for r in sweep.rows] == [1, 2, 4]
    peaks = [r.measured_peak_bytes for r in sweep.rows]
    assert peaks[0] > peaks[1] > peaks[2]  # fewer activations alive at once
    for r in sweep.rows:
        assert r.measured_over_estimated == pytest.approx(1.0, rel=0.02)
        assert r.step_ms > 0 and r.ms_per_sample == pytest.approx(r.step_ms / sweep.global_batch)
    assert "measured" in sweep.table()


def test_the_micro_batch_trade_reads_rows_by_size_not_place(experiment):
    """A smaller micro-batch lowers the peak and raises the time per sample: the sentence goes
    from the largest micro-batch to the smallest whatever order the rows come in."""
    from dataclasses import replace

    sweep = experiment.sweep
    flipped = replace(sweep, rows=tuple(reversed(sweep.rows)))
    small, large = sweep.smallest_and_largest()
    assert (small.micro_batch, large.micro_batch) == (1, 4)
    assert flipped.smallest_and_largest() == (small, large)
    text = micro_batch_trade(sweep)
    assert text == micro_batch_trade(flipped)
    assert text.startswith("micro-batch 4 -> 1 (1 -> 4 accumulation steps): peak ")
    assert f"{large.measured_peak_bytes / 2**20:.2f} -> {small.measured_peak_bytes / 2**20:.2f} MiB" in text
    assert small.measured_peak_bytes < large.measured_peak_bytes


def test_accumulated_update_equals_the_whole_batch_update(experiment):
    ok = experiment.update
    assert ok.loss_scaled and ok.within_tolerance
    assert ok.max_abs_diff <= ok.tolerance_abs
    assert ok.max_abs_update > 100 * ok.tolerance_abs  # the step moved the weights visibly
    assert "gamma_N" in ok.tolerance_rule


def test_forgetting_one_over_k_is_caught(experiment):
    bad = experiment.update_unscaled
    assert not bad.loss_scaled and not bad.within_tolerance
    assert bad.max_abs_diff > 100 * bad.tolerance_abs
    k = bad.micro_batches
    assert bad.max_rel_diff == pytest.approx(k - 1, rel=0.05)  # k times the gradient, k - 1 too much


def test_fp32_buffer_bytes_counted_and_measured(experiment):
    buf = experiment.buffer
    n = get_config("tiny").num_parameters()
    assert buf.trainable_parameters == n
    assert buf.extra_bytes_counted == buf.extra_bytes_measured == MAIN_GRAD_BYTES_PER_PARAMETER * n


def test_bf16_accumulation_error_grows_with_k_and_the_buffer_fixes_it(experiment):
    rows = {r.micro_batches: r for r in experiment.buffer.rows}
    assert rows[1].bf16_grad_error == 0.0  # one gradient: nothing added yet
    assert rows[16].bf16_grad_error > rows[2].bf16_grad_error > 0
    for k, r in rows.items():
        if k > 1:
            assert r.fp32_buffer_error < r.bf16_grad_error / 1000
    # bf16 keeps 8 significant bits: one addition rounds by at most 2^-8 of its result.
    assert rows[2].bf16_grad_error < 2.0**-8


def test_experiment_scale_and_device(experiment):
    assert experiment.scale == "ci" and experiment.device == "cpu"
    assert set(experiment.as_dict()) == {"scale", "device", "sweep", "update",
                                         "update_unscaled", "buffer"}


def test_gamma_and_divisors():
    assert gamma(1) == pytest.approx(2.0**-24)
    assert divisors(12) == (12, 6, 4, 3, 2, 1)


def test_accumulated_step_loss_is_the_batch_mean():
    net = build_model("tiny", seed=0)
    opt = make_optimizer("sgd", net.parameters(), lr=1e-3)
    idx = torch.randint(0, 512, (2, 4, 8), generator=torch.Generator().manual_seed(0))
    whole = accumulated_step(net, opt, idx[0], idx[1], 1)
    net = build_model("tiny", seed=0)
    opt = make_optimizer("sgd", net.parameters(), lr=1e-3)
    split = accumulated_step(net, opt, idx[0], idx[1], 4)
    assert split == pytest.approx(whole, rel=1e-5)


def test_errors_are_one_line():
    with pytest.raises(MemlabError) as e:
        accumulation_sweep("tiny", global_batch=8, micro_batches=(4, 3), seq_len=16)
    msg = _one_line(e)
    assert "3" in msg and "8, 4, 2, 1" in msg
    with pytest.raises(MemlabError) as e:
        accumulation_sweep("tiny", global_batch=8, micro_batches=(), seq_len=16)
    _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulation_sweep("tiny", global_batch=0, seq_len=16)
    assert "global_batch" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulation_sweep("tiny", global_batch=4, seq_len=16, precision="fp8")
    assert "fp8" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulated_update("tiny", global_batch=6, micro_batches=4)
    assert "6" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulated_update("tiny", lr=-1.0)
    assert "lr" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulation_buffer("tiny", micro_batches=4)
    assert "micro_batches" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulation_buffer("tiny", micro_batches=(2, 0))
    assert "micro_batches" in _one_line(e)
    with pytest.raises(MemlabError) as e:
        accumulation_sweep("no-such-model", global_batch=4, seq_len=16)
    _one_line(e)
    net = build_model("tiny", seed=0)
    opt = make_optimizer("sgd", net.parameters(), lr=1e-3)
    idx = torch.zeros(2, 3, 8, dtype=torch.long)
    with pytest.raises(MemlabError) as e:
        accumulated_step(net, opt, idx[0], idx[1], 2)
    assert "accepted: 1, 3" in _one_line(e)
