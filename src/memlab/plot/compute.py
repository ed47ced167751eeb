"""Figures of chapter 7, trading compute for memory: FLOPs against the rules, checkpointing's
bytes against its FLOPs and time, gradient accumulation, offload, the scaling-law fit, the
memory planner's cheapest set-ups and the accelerator table.

Every function takes a result of :mod:`memlab.compute` (the dataclass; a record's is
``Record.value()``) and returns the ``Figure``. A one-panel function draws on ``ax`` when one is
given (and returns its figure), a several-panel one on ``axes``; otherwise it makes its own
figure. What a figure computes itself comes from formulas (the FLOP counts of
:func:`flops_over_seq_len`, a fitted law's compute-optimal split); nothing here runs a step or
measures.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from memlab.compute.accumulation import AccumulationBuffer, AccumulationSweep
from memlab.compute.checkpointing import CheckpointCosts, CheckpointCurve
from memlab.compute.flops import matmul_parameters, palm_flops, six_nd, step_flops
from memlab.compute.grid import (
    ScalingGrid,
)
from memlab.compute.hardware import ACCELERATORS, Accelerator, get_accelerator
from memlab.compute.offload import OffloadTable
from memlab.compute.plan import MemoryPlan
from memlab.compute.scaling import (
    CHINCHILLA_FLOPS_QUOTED,
    CHINCHILLA_PARAMS_QUOTED,
    HOFFMANN_URL,
    PUBLISHED,
    budget_key,
    compute_optimal,
    n_opt_exponent,
)
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.transformer import ModelConfig, get_config
from memlab.plot.style import style
from memlab.units import UNITS, to_unit

# The three named plans of a checkpointing curve: colour, marker.
PLAN_STYLE = {"none": ("black", "o"), "selective": ("tab:purple", "s"), "full": ("tab:red", "D")}
# every-K and segments-K: one line each through their K.
KIND_STYLE = {"every": ("tab:blue", "o"), "segments": ("tab:orange", "s")}
CURVE_MEMORY = {"backward": ("backward_peak_bytes", "backward-phase peak"),
                "saved": ("saved_bytes", "saved activations"),
                "peak": ("peak_bytes", "step's peak")}
TRAINS_COLORS = {"full": "tab:red", "lora": "tab:blue", "qlora": "tab:green"}
VENDOR_COLORS = {"NVIDIA": "#76B900", "AMD": "#ED1C24", "Google": "#4285F4", "AWS": "#FF9900"}
MEASURED_COLOR, ESTIMATED_COLOR, COUNTED_COLOR = "tab:blue", "black", "0.55"

HOFFMANN_PARAMS_RANGE_QUOTED = (70e6, 16e9)
"""Smallest and largest parameter counts Hoffmann et al. 2022 trained ("from 70 million to over
16 billion parameters", the abstract of arXiv:2203.15556, :data:`HOFFMANN_RANGE_SOURCE`): the
range a quoted fit's N_opt(C) is drawn solid over (chapter: 7)."""
HOFFMANN_RANGE_SOURCE = HOFFMANN_URL


# Helpers -------------------------------------------------------------------------------------
def _check(obj, cls: type, what: str):
    """``obj`` if it is a ``cls``, else a one-line MemlabError."""
    if isinstance(obj, cls):
        return obj
    raise MemlabError(f"{what} must be {_a(cls.__name__)}, got {type(obj).__name__}")


def _a(name: str) -> str:
    return ("an " if name[0].lower() in "aeiou" else "a ") + name


def _unit(unit: str | None, largest: float) -> tuple[str, int]:
    unit = unit or ("GiB" if largest >= 2**30 else "MiB")
    return unit, UNITS[check_choice("unit", unit, UNITS)]


def _one_ax(ax, figsize: tuple[float, float]):
    """(figure, axes, whether this call made the figure)."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax, True
    if not isinstance(ax, Axes):
        raise MemlabError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__}")
    return ax.figure, ax, False


def _many_axes(axes, n: int, figsize: tuple[float, float]):
    """(figure, list of n axes, whether this call made the figure)."""
    if axes is None:
        fig, made = plt.subplots(1, n, figsize=figsize, squeeze=False)
        return fig, list(made[0]), True
    flat = list(np.ravel(np.asarray(axes, dtype=object))) if not isinstance(axes, Axes) \
        else [axes]
    if len(flat) != n or not all(isinstance(a, Axes) for a in flat):
        raise MemlabError(f"axes must be {n} matplotlib Axes or None, got "
                          f"{len(flat)} of {', '.join(sorted({type(a).__name__ for a in flat}))}")
    return flat[0].figure, flat, False


def _finish(fig, made: bool, title: str | None, default: str, ax: Axes | None = None) -> None:
    """The figure's title (on ``ax`` for one panel, else above all) and its layout.

    A given ``title`` is set as it is; the ``default`` is wrapped to the width it sits over. On
    axes the caller made, a several-panel figure gets no title above all unless one is given.
    """
    if made:
        fig.tight_layout()
    if title is None:
        width = fig.get_figwidth() * (ax.get_position().width if ax is not None else 1.0)
        title = textwrap.fill(" ".join(default.split()), max(30, int(width * 72 / 6.5)))
    elif ax is None and not made:
        fig.suptitle(title, fontsize=10)
        return
    if ax is not None:
        ax.set_title(title, fontsize=10)
    elif made:
        fig.suptitle(title, fontsize=10)
    if made:
        fig.tight_layout()


def _plain_log_ticks(axis) -> None:
    """Ticks of a log axis at 1, 2 and 5 times the powers of ten, written as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _label_points(ax, points: Sequence[tuple[float, float, str]], color, min_px: float = 11.0,
                  taken: list | None = None) -> list:
    """Annotate points (x, y, text), leaving out a label closer than ``min_px`` to one placed."""
    taken = [] if taken is None else taken
    for x, y, text in points:
        px, py = ax.transData.transform((x, y))
        if any(math.hypot(px - qx, py - qy) < min_px for qx, qy in taken):
            continue
        taken.append((px, py))
        ax.annotate(text, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7,
                    color=color)
    return taken


# 1. FLOPs against the rules ----------------------------------------------------------------
def _configs(models) -> list[ModelConfig]:
    if isinstance(models, (str, ModelConfig)):
        models = [models]
    if not isinstance(models, Iterable):
        raise MemlabError(f"models must be a preset name, a ModelConfig or a sequence of them, "
                          f"got {type(models).__name__}")
    out = []
    for m in models:
        if isinstance(m, str):
            out.append(get_config(m))
        elif isinstance(m, ModelConfig):
            out.append(m)
        else:
            raise MemlabError(f"models must be preset names or ModelConfigs, got "
                              f"{type(m).__name__}")
    if not out:
        raise MemlabError("flops_over_seq_len needs at least one model")
    return out


def flops_over_seq_len(models, seq_lens, ax=None, title: str | None = None):
    """Counted FLOPs of a step (batch 1) over 6ND, and PaLM's (6N + 12LCT)D over 6ND, against the sequence length, a line pair per model (chapter: 7).

    ``models``: preset names or configs; ``seq_lens``: sequence lengths T in tokens. The counted
    FLOPs are :func:`memlab.compute.flops.step_flops` (the count PyTorch's FlopCounterMode
    makes, written down from the shapes; no step is run), N is
    :func:`~memlab.compute.flops.matmul_parameters` and D = T tokens. A model's lines stop at
    its ``max_seq_len``. The horizontal line at 1 is 6ND itself.
    """
    cfgs = _configs(models)
    if isinstance(seq_lens, int) and not isinstance(seq_lens, bool):
        seq_lens = [seq_lens]
    if not isinstance(seq_lens, Iterable) or isinstance(seq_lens, str):
        raise MemlabError(f"seq_lens must be a sequence of positive integers, got "
                          f"{type(seq_lens).__name__}")
    Ts = sorted({check_positive_int("seq_len", T) for T in seq_lens})
    if not Ts:
        raise MemlabError("flops_over_seq_len needs at least one sequence length")
    style()
    fig, ax, made = _one_ax(ax, (7.0, 4.2))
    for i, cfg in enumerate(cfgs):
        own = [T for T in Ts if cfg.max_seq_len >= T]
        if not own:
            raise MemlabError(f"no sequence length fits model {cfg.name!r} (max_seq_len "
                              f"{cfg.max_seq_len}); got {', '.join(map(str, Ts))}")
        n = matmul_parameters(cfg)
        rule = [six_nd(n, T) for T in own]
        counted = [step_flops(cfg, batch_size=1, seq_len=T).total / r
                   for T, r in zip(own, rule, strict=True)]
        palm = [palm_flops(cfg, T, T) / r for T, r in zip(own, rule, strict=True)]
        color = f"C{i}"
        ax.plot(own, counted, "o-", color=color, markersize=4,
                label=f"{cfg.name}: counted ({cfg.attention})")
        ax.plot(own, palm, "--", color=color, label=f"{cfg.name}: PaLM's (6N + 12LCT)D")
    ax.axhline(1.0, color="0.3", lw=1, linestyle=":", label="6ND")
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ts, [f"{T:,}" for T in Ts], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("sequence length T (tokens), batch 1")
    ax.set_ylabel("training FLOPs / 6ND")
    ax.legend(fontsize=8)
    _finish(fig, made, title, "Training FLOPs over 6ND: counted (FlopCounterMode's count, "
                                "from the shapes) and PaLM's formula", ax)
    return fig


# 2. The checkpointing curve ------------------------------------------------------------------


def checkpoint_curve(curve, ax=None, memory: str = "backward", unit: str | None = None,
                     title: str | None = None):
    """Each checkpointing plan's memory (estimated) against the FLOPs it adds (counted, %), every-K and segments-K as lines, Chen et al.'s sqrt(n) plan marked (chapter: 7).

    ``curve`` is a :class:`memlab.compute.checkpointing.CheckpointCurve`; ``memory`` is
    ``'backward'`` (the backward pass's peak, where recomputed blocks live), ``'saved'`` (the
    activations saved for the backward pass) or ``'peak'`` (the step's). The x position is the
    FLOPs PyTorch's checkpoint does with its default early stop; the faint crosses, at the same
    height, are each plan's FLOPs with every recomputation run to its end.
    """
    curve = _check(curve, CheckpointCurve, "curve")
    field, what = CURVE_MEMORY[check_choice("memory", memory, tuple(CURVE_MEMORY))]
    rows = list(curve.rows)
    if not rows:
        raise MemlabError("checkpoint_curve needs a curve with at least one row")
    unit, scale = _unit(unit, max(getattr(r, field) for r in rows))
    style()
    fig, ax, made = _one_ax(ax, (9.0, 4.6))

    def xy(r) -> tuple[float, float]:
        return 100 * r.recompute_share, getattr(r, field) / scale

    by_name = {r.plan: r for r in rows}
    top = max(getattr(r, field) for r in rows) / scale
    right = max(100 * r.recompute_share_whole for r in rows)
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.set_xlim(-0.04 * right - 0.5, right * 1.08 + 0.5)
    ax.plot([100 * r.recompute_share_whole for r in rows],
            [getattr(r, field) / scale for r in rows], linestyle="none", marker="x", markersize=5,
            color="0.6", alpha=0.6, zorder=2,
            label="each plan, recomputation run to its end (early stop off)")
    labels = {}
    for kind, (color, marker) in KIND_STYLE.items():
        sel = sorted(((parse_checkpointing(n).k, r) for n, r in by_name.items()
                      if parse_checkpointing(n).kind == kind), key=lambda p: p[0])
        if not sel:
            continue
        pts = [xy(r) for _, r in sel]
        ax.plot(*zip(*pts, strict=True), marker=marker, color=color, markersize=4.5, lw=1.4,
                zorder=3, label=f"{kind}-K (label: K)")
        labels[kind] = [(x, y, str(k)) for (k, _), (x, y) in zip(sel, pts, strict=True)]
    taken = []
    for name, (color, marker) in PLAN_STYLE.items():
        if name in by_name:
            x, y = xy(by_name[name])
            ax.plot([x], [y], linestyle="none", marker=marker, markersize=7, color=color,
                    zorder=4, label=name)
            ax.annotate(name, (x, y), xytext=(5, -11), textcoords="offset points", fontsize=8,
                        color=color)
            taken.append(tuple(ax.transData.transform((x, y))))
    root = curve.sqrt_plan
    if root in by_name:
        x, y = xy(by_name[root])
        ax.plot([x], [y], linestyle="none", marker="*", markersize=15, markerfacecolor="none",
                markeredgecolor="black", zorder=5, label=f"Chen et al.'s sqrt(n) plan ({root})")
        ax.annotate(f"sqrt(n): {root}", (x, y), xytext=(-12, 20), textcoords="offset points",
                    ha="right", fontsize=8, arrowprops=dict(arrowstyle="-", color="0.3", lw=0.8))
    for kind, pts in labels.items():  # the K of a point crowded by others is left out
        _label_points(ax, pts, KIND_STYLE[kind][0], taken=taken)
    ax.set_xlabel("FLOPs added by recomputation, counted (% of the step without it)")
    ax.set_ylabel(f"{what}, estimated ({unit})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    s = curve.setup
    _finish(fig, made, title, (
        f"Checkpointing plans of {s['model']}, batch {s['batch_size']} x {s['seq_len']}, "
        f"{s['precision']}: {what} (estimated) against FLOPs added (counted)"), ax)
    return fig


# 3. Checkpointing measured -------------------------------------------------------------------


def checkpoint_costs(costs, axes=None, unit: str | None = None, whole: bool = False,
                     title: str | None = None):
    """Two panels per checkpointing plan: saved bytes (measured bars, estimated markers); time ratio (measured) beside FLOPs ratio (counted) against no checkpointing (chapter: 7).

    ``costs`` is a :class:`memlab.compute.checkpointing.CheckpointCosts`; it must hold the plan
    ``none``, which the ratios divide by. ``whole=True`` shows the ratios with every
    recomputation run to its end (the early stop of PyTorch's checkpoint turned off).
    """
    costs = _check(costs, CheckpointCosts, "costs")
    if not isinstance(whole, bool):
        raise MemlabError(f"whole must be True or False, got {whole!r}")
    plans = list(costs.plans)
    names = [p.plan for p in plans]
    if "none" not in names:
        raise MemlabError("checkpoint_costs divides by the plan 'none'; plans: " + ", ".join(names))
    none = plans[names.index("none")]
    ms, fl = ("step_ms_whole", "flops_whole") if whole else ("step_ms", "flops")
    time_x = [getattr(p, ms) / none.step_ms for p in plans]
    flops_x = [getattr(p, fl) / none.flops for p in plans]
    unit, scale = _unit(unit, max(max(p.saved_bytes, p.estimated_saved_bytes)
                                  for p in plans))
    style()
    fig, (ax, ax2), made = _many_axes(axes, 2, (10.5, 4.0))
    xs = np.arange(len(plans))
    ax.bar(xs, [p.saved_bytes / scale for p in plans], width=0.6, color=MEASURED_COLOR,
           label="measured")
    ax.plot(xs, [p.estimated_saved_bytes / scale for p in plans], linestyle="none",
            marker="v", markersize=8, color=ESTIMATED_COLOR, zorder=4, label="estimated")
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_ylabel(f"saved activations ({unit})")
    ax.set_title("bytes saved for the backward pass", fontsize=9)
    ax.legend(fontsize=8)
    w = 0.38
    ax2.bar(xs - w / 2, time_x, width=w, color=MEASURED_COLOR, label="time per step, measured")
    ax2.bar(xs + w / 2, flops_x, width=w, color=COUNTED_COLOR, label="FLOPs, counted")
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_xticks(xs, names, fontsize=8)
    ax2.set_ylabel("ratio to no checkpointing")
    ax2.set_title("cost against 'none'" + (" (early stop off)" if whole else ""), fontsize=9)
    ax2.legend(fontsize=8, loc="upper left")
    s = costs.setup
    _finish(fig, made, title, (
        f"Checkpointing {s['model']} ({s['parameters']:,} parameters) on "
        f"{costs.device} ({costs.scale} scale), batch {s['batch_size']} x "
        f"{s['seq_len']}, {s['precision']}: bytes and time measured, FLOPs counted"))
    return fig


# 4-5. Gradient accumulation ----------------------------------------------------------------


def accumulation_sweep(sweep, axes=None, unit: str | None = None, title: str | None = None):
    """Peak bytes per micro-batch size (measured bars, estimated markers) and ms per sample (measured) of one global batch (chapter: 7).

    ``sweep`` is a :class:`memlab.compute.accumulation.AccumulationSweep`; a bar is labelled
    ``m x k``: micro-batches of m samples, k of them per optimizer step.
    """
    sweep = _check(sweep, AccumulationSweep, "sweep")
    rows = list(sweep.rows)
    if not rows:
        raise MemlabError("accumulation_sweep needs a sweep with at least one row")
    unit, scale = _unit(unit, max(max(r.measured_peak_bytes,
                                      r.estimated_peak_bytes) for r in rows))
    style()
    fig, (ax, ax2), made = _many_axes(axes, 2, (10.0, 3.9))
    xs = np.arange(len(rows))
    ticks = [f"{r.micro_batch} x {r.grad_accum_steps}" for r in rows]
    ax.bar(xs, [r.measured_peak_bytes / scale for r in rows], width=0.6,
           color=MEASURED_COLOR, label="measured")
    ax.plot(xs, [r.estimated_peak_bytes / scale for r in rows], linestyle="none",
            marker="v", markersize=8, color=ESTIMATED_COLOR, zorder=4, label="estimated")
    ax.set_xticks(xs, ticks)
    ax.set_xlabel("micro-batch size m x micro-batches k")
    ax.set_ylabel(f"peak of a step ({unit})")
    ax.set_title("peak bytes", fontsize=9)
    ax.legend(fontsize=8, loc="lower left")
    ax2.bar(xs, [r.ms_per_sample for r in rows], width=0.6, color=MEASURED_COLOR,
            label="measured")
    ax2.set_xticks(xs, ticks)
    ax2.set_xlabel("micro-batch size m x micro-batches k")
    ax2.set_ylabel("time per sample, measured (ms)")
    ax2.set_title("time per sample (median step / global batch)", fontsize=9)
    _finish(fig, made, title, (
        f"Gradient accumulation on {sweep.device}: {sweep.model} "
        f"({sweep.parameters:,} parameters), global batch {sweep.global_batch} "
        f"x seq {sweep.seq_len}, {sweep.precision}"))
    return fig




def accumulation_buffer(buffer, ax=None, title: str | None = None):
    """Relative error of k accumulated bf16 micro-batch gradients against their fp64 sum, in bf16 .grad and in an fp32 buffer, log y (chapter: 7).

    ``buffer`` is a :class:`memlab.compute.accumulation.AccumulationBuffer`, errors measured. An
    error of exactly 0 (k = 1, where nothing is added, or a sum that came out exact) has no
    place on a log axis and is left out; the
    dotted line is bf16's unit roundoff, half its machine epsilon.
    """
    buffer = _check(buffer, AccumulationBuffer, "buffer")
    rows = sorted(buffer.rows, key=lambda r: r.micro_batches)
    if not rows:
        raise MemlabError("accumulation_buffer needs a result with at least one row")
    style()
    fig, ax, made = _one_ax(ax, (6.6, 4.0))
    ks = [r.micro_batches for r in rows]
    for field, label, color, marker in (
            ("bf16_grad_error", "bf16 .grad (autograd adds in bf16)", "tab:red", "o"),
            ("fp32_buffer_error", "fp32 buffer (main_grad)", "tab:blue", "s")):
        pts = [(k, getattr(r, field)) for k, r in zip(ks, rows, strict=True) if getattr(r, field) > 0]
        xs, ys = ([p[0] for p in pts], [p[1] for p in pts])
        ax.plot(xs, ys, marker=marker, color=color, label=label)
    u = torch.finfo(torch.bfloat16).eps / 2
    ax.axhline(u, color="0.4", lw=1, linestyle=":", label=f"bf16 unit roundoff u = 2^{math.log2(u):g}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("micro-batches k")
    ax.set_ylabel("relative L2 error, measured (vs fp64 sum)")
    ax.legend(fontsize=8)
    extra = buffer.extra_bytes_measured
    _finish(fig, made, title, (
        f"Accumulating bf16 gradients on {buffer.device}: {buffer.model}, "
        f"micro-batch {buffer.micro_batch_size} x seq {buffer.seq_len}; "
        f"the fp32 buffer costs {extra:,} bytes measured "
        f"({buffer.extra_bytes_counted:,} counted)"), ax)
    return fig


# 6. Offload --------------------------------------------------------------------------------


def offload_costs(table, ax=None, title: str | None = None):
    """Per offload choice: seconds over the host link beside seconds of compute per step (estimated bars, log y), with its verdict (chapter: 7).

    ``table`` is a :class:`memlab.compute.offload.OffloadTable`: the transfer at the quoted link
    bandwidth, the compute at a quoted peak times an assumed MFU, both estimated. A row that moves
    nothing has no transfer bar. Each tick names the per-GPU peak (estimated).
    """
    table = _check(table, OffloadTable, "table")
    rows = list(table.rows)
    if not rows:
        raise MemlabError("offload_costs needs a table with at least one row")
    style()
    fig, ax, made = _one_ax(ax, (7.0, 4.2))
    xs = np.arange(len(rows))
    w = 0.38
    moved = [(x, r.transfer_s) for x, r in zip(xs, rows, strict=True)
             if r.transfer_s > 0]
    ax.bar([x - w / 2 for x, _ in moved], [s for _, s in moved], width=w, color="tab:orange",
           label=f"transfer over {table.link}, estimated")
    ax.bar(xs + w / 2, [r.compute_s for r in rows], width=w, color=COUNTED_COLOR,
           label=f"compute at MFU {table.mfu:.0%}, estimated")
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    seconds = [r.compute_s for r in rows] + [s for _, s in moved]
    top = max(seconds)
    for x, r in zip(xs, rows, strict=True):
        ratio = r.transfer_over_compute
        text = r.verdict + (f"\ntransfer / compute {ratio:.2f}" if ratio else "")
        ax.text(x, top * 2.0, text, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(min(seconds) / 5, top * 60)  # a log axis has no 0: the bars start below
    ax.set_xticks(xs, [f"{r.offload}, ZeRO-{r.zero_stage}\npeak "
                       f"{to_unit(r.per_gpu_peak_bytes, 'GiB'):.1f} GiB" for r in rows],
                  fontsize=8)
    ax.set_ylabel("seconds per step (s)")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    _finish(fig, made, title, (
        f"Offload, estimated: {table.model} ({table.parameters:,} parameters) "
        f"on one of {table.gpus} {table.gpu}, batch {table.batch_size}"
        f" x {table.seq_len} per GPU, {table.precision}; link "
        f"{table.link_bytes_per_s / UNITS['GB']:g} GB/s and peak "
        f"{table.peak_flops / 1e12:g} TFLOP/s quoted"), ax)
    return fig


# 7. The scaling law --------------------------------------------------------------------------


def _n_opt_line(ax, fit, flops: np.ndarray, **kw) -> bool:
    """N_opt(C) of a law over ``flops``; False where the law has no optimum."""
    try:
        ns = [compute_optimal(fit, float(c)).n_opt for c in flops]
        a = n_opt_exponent(fit)
    except MemlabError:
        return False
    ax.plot(flops, ns, label=f"{kw.pop('label')}: N_opt ~ C^{a:.2f}", **kw)
    return True


def scaling_fit(grid, axes=None, title: str | None = None):
    """Held-out loss against tokens with the E-free fit; the grid's compute-optimal N against C; the quoted fits' N_opt(C) in a panel of their own (chapter: 7).

    ``grid`` is a :class:`memlab.compute.grid.ScalingGrid`. Left: the measured held-out loss
    of every run (one colour per model size) against its tokens, the E-free fit of L(N, D) as
    lines, the task's entropy (exact) dashed and the fitted E dotted with its bootstrap
    interval shaded. Middle: N_opt(C) of both fits (E free, E fixed to the entropy) over the
    grid's FLOPs, the grid's budgets marked with their bootstrap intervals, the runs as grey
    dots. Right: the quoted fits (:data:`memlab.compute.scaling.PUBLISHED`), solid where their
    N_opt lies inside the parameter range Hoffmann et al. trained
    (:data:`HOFFMANN_PARAMS_RANGE_QUOTED`), dashed on to Chinchilla's quoted budget, Chinchilla
    itself marked.

    The quoted fits get a panel of their own, not the middle one's axes: their budgets lie
    about fourteen decades of FLOPs above the grid's and their losses are of another task and
    tokenizer, so on one axis only the slopes (the exponents in the legends) would compare, and
    a shared line would read as an extrapolation from one to the other.
    """
    grid = _check(grid, ScalingGrid, "grid")
    runs = list(grid.runs)
    if not runs:
        raise MemlabError("scaling_fit needs a grid with at least one run")
    free, fixed = grid.fit_free, grid.fit_fixed
    entropy = grid.entropy_nats
    style()
    fig, (ax, ax2, ax3), made = _many_axes(axes, 3, (14.5, 4.4))

    # Left: loss against tokens.
    sizes = sorted({r.n_params for r in runs})
    cmap = plt.get_cmap("viridis")
    tokens = np.array([r.tokens for r in runs], dtype=np.float64)
    dense = np.geomspace(tokens.min(), tokens.max(), 64)
    for i, n in enumerate(sizes):
        color = cmap(0.1 + 0.75 * i / max(1, len(sizes) - 1))
        sel = sorted((r for r in runs if r.n_params == n), key=lambda r: r.tokens)
        ax.plot([r.tokens for r in sel], [r.loss for r in sel], linestyle="none",
                marker="o", color=color, label=f"N = {n:,}, measured")
        ax.plot(dense, free.predict(np.full_like(dense, n), dense), "-", color=color, lw=1.2)
    ax.axhline(entropy, color="black", linestyle="--", lw=1,
               label=f"task entropy {entropy:.3f} nats (exact)")
    lo, hi = grid.boot_free.intervals["E"]
    ax.axhline(free.E, color="0.4", linestyle=":", lw=1.2,
               label=f"fitted E {free.E:.3f} [{lo:.3f}, {hi:.3f}]")
    if math.isfinite(lo) and math.isfinite(hi):
        ax.axhspan(lo, hi, color="0.5", alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_xlabel("tokens seen in training D")
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title("loss against tokens; lines: the E-free fit", fontsize=9)
    ax.legend(fontsize=7)

    # Middle: the grid's fits, compute-optimal N against C.
    flops = np.array([r.flops for r in runs], dtype=np.float64)
    span = np.geomspace(flops.min(), flops.max(), 64)
    ax2.plot(flops, [r.n_params for r in runs], linestyle="none", marker=".",
             color="0.7", label="runs of the grid")
    missing = []
    for fit, boot_key, opt_key, label, color in (
            (free, "boot_free", "optimal_free", "E free", "tab:blue"),
            (fixed, "boot_fixed", "optimal_fixed", "E fixed to the entropy", "tab:red")):
        if not _n_opt_line(ax2, fit, span, color=color, label=label):
            missing.append(label)
            continue
        opts = list(getattr(grid, opt_key))
        intervals = getattr(grid, boot_key).intervals
        cs = [o.flops for o in opts]
        ns = [o.n_opt for o in opts]
        bands = [intervals.get(budget_key("n_opt", c), (math.nan, math.nan)) for c in cs]
        err = np.array([[max(n - b[0], 0.0) if math.isfinite(b[0]) else 0.0 for n, b in
                         zip(ns, bands, strict=True)],
                        [max(b[1] - n, 0.0) if math.isfinite(b[1]) else 0.0 for n, b in
                         zip(ns, bands, strict=True)]])
        if cs:
            ax2.errorbar(cs, ns, yerr=err, linestyle="none", marker="o", markersize=4,
                         color=color, capsize=3)
    if missing:
        ax2.text(0.02, 0.98, "no optimum: " + ", ".join(missing), transform=ax2.transAxes,
                 va="top", fontsize=8)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("compute budget C = 6ND (FLOPs)")
    ax2.set_ylabel("compute-optimal parameters N_opt")
    ax2.set_title("this grid's fits (bars: bootstrap intervals)", fontsize=9)
    ax2.legend(fontsize=7)

    # Right: the quoted fits over their own range.
    n_lo, n_hi = HOFFMANN_PARAMS_RANGE_QUOTED
    for i, law in enumerate(PUBLISHED.values()):
        a = n_opt_exponent(law)
        g = compute_optimal(law, 6.0).n_opt  # N_opt at C = 6, i.e. C / 6 = 1: the constant G
        c_lo, c_hi = 6 * (n_lo / g) ** (1 / a), 6 * (n_hi / g) ** (1 / a)
        color = f"C{i + 2}"
        inside = np.geomspace(c_lo, c_hi, 32)
        _n_opt_line(ax3, law, inside, color=color, label=f"{law.name} ({law.label})")
        if c_hi < CHINCHILLA_FLOPS_QUOTED:
            beyond = np.geomspace(c_hi, CHINCHILLA_FLOPS_QUOTED, 16)
            ax3.plot(beyond, [compute_optimal(law, float(c)).n_opt for c in beyond], "--",
                     color=color, lw=1)
    ax3.plot([CHINCHILLA_FLOPS_QUOTED], [CHINCHILLA_PARAMS_QUOTED], linestyle="none", marker="*",
             markersize=11, color="black", label="Chinchilla (quoted)")
    ax3.set_xscale("log")
    ax3.set_yscale("log")
    ax3.set_xlabel("compute budget C (FLOPs)")
    ax3.set_ylabel("compute-optimal parameters N_opt")
    ax3.set_title("quoted fits (dashed: past the sizes they trained)", fontsize=9)
    ax3.legend(fontsize=7, loc="upper left")
    _finish(fig, made, title, (
        f"A scaling law fitted on {len(runs)} runs measured on {grid.device}, beside "
        "the quoted fits"))
    return fig


# 8. The planner ------------------------------------------------------------------------------


def plan_costs(plan, limit: int = 12, ax=None, title: str | None = None):
    """The cheapest set-ups of a memory plan: estimated GPU-seconds per optimizer step as bars, each with its per-GPU peak (chapter: 7).

    ``plan`` is a :class:`memlab.compute.plan.MemoryPlan`; its ``limit`` cheapest rows are drawn,
    the cheapest on top, coloured by what trains (full, LoRA, QLoRA). The GPU's usable memory is
    in the title.
    """
    plan = _check(plan, MemoryPlan, "plan")
    check_positive_int("limit", limit)
    rows = list(plan.rows)[:limit]
    usable = to_unit(plan.usable_bytes, "GiB")
    style()
    fig, ax, made = _one_ax(ax, (10.0, 0.38 * max(len(rows), 3) + 1.8))
    ys = np.arange(len(rows))
    costs = [r.gpu_seconds for r in rows]
    ax.barh(ys, costs, height=0.7, color=[TRAINS_COLORS[r.trains] for r in rows])
    for y, r, c in zip(ys, rows, costs, strict=True):
        ax.text(c, y, f" {to_unit(r.per_gpu_peak_bytes, 'GiB'):.1f} GiB", va="center",
                fontsize=7)
    if not rows:
        ax.text(0.5, 0.5, f"nothing fits: the smallest per-GPU peak is "
                f"{to_unit(plan.smallest_peak_bytes, 'GiB'):.1f} GiB\n"
                f"({plan.smallest_peak_label})", transform=ax.transAxes, ha="center",
                va="center", fontsize=9)
    ax.set_yticks(ys, [r.label for r in rows], fontsize=7)
    ax.invert_yaxis()
    if costs:
        ax.set_xlim(0, max(costs) * 1.18)
    ax.set_xlabel("GPU-seconds per optimizer step, estimated (s)")
    import matplotlib.patches as patches

    shown = [t for t in TRAINS_COLORS if any(r.trains == t for r in rows)]
    if shown:
        ax.legend(handles=[patches.Patch(color=TRAINS_COLORS[t], label=t) for t in shown],
                  fontsize=8, loc="upper right")
    _finish(fig, made, title, (
        f"Cheapest set-ups for {plan.model} on {plan.gpu} ({usable:.1f} GiB "
        f"usable), global batch {plan.global_batch} x {plan.seq_len}: "
        f"estimated (MFU {plan.mfu:.0%}, no overlap); at each bar: its per-GPU peak"), ax)
    return fig


# 9. Accelerators -----------------------------------------------------------------------------


def _accelerator_rows(rows) -> list:
    if rows is None:
        return list(ACCELERATORS)
    if isinstance(rows, (str, Accelerator)) or not isinstance(rows, Iterable):
        rows = [rows]
    out = []
    for r in rows:
        if isinstance(r, str):
            r = get_accelerator(r)
        out.append(_check(r, Accelerator, "accelerator row"))
    if not out:
        raise MemlabError("accelerators needs at least one row")
    return out


def accelerators(rows=None, ax=None, title: str | None = None):
    """Quoted memory (GiB) against quoted dense 16-bit TFLOP/s of each accelerator, a colour per vendor, names annotated (chapter: 7).

    ``rows``: :class:`~memlab.compute.hardware.Accelerator` objects or their names (the default:
    every row of :data:`~memlab.compute.hardware.ACCELERATORS`). A hollow marker is a
    part whose 16-bit peak is fp16 (no bf16 rate). Both axes are logarithmic; a name close to an
earlier one is written below its point.
    """
    rows = _accelerator_rows(rows)
    style()
    fig, ax, made = _one_ax(ax, (7.4, 4.8))
    vendors: list[str] = []
    placed: list[tuple[float, float]] = []
    for r in rows:
        vendor = r.vendor
        color = VENDOR_COLORS.get(vendor, "0.4")
        x = r.dense_16bit_flops_per_s / 1e12
        y = to_unit(r.memory_bytes, "GiB")
        bf16 = r.dense_16bit_format == "bf16"
        ax.plot([x], [y], linestyle="none", marker="o", markersize=7, color=color,
                markerfacecolor=color if bf16 else "none")
        if vendor not in vendors:
            vendors.append(vendor)
        # A name near another's goes below its point, not on top of the first.
        near = sum(abs(math.log(x / px)) < 0.12 and abs(math.log(y / py)) < 0.12
                   for px, py in placed)
        placed.append((x, y))
        ax.annotate(r.name, (x, y), xytext=(5, 3 - 10 * near),
                    textcoords="offset points", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        _plain_log_ticks(axis)
    ax.set_xlabel("dense 16-bit peak, quoted (TFLOP/s)")
    ax.set_ylabel("memory, quoted (GiB)")
    handles = [Line2D([], [], linestyle="none", marker="o", color=VENDOR_COLORS.get(v, "0.4"),
                      label=v) for v in vendors]
    handles.append(Line2D([], [], linestyle="none", marker="o", color="0.4",
                          markerfacecolor="none", label="fp16 peak (no bf16 rate)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    _finish(fig, made, title, "Accelerators: memory and dense 16-bit peak, quoted from "
                                "datasheets and vendors' documentation", ax)
    return fig
