"""Figures of chapter 6: each rank's bytes by strategy, who holds what under ZeRO, FSDP's gather
timeline, communication per step, per-GPU memory against the number of GPUs, the pipeline's
bubble, and the throughput model.

Every function takes a result dataclass (a record's is ``Record.value()``) and returns the
``Figure``; nothing here runs a process or measures.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt

from memlab.distributed.comm import COLLECTIVES, VOLUME_FACTOR
from memlab.distributed.zero import LAYOUTS, STAGES, check_gpus, check_stage, formula, model_states
from memlab.errors import MemlabError, check_choice
from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, CATEGORY_LABELS, MAX_FIGURE_WIDTH_IN, style
from memlab.plot.timeline import PHASE_SHADES
from memlab.units import UNITS, to_unit

STAGE_COLORS = {0: "tab:red", 1: "tab:orange", 2: "tab:green", 3: "tab:blue"}
COLLECTIVE_COLORS = {
    "all-reduce": "#4C72B0",
    "all-gather": "#55A868",
    "reduce-scatter": "#DD8452",
    "broadcast": "#8172B3",
    "send": "#937860",
    "recv": "#DA8BC3",
    "all-to-all": "#8C8C8C",
}
# What one rank holds during a step, bottom to top: parameters as held between forward and
# backward (FSDP's gathered ones included), then gradients, optimizer states, activations.
RANK_CATEGORIES = {"parameters": "parameters_after_forward", "gradients": "gradients",
                   "optimizer_states": "optimizer_states", "activations": "activations"}
MODEL_STATE_CATEGORIES = ("parameters", "gradients", "optimizer_states")
SWEEP_VALUES = {"peak": "peak_bytes", "model_states": "model_state_bytes"}
MAX_DRAWN_RANKS = 16  # who_holds_what: more rows than this are no longer legible


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _unit(unit: str | None, largest: float) -> tuple[str, int]:
    unit = unit or ("GiB" if largest >= 2**30 else "MiB")
    return unit, UNITS[check_choice("unit", unit, UNITS)]


def _run(result, strategy: str):
    runs = result.runs
    for r in runs:
        if r.strategy == strategy:
            return r
    raise MemlabError(f"no run of strategy {strategy!r}; accepted: "
                      + ", ".join(r.strategy for r in runs))


def _rank(run, rank: int):
    ranks = run.ranks
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(ranks):
        raise MemlabError(f"rank must be one of 0..{len(ranks) - 1}, got {rank!r}")
    return ranks[rank]


def _where(result) -> str:
    return f"{result.backend}, {result.device}"


def _tick(run) -> str:
    return textwrap.fill(run.label, 16)


BARS_AT_COLUMN_WIDTH = 5  # strategies a bar figure draws at the column's width, legend below


def _bars_size(n: int, height: float) -> tuple[float, float]:
    """A bar per strategy: the column's width up to five, its legend below; wider past that."""
    if n <= BARS_AT_COLUMN_WIDTH:
        return MAX_FIGURE_WIDTH_IN, height + 1.4
    return max(7.0, 1.15 * n + 2.8), height


def _bars_legend(ax, n: int) -> None:
    if n <= BARS_AT_COLUMN_WIDTH:
        ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    else:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))


def rank_memory(result, rank: int = 0, unit: str | None = None, source: str = "measured",
                title: str | None = None):
    """One rank's bytes by category, a stacked bar per strategy (chapter: 6).

    The ZeRO formula's model states and the peak are marked.

    ``result`` is a :class:`memlab.distributed.sharding.DistributedMemory`.
    The parameters are those held between forward and backward (FSDP's gathered ones
    included); the black tick is the formula's model states (parameters + gradients +
    optimizer states), the triangle the rank's peak. ``source`` is how the page names where
    the numbers come from: ``'measured'``, or a record's label (``'recorded on ...'``).
    """
    style()
    runs = list(result.runs)
    ranks = [_rank(r, rank) for r in runs]
    tops = [sum(getattr(k, f) for f in RANK_CATEGORIES.values()) for k in ranks]
    largest = max([*tops, *(k.peak_bytes for k in ranks),
                   *(r.formula_bytes for r in runs)], default=0)
    unit, scale = _unit(unit, largest)
    fig, ax = plt.subplots(figsize=_bars_size(len(runs), 4.4))
    xs = list(range(len(runs)))
    bottom = [0.0] * len(runs)
    for cat, field in RANK_CATEGORIES.items():
        vals = [getattr(k, field) / scale for k in ranks]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, width=0.7, color=CATEGORY_COLORS[cat],
               label=CATEGORY_LABELS[cat])
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    forms = [r.formula_bytes / scale for r in runs]
    ax.hlines(forms, [x - 0.42 for x in xs], [x + 0.42 for x in xs], color="black", lw=2.2,
              zorder=4, label="formula's model states")
    peaks = [k.peak_bytes / scale for k in ranks]
    ax.plot(xs, peaks, linestyle="none", marker="v", markersize=7, color="black", zorder=5,
            label=f"{source.split(' ')[0]} peak")
    for x, k, r, top in zip(xs, ranks, runs, bottom, strict=True):
        states = sum(getattr(k, RANK_CATEGORIES[c]) for c in MODEL_STATE_CATEGORIES)
        ratio = states / r.formula_bytes if r.formula_bytes else float("nan")
        y = max(top, k.peak_bytes / scale, r.formula_bytes / scale)
        ax.annotate(f"states\n{ratio:.2f}x formula", (x, y), xytext=(0, 5), textcoords="offset points",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [f"{_tick(r)}\n{r.formula}" for r in runs], fontsize=8)
    ax.set_ylabel(f"bytes on rank {rank} ({unit})")
    ax.set_ylim(0, largest / scale * 1.25 if largest else 1)
    _bars_legend(ax, len(runs))
    world = result.world_size
    ax.set_title(title or f"Bytes by strategy on rank {rank} of {_plural(world, 'rank')}, {source}\n"
                 f"{result.parameters:,} parameters ({result.layout}), "
                 f"{_where(result)}", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def who_holds_what(gpus: int = 4, *, stages=STAGES, layout: str = "mixed",
                   title: str | None = None):
    """Which rank holds which share of model states at each ZeRO stage (chapter: 6).

    The shares of parameters, gradients and optimizer states are computed from the formulas.

    A row per rank; per stage, three segments (parameters, gradients, optimizer states), filled
    across the whole segment where the rank holds all of it and over its own 1/N slot where
    the category is sharded (:func:`memlab.distributed.zero.model_states`). Each stage is
    headed by its formula (:func:`memlab.distributed.zero.formula`) and its bytes per
    parameter on one GPU at this N.
    """
    import matplotlib.patches as patches

    gpus = check_gpus(gpus)
    if gpus > MAX_DRAWN_RANKS:
        raise MemlabError(f"who_holds_what draws at most {MAX_DRAWN_RANKS} ranks, got {gpus}")
    stages = tuple(check_stage(s) for s in stages)
    check_choice("layout", layout, tuple(LAYOUTS))
    style()
    per_byte = dict(zip(MODEL_STATE_CATEGORIES, LAYOUTS[layout], strict=True))
    n_params = gpus * 1_000_000  # any multiple of N: the shards come out exact
    seg, gap, height = 1.0, 0.7, 0.72
    said = []
    fig, ax = plt.subplots(figsize=(2.3 * len(stages) + 1.2, 1.5 + 0.42 * gpus))
    for j, stage in enumerate(stages):
        held = model_states(n_params, stage, gpus, layout=layout)
        x0 = j * (3 * seg + gap)
        for c, cat in enumerate(MODEL_STATE_CATEGORIES):
            sharded = getattr(held, cat) < per_byte[cat] * n_params
            for rank in range(gpus):
                y = gpus - 1 - rank
                left = x0 + c * seg
                ax.add_patch(patches.Rectangle((left, y), seg, height, fill=False,
                                               edgecolor="0.65", lw=0.8))
                width = seg / gpus if sharded else seg
                ax.add_patch(patches.Rectangle((left + (rank * width if sharded else 0), y),
                                               width, height, facecolor=CATEGORY_COLORS[cat],
                                               edgecolor="none"))
        per_param = held.total / n_params
        said.append(f"stage {stage} {per_param:g}")
        name = f"stage {stage}" + (" (DDP)" if stage == 0 else "")
        ax.text(x0 + 1.5 * seg, gpus + 0.15, f"{name}\n{formula(stage, layout=layout)}\n"
                f"= {per_param:g} bytes/parameter at N={gpus}", ha="center", va="bottom",
                fontsize=8)
    ax.set_xlim(-0.2, len(stages) * (3 * seg + gap) - gap + 0.2)
    ax.set_ylim(-0.5, gpus + 1.35)
    ax.set_xticks([])
    ax.set_yticks([gpus - 1 - r + height / 2 for r in range(gpus)],
                  [f"rank {r}" for r in range(gpus)], fontsize=8)
    ax.grid(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    handles = [patches.Patch(color=CATEGORY_COLORS[c],
                             label=f"{CATEGORY_LABELS[c]} ({per_byte[c]} bytes/parameter)")
               for c in MODEL_STATE_CATEGORIES]
    handles.append(patches.Patch(facecolor="white", edgecolor="0.65",
                                 label="held by another rank"))
    ax.legend(handles=handles, fontsize=8, ncol=4, loc="upper center",
              bbox_to_anchor=(0.5, 0.0))
    p, g, k = LAYOUTS[layout]
    ax.set_title(title or f"Who holds what on N = {gpus} GPUs, by ZeRO stage ({layout}: "
                 f"{p}Ψ + {g}Ψ + {k}Ψ), computed from the formulas", fontsize=10)
    fig.tight_layout()
    return describe(fig, (
        f"Diagram: for each ZeRO stage, which of {gpus} ranks holds the parameters, gradients "
        f"and optimizer states whole and which holds a 1/{gpus} share; bytes per parameter on "
        "one GPU: " + ", ".join(said)))


def _phases(events) -> list[str]:
    """Each event's phase: 'forward'/'backward' from its label.

    A collective issued takes the phase it falls in.
    """
    phase, out = "forward", []
    for what, _ in events:
        head = str(what).split(" ", 1)[0]
        if head in ("forward", "backward"):
            phase = head
        out.append(phase)
    return out


def gather_timeline(result, strategies=("zero3", "zero2"), unit: str | None = None,
                    source: str = "measured", title: str | None = None):
    """Parameter bytes FSDP holds gathered at each event of one step on rank 0 (chapter: 6).

    A panel per strategy, forward and backward shaded.

    ``result`` is a :class:`memlab.distributed.sharding.DistributedMemory`; the events are the
    blocks' forward and backward starts and ends and every collective issued, in order. The
    dashed line is every parameter of the model, unsharded.
    """
    style()
    runs = [_run(result, s) for s in strategies]
    if not runs:
        raise MemlabError("gather_timeline needs at least one strategy")
    for r in runs:
        if not r.gather_timeline:
            raise MemlabError(f"run {r.strategy!r} has no gather timeline")
    whole = result.parameters * LAYOUTS[result.layout][0]
    largest = max([whole, *(b for r in runs for _, b in r.gather_timeline)])
    unit, scale = _unit(unit, largest)
    fig, axes = plt.subplots(len(runs), 1, figsize=(MAX_FIGURE_WIDTH_IN, 1.2 + 2.7 * len(runs)),
                             sharey=True, squeeze=False)
    top = largest / scale * 1.2
    for ax, r in zip(axes[:, 0], runs, strict=True):
        events = list(r.gather_timeline)
        phases = _phases(events)
        start = 0
        for i in range(1, len(events) + 1):
            if i == len(events) or phases[i] != phases[start]:
                ax.axvspan(start, i, color=PHASE_SHADES[phases[start]], zorder=0, lw=0)
                ax.text((start + i) / 2, top * 0.98, phases[start], ha="center", va="top",
                        fontsize=8, color="#444444")
                start = i
        ys = [b / scale for _, b in events]
        ax.step(range(len(events) + 1), [*ys, ys[-1]], where="post",
                color=CATEGORY_COLORS["parameters"], lw=1.6, zorder=3,
                label="gathered parameters")
        issued = [i for i, (what, _) in enumerate(events) if str(what).endswith(" issued")]
        if issued:
            ax.plot(issued, [0] * len(issued), linestyle="none", marker="|", markersize=9,
                    color="0.25", clip_on=False, zorder=4, label="collective issued")
        ax.axhline(whole / scale, color="black", linestyle="--", lw=1, zorder=2,
                   label="all parameters, unsharded")
        ax.set_xlim(0, len(events))
        ax.set_ylim(0, top)
        ax.set_xlabel("event on rank 0, in order")
        ax.set_title(r.label, fontsize=9)
        ax.set_ylabel(f"gathered ({unit})")
    axes[0][0].legend(fontsize=9, loc="center")
    fig.suptitle(title or f"Parameters FSDP holds gathered during one step, {source}\n"
                 f"rank 0 of {_plural(result.world_size, 'rank')} ({_where(result)})",
                 fontsize=10)
    fig.tight_layout()
    return describe(fig)


def comm_by_strategy(result, rank: int = 0, unit: str | None = None, source: str = "measured",
                     title: str | None = None):
    """Bytes one rank communicates per step by collective (chapter: 6).

    A stacked bar per strategy, with the 2Ψ or 3Ψ formula marked.

    The volume is the ZeRO paper's: each collective's payload, an all-reduce counted twice
    (:data:`memlab.distributed.comm.VOLUME_FACTOR`); the bars sum to ``comm_volume_bytes``.
    """
    style()
    runs = list(result.runs)
    ranks = [_rank(r, rank) for r in runs]
    largest = max([*(k.comm_volume_bytes for k in ranks),
                   *(r.comm_formula_bytes for r in runs)], default=0)
    unit, scale = _unit(unit, largest)
    fig, ax = plt.subplots(figsize=_bars_size(len(runs), 4.2))
    xs = list(range(len(runs)))
    bottom = [0.0] * len(runs)
    for c in COLLECTIVES:
        vals = [VOLUME_FACTOR[c] * k.comm.get(c, {}).get("bytes", 0) / scale
                for k in ranks]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, width=0.7, color=COLLECTIVE_COLORS[c],
               label=c + (f" (x{VOLUME_FACTOR[c]})" if VOLUME_FACTOR[c] != 1 else ""))
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    forms = [r.comm_formula_bytes / scale for r in runs]
    ax.hlines(forms, [x - 0.42 for x in xs], [x + 0.42 for x in xs], color="black", lw=2.2,
              zorder=4, label="formula: 2Ψ or 3Ψ")
    per_psi = result.parameters * LAYOUTS[result.layout][0]
    for x, k, form, top in zip(xs, ranks, forms, bottom, strict=True):
        factor = form * scale / per_psi if per_psi else 0
        ratio = f"\nx{k.comm_volume_bytes / (form * scale):.2f}" if form else ""
        ax.annotate(f"{factor:.3g}Ψ{ratio}", (x, max(top, form)), xytext=(0, 5),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs, [_tick(r) for r in runs], fontsize=8)
    ax.set_ylabel(f"bytes per step, payloads ({unit})")
    ax.set_ylim(0, largest / scale * 1.3 if largest else 1)
    _bars_legend(ax, len(runs))
    ax.set_title(title or f"Communication per step by strategy, {source}\nrank {rank} of "
                 f"{_plural(result.world_size, 'rank')} ({_where(result)})", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def _gpu_axis(ax) -> None:
    """A log2 axis of GPU counts, ticks at powers of 4 written as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("number of GPUs N")


def per_gpu_memory(sweep, what: str = "peak", gpu: str = "A100-80GB", unit: str = "GiB",
                   title: str | None = None):
    """Estimated per-GPU peak (or model states) against the number of GPUs N (chapter: 6).

    A panel per model and a line per ZeRO stage, with a GPU's usable memory.

    ``sweep`` is a :class:`memlab.distributed.plan.GpuSweep`; ``what`` is ``'peak'`` or
    ``'model_states'``. Both axes are logarithmic.
    """
    from memlab.gpus import get_gpu

    check_choice("what", what, tuple(SWEEP_VALUES))
    scale = UNITS[check_choice("unit", unit, UNITS)]
    target = get_gpu(gpu)
    style()
    models, gpus = list(sweep.models), list(sweep.gpus)
    values = getattr(sweep, SWEEP_VALUES[what])
    fig, axes = plt.subplots(len(models), 1, figsize=(MAX_FIGURE_WIDTH_IN, 1.2 + 2.6 * len(models)),
                             sharex=True, sharey=True, squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        for stage in sweep.stages:
            ys = [v / scale for v in values[model][stage]]
            ax.loglog(gpus, ys, "o-", base=2, markersize=3.5, color=STAGE_COLORS[stage],
                      label=f"stage {stage}" + (" (DDP)" if stage == 0 else ""))
        ax.axhline(target.usable_bytes / scale, color="black", linestyle="--", lw=1,
                   label=f"{target.name} usable ({to_unit(target.usable_bytes, unit):.1f} {unit})")
        ax.set_yscale("log", base=10)
        _gpu_axis(ax)
        ax.set_title(f"{model} ({sweep.parameters[model] / 1e9:.1f}B parameters)",
                     fontsize=9)
        ax.set_ylabel(f"{what.replace('_', ' ')} per GPU ({unit})")
    for ax in axes[:-1, 0]:
        ax.set_xlabel("")
    axes[0][0].legend(fontsize=9)
    s = sweep.setup
    fig.suptitle(title or textwrap.fill(
        f"Estimated per-GPU {what.replace('_', ' ')} against N: "
        f"{s['precision']}, batch {s['batch_size']} x {s['seq_len']} tokens per GPU"
        + (", checkpointing" if s["checkpointing"] else "")
        + (f", offload {s['offload']}" if s["offload"] != "none" else ""), 80), fontsize=10)
    fig.tight_layout()
    return describe(fig)


def pipeline_bubble(result, source: str = "measured", title: str | None = None):
    """The pipeline's bubble against the number of micro-batches m, three ways (chapter: 6).

    GPipe's (p - 1)/(m + p - 1), the schedule built from the stage times measured alone, and
    the wall clock of the real schedule (each stage's, and their mean).

    ``result`` is a :class:`memlab.distributed.parallel.ParallelismResult`; a bubble is a share
    of the step.
    """
    from memlab.distributed.schedule import gpipe_bubble

    style()
    runs = sorted(result.pp_runs, key=lambda r: r.microbatches)
    if not runs:
        raise MemlabError("pipeline_bubble needs a result with at least one pipeline run")
    ms = [r.microbatches for r in runs]
    p = runs[0].stages
    fig, ax = plt.subplots(figsize=(6.4, 3.9))
    every = list(range(ms[0], ms[-1] + 1))
    ax.semilogx(every, [gpipe_bubble(p, m) for m in every], "--", base=2, color="0.3",
                label=f"(p - 1)/(m + p - 1), p = {p}")
    sched = [r.schedule_bubble for r in runs]
    ax.semilogx(ms, sched, "s-", base=2, color="C2", lw=1.8,
                label="schedule from the stage times alone")
    word = source.split(" ")[0]
    for stage in range(p):
        ax.semilogx(ms, [r.bubble[stage] for r in runs], linestyle="none", marker=".",
                    base=2, markersize=7, alpha=0.6, color=f"C{stage + 3}",
                    label=f"wall clock ({word}), stage {stage}")
    mean = [r.mean_bubble for r in runs]
    ax.semilogx(ms, mean, "o-", base=2, color="C0", lw=1.8,
                label=f"wall clock ({word}), mean of the stages")
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble (share of the step idle)")
    ax.set_ylim(0, max([*mean, *sched, *(max(r.bubble) for r in runs),
                        gpipe_bubble(p, ms[0])]) * 1.25)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    cfg, (B, T) = result.pp_config, result.pp_batch
    ax.set_title(title or f"GPipe's bubble on {p} stages, {source} ({_where(result)}): "
                 f"{cfg['name']}, batch {B} x {T}", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def pipeline_schedule(result, source: str = "measured", title: str | None = None):
    """GPipe's step built from the stage times measured alone, one panel per m (chapter: 6).

    Each stage's forwards and backwards as bars, its idle time blank, the schedule's bubble
    and the wall clock's step beside it.

    ``result`` is a :class:`memlab.distributed.parallel.ParallelismResult`; times in ms.
    """
    style()
    runs = sorted(result.pp_runs, key=lambda r: r.microbatches)
    if not runs:
        raise MemlabError("pipeline_schedule needs a result with at least one pipeline run")
    p = runs[0].stages
    fig, axes = plt.subplots(len(runs), 1, figsize=(7.2, 1.0 + 0.55 * p * len(runs)),
                             squeeze=False)
    colors = {"forward": "C0", "backward": "C1"}
    for ax, r in zip(axes[:, 0], runs, strict=True):
        tl = r.schedule()
        for slot in tl.slots:
            ax.barh(slot.stage, (slot.end_s - slot.start_s) * 1e3, left=slot.start_s * 1e3,
                    height=0.6, color=colors[slot.kind], edgecolor="white", lw=0.5)
            if r.microbatches <= 8:
                ax.text((slot.start_s + slot.end_s) / 2 * 1e3, slot.stage, str(slot.microbatch),
                        ha="center", va="center", fontsize=6, color="white")
        wall = max(r.step_s) * 1e3
        ax.axvline(tl.step_s * 1e3, color="0.3", lw=1)
        ax.axvline(wall, color="C3", lw=1, linestyle="--")
        ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
        ax.invert_yaxis()
        ax.set_xlim(0, max(wall, tl.step_s * 1e3) * 1.02)
        ax.set_title(f"m = {r.microbatches}: schedule's bubble {tl.mean_bubble:.3f} "
                     f"(formula {r.formula:.3f}); wall clock's {r.mean_bubble:.3f}", fontsize=9)
    axes[-1, 0].set_xlabel("ms from the step's start")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles += [plt.Line2D([], [], color="0.3", lw=1),
                plt.Line2D([], [], color="C3", lw=1, linestyle="--")]
    axes[0, 0].legend(handles, ["forward (with the loss)", "backward", "schedule's step ends",
                                f"wall clock's step ends ({source})"], fontsize=7, ncol=4,
                      loc="lower center", bbox_to_anchor=(0.5, 1.25), frameon=False)
    cfg, (B, T) = result.pp_config, result.pp_batch
    fig.suptitle(title or f"GPipe's schedule from the stage times measured alone "
                 f"({_where(result)}): {cfg['name']}, batch {B} x {T}", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def _inputs_text(inputs: dict) -> str:
    def show(v) -> str:
        if isinstance(v, bool):
            return str(v)
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, float):
            return f"{v:g}"
        return str(v)

    return ", ".join(f"{k} {show(v)}" for k, v in inputs.items())


def throughput_scaling(rows, inputs: dict | None = None, title: str | None = None):
    """Estimated per-GPU throughput and step seconds against N (chapter: 6).

    Throughput relative to the fewest GPUs, and seconds of compute and communication per step.

    ``rows`` is what :func:`memlab.distributed.commtime.throughput_model` returns (or a dict
    of such lists by label, drawn as one line each); ``inputs`` are the model's inputs
    (parameters, tokens per GPU, stage, MFU, links...), shown in the title. With
    ``gpus_per_node`` among them, the first N past one node is marked.
    """
    style()
    curves = dict(rows) if isinstance(rows, dict) else {"": list(rows)}
    if not curves or not all(curves.values()):
        raise MemlabError("throughput_scaling needs at least one row per curve")
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(MAX_FIGURE_WIDTH_IN, 7.0), sharex=True)
    for i, (label, rs) in enumerate(curves.items()):
        rs = sorted(rs, key=lambda r: r.gpus)
        ns = [r.gpus for r in rs]
        color = f"C{i}"
        ax.plot(ns, [r.relative for r in rs], "o-", markersize=3.5, color=color,
                label=label or "per-GPU throughput")
        sends = [r for r in rs if r.comm_s > 0]  # one GPU sends nothing
        ax2.plot([r.gpus for r in sends], [r.comm_s for r in sends], "o-",
                 markersize=3.5, color=color,
                 label=f"communication{', ' + label if label else ''}")
        ax2.plot(ns, [r.compute_s for r in rs], ":", color=color,
                 label=f"compute{', ' + label if label else ''}")
    node = (inputs or {}).get("gpus_per_node")
    if node:
        for a in (ax, ax2):
            a.axvline(node, color="0.5", lw=1, linestyle="--")
        ax.text(node, 0.97, f" {node} GPUs per node", fontsize=7, color="0.35", va="top",
                transform=ax.get_xaxis_transform())
    ax.set_xscale("log", base=2)
    _gpu_axis(ax)
    ax.set_xlabel("")
    ax.set_ylabel("tokens/s per GPU,\nrelative to the fewest")
    ax.set_ylim(0, 1.08)
    ax.legend(fontsize=9, loc="lower left")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    _gpu_axis(ax2)
    ax2.set_ylabel("seconds per step (s)")
    ax2.legend(fontsize=9)
    text = f": {_inputs_text(inputs)}" if inputs else ""
    fig.suptitle(title or textwrap.fill(f"Estimated per-GPU throughput against N{text}", 80),
                 fontsize=10)
    fig.tight_layout()
    ends = []
    for label, rs in curves.items():
        last = max(rs, key=lambda r: r.gpus)
        ends.append(f"{label + ': ' if label else ''}{last.relative:.2f} at N = {last.gpus:,}")
    return describe(fig, "Estimated per-GPU throughput relative to the fewest GPUs', at the most "
                    "GPUs: " + "; ".join(ends))
