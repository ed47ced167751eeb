"""Figure of chapter 0's out-of-memory toolkit: the memory of one training step over time."""

from __future__ import annotations

from bisect import bisect_left

import matplotlib.pyplot as plt

from memlab.errors import check_choice
from memlab.plot.alt import describe
from memlab.plot.style import CATEGORY_COLORS, CATEGORY_LABELS, as_dict, style
from memlab.units import UNITS

PHASE_SHADES = {"forward": "#f2f2f2", "backward": "#e4e4e4", "optimizer": "#d6d6d6"}
ALLOCATED_COLOR = "#4C72B0"  # a CUDA snapshot's one series: allocated (requested) bytes
TIMELINE_AXES = ("events", "time")
# Bottom to top: what lives through the whole step first, so its floor stays flat.
STACK_ORDER = ("parameters", "optimizer_states", "other", "gradients", "activations",
               "temporaries")


def memory_timeline(timeline, unit: str | None = None, title: str | None = None,
                    x: str = "events"):
    """Stacked bytes by category over one step, the phases shaded, the peak marked (chapter: 0).

    Takes a :class:`memlab.measure.timeline.MemoryTimeline`. ``x='events'`` spaces
    the allocator's events evenly in their order (the same picture on a busy machine);
    ``x='time'`` puts them at their milliseconds. A CUDA snapshot's timeline has one series,
    allocated bytes, and a dashed line for the reserved bytes.
    """
    check_choice("x axis", x, TIMELINE_AXES)
    style()
    d = as_dict(timeline)
    times = list(d["times_us"])
    spans = d["phase_spans_us"]
    rank = {c: i for i, c in enumerate(STACK_ORDER)}
    cats = {c: list(v) for c, v in sorted(d["category_bytes"].items(),
                                          key=lambda kv: rank.get(kv[0], -1)) if any(v)}
    reserved = list(d.get("reserved_bytes") or [])
    for vals in (*cats.values(), reserved):  # hold the last state to the end of the step
        if vals:
            vals.append(vals[-1])
    if x == "time":
        end = max(max(e for _, e in spans.values()), times[-1])
        pos = [t / 1e3 for t in times] + [end / 1e3]
        edges = {p: (a / 1e3, b / 1e3) for p, (a, b) in spans.items()}
        xlabel = "time into the step (ms)"
    else:
        pos = list(range(len(times) + 1))
        starts = {p: (0 if i == 0 else bisect_left(times, spans[p][0]))
                  for i, p in enumerate(sorted(spans, key=lambda p: spans[p][0]))}
        order = sorted(starts, key=starts.get)
        edges = {p: (starts[p], starts[order[i + 1]] if i + 1 < len(order) else len(times))
                 for i, p in enumerate(order)}
        xlabel = "allocations and frees, in order"
    total = [sum(v) for v in zip(*cats.values(), strict=True)]
    peak = max(total + reserved)
    unit = unit or ("GiB" if peak >= 2**30 else "MiB")
    scale = UNITS[unit]
    fig, ax = plt.subplots(figsize=(8.8, 3.9))
    for phase, (start, end) in edges.items():
        ax.axvspan(start, end, color=PHASE_SHADES.get(phase, "#eeeeee"), zorder=0)
    base = [0.0] * len(pos)
    for cat, vals in cats.items():
        upper = [b + v / scale for b, v in zip(base, vals, strict=True)]
        ax.fill_between(pos, base, upper, step="post", linewidth=0, zorder=2,
                        color=CATEGORY_COLORS.get(cat, ALLOCATED_COLOR),
                        label=CATEGORY_LABELS.get(cat, cat))
        base = upper
    if reserved:
        ax.step(pos, [r / scale for r in reserved], where="post", color="black",
                linestyle="--", linewidth=1.2, zorder=3, label="reserved")
    k = max(range(len(total)), key=total.__getitem__)
    ax.plot([pos[k]], [total[k] / scale], marker="v", color="black", zorder=4)
    ax.annotate(f"peak {total[k] / scale:,.2f} {unit}", (pos[k], total[k] / scale),
                xytext=(6, 6), textcoords="offset points", fontsize=9, zorder=4)
    top = peak / scale * 1.22
    ax.set_ylim(0, top)
    for phase, (start, end) in edges.items():
        ax.text((start + end) / 2, top * 0.97, phase, ha="center", va="top", fontsize=9,
                color="#444444")
    ax.set_xlim(min(pos[0], 0), pos[-1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"bytes alive ({unit})")
    ax.grid(axis="x", visible=False)
    handles, labels = ax.get_legend_handles_labels()  # top of the stack first, as drawn
    ax.legend(handles[::-1], labels[::-1], loc="center left", bbox_to_anchor=(1.0, 0.5))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return describe(fig)
