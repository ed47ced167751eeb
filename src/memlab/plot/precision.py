"""Figures of chapter 2: loss curves, gradient histograms, memory by mode, format ranges and errors."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.errors import check_choice
from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, MAX_FIGURE_WIDTH_IN, as_dict, style
from memlab.units import UNITS

# Chapter 2: mixed precision ---------------------------------------------------------------------
MODE_COLORS = {
    "fp32": "#333333",
    "fp16-autocast": "#C44E52",
    "fp16-scaled": "#DD8452",
    "bf16-autocast": "#4C72B0",
    "bf16-pure": "#55A868",
}
# (category of a ModeMemory's phase_breakdown, label, colour), bottom to top, for memory_by_mode;
# 'weight_cast_cache' is the part of the activations that autocast's weight copies take.
MEMORY_PARTS = (
    ("parameters", "parameters", CATEGORY_COLORS["parameters"]),
    ("gradients", "gradients", CATEGORY_COLORS["gradients"]),
    ("optimizer_states", "optimizer states", CATEGORY_COLORS["optimizer_states"]),
    ("activations", "activations", CATEGORY_COLORS["activations"]),
    ("weight_cast_cache", "weight-cast cache (part of the activations)", "#E8A0A2"),
    ("temporaries", "temporaries", CATEGORY_COLORS["temporaries"]),
    ("other", "other (token ids, GradScaler state)", CATEGORY_COLORS["other"]),
)
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


def loss_curves(result, title: str | None = None):
    """Training loss (nats) per step for every mode, one panel per loss setting (chapter: 2).

    The best loss is dashed.
    """
    style()
    d = as_dict(result)
    settings = d["settings"]
    fig, axes = plt.subplots(len(settings), 1, figsize=(MAX_FIGURE_WIDTH_IN, 1.4 + 2.7 * len(settings)),
                             sharex=True, sharey=True, squeeze=False)
    best = d["task"]["entropy_nats"]
    for ax, s in zip(axes[:, 0], settings, strict=True):
        for run in s["runs"]:
            loss = [float("nan") if x is None else x for x in run["loss"]]
            color = MODE_COLORS.get(run["mode"], "0.5")
            ref = run["mode"] == "fp32"  # drawn thin and on top: the others overlap it
            ax.plot(range(len(loss)), loss, color=color, lw=1.0 if ref else 1.6,
                    label=run["mode"], ls="--" if run["mode"] == "fp16-scaled" else "-",
                    zorder=3 if ref else 2)
            skipped = run.get("skipped_steps") or []
            if skipped:
                ax.plot(skipped, [loss[i] for i in skipped], "x", color=color, ms=5,
                        label=f"{run['mode']}: skipped step")
        ax.axhline(best, color="0.5", ls=":", lw=1)
        ax.annotate("best possible (entropy of the chain)", (0.98, best), ha="right",
                    va="bottom", xycoords=("axes fraction", "data"), fontsize=8, color="0.4")
        ax.set_ylabel("training loss (nats)")
        divisor = s["loss_divisor"]
        ax.set_title(f"loss / {divisor:,}: {s['tokens_per_gradient']:,} tokens per gradient"
                     if divisor > 1 else f"mean over {s['tokens_per_gradient']:,} tokens",
                     fontsize=10)
    axes[-1][0].set_xlabel("step")
    handles = {}
    for ax in axes[:, 0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    ncol = 3
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, fontsize=9)
    if title:
        fig.suptitle(title, fontweight="bold")
    legend_in = 0.25 * -(-len(handles) // ncol) + 0.1
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    said = []
    for s in settings:
        last = {run["mode"]: next((x for x in reversed(run["loss"]) if x is not None), None)
                for run in s["runs"]}
        said.append(f"with {s['tokens_per_gradient']:,} tokens per gradient, the last step's "
                    "loss is " + ", ".join(f"{m} {v:.3f}" if v is not None else f"{m} none"
                                           for m, v in last.items()))
    return describe(fig, f"Training loss per step against the best possible {best:.3f} nats; "
                    + "; ".join(said))


def gradient_histogram(result, setting: str | None = None, mode: str = "fp32",
                       which: str = "activations", title: str | None = None):
    """Share of gradient values per log2|g| bin with fp16's limits marked (chapter: 2).

    As in Micikevicius et al. 2018, Fig. 3.

    One histogram per setting (or only ``setting``), of ``mode``'s run, for activation or
    parameter gradients; values left of fp16's smallest subnormal become zero in fp16.
    """
    import math

    style()
    check_choice("gradients", which, ("activations", "parameters"))
    d = as_dict(result)
    names = [s["name"] for s in d["settings"]]
    chosen = names if setting is None else [check_choice("setting", setting, names)]
    edges = d["hist_edges_log2"]
    key, tot = ("act_grad_hist", "act_totals") if which == "activations" else (
        "param_grad_hist", "param_totals")
    fig, ax = plt.subplots(figsize=(9.0, 3.8))
    used = []
    colors = ("#4C72B0", "#C44E52", "#55A868", "#8172B3")
    for i, s in enumerate(d["settings"]):
        if s["name"] not in chosen:
            continue
        runs = {r["mode"]: r for r in s["runs"]}
        run = runs[check_choice("mode", mode, list(runs))]
        total = run[tot]["values"]
        pct = [100.0 * c / total for c in run[key]]
        used += [e for e, c in zip(edges, run[key], strict=True) if c]
        zeros = 100.0 * run[tot]["zeros"] / total
        label = (f"{s['name']} (loss / {s['loss_divisor']:,}); exactly zero: {zeros:.2f}%")
        ax.stairs(pct, edges + [edges[-1] + 1], color=colors[i % len(colors)], lw=1.5,
                  label=label, fill=len(chosen) == 1, alpha=0.6 if len(chosen) == 1 else 1.0)
    f16 = d["fp16"]
    lines = (("fp16 min subnormal", f16["min_subnormal"], "#C44E52", "--"),
             ("fp16 min normal", f16["min_normal"], "0.3", ":"),
             ("fp16 max", f16["max"], "0.3", "-."))
    for label, value, color, ls in lines:
        x = math.log2(value)
        power = f"2^{x:.0f}" if x.is_integer() else f"2^{x:.4f}"  # fp16's max is just below 2^16
        ax.axvline(x, color=color, ls=ls, lw=1.2, label=f"{label} {value:.3g} ({power})")
    lo = min(used + [math.log2(f16["min_subnormal"])]) - 2
    hi = max(used + [math.log2(f16["max"])]) + 2
    ax.axvspan(lo, math.log2(f16["min_subnormal"]), color="#C44E52", alpha=0.08)
    ax.annotate("below fp16's smallest subnormal:\nzero in fp16", (lo + 0.5, 0.96),
                xycoords=("data", "axes fraction"), fontsize=8, color="#C44E52", va="top")
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"log2 |gradient| ({which}, {mode} run)")
    ax.set_ylabel("share of values (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)


def memory_phase_parts(row: dict, phase: str) -> dict[str, int]:
    """Bytes per part of ``MEMORY_PARTS`` alive at one phase's peak (chapter: 2).

    Of a ModeMemory (as a dict).

    The weight-cast cache is split out of the activations in a phase where all the saved
    activations are alive (the forward peak, the start of backward); the parts add up to the
    phase's peak exactly.
    """
    cats = dict(row["phase_breakdown"][phase])
    parts = {key: cats.get(key, 0) for key, _, _ in MEMORY_PARTS}
    cache = row["weight_cast_cache_bytes"]
    if cache and cats.get("activations", 0) >= max(row["saved_activations_bytes"], cache):
        parts["weight_cast_cache"] = cache
        parts["activations"] -= cache
    return parts


def memory_by_mode(result, which: str = "large", unit: str | None = None,
                   title: str | None = None):
    """Bytes alive at each phase's peak, one stacked bar per phase, grouped by mode (chapter: 2).

    ``which='small'`` shows the trained model (measured), ``'large'`` the 7B-class model
    (estimated). Each bar is what is alive at the peak of its phase (forward, backward,
    optimizer), so its top is that phase's peak; the mode's peak is labelled, with its ratio to
    fp32's. Parts with no bytes in any bar get no legend entry.
    """
    import matplotlib.transforms as mtransforms

    style()
    check_choice("memory", which, ("small", "large"))
    d = as_dict(result)
    rows = list(d["memory"] if which == "small" else d["memory_large"])  # asdict made them dicts
    peak = max((r["peak_bytes"] for r in rows), default=0)
    unit = unit or ("GiB" if peak >= 2**30 else "MiB")
    scale = UNITS[check_choice("unit", unit, UNITS)]
    batches = {r["batch_size"] for r in rows}
    phases = list(PHASE_SHORT)
    gap = 1.0
    # up to five modes at the column's width, their legend below; more get wider
    narrow = len(rows) <= 5
    width = MAX_FIGURE_WIDTH_IN if narrow else \
        min(14.0, max(8.0, 0.62 * len(rows) * (len(phases) + gap)))
    fig, ax = plt.subplots(figsize=(width, 5.4 if narrow else 4.4))
    xs, tick_labels, bars = [], [], []  # one entry per bar: (row, phase)
    for i, r in enumerate(rows):
        for j, phase in enumerate(phases):
            xs.append(i * (len(phases) + gap) + j)
            tick_labels.append(PHASE_SHORT[phase])
            bars.append((r, phase))
    parts = [memory_phase_parts(r, phase) for r, phase in bars]
    bottom = [0.0] * len(bars)
    for key, label, color in MEMORY_PARTS:
        vals = [p[key] / scale for p in parts]
        if not any(vals):
            continue
        ax.bar(xs, vals, bottom=bottom, width=0.8, color=color, label=label)
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    for x, (r, phase), top in zip(xs, bars, bottom, strict=True):
        if phase != r["peak_phase"]:
            continue
        ratio = r.get("peak_ratio_to_fp32")
        text = f"{top:,.2f}" + (f"\nx{ratio:.2f}" if ratio else "")
        ax.annotate(text, (x, top), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=7)
    ax.set_xticks(xs, tick_labels, fontsize=7)
    under = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for i, r in enumerate(rows):
        label = r["mode"] + (f"\nbatch {r['batch_size']}" if len(batches) > 1 else "")
        ax.text(i * (len(phases) + gap) + (len(phases) - 1) / 2, -0.09, label, ha="center",
                va="top", fontsize=8, transform=under)
    how = rows[0]["how"] if rows else ""
    model = rows[0]["model"] if rows else ""
    shape = (f"batch {rows[0]['batch_size']} x seq {rows[0]['seq_len']}" if len(batches) == 1
             else f"seq {rows[0]['seq_len']}") if rows else ""
    ax.set_ylabel(f"bytes alive at the phase's peak ({unit})")
    ax.set_xlabel(f"{how}: {model}, {shape}; peak of each mode labelled ({unit}, x fp32's)",
                  labelpad=26)
    ax.set_ylim(0, max(bottom + [1e-9]) * 1.18)
    if narrow:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, fontsize=9)
    else:
        ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    ax.grid(axis="x", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    peaks = "; ".join(f"{r['mode']}" + (f", batch {r['batch_size']}," if len(batches) > 1 else "")
                      + f" {r['peak_bytes'] / scale:,.2f} {unit}" + (
        f" ({r['peak_ratio_to_fp32']:.2f}x fp32's)" if r.get("peak_ratio_to_fp32") else "")
        for r in rows)
    return describe(fig, f"Peak of a step by mode, {how}: {peaks}")


# Number formats (chapter 2) -------------------------------------------------------------------
FORMAT_COLORS = {
    "fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868", "fp8-e4m3": "#C44E52",
    "fp8-e5m2": "#8172B3", "int8": "#937860", "int4": "#DA8BC3", "nf4": "#8C8C8C", "fp4": "#CCB974",
}


def format_ranges(thresholds: dict, title: str | None = None):
    """Log-scale bars per float format: flush-to-zero, subnormal, normal and overflow ranges (chapter: 2).

    ``thresholds`` maps a format name to :class:`memlab.precision.formats.Thresholds`.
    """
    import math

    style()
    names = list(thresholds)
    fig, ax = plt.subplots(figsize=(8.0, 1.0 + 0.55 * len(names)))
    for i, name in enumerate(names):
        t = as_dict(thresholds[name])
        lo, sub, norm, top = (math.log10(t[k]) for k in
                              ("flush_to_zero_below", "min_subnormal", "min_normal", "max"))
        color = FORMAT_COLORS.get(name, "0.5")
        ax.barh(i, norm - sub, left=sub, color=color, alpha=0.35, height=0.6)
        ax.barh(i, top - norm, left=norm, color=color, height=0.6)
        ax.plot([lo], [i], marker="|", ms=12, color="0.2")
        ax.annotate(f"max {t['max']:.3g}", (top, i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("log10 |x|: pale = subnormal (precision drops), solid = normal, | = flushed to 0 below")
    ax.set_xlim(right=ax.get_xlim()[1] + 6)
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)


def representable_values(values: dict, log: bool = True, title: str | None = None):
    """A rug of every representable value per format, on a log or linear axis (chapter: 2).

    ``values`` maps a format name to a 1-D sequence (tensor or list) of its values.
    """
    style()
    names = list(values)
    fig, ax = plt.subplots(figsize=(8.0, 0.8 + 0.5 * len(names)))
    said = []
    for i, name in enumerate(names):
        v = [float(x) for x in values[name]]
        pos = [x for x in v if x > 0]
        said.append(f"{name} {len(v):,} values" + (
            f", the positive ones from {min(pos):.3g} to {max(pos):.3g}" if pos else ""))
        ax.vlines(v, i - 0.3, i + 0.3, color=FORMAT_COLORS.get(name, "0.3"), lw=0.8)
        ax.annotate(f"{len(v)} values", (1, i), xycoords=("axes fraction", "data"),
                    xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    if log:
        ax.set_xscale("log", base=2)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("value (log2 axis)" if log else "value")
    ax.grid(axis="y", visible=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig, "Every value each format can represent, one tick each: " + "; ".join(said))


def relative_error_curves(curves: dict, eps: dict | None = None, bins: int = 300,
                          title: str | None = None):
    """Worst relative rounding error against magnitude, log-log, one line per format (chapter: 2).

    ``curves`` maps a format to ``(xs, relative_errors)`` with ``xs`` sorted; each line is the
    largest error within each of ``bins`` consecutive slices (the envelope of the saw-tooth).
    ``eps`` maps a format to its machine epsilon, drawn dotted as the eps/2 bound.
    """
    import torch

    style()
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    for name, (xs, err) in curves.items():
        x = torch.as_tensor(xs, dtype=torch.float64)
        e = torch.as_tensor(err, dtype=torch.float64).clamp(max=1.0)  # inf (overflow) drawn at 1
        n = (len(x) // bins) * bins
        top = e[:n].reshape(bins, -1).max(dim=1).values
        mid = x[:n].reshape(bins, -1).median(dim=1).values
        color = FORMAT_COLORS.get(name, "0.3")
        ax.plot(mid.tolist(), top.clamp(min=1e-12).tolist(), lw=1.6, color=color, label=name)
        if eps and name in eps:
            ax.axhline(eps[name] / 2, color=color, ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("|x|")
    ax.set_ylabel("worst |stored - x| / |x|   (1 = lost)")
    ax.legend(loc="lower left", ncol=2)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)
