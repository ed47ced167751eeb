"""Figures of chapter 7 on where a run fits: offload's transfer against compute, the memory
planner's cheapest set-ups and the accelerator table.

Every function takes a result of :mod:`memlab.compute` (the dataclass) and returns the
``Figure``, drawn on ``ax`` when one is given; everything drawn is estimated or quoted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from matplotlib.lines import Line2D

from memlab.compute.hardware import ACCELERATORS, Accelerator, get_accelerator
from memlab.compute.offload import OffloadTable
from memlab.compute.plan import MemoryPlan
from memlab.errors import MemlabError, check_positive_int
from memlab.plot.alt import describe
from memlab.plot.panels import (
    COUNTED_COLOR,
    check_type,
    finish,
    one_ax,
    plain_log_ticks,
)
from memlab.plot.style import style
from memlab.units import UNITS, to_unit

TRAINS_COLORS = {"full": "tab:red", "lora": "tab:blue", "qlora": "tab:green"}
VENDOR_COLORS = {"NVIDIA": "#76B900", "AMD": "#ED1C24", "Google": "#4285F4", "AWS": "#FF9900"}


# 6. Offload --------------------------------------------------------------------------------


def offload_costs(table, ax=None, title: str | None = None):
    """Per offload choice: the seconds offload adds beside compute seconds per step (chapter: 7).

    Estimated bars, log y, each with its verdict.

    ``table`` is a :class:`memlab.compute.offload.OffloadTable`: the transfer at the quoted link
    bandwidth with the CPU's optimizer step stacked on it (at the table's rate, recorded or
    measured), the compute at a quoted peak times an assumed MFU. A row that moves nothing has
    no added bar. Each tick names the per-GPU peak (estimated).
    """
    table = check_type(table, OffloadTable, "table")
    rows = list(table.rows)
    if not rows:
        raise MemlabError("offload_costs needs a table with at least one row")
    style()
    fig, ax, made = one_ax(ax, (7.0, 4.2))
    xs = np.arange(len(rows))
    w = 0.38
    moved = [(x, r) for x, r in zip(xs, rows, strict=True) if r.added_s > 0]
    ax.bar([x - w / 2 for x, _ in moved], [r.transfer_s for _, r in moved], width=w,
           color="tab:orange", label=f"transfer over {table.link}, estimated")
    ax.bar([x - w / 2 for x, _ in moved], [r.cpu_step_s for _, r in moved], width=w,
           bottom=[r.transfer_s for _, r in moved], color="tab:brown",
           label=f"the CPU's optimizer step ({table.cpu_step_kind} rate)")
    ax.bar(xs + w / 2, [r.compute_s for r in rows], width=w, color=COUNTED_COLOR,
           label=f"compute at MFU {table.mfu:.0%}, estimated")
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    seconds = [r.compute_s for r in rows] + [r.added_s for _, r in moved] \
        + [r.transfer_s for _, r in moved if r.transfer_s > 0]
    top = max(seconds)
    for x, r in zip(xs, rows, strict=True):
        ratio = r.added_over_compute
        text = r.verdict + (f"\nadded / compute {ratio:.2f}" if ratio else "")
        ax.text(x, top * 2.0, text, ha="center", va="bottom", fontsize=8)
    ax.set_ylim(min(seconds) / 5, top * 60)  # a log axis has no 0: the bars start below
    ax.set_xticks(xs, [f"{r.offload}, ZeRO-{r.zero_stage}\npeak "
                       f"{to_unit(r.per_gpu_peak_bytes, 'GiB'):.1f} GiB" for r in rows],
                  fontsize=8)
    ax.set_ylabel("seconds per step (s)")
    ax.legend(fontsize=8, loc="upper center", ncol=3)
    finish(fig, made, title, (
        f"Offload, estimated: {table.model} ({table.parameters:,} parameters) "
        f"on one of {table.gpus} {table.gpu}, batch {table.batch_size}"
        f" x {table.seq_len} per GPU, {table.precision}; link "
        f"{table.link_bytes_per_s / UNITS['GB']:g} GB/s and peak "
        f"{table.peak_flops / 1e12:g} TFLOP/s quoted"), ax)
    return describe(fig)


# 8. The planner ------------------------------------------------------------------------------


def plan_costs(plan, limit: int = 12, ax=None, title: str | None = None):
    """The cheapest set-ups of a memory plan (chapter: 7).

    Estimated GPU-seconds per optimizer step as bars, each with its per-GPU peak.

    ``plan`` is a :class:`memlab.compute.plan.MemoryPlan`; its ``limit`` cheapest rows are drawn,
    the cheapest on top, coloured by what trains (full, LoRA, QLoRA). The GPU's usable memory is
    in the title.
    """
    plan = check_type(plan, MemoryPlan, "plan")
    check_positive_int("limit", limit)
    rows = list(plan.rows)[:limit]
    usable = to_unit(plan.usable_bytes, "GiB")
    style()
    fig, ax, made = one_ax(ax, (10.0, 0.38 * max(len(rows), 3) + 1.8))
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
    finish(fig, made, title, (
        f"Cheapest set-ups for {plan.model} on {plan.gpu} ({usable:.1f} GiB "
        f"usable), global batch {plan.global_batch} x {plan.seq_len}: "
        f"estimated (MFU {plan.mfu:.0%}, no overlap); at each bar: its per-GPU peak"), ax)
    return describe(fig)


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
        out.append(check_type(r, Accelerator, "accelerator row"))
    if not out:
        raise MemlabError("accelerators needs at least one row")
    return out


def accelerators(rows=None, ax=None, title: str | None = None):
    """Quoted memory (GiB) against quoted dense 16-bit TFLOP/s of each accelerator (chapter: 7).

    A colour per vendor, names annotated.

    ``rows``: :class:`~memlab.compute.hardware.Accelerator` objects or their names (the default:
    every row of :data:`~memlab.compute.hardware.ACCELERATORS`). A hollow marker is a
    part whose 16-bit peak is fp16 (no bf16 rate). Both axes are logarithmic; a name close to an
earlier one is written below its point.
    """
    rows = _accelerator_rows(rows)
    style()
    fig, ax, made = one_ax(ax, (7.4, 4.8))
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
        plain_log_ticks(axis)
    ax.set_xlabel("dense 16-bit peak, quoted (TFLOP/s)")
    ax.set_ylabel("memory, quoted (GiB)")
    handles = [Line2D([], [], linestyle="none", marker="o", color=VENDOR_COLORS.get(v, "0.4"),
                      label=v) for v in vendors]
    handles.append(Line2D([], [], linestyle="none", marker="o", color="0.4",
                          markerfacecolor="none", label="fp16 peak (no bf16 rate)"))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    finish(fig, made, title, "Accelerators: memory and dense 16-bit peak, quoted from "
                                "datasheets and vendors' documentation", ax)
    return describe(fig)
