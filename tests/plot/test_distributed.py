"""Chapter 6's figures (memlab.plot.distributed), each drawn from a small constructed result."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from memlab.distributed import zero  # noqa: E402
from memlab.distributed.commtime import throughput_model  # noqa: E402
from memlab.distributed.parallel import ParallelismResult, PipelineRun  # noqa: E402
from memlab.distributed.plan import GpuSweep  # noqa: E402
from memlab.distributed.sharding import (  # noqa: E402
    Agreement,
    DistributedMemory,
    RankMemory,
    StrategyRun,
)
from memlab.errors import MemlabError  # noqa: E402
from memlab.gpus import get_gpu  # noqa: E402
from memlab.plot import distributed as dplot  # noqa: E402

N_PARAMS = 1_000_000  # made-up numbers: fp32, 4 ranks
WORLD = 4
MiB = 2**20


def _rank(rank: int, stage: int, comm: dict) -> RankMemory:
    s = zero.model_states(N_PARAMS, stage, WORLD, layout="fp32")
    volume = sum((2 if c == "all-reduce" else 1) * v["bytes"] for c, v in comm.items())
    return RankMemory(rank=rank, parameters=s.parameters, gradients=s.gradients,
                      optimizer_states=s.optimizer_states,
                      parameters_after_forward=4 * N_PARAMS if stage == 2 else s.parameters,
                      activations=3 * MiB, peak_bytes=s.total + 4 * MiB, offloaded_bytes=0,
                      comm=comm, comm_volume_bytes=volume)


def _timeline(reshard: bool) -> tuple[tuple[str, int], ...]:
    block = N_PARAMS  # bytes of one of 4 blocks' parameters, gathered
    events, held = [], 0
    for i in range(4):
        events.append((f"forward block {i} starts", held + block))
        events.append(("all-gather issued", held + block))
        held = 0 if reshard else held + block
        events.append((f"forward block {i} ends", held))
    for i in reversed(range(4)):
        events.append((f"backward block {i} starts", block if reshard else held))
        events.append(("reduce-scatter issued", block if reshard else held))
        held = held - block if not reshard else 0
        events.append((f"backward block {i} ends", held))
    return tuple(events)


def _run(strategy: str, stage: int, comm: dict, timeline=()) -> StrategyRun:
    ok = Agreement(0.0, 0.0, 0.0)
    return StrategyRun(
        strategy=strategy, label=strategy.upper(), stage=stage, shard_size=1 if stage < 2 else 4,
        mesh_shape=(WORLD,), formula=zero.formula(stage, layout="fp32"),
        formula_bytes=zero.model_states(N_PARAMS, stage, WORLD, layout="fp32").total,
        built_bytes=zero.model_states(N_PARAMS, stage, WORLD, layout="fp32").total,
        comm_formula_bytes=zero.comm_volume(N_PARAMS, stage, bytes_per_value=4),
        ranks=tuple(_rank(r, stage, comm) for r in range(WORLD)), losses=(1.0,),
        step_seconds=0.1, against_one_process=ok, tolerance=ok, gather_timeline=timeline)


@pytest.fixture(scope="module")
def memory() -> DistributedMemory:
    psi = 4 * N_PARAMS
    runs = (
        _run("ddp", 0, {"all-reduce": dict(calls=3, bytes=psi, sent_bytes=0)}),
        _run("zero1", 1, {"all-reduce": dict(calls=3, bytes=psi, sent_bytes=0),
                          "broadcast": dict(calls=9, bytes=psi, sent_bytes=0)}),
        _run("zero2", 2, {"all-gather": dict(calls=4, bytes=psi, sent_bytes=0),
                          "reduce-scatter": dict(calls=4, bytes=psi, sent_bytes=0)},
             _timeline(reshard=False)),
        _run("zero3", 3, {"all-gather": dict(calls=8, bytes=2 * psi, sent_bytes=0),
                          "reduce-scatter": dict(calls=4, bytes=psi, sent_bytes=0)},
             _timeline(reshard=True)),
    )
    return DistributedMemory(
        config={}, parameters=N_PARAMS, world_size=WORLD, backend="gloo", device="cpu",
        batch_size=8, seq_len=32, steps=3, layout="fp32", lr=1e-2, reference_losses=(1.0,),
        reference_noise=None, reference_activations=12 * MiB, reference_peak_bytes=30 * MiB,
        runs=runs, launch_seconds=20.0)


def _stack_tops(ax) -> dict[int, float]:
    tops: dict[int, float] = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    return tops


def test_rank_memory_stacks_four_categories_and_marks_formula_and_peak(memory):
    fig = dplot.rank_memory(memory, unit="MiB")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.patches) == 4 * len(memory.runs)  # parameters, gradients, optimizer, activations
    for x, run in enumerate(memory.runs):
        k = run.ranks[0]
        assert _stack_tops(ax)[x] == pytest.approx((k.model_states + k.activations) / MiB)
    (ticks,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert [seg[0][1] for seg in ticks.get_segments()] == pytest.approx(
        [r.formula_bytes / MiB for r in memory.runs])
    (peaks,) = ax.lines
    assert list(peaks.get_ydata()) == pytest.approx([r.ranks[0].peak_bytes / MiB
                                                      for r in memory.runs])
    assert "measured" in ax.get_title() and "4 ranks" in ax.get_title()
    assert "cpu" in ax.get_title()
    plt.close(fig)


def test_rank_memory_takes_a_records_value_and_refuses_a_bad_rank(memory):
    from memlab.results import make_record

    stored = make_record("distributed-memory", "ci", memory).value(type(memory))
    assert stored == memory
    fig = dplot.rank_memory(stored, source="recorded on X, 2026-01-01")
    assert "recorded on X" in fig.axes[0].get_title()
    plt.close(fig)
    with pytest.raises(MemlabError, match="rank must be one of 0..3"):
        dplot.rank_memory(memory, rank=4)


@pytest.mark.parametrize("gpus", [2, 4])
def test_who_holds_what_draws_a_shard_per_rank_where_the_stage_splits(gpus):
    fig = dplot.who_holds_what(gpus)
    ax = fig.axes[0]
    filled = [p for p in ax.patches if p.get_fill()]
    assert len(filled) == gpus * len(zero.STAGES) * 3
    assert len(ax.patches) == 2 * len(filled)  # each with its outline
    # stage 0 holds everything (12 full segments per rank); stage 3 splits all three
    widths = sorted(round(p.get_width(), 6) for p in filled)
    assert widths.count(round(1 / gpus, 6)) == (0 + 1 + 2 + 3) * gpus  # categories split
    texts = " ".join(t.get_text() for t in ax.texts)
    for stage in zero.STAGES:
        assert zero.formula(stage) in texts
    assert "computed" in ax.get_title()
    plt.close(fig)
    with pytest.raises(MemlabError):
        dplot.who_holds_what(0)


def test_gather_timeline_has_a_step_line_per_strategy_and_shades_the_phases(memory):
    fig = dplot.gather_timeline(memory, unit="MiB")
    assert len(fig.axes) == 2
    for ax, strategy in zip(fig.axes, ("zero3", "zero2"), strict=True):
        events = memory.run(strategy).gather_timeline
        gathered = ax.lines[0]
        assert list(gathered.get_ydata())[:-1] == pytest.approx([b / MiB for _, b in events])
        assert len(ax.lines) == 3  # gathered, collectives issued, all parameters
        assert len(ax.patches) == 2  # forward, backward
        assert len(ax.lines[1].get_xdata()) == sum(e.endswith("issued") for e, _ in events)
    assert max(fig.axes[0].lines[0].get_ydata()) < max(fig.axes[1].lines[0].get_ydata())
    assert "measured" in fig.texts[0].get_text()
    plt.close(fig)
    with pytest.raises(MemlabError, match="no run of strategy 'hsdp'"):
        dplot.gather_timeline(memory, strategies=("hsdp",))


def test_comm_by_strategy_splits_the_volume_by_collective(memory):
    fig = dplot.comm_by_strategy(memory, unit="MiB")
    ax = fig.axes[0]
    used = {c for r in memory.runs for c in r.ranks[0].comm}
    assert len(ax.patches) == len(used) * len(memory.runs)  # a bar per collective used, each run
    tops = _stack_tops(ax)
    for x, run in enumerate(memory.runs):
        assert tops[x] == pytest.approx(run.ranks[0].comm_volume_bytes / MiB)
    (ticks,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert [seg[0][1] for seg in ticks.get_segments()] == pytest.approx(
        [r.comm_formula_bytes / MiB for r in memory.runs])
    texts = [t.get_text() for t in ax.texts]
    assert texts[0].startswith("2Ψ") and texts[-1].startswith("3Ψ")
    plt.close(fig)


def _sweep() -> GpuSweep:
    gpus = (1, 2, 4, 8)
    models = ("m-small", "m-large")
    params = {"m-small": 10**9, "m-large": 10**10}
    states = {m: {s: tuple(zero.model_states(params[m], s, n).total for n in gpus)
                  for s in zero.STAGES} for m in models}
    peaks = {m: {s: tuple(v + 2 * 2**30 for v in states[m][s]) for s in zero.STAGES}
             for m in models}
    return GpuSweep(models=models, stages=zero.STAGES, gpus=gpus, model_state_bytes=states,
                    peak_bytes=peaks, parameters=params,
                    setup=dict(precision="bf16-mixed", batch_size=1, seq_len=4096,
                               checkpointing=True, offload="none", device="cuda"))


@pytest.mark.parametrize("what", ["peak", "model_states"])
def test_per_gpu_memory_has_a_panel_per_model_and_a_line_per_stage(what):
    sweep = _sweep()
    fig = dplot.per_gpu_memory(sweep, what=what)
    assert len(fig.axes) == 2
    usable = get_gpu("A100-80GB").usable_bytes / 2**30
    for ax, model in zip(fig.axes, sweep.models, strict=True):
        assert len(ax.lines) == len(sweep.stages) + 1
        values = getattr(sweep, "peak_bytes" if what == "peak" else "model_state_bytes")
        assert list(ax.lines[3].get_ydata()) == pytest.approx(
            [v / 2**30 for v in values[model][3]])
        assert ax.lines[-1].get_ydata()[0] == pytest.approx(usable)
        assert ax.get_xscale() == "log"
    assert "Estimated" in fig.texts[0].get_text()
    plt.close(fig)
    with pytest.raises(MemlabError, match="what"):
        dplot.per_gpu_memory(sweep, what="weights")


def _pipeline_result() -> ParallelismResult:
    def run(m: int, bubble: tuple[float, float]) -> PipelineRun:
        return PipelineRun(microbatches=m, stages=2, bubble=bubble, busy_s=(0.1, 0.1),
                           step_s=(0.2, 0.2), formula=1 / (m + 1), loss=1.0,
                           reference_loss=1.0, grad_error=0.0, forward_s=(1.0, 1.0),
                           backward_s=(2.0, 2.0), transfer_s=0.0,
                           forward_in_schedule_s=(1.0, 1.0), backward_in_schedule_s=(2.0, 2.0))

    return ParallelismResult(scale="ci", world_size=2, backend="gloo", device="cpu",
                             tp_config={}, tp_batch=(2, 32), tp_ranks=(), pp_config={
                                 "name": "pp-ci", "n_layer": 4}, pp_batch=(8, 128),
                             pp_runs=(run(8, (0.2, 0.14)), run(4, (0.3, 0.26))),
                             launch_seconds=5.0)


def test_pipeline_bubble_draws_the_schedule_and_the_wall_clock_beside_the_formula():
    fig = dplot.pipeline_bubble(_pipeline_result())
    ax = fig.axes[0]
    assert len(ax.lines) == 1 + 1 + 2 + 1  # formula, schedule, each stage, the mean
    formula, schedule, mean = ax.lines[0], ax.lines[1], ax.lines[-1]
    assert list(mean.get_xdata()) == [4, 8]
    assert list(mean.get_ydata()) == pytest.approx([0.28, 0.17])
    assert list(schedule.get_ydata()) == pytest.approx([1 / 5, 1 / 9])  # equal stages
    assert formula.get_ydata()[0] == pytest.approx(1 / 5)
    assert formula.get_ydata()[-1] == pytest.approx(1 / 9)
    assert "measured" in ax.get_title()
    plt.close(fig)


def test_pipeline_schedule_draws_every_forward_and_backward():
    fig = dplot.pipeline_schedule(_pipeline_result())
    assert len(fig.axes) == 2
    for ax, m in zip(fig.axes, (4, 8), strict=True):
        assert len(ax.patches) == 2 * 2 * m  # a bar per stage, kind and micro-batch
        assert f"m = {m}" in ax.get_title() and f"{1 / (m + 1):.3f}" in ax.get_title()
    plt.close(fig)


def test_throughput_scaling_draws_relative_throughput_and_seconds():
    inputs = dict(parameters=7_000_000_000, tokens_per_gpu=4096, stage=3, mfu=0.4,
                  gpus_per_node=8)
    gpus = [1, 2, 4, 8, 16, 64]
    rows = throughput_model(7_000_000_000, 4096, gpus, stage=3, mfu=0.4)
    fig = dplot.throughput_scaling(rows, inputs=inputs)
    ax, ax2 = fig.axes
    curve = [line for line in ax.lines if line.get_label() == "per-GPU throughput"]
    assert len(curve) == 1
    assert list(curve[0].get_ydata()) == pytest.approx([r.relative for r in rows])
    assert len(ax2.lines) == 2 + 1  # communication, compute, the node boundary
    assert "Estimated" in fig.texts[0].get_text() and "mfu 0.4" in fig.texts[0].get_text()
    plt.close(fig)
    both = {"overlapped": rows,
            "not overlapped": throughput_model(7_000_000_000, 4096, gpus, mfu=0.4,
                                               overlap=False)}
    fig = dplot.throughput_scaling(both)
    assert len(fig.axes[0].lines) == 2 and len(fig.axes[1].lines) == 4
    plt.close(fig)
