"""Figures of chapter 7 on one step's compute for its memory: FLOPs against the rules,
checkpointing's bytes against its FLOPs and time, and gradient accumulation.

Every function takes a result of :mod:`memlab.compute` (the dataclass; a record's is
``Record.value()``) and returns the ``Figure``. A one-panel function draws on ``ax`` when one is
given (and returns its figure), a several-panel one on ``axes``; otherwise it makes its own
figure. What a figure computes itself comes from formulas (the FLOP counts of
:func:`flops_over_seq_len`); nothing here runs a step or measures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch

from memlab.compute.accumulation import AccumulationBuffer, AccumulationSweep
from memlab.compute.checkpointing import CheckpointCosts, CheckpointCurve
from memlab.compute.flops import matmul_parameters, palm_flops, six_nd, step_flops
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import ModelConfig, get_config
from memlab.plot.alt import describe
from memlab.plot.panels import (
    COUNTED_COLOR,
    ESTIMATED_COLOR,
    MEASURED_COLOR,
    check_type,
    finish,
    label_points,
    many_axes,
    one_ax,
    pick_unit,
)
from memlab.plot.style import MAX_FIGURE_WIDTH_IN, style

# The three named plans of a checkpointing curve: colour, marker.
PLAN_STYLE = {"none": ("black", "o"), "selective": ("tab:purple", "s"), "full": ("tab:red", "D")}
# every-K and segments-K: one line each through their K.
KIND_STYLE = {"every": ("tab:blue", "o"), "segments": ("tab:orange", "s")}
CURVE_MEMORY = {"backward": ("backward_peak_bytes", "backward-phase peak"),
                "saved": ("saved_bytes", "saved activations"),
                "peak": ("peak_bytes", "step's peak")}


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
    """Counted FLOPs of a step (batch 1) over 6ND against the sequence length (chapter: 7).

    Also PaLM's (6N + 12LCT)D over 6ND, a line pair per model.

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
    fig, ax, made = one_ax(ax, (7.0, 4.2))
    said = []
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
        said.append(f"{cfg.name} {counted[0]:.2f} at {own[0]:,} tokens" + (
            f" to {counted[-1]:.2f} at {own[-1]:,}" if len(own) > 1 else ""))
    ax.axhline(1.0, color="0.3", lw=1, linestyle=":", label="6ND")
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ts, [f"{T:,}" for T in Ts], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("sequence length T (tokens), batch 1")
    ax.set_ylabel("training FLOPs / 6ND")
    ax.legend(fontsize=8)
    finish(fig, made, title, "Training FLOPs over 6ND: counted (FlopCounterMode's count, "
                                "from the shapes) and PaLM's formula", ax)
    return describe(fig, "Counted training FLOPs over 6ND, batch 1: " + "; ".join(said))


# 2. The checkpointing curve ------------------------------------------------------------------


def checkpoint_curve(curve, ax=None, memory: str = "backward", unit: str | None = None,
                     title: str | None = None):
    """Each checkpointing plan's memory against the FLOPs it adds (chapter: 7).

    Memory estimated, FLOPs counted (%); every-K and segments-K as lines, Chen et al.'s sqrt(n) plan
    marked.

    ``curve`` is a :class:`memlab.compute.checkpointing.CheckpointCurve`; ``memory`` is
    ``'backward'`` (the backward pass's peak, where recomputed blocks live), ``'saved'`` (the
    activations saved for the backward pass) or ``'peak'`` (the step's). The x position is the
    FLOPs PyTorch's checkpoint does with its default early stop; the faint crosses, at the same
    height, are each plan's FLOPs with every recomputation run to its end.
    """
    curve = check_type(curve, CheckpointCurve, "curve")
    field, what = CURVE_MEMORY[check_choice("memory", memory, tuple(CURVE_MEMORY))]
    rows = list(curve.rows)
    if not rows:
        raise MemlabError("checkpoint_curve needs a curve with at least one row")
    unit, scale = pick_unit(unit, max(getattr(r, field) for r in rows))
    style()
    fig, ax, made = one_ax(ax, (9.0, 4.6))

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
        label_points(ax, pts, KIND_STYLE[kind][0], taken=taken)
    ax.set_xlabel("FLOPs added by recomputation, counted (% of the step without it)")
    ax.set_ylabel(f"{what}, estimated ({unit})")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    s = curve.setup
    finish(fig, made, title, (
        f"Checkpointing plans of {s['model']}, batch {s['batch_size']} x {s['seq_len']}, "
        f"{s['precision']}: {what} (estimated) against FLOPs added (counted)"), ax)
    return describe(fig)


# 3. Checkpointing measured -------------------------------------------------------------------


def checkpoint_costs(costs, axes=None, unit: str | None = None, whole: bool = False,
                     title: str | None = None):
    """Two panels per checkpointing plan, against no checkpointing (chapter: 7).

    Saved bytes (measured bars, estimated markers); time ratio (measured) beside FLOPs ratio
    (counted).

    ``costs`` is a :class:`memlab.compute.checkpointing.CheckpointCosts`; it must hold the plan
    ``none``, which the ratios divide by. ``whole=True`` shows the ratios with every
    recomputation run to its end (the early stop of PyTorch's checkpoint turned off).
    """
    costs = check_type(costs, CheckpointCosts, "costs")
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
    unit, scale = pick_unit(unit, max(max(p.saved_bytes, p.estimated_saved_bytes)
                                  for p in plans))
    style()
    fig, (ax, ax2), made = many_axes(axes, 2, (MAX_FIGURE_WIDTH_IN, 7.6))
    xs = np.arange(len(plans))
    ax.bar(xs, [p.saved_bytes / scale for p in plans], width=0.6, color=MEASURED_COLOR,
           label="measured")
    ax.plot(xs, [p.estimated_saved_bytes / scale for p in plans], linestyle="none",
            marker="v", markersize=8, color=ESTIMATED_COLOR, zorder=4, label="estimated")
    ax.set_xticks(xs, names, fontsize=8)
    ax.set_ylabel(f"saved activations ({unit})")
    ax.set_title("bytes saved for the backward pass", fontsize=9)
    ax.legend(fontsize=9)
    w = 0.38
    ax2.bar(xs - w / 2, time_x, width=w, color=MEASURED_COLOR, label="time per step, measured")
    ax2.bar(xs + w / 2, flops_x, width=w, color=COUNTED_COLOR, label="FLOPs, counted")
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_xticks(xs, names, fontsize=8)
    ax2.set_ylabel("ratio to no checkpointing")
    ax2.set_title("cost against 'none'" + (" (early stop off)" if whole else ""), fontsize=9)
    ax2.legend(fontsize=9, loc="upper left")
    said = "; ".join(f"{p.plan} saves {p.saved_bytes / scale:,.3g} {unit} at {t:.2f}x the time "
                     f"and {f:.2f}x the FLOPs" for p, t, f in zip(plans, time_x, flops_x,
                                                                  strict=True))
    s = costs.setup
    finish(fig, made, title, (
        f"Checkpointing {s['model']} ({s['parameters']:,} parameters) on "
        f"{costs.device} ({costs.scale} scale), batch {s['batch_size']} x "
        f"{s['seq_len']}, {s['precision']}: bytes and time measured, FLOPs counted"))
    return describe(fig, f"Against no checkpointing, measured: {said}")


# 4-5. Gradient accumulation ----------------------------------------------------------------


def accumulation_sweep(sweep, axes=None, unit: str | None = None, title: str | None = None):
    """Peak bytes and ms per sample per micro-batch size of one global batch (chapter: 7).

    Peaks as measured bars with estimated markers; ms per sample measured.

    ``sweep`` is a :class:`memlab.compute.accumulation.AccumulationSweep`; a bar is labelled
    ``m x k``: micro-batches of m samples, k of them per optimizer step.
    """
    sweep = check_type(sweep, AccumulationSweep, "sweep")
    rows = list(sweep.rows)
    if not rows:
        raise MemlabError("accumulation_sweep needs a sweep with at least one row")
    unit, scale = pick_unit(unit, max(max(r.measured_peak_bytes,
                                      r.estimated_peak_bytes) for r in rows))
    style()
    fig, (ax, ax2), made = many_axes(axes, 2, (MAX_FIGURE_WIDTH_IN, 7.2))
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
    ax.legend(fontsize=9, loc="lower left")
    ax2.bar(xs, [r.ms_per_sample for r in rows], width=0.6, color=MEASURED_COLOR,
            label="measured")
    ax2.set_xticks(xs, ticks)
    ax2.set_xlabel("micro-batch size m x micro-batches k")
    ax2.set_ylabel("time per sample, measured (ms)")
    ax2.set_title("time per sample (median step / global batch)", fontsize=9)
    finish(fig, made, title, (
        f"Gradient accumulation on {sweep.device}: {sweep.model} "
        f"({sweep.parameters:,} parameters), global batch {sweep.global_batch} "
        f"x seq {sweep.seq_len}, {sweep.precision}"))
    return describe(fig)




def accumulation_buffer(buffer, ax=None, title: str | None = None):
    """Relative error of k accumulated bf16 micro-batch gradients (chapter: 7).

    Against their fp64 sum, in bf16 .grad and in an fp32 buffer, log y.

    ``buffer`` is a :class:`memlab.compute.accumulation.AccumulationBuffer`, errors measured. An
    error of exactly 0 (k = 1, where nothing is added, or a sum that came out exact) has no
    place on a log axis and is left out; the
    dotted line is bf16's unit roundoff, half its machine epsilon.
    """
    buffer = check_type(buffer, AccumulationBuffer, "buffer")
    rows = sorted(buffer.rows, key=lambda r: r.micro_batches)
    if not rows:
        raise MemlabError("accumulation_buffer needs a result with at least one row")
    style()
    fig, ax, made = one_ax(ax, (6.6, 4.0))
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
    finish(fig, made, title, (
        f"Accumulating bf16 gradients on {buffer.device}: {buffer.model}, "
        f"micro-batch {buffer.micro_batch_size} x seq {buffer.seq_len}; "
        f"the fp32 buffer costs {extra:,} bytes measured "
        f"({buffer.extra_bytes_counted:,} counted)"), ax)
    return describe(fig)
