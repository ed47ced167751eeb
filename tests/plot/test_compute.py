"""Chapter 7's figures (memlab.plot.recompute, .scaling, .planning), each drawn from a small result of memlab.compute."""

from __future__ import annotations

import dataclasses
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.compute.accumulation import accumulation_buffer, accumulation_sweep  # noqa: E402
from memlab.compute.checkpointing import (  # noqa: E402
    CheckpointCosts,
    MeasuredPlan,
    checkpointing_curve,
)
from memlab.compute.flops import matmul_parameters, palm_flops, six_nd, step_flops  # noqa: E402
from memlab.compute.grid import (  # noqa: E402
    GridModel,
    GridSpec,
    scaling_grid,
)
from memlab.compute.hardware import ACCELERATORS  # noqa: E402
from memlab.compute.offload import offload_table  # noqa: E402
from memlab.compute.plan import plan_training  # noqa: E402
from memlab.compute.scaling import (  # noqa: E402
    CHINCHILLA_PARAMS_QUOTED,
    PUBLISHED,
)
from memlab.errors import MemlabError  # noqa: E402
from memlab.plot.scaling import HOFFMANN_PARAMS_RANGE_QUOTED  # noqa: E402

MiB = 2**20


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def _bars(ax) -> list[Rectangle]:
    return [p for c in ax.containers for p in c]


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


# Small results from the real functions -------------------------------------------------------
@pytest.fixture(scope="module")
def curve():
    return checkpointing_curve("gpt2", batch_size=1, seq_len=256)


@pytest.fixture(scope="module")
def plan():
    return plan_training("llama2-7b", "A100-80GB", global_batch=64, seq_len=2048)


@pytest.fixture(scope="module")
def sweep():
    return accumulation_sweep("tiny", global_batch=4, micro_batches=(4, 1), seq_len=32,
                              repeats=1, device="cpu")


@pytest.fixture(scope="module")
def buffer():
    return accumulation_buffer("tiny", micro_batches=(1, 2, 4), seq_len=16, device="cpu")


@pytest.fixture(scope="module")
def table():
    return offload_table("llama2-7b", batch_size=1, seq_len=2048)


TINY_GRID = GridSpec(vocab_size=32, order=1,
                     models=(GridModel(4, 1, 1, 12, 0.12), GridModel(8, 1, 1, 24, 0.06),
                             GridModel(16, 1, 2, 48, 0.03)),
                     steps=(6, 12), batch_size=32, seq_len=16, eval_sequences=64, resamples=8,
                     n_starts=1)


@pytest.fixture(scope="module")
def grid():
    return scaling_grid("ci", device="cpu", spec=TINY_GRID)


def _costs() -> CheckpointCosts:
    """Made-up measurements: exact numbers to check the bars against."""
    def plan(name, saved, est, flops, whole, ms, ms_whole):
        return MeasuredPlan(name, saved * MiB, 3 * saved * MiB, est * MiB, 3 * est * MiB, flops,
                            whole, ms, ms_whole, (ms,))
    return CheckpointCosts(scale="ci", device="cpu",
                           setup={"batch_size": 2, "seq_len": 128, "precision": "fp32",
                                  "repeats": 1, "model": "m", "parameters": 1000},
                           plans=(plan("none", 24, 24, 100, 100, 10.0, 10.0),
                                  plan("selective", 23, 22, 104, 104, 11.0, 11.0),
                                  plan("full", 2, 2, 125, 132, 13.0, 14.0)))


# 1. FLOPs against the rules ------------------------------------------------------------------
def test_flops_over_seq_len_draws_the_counted_and_palm_ratios():
    Ts = [256, 1024, 4096]
    fig = mplot.flops_over_seq_len(["gpt2", "llama2-7b"], Ts)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.lines) == 2 * 2 + 1  # counted and PaLM per model, and 6ND
    by_label = {line.get_label(): line for line in ax.lines}
    gpt2 = by_label["gpt2: counted (sdpa)"]
    assert list(gpt2.get_xdata()) == [256, 1024]  # stops at gpt2's max_seq_len
    n = matmul_parameters("llama2-7b")
    llama = by_label["llama2-7b: counted (sdpa)"]
    assert list(llama.get_ydata()) == [
        step_flops("llama2-7b", batch_size=1, seq_len=T).total / six_nd(n, T) for T in Ts]
    assert list(by_label["llama2-7b: PaLM's (6N + 12LCT)D"].get_ydata()) == [
        palm_flops("llama2-7b", T, T) / six_nd(n, T) for T in Ts]
    assert all(y > 1 for y in llama.get_ydata())  # 6ND leaves attention out
    assert list(by_label["6ND"].get_ydata()) == [1.0, 1.0]
    assert ax.get_xscale() == "log"
    assert "counted" in ax.get_title()


def test_flops_over_seq_len_draws_on_a_given_axes_with_a_given_title():
    fig, ax = plt.subplots()
    assert mplot.flops_over_seq_len("tiny", 64, ax=ax, title="t") is fig
    assert ax.get_title() == "t" and len(ax.lines) == 3


@pytest.mark.parametrize("models, seq_lens, words", [
    (3, [256], "models must be a preset name, a ModelConfig or a sequence of them, got int"),
    ([None], [256], "models must be preset names or ModelConfigs, got NoneType"),
    ([], [256], "needs at least one model"),
    ("gpt2", [0], "seq_len must be a positive integer, got 0"),
    ("gpt2", "256", "seq_lens must be a sequence of positive integers, got str"),
    ("gpt2", [4096], "no sequence length fits model 'gpt2' (max_seq_len 1024)"),
    ("gpt3", [256], "gpt3"),
])
def test_flops_over_seq_len_rejects_bad_input(models, seq_lens, words):
    with pytest.raises(MemlabError) as e:
        mplot.flops_over_seq_len(models, seq_lens)
    assert words in one_line(e)


# 2. The checkpointing curve ------------------------------------------------------------------
def test_checkpoint_curve_marks_the_plans_and_the_sqrt_plan(curve):
    fig = mplot.checkpoint_curve(curve, memory="saved")
    ax = fig.axes[0]
    legend = _legend(ax)
    assert {"none", "selective", "full", "every-K (label: K)", "segments-K (label: K)",
            f"Chen et al.'s sqrt(n) plan ({curve.sqrt_plan})"} <= set(legend)
    lines = {line.get_label(): line for line in ax.lines}
    root = curve.row(curve.sqrt_plan)
    star = lines[f"Chen et al.'s sqrt(n) plan ({curve.sqrt_plan})"]
    assert star.get_xdata()[0] == 100 * root.recompute_share
    assert star.get_ydata()[0] == root.saved_bytes / MiB  # gpt2 at 256 tokens: MiB
    every = lines["every-K (label: K)"]
    ks = sorted(int(r.plan.split("-")[1]) for r in curve.rows if r.plan.startswith("every-"))
    by_plan = {r.plan: r for r in curve.rows}
    assert list(every.get_xdata()) == [100 * by_plan[f"every-{k}"].recompute_share for k in ks]
    whole = lines["each plan, recomputation run to its end (early stop off)"]
    assert len(whole.get_xdata()) == len(curve.rows)
    assert ax.get_ylabel() == "saved activations, estimated (MiB)"
    assert "counted" in ax.get_xlabel()
    assert any(t.get_text() == f"sqrt(n): {curve.sqrt_plan}" for t in ax.texts)
    assert "(estimated)" in ax.get_title() and "(counted)" in ax.get_title()


def test_checkpoint_curve_with_the_backward_peak(curve):
    fig = mplot.checkpoint_curve(curve, unit="GiB")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "backward-phase peak, estimated (GiB)"
    none = {line.get_label(): line for line in ax.lines}["none"]
    assert none.get_ydata()[0] == curve.row("none").backward_peak_bytes / 2**30


def test_checkpoint_curve_rejects_bad_input(curve):
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_curve(curve, memory="activations")
    assert "unknown memory 'activations'; accepted: backward, saved, peak" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_curve(5)
    assert "curve must be a CheckpointCurve, got int" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_curve(curve.as_dict())
    assert "curve must be a CheckpointCurve, got dict" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_curve(curve, ax="left")
    assert "ax must be a matplotlib Axes or None, got str" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_curve(curve, unit="GiBs")
    assert "unknown unit 'GiBs'" in one_line(e)


# 3. Checkpointing measured -------------------------------------------------------------------
def test_checkpoint_costs_draws_bytes_and_ratios():
    costs = _costs()
    fig = mplot.checkpoint_costs(costs, unit="MiB")
    ax, ax2 = fig.axes
    assert [b.get_height() for b in _bars(ax)] == [24, 23, 2]
    est = {line.get_label(): line for line in ax.lines}["estimated"]
    assert list(est.get_ydata()) == [24, 22, 2]
    heights = [b.get_height() for b in _bars(ax2)]
    names = [p.plan for p in costs.plans]
    assert heights == [costs.time_ratio(n) for n in names] + [costs.flops_ratio(n) for n in names]
    assert _legend(ax2) == ["time per step, measured", "FLOPs, counted"]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert "measured" in fig.get_suptitle()
    whole = mplot.checkpoint_costs(costs, whole=True).axes[1]
    heights = [b.get_height() for b in _bars(whole)]  # times, then FLOPs
    assert heights[2] == costs.time_ratio("full", True) != costs.time_ratio("full")
    assert heights[5] == costs.flops_ratio("full", True) != costs.flops_ratio("full")


def test_checkpoint_costs_rejects_bad_input():
    costs = _costs()
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_costs(dataclasses.replace(costs, plans=costs.plans[1:]))
    assert "divides by the plan 'none'; plans: selective, full" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_costs(costs, whole="yes")
    assert "whole must be True or False" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_costs([costs])
    assert "costs must be a CheckpointCosts, got list" in one_line(e)
    fig, ax = plt.subplots()
    with pytest.raises(MemlabError) as e:
        mplot.checkpoint_costs(costs, axes=[ax])
    assert "axes must be 2 matplotlib Axes or None, got 1" in one_line(e)


def test_two_panel_figures_draw_on_given_axes():
    fig, axes = plt.subplots(1, 2)
    assert mplot.checkpoint_costs(_costs(), axes=axes) is fig
    assert fig.get_suptitle() == ""  # the caller's figure gets no title it did not ask for
    assert len(_bars(axes[0])) == 3


# 4-5. Gradient accumulation ------------------------------------------------------------------
def test_accumulation_sweep_draws_measured_bars_and_estimated_markers(sweep):
    fig = mplot.accumulation_sweep(sweep, unit="MiB")
    ax, ax2 = fig.axes
    assert [b.get_height() for b in _bars(ax)] == [r.measured_peak_bytes / MiB
                                                  for r in sweep.rows]
    est = {line.get_label(): line for line in ax.lines}["estimated"]
    assert list(est.get_ydata()) == [r.estimated_peak_bytes / MiB for r in sweep.rows]
    assert [b.get_height() for b in _bars(ax2)] == [r.ms_per_sample for r in sweep.rows]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4 x 1", "1 x 4"]
    assert "measured" in ax2.get_ylabel()
    with pytest.raises(MemlabError) as e:
        mplot.accumulation_sweep(sweep.rows)
    assert "sweep must be an AccumulationSweep, got tuple" in one_line(e)


def test_accumulation_buffer_leaves_exact_zeros_off_the_log_axis(buffer):
    assert buffer.rows[0].micro_batches == 1 and buffer.rows[0].bf16_grad_error == 0
    fig = mplot.accumulation_buffer(buffer)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    bf16 = lines["bf16 .grad (autograd adds in bf16)"]
    fp32 = lines["fp32 buffer (main_grad)"]
    for line, field in ((bf16, "bf16_grad_error"), (fp32, "fp32_buffer_error")):
        # an fp32 sum of two bf16 gradients can be exact on some CPU kernels: 0, left out too
        kept = [(r.micro_batches, getattr(r, field)) for r in buffer.rows
                if getattr(r, field) > 0]
        assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == kept
    assert list(bf16.get_xdata()) == [2, 4]
    assert all(r.bf16_grad_error > r.fp32_buffer_error for r in buffer.rows[1:])
    assert lines["bf16 unit roundoff u = 2^-8"].get_ydata()[0] == 2.0**-8
    assert ax.get_yscale() == "log"
    assert f"{buffer.extra_bytes_measured:,} bytes measured" in " ".join(ax.get_title().split())
    with pytest.raises(MemlabError) as e:
        mplot.accumulation_buffer("tiny")
    assert "buffer must be an AccumulationBuffer, got str" in one_line(e)


# 6. Offload ----------------------------------------------------------------------------------
def test_offload_costs_draws_seconds_and_a_verdict_per_row(table):
    fig = mplot.offload_costs(table)
    ax = fig.axes[0]
    transfer, cpu_step, compute = ax.containers
    moved = [r for r in table.rows if r.added_s > 0]
    assert [b.get_height() for b in transfer] == [r.transfer_s for r in moved]
    assert [b.get_height() for b in cpu_step] == [r.cpu_step_s for r in moved]
    assert [b.get_y() for b in cpu_step] == [r.transfer_s for r in moved]  # stacked on it
    assert [b.get_height() for b in compute] == [r.compute_s for r in table.rows]
    assert len(moved) == len(table.rows) - 1  # 'none' moves nothing: no bar on a log axis
    assert [t.get_text().split("\n")[0] for t in ax.texts] == [r.verdict for r in table.rows]
    assert ax.get_yscale() == "log"
    assert ax.get_title().startswith("Offload, estimated")
    with pytest.raises(MemlabError) as e:
        mplot.offload_costs(table.rows[0])
    assert "table must be an OffloadTable, got OffloadRow" in one_line(e)


# 7. The scaling law --------------------------------------------------------------------------
def test_scaling_fit_draws_the_runs_the_fits_and_the_quoted_laws(grid):
    fig = mplot.scaling_fit(grid)
    ax, ax2, ax3 = fig.axes
    sizes = sorted({r.n_params for r in grid.runs})
    assert len(ax.lines) == 2 * len(sizes) + 2  # runs and fit per size, entropy, fitted E
    measured = [line for line in ax.lines if line.get_label().endswith(", measured")]
    assert [line.get_label() for line in measured] == [f"N = {n:,}, measured" for n in sizes]
    assert sum(len(line.get_xdata()) for line in measured) == len(grid.runs)
    assert f"task entropy {grid.entropy_nats:.3f} nats (exact)" in _legend(ax)
    assert ax.get_xscale() == "log"
    legend2 = _legend(ax2)
    assert legend2[0] == "runs of the grid"
    drawn = {fit: any(label.startswith(f"{fit}: N_opt ~ C^") for label in legend2)
             for fit in ("E free", "E fixed to the entropy")}
    assert drawn == {"E free": bool(grid.optimal_free),
                     "E fixed to the entropy": bool(grid.optimal_fixed)}
    missing = [fit for fit, ok in drawn.items() if not ok]
    assert [t.get_text() for t in ax2.texts] == (["no optimum: " + ", ".join(missing)]
                                                 if missing else [])
    legend3 = _legend(ax3)
    for law in PUBLISHED.values():
        assert any(label.startswith(f"{law.name} (quoted)") for label in legend3)
    assert "Chinchilla (quoted)" in legend3
    lo, hi = HOFFMANN_PARAMS_RANGE_QUOTED
    solid = [line for line in ax3.lines if "(quoted): N_opt" in line.get_label()]
    assert len(solid) == len(PUBLISHED)
    for line in solid:  # drawn over the sizes Hoffmann et al. trained
        ys = line.get_ydata()
        assert ys[0] == pytest.approx(lo, rel=1e-9) and ys[-1] == pytest.approx(hi, rel=1e-9)
    star = [line for line in ax3.lines if line.get_label() == "Chinchilla (quoted)"][0]
    assert star.get_ydata()[0] == CHINCHILLA_PARAMS_QUOTED
    assert "measured" in fig.get_suptitle()


def test_scaling_fit_rejects_bad_input(grid):
    with pytest.raises(MemlabError) as e:
        mplot.scaling_fit(grid.fit_free)
    assert "grid must be a ScalingGrid, got ScalingFit" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.scaling_fit(grid.as_dict())
    assert "grid must be a ScalingGrid, got dict" in one_line(e)
    fig, axes = plt.subplots(1, 2)
    with pytest.raises(MemlabError) as e:
        mplot.scaling_fit(grid, axes=axes)
    assert "axes must be 3 matplotlib Axes or None, got 2" in one_line(e)


# 8. The planner ------------------------------------------------------------------------------
def test_plan_costs_draws_the_cheapest_rows(plan):
    fig = mplot.plan_costs(plan, limit=5)
    ax = fig.axes[0]
    rows = plan.rows[:5]
    assert [b.get_width() for b in _bars(ax)] == [r.gpu_seconds for r in rows]
    assert [t.get_text() for t in ax.get_yticklabels()] == [r.label for r in rows]
    assert [t.get_text() for t in ax.texts] == [f" {r.per_gpu_peak_bytes / 2**30:.1f} GiB"
                                                for r in rows]
    title = " ".join(ax.get_title().split())
    assert f"({plan.usable_bytes / 2**30:.1f} GiB usable)" in title and "estimated" in title


def test_plan_costs_says_when_nothing_fits_and_rejects_bad_input(plan):
    empty = dataclasses.replace(plan, rows=())
    ax = mplot.plan_costs(empty).axes[0]
    assert not _bars(ax)
    assert ax.texts[0].get_text().startswith("nothing fits: the smallest per-GPU peak is")
    with pytest.raises(MemlabError) as e:
        mplot.plan_costs(plan, limit=0)
    assert "limit must be a positive integer, got 0" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.plan_costs(plan.rows)
    assert "plan must be a MemoryPlan, got tuple" in one_line(e)


# 9. Accelerators -----------------------------------------------------------------------------
def test_accelerators_annotates_every_quoted_row():
    fig = mplot.accelerators()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == [a.name for a in ACCELERATORS]
    assert "quoted" in ax.get_xlabel() and "quoted" in ax.get_ylabel()
    points = [line for line in ax.lines if len(line.get_xdata()) == 1]
    assert len(points) == len(ACCELERATORS)
    h100 = next(a for a in ACCELERATORS if a.name == "H100")
    i = [a.name for a in ACCELERATORS].index("H100")
    assert points[i].get_xdata()[0] == h100.dense_16bit_flops_per_s / 1e12
    assert points[i].get_ydata()[0] == h100.memory_bytes / 2**30
    assert {"NVIDIA", "AMD", "Google", "AWS"} <= set(_legend(ax))


def test_accelerators_takes_names_and_rejects_bad_rows():
    ax = mplot.accelerators(["MI300X", "h100"]).axes[0]
    assert [t.get_text() for t in ax.texts] == ["MI300X", "H100"]
    with pytest.raises(MemlabError) as e:
        mplot.accelerators(["B300"])
    assert "unknown accelerator 'B300'" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.accelerators([3.5])
    assert "accelerator row must be an Accelerator, got float" in one_line(e)
    with pytest.raises(MemlabError) as e:
        mplot.accelerators([])
    assert "needs at least one row" in one_line(e)


def test_every_figure_is_finite(curve, sweep, buffer, table, plan):
    """No NaN or inf reaches a drawn line (a log axis would drop it silently)."""
    for fig in (mplot.checkpoint_curve(curve), mplot.accumulation_sweep(sweep),
                mplot.accumulation_buffer(buffer), mplot.offload_costs(table),
                mplot.plan_costs(plan), mplot.flops_over_seq_len("gpt2", [128, 1024])):
        for ax in fig.axes:
            for line in ax.lines:
                assert all(math.isfinite(float(v)) for v in line.get_ydata())
