import json
import math
import re

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

import memlab.experiments  # noqa: E402
import memlab.plot as mplot  # noqa: E402
import memlab.precision.experiments as ex  # noqa: E402
from memlab import claims  # noqa: E402
from memlab.errors import MemlabError  # noqa: E402
from memlab.precision import fp8, memory, modes, runs, speed  # noqa: E402
from memlab.precision.formats import spec  # noqa: E402

# A small, fast setting: the tiny model with a 128-token vocabulary, 8 steps of 4 x 16 tokens.
FAST = dict(model="tiny", model_overrides=dict(vocab_size=128), steps=8, batch_size=4, seq_len=16,
            device="cpu")


@pytest.fixture(scope="module")
def token_mean():
    return runs.train_setting("token-mean", **FAST)


@pytest.fixture(scope="module")
def accumulation():
    return runs.train_setting("accumulation", modes=("fp32", "fp16-autocast", "fp16-scaled"),
                               loss_divisor=4096, **FAST)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """The registered experiment at ci scale, shrunk: fewer steps, the 7B trace swapped for tiny."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MEMLAB_DEVICE", "cpu")
    mp.setitem(ex.MIXED_SIZES, "ci", dict(
        ex.MIXED_SIZES["ci"], steps=6, batch_size=4, seq_len=16,
        large=dict(model="tiny", batch_sizes=(1, 2), seq_len=32)))
    try:
        out = tmp_path_factory.mktemp("records")
        result, record, path = memlab.experiments.run_experiment("mixed-precision", "ci", out, command="test")
    finally:
        mp.undo()
    return result, record, path


def test_markov_task_best_loss_is_the_chains_entropy():
    task = runs.MarkovTask(128, seed=0)
    p = torch.tensor(runs.MarkovTask.PROBS, dtype=torch.float64)
    assert task.entropy_nats == pytest.approx(float(-(p * p.log()).sum()))
    x, y = task.sample(256, 32, seed=5)
    assert x.shape == y.shape == (256, 32) and torch.equal(x[:, 1:], y[:, :-1])
    loss, acc = task.optimal(x, y)
    assert loss == pytest.approx(task.entropy_nats, abs=0.02)  # 8,192 transitions
    assert acc == pytest.approx(max(runs.MarkovTask.PROBS), abs=0.02)


def test_five_modes_give_finite_losses_that_fall(token_mean):
    assert [r.mode for r in token_mean.runs] == list(modes.MODES)
    for r in token_mean.runs:
        assert len(r.loss) == FAST["steps"] and all(x is not None for x in r.loss)
        assert r.loss[-1] < r.loss[0] and r.eval_loss is not None
        assert not r.skipped_steps and not r.nonfinite_grad_steps
    assert token_mean.run("fp16-scaled").scale == [2.0**16] * FAST["steps"]
    assert token_mean.run("fp32").scale is None


def test_fp32_and_bf16_autocast_curves_agree(token_mean):
    a, b = token_mean.run("fp32").loss, token_mean.run("bf16-autocast").loss
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 0.05


def test_gradient_counts_add_up(token_mean):
    for r in token_mean.runs:
        for totals, hist in ((r.act_totals, r.act_grad_hist), (r.param_totals, r.param_grad_hist)):
            assert len(hist) == len(runs.HIST_EDGES)
            assert sum(hist) + totals["zeros"] == totals["values"]  # no inf or NaN here
    fp16_run = token_mean.run("fp16-autocast")  # its activation gradients are fp16 already
    assert fp16_run.act_totals["underflow"] == 0


def test_unscaled_fp16_loses_gradients_that_the_scaler_keeps(accumulation):
    """Loss / 4096: most fp32 activation gradients lie below fp16's range (measured)."""
    s = accumulation
    assert s.tokens_per_gradient == 4 * 16 * 4096 and "4,096" in s.description
    assert s.fp32_act_underflow_share > 0.3
    assert s.fp16_act_zero_share > 0.3
    assert s.scaled_act_zero_share < s.fp16_act_zero_share / 10
    assert s.fp16_param_zero_share > s.scaled_param_zero_share
    scaled, fp32 = s.run("fp16-scaled"), s.run("fp32")
    assert max(abs(x - y) for x, y in zip(scaled.loss, fp32.loss, strict=True)) < 0.05


def test_grad_scaler_skips_steps_with_inf_gradients():
    run = runs.train("fp16-scaled", init_scale=2.0**40, **FAST)
    assert run.skipped_steps == list(range(FAST["steps"]))  # 2^40 x the loss overflows fp16
    assert run.nonfinite_grad_steps == run.skipped_steps
    assert all(b == a / 2 for a, b in zip(run.scale, run.scale[1:], strict=False))
    assert all(x is not None for x in run.loss)  # skipped, so the weights stay finite


def test_memory_state_bytes_per_param_from_the_measurement():
    rows = {r.mode: r for r in memory.memory_by_mode("tiny", batch_size=2, seq_len=16,
                                                    device="cpu")}
    assert list(rows) == list(modes.MODES)
    for mode in ("fp32", "fp16-autocast", "fp16-scaled", "bf16-autocast"):
        assert rows[mode].state_bytes_per_param == pytest.approx(16, abs=0.01)
    assert rows["bf16-pure"].state_bytes_per_param == pytest.approx(8, abs=0.01)
    assert rows["fp32"].how == "measured" and rows["fp32"].peak_ratio_to_fp32 == 1.0
    # The two fp16 modes hold the same step; the scaler adds its own tensors.
    a, s = rows["fp16-autocast"], rows["fp16-scaled"]
    assert a.grad_scaler_bytes == 0 and s.grad_scaler_bytes == memory.grad_scaler_bytes("cpu") > 0
    assert s.peak_bytes == a.peak_bytes + s.grad_scaler_bytes
    # The cast cache: one 16-bit copy of every Linear weight, measured from the casts.
    model = memory.build_model("tiny")
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    for mode in ("fp16-autocast", "bf16-autocast"):
        assert rows[mode].weight_cast_cache_bytes == 2 * linear
    assert rows["fp32"].weight_cast_cache_bytes == rows["bf16-pure"].weight_cast_cache_bytes == 0


def test_gradient_counter_agrees_with_storing_in_fp16():
    """The counter compares with thresholds; storing in fp16 and looking gives the same counts."""
    fp16 = spec("fp16")
    edges = [0.0, -0.0, math.inf, -math.inf, math.nan, fp16.min_subnormal / 2,
             fp16.min_subnormal / 2 * (1 + 2**-20), fp16.min_normal - fp16.min_subnormal / 2,
             fp16.min_normal - fp16.min_subnormal, fp16.min_normal, 65519.99, 65520.0, 65504.0,
             2.0**-100, 2.0**-101, 2.0**20, 2.0**21, 1e-45, 3e38]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, generator=g) * torch.exp2(torch.randint(-140, 25, (20_000,),
                                                                  generator=g).float())
    x = torch.cat([torch.tensor(edges), x])
    counter = runs._GradCounter(torch.device("cpu"))
    for part in (x[:5000], x[5000:].half(), x[:3000].bfloat16()):
        counter.add(part)
    counts = counter.end_step()
    a = torch.cat([x[:5000], x[5000:].half().float(), x[:3000].bfloat16().float()]).abs()
    h, finite = a.half(), a.isfinite()
    nonzero = (a != 0) & finite
    expected = [a.numel(), int((a == 0).sum()), int((nonzero & (h == 0)).sum()),
                int(((h != 0) & (h.float() < fp16.min_normal)).sum()),
                int((finite & h.isinf()).sum())]
    assert counts == expected and counter.total == expected
    e = (torch.frexp(a[nonzero]).exponent - 1).clamp(runs.HIST_LO, runs.HIST_HI) - runs.HIST_LO
    assert counter.hist.tolist() == torch.bincount(e, minlength=len(runs.HIST_EDGES)).tolist()


def test_train_runs_once_per_process_on_the_seeds_task():
    a, b = runs.train("fp32", **FAST), runs.train("fp32", **FAST)
    assert a is b
    task = runs.MarkovTask(128, seed=0)
    c = runs.train("fp32", task=task, **FAST)
    assert c is not a and c.loss == a.loss  # the same run, computed again


def test_every_phase_adds_up_to_its_peak_measured_and_estimated():
    from memlab.memory.estimator import estimate

    measured = memory.memory_by_mode("tiny", batch_size=2, seq_len=16, device="cpu")
    big = memory.memory_by_mode("llama2-7b", batch_size=1, seq_len=2048, how="estimated")
    for r in measured + big:
        assert set(r.phase_breakdown) == {"forward", "backward", "optimizer"}
        for phase, cats in r.phase_breakdown.items():
            assert sum(cats.values()) == r.phase_peak_bytes[phase]
        assert r.peak_bytes == max(r.phase_peak_bytes.values()) == r.phase_peak_bytes[r.peak_phase]
        assert sum(r.at_peak.values()) == r.peak_bytes
    for r in big:
        e = estimate("llama2-7b", batch_size=1, seq_len=2048, precision=r.precision)
        extra = r.grad_scaler_bytes
        assert r.how == "estimated" and r.device == "cuda"
        assert r.phase_peak_bytes == {p: v + extra for p, v in e.phase_peak_bytes.items()}
        assert r.saved_activations_bytes == e.saved_activations_bytes
    rows = {r.mode: r for r in big}
    # autocast at batch 1: the same peak as fp32, more saved activations (the weight-cast cache)
    assert rows["bf16-autocast"].peak_ratio_to_fp32 == 1.0
    assert rows["bf16-autocast"].saved_activations_bytes > rows["fp32"].saved_activations_bytes
    assert rows["bf16-pure"].peak_ratio_to_fp32 == pytest.approx(0.5, abs=0.01)


def test_estimated_weight_cast_cache_is_the_traced_one():
    est = {r.mode: r for r in memory.memory_by_mode("tiny", batch_size=2, seq_len=16,
                                                   how="estimated")}
    assert est["bf16-autocast"].weight_cast_cache_bytes == memory.weight_cast_cache_bytes(
        "tiny", "bf16-mixed") > 0
    assert est["fp32"].weight_cast_cache_bytes == est["bf16-pure"].weight_cast_cache_bytes == 0


def test_autocast_crossover_is_the_first_batch_that_saves():
    from memlab.memory.estimator import estimate

    x = memory.autocast_crossover("llama2-7b", seq_len=2048)
    assert x.saved_batch is not None and x.peak_batch is not None
    assert x.saved_batch > 1  # at batch 1 the weight-cast cache outweighs the 16-bit saving
    assert x.saved_tokens == x.saved_batch * 2048 and x.peak_tokens == x.peak_batch * 2048

    def est(b, p):
        return estimate("llama2-7b", batch_size=b, seq_len=2048, precision=p)

    for b in range(1, x.peak_batch + 1):
        f, m = est(b, "fp32"), est(b, "bf16-mixed")
        assert (m.saved_activations_bytes < f.saved_activations_bytes) == (b >= x.saved_batch), b
        assert (m.peak_bytes < f.peak_bytes) == (b >= x.peak_batch), b
    assert [r["batch"] for r in x.rows][0] == 1 and x.saved_batch in [r["batch"] for r in x.rows]
    assert x.rows[0]["saved_mixed"] > x.rows[0]["saved_fp32"]
    assert f"from batch {x.saved_batch} " in x.summary()
    small = memory.autocast_crossover(modes.get_config("tiny").to_dict(), seq_len=32, device="cpu")
    assert small.model == "tiny" and small.device == "cpu"
    with pytest.raises(MemlabError, match="unknown autocast precision 'fp32'; accepted: bf16-mixed"):
        memory.autocast_crossover("llama2-7b", seq_len=2048, precision="fp32")
    with pytest.raises(MemlabError, match="unknown how 'guessed'; accepted: measured, traced"):
        memory.memory_by_mode("tiny", batch_size=1, seq_len=8, how="guessed")


def test_bad_mode_names_fail_in_one_line():
    accepted = "accepted: fp32, fp16-autocast, fp16-scaled, bf16-autocast, bf16-pure"
    with pytest.raises(MemlabError, match=f"unknown mixed-precision mode 'fp8'; {accepted}$"):
        runs.train("fp8", **FAST)
    with pytest.raises(MemlabError, match="unknown mixed-precision mode 'amp'") as info:
        memory.memory_by_mode("tiny", batch_size=1, seq_len=8, modes=["fp32", "amp"])
    assert "\n" not in str(info.value)
    with pytest.raises(MemlabError, match="unknown setting 'sum'; accepted: token-mean"):
        runs.train_setting("sum", **FAST)
    with pytest.raises(MemlabError, match="fp8 matmul m must be a multiple of 16, got 100"):
        fp8.fp8_matmul(100, 128, 128, device="cpu")


def test_gpu_only_functions_say_not_measurable_on_cpu():
    times = speed.step_times("tiny", batch_size=1, seq_len=8, device="cpu")
    assert times.status.startswith("not measurable on cpu: ") and times.rows == []
    mm = fp8.fp8_matmul(256, 256, 256, device="cpu")
    assert mm.status.startswith("not measurable on cpu: ")
    assert mm.fp8_ms is None and mm.fp8_tflops is None and mm.status in mm.table()


def test_c42_verdict_is_computed_from_numbers():
    (verdict,) = claims.verdicts(["C42"])
    assert claims.CHECKS["C42"].chapter == "chapters/02_number_formats"
    ratios = [float(x) for x in re.findall(r"(\d\.\d\d) at batch \d+", verdict.evidence)]
    assert len(ratios) >= 2 and ratios[0] == 1.0 and "16.0 B/param" in verdict.evidence
    halved = [r <= 0.55 for r in ratios]
    assert verdict.verdict == (claims.HOLDS if all(halved) else
                               claims.CAVEAT if any(halved) else claims.WRONG)


def test_experiment_runs_and_serialises(experiment):
    result, record, path = experiment
    body = json.loads(path.read_text())
    assert body["experiment"] == "mixed-precision" and body["scale"] == "ci"
    settings = {s["name"]: s for s in body["result"]["settings"]}
    assert set(settings) == set(runs.SETTINGS)
    assert [r["mode"] for r in settings["token-mean"]["runs"]] == list(modes.MODES)
    assert body["result"]["fp16"]["min_subnormal"] == spec("fp16").min_subnormal
    assert len(body["result"]["memory_large"]) == 2 * len(modes.MODES)
    assert body["result"]["step_times"]["status"].startswith("not measurable on cpu")
    assert result.setting("accumulation").loss_divisor == ex.MIXED_SIZES["ci"]["accumulation"]
    assert "fp16 would flush to zero" in result.table()


def test_fp8_experiment_runs_on_cpu_and_records_nothing_there(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    result, record, path = memlab.experiments.run_experiment("fp8-matmul", "ci", command="test")
    assert record.result["status"].startswith("not measurable on cpu")
    assert record.result["fp8_ms"] is None and path is None
    with pytest.raises(MemlabError, match="fp8-matmul measures on a CUDA GPU only"):
        memlab.experiments.run_experiment("fp8-matmul", "ci", tmp_path, command="test")
    assert not any(tmp_path.iterdir())  # refused before running: nothing written


def test_plots_return_figures_from_results_and_records(experiment):
    result, record, _ = experiment
    for res in (result, record.value()):
        fig = mplot.loss_curves(res)
        assert isinstance(fig, Figure) and len(fig.axes) == 2
        fig = mplot.gradient_histogram(res)
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert any(label.startswith("fp16 min subnormal") for label in labels)
        xs = {line.get_xdata()[0] for line in fig.axes[0].lines}
        assert math.log2(spec("fp16").min_subnormal) in xs
        assert isinstance(mplot.gradient_histogram(res, setting="accumulation",
                                                   which="parameters"), Figure)
        for which in ("small", "large"):
            fig = mplot.memory_by_mode(res, which=which)
            assert isinstance(fig, Figure)
    with pytest.raises(MemlabError, match="unknown memory 'x'; accepted: small, large"):
        mplot.memory_by_mode(result, which="x")


def test_gpu_step_and_fp8_operands_work_on_any_device():
    """The pieces the GPU timings call, run on the CPU: one step per mode, the fp8 operands."""
    cfg = modes.get_config("tiny", vocab_size=128)
    for mode in modes.MODES:
        assert math.isfinite(float(speed._step_fn(mode, cfg, 2, 8, 1e-3, torch.device("cpu"))()))
    a, b, a8, b8, sa, sb = fp8._fp8_operands(64, 48, 32, torch.device("cpu"))
    assert a8.dtype == b8.dtype == torch.float8_e4m3fn and b8.shape == (32, 48)
    assert b8.stride() == (1, 32)  # column-major, as torch._scaled_mm requires
    assert float((a8.float() * sa).sub(a).abs().max()) <= float(a.abs().max()) / 8
    try:
        c = fp8._fp8_mm(a8, b8, sa, sb)
    except (RuntimeError, NotImplementedError):
        pytest.skip("this torch build has no CPU kernel for torch._scaled_mm")
    assert c.dtype == torch.bfloat16 and c.shape == (64, 48)
    assert fp8._rel_error(c, a.double() @ b.double()) < 0.1


def test_c14_verdict_is_computed_from_training():
    from memlab.claims import VERDICTS, verdicts

    (v,) = verdicts(["C14"])
    assert v.verdict in VERDICTS
    assert "fp32" in v.evidence and "256 in bf16" in v.evidence
