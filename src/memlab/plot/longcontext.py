"""Figures of chapter 8 on long context: where the bytes go by length, the chunked loss, activation
offloading and the compiler's memory budgets.

Every function takes a result of :mod:`memlab.longcontext` (the dataclass; a record's is
``Record.value()``) and returns the ``Figure``; nothing here runs a step or measures.
"""

from __future__ import annotations

import numpy as np

from memlab.errors import MemlabError
from memlab.longcontext.budget import BudgetTable
from memlab.longcontext.chunked import ChunkSweep
from memlab.longcontext.offload import OffloadStudy
from memlab.longcontext.where import LengthTable
from memlab.plot.alt import describe
from memlab.plot.panels import (
    ESTIMATED_COLOR,
    MEASURED_COLOR,
    check_type,
    finish,
    many_axes,
    one_ax,
    pick_unit,
    plain_log_ticks,
)
from memlab.plot.style import MAX_FIGURE_WIDTH_IN, style

PIECE_STYLE = {  # field of a LengthRow: label, colour, line style
    "logits_bytes": ("logits (head and loss, at their highest)", "tab:red", "-"),
    "blocks_bytes": ("blocks' saved activations", "tab:blue", "-"),
    "attention_sdpa_bytes": ("of which attention (SDPA)", "tab:blue", ":"),
    "attention_eager_bytes": ("attention if eager (T x T)", "tab:purple", "--"),
    "kv_cache_bytes": ("KV cache serving T tokens", "0.5", "-."),
}


def long_context_pieces(table, axes=None, unit: str = "GiB", title: str | None = None):
    """The pieces of a step that grow with T, without and with checkpointing (chapter: 8)."""
    table = check_type(table, LengthTable, "table")
    if not table.rows:
        raise MemlabError("long_context_pieces needs a table with at least one row")
    unit, scale = pick_unit(unit, max(r.blocks_bytes for r in table.rows))
    style()
    fig, axs, made = many_axes(axes, 2, (MAX_FIGURE_WIDTH_IN, 7.4))
    for ax, ckpt in zip(axs, (False, True), strict=True):
        rows = [r for r in table.rows if r.checkpointing == ckpt]
        xs = [r.seq_len for r in rows]
        for key, (label, color, ls) in PIECE_STYLE.items():
            if ckpt and key in ("attention_sdpa_bytes", "attention_eager_bytes"):
                continue  # recomputed with the block: nothing of attention is saved
            ax.plot(xs, [getattr(r, key) / scale for r in rows], color=color, linestyle=ls,
                    marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_log_ticks(ax.xaxis)
        ax.set_xlabel("sequence length T (tokens)")
        ax.set_ylabel(f"bytes ({unit}), estimated")
        ax.set_title("full checkpointing" if ckpt else "no checkpointing", fontsize=9)
        ax.legend(fontsize=9, loc="upper left")
    finish(fig, made, title, (
        f"{table.model} ({table.vocab_size:,}-entry vocabulary), batch {table.batch_size}, "
        f"{table.precision}: what grows with T"))
    return describe(fig)


def chunk_sweep(sweep, ax=None, unit: str | None = None, title: str | None = None):
    """A step's peak measured (bars) and estimated (markers) against the loss chunks K (chapter: 8)."""
    sweep = check_type(sweep, ChunkSweep, "sweep")
    rows = list(sweep.rows)
    if not rows:
        raise MemlabError("chunk_sweep needs a sweep with at least one row")
    unit, scale = pick_unit(unit, max(r.peak_bytes for r in rows))
    style()
    fig, ax, made = one_ax(ax, (6.0, 3.8))
    xs = np.arange(len(rows))
    ax.bar(xs, [r.peak_bytes / scale for r in rows], width=0.6, color=MEASURED_COLOR,
           label="peak, measured")
    ax.plot(xs, [r.estimated_peak_bytes / scale for r in rows], linestyle="none", marker="v",
            markersize=8, color=ESTIMATED_COLOR, zorder=4, label="peak, estimated")
    ax.bar(xs, [r.saved_bytes / scale for r in rows], width=0.3, color="tab:orange",
           label="saved for the backward, measured")
    ax.set_xticks(xs, [str(r.chunks) for r in rows])
    ax.set_xlabel("loss chunks K")
    ax.set_ylabel(f"bytes ({unit})")
    ax.legend(fontsize=8)
    s = sweep.setup
    finish(fig, made, title, (
        f"{s['model']} (vocabulary {s['vocab_size']:,}), batch {s['batch_size']} x "
        f"{s['seq_len']}, {s['precision']}, on {sweep.device}"), ax)
    return describe(fig)


def offload_cut(study, ax=None, title: str | None = None):
    """The share of the peak activation offloading saves, against tokens per micro-batch (chapter: 8)."""
    study = check_type(study, OffloadStudy, "study")
    if not study.cases:
        raise MemlabError("offload_cut needs a study with at least one case")
    style()
    fig, ax, made = one_ax(ax, (6.0, 3.8))
    for setup in dict.fromkeys(c.setup for c in study.cases):
        cases = sorted((c for c in study.cases if c.setup == setup),
                       key=lambda c: c.batch_size * c.seq_len)
        ax.plot([c.batch_size * c.seq_len for c in cases], [100 * c.cut for c in cases],
                marker="o", markersize=4, label=setup)
    ax.axhline(30, color="0.6", linestyle="--", linewidth=1, label="the claim's 30%")
    ax.set_xscale("log", base=2)
    plain_log_ticks(ax.xaxis)
    ax.set_xlabel("tokens per micro-batch (B x T)")
    ax.set_ylabel("peak saved by offloading (%), estimated")
    ax.legend(fontsize=8)
    finish(fig, made, title, f"{study.model}, {study.precision}, full checkpointing", ax)
    return describe(fig)


def budget_frontier(table, ax=None, unit: str | None = None, title: str | None = None):
    """Saved bytes against FLOPs: the compiler's budgets and the hand-written plans (chapter: 8)."""
    table = check_type(table, BudgetTable, "table")
    if not table.rows:
        raise MemlabError("budget_frontier needs a table with at least one row")
    unit, scale = pick_unit(unit, max(r.saved_bytes for r in table.rows))
    style()
    fig, ax, made = one_ax(ax, (6.0, 3.8))
    parts = [r for r in table.rows if r.source == "partitioner"]
    hand = [r for r in table.rows if r.source != "partitioner"]
    ax.plot([100 * r.recompute_share for r in parts], [r.saved_bytes / scale for r in parts],
            marker="o", color="tab:green", label="memory budget (partitioner)")
    for r in parts:
        ax.annotate(r.plan.replace("budget ", ""), (100 * r.recompute_share, r.saved_bytes / scale),
                    textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.plot([100 * r.recompute_share for r in hand], [r.saved_bytes / scale for r in hand],
            linestyle="none", marker="D", color="tab:red", label="chapter 7's plans")
    for r in hand:
        ax.annotate(r.plan, (100 * r.recompute_share, r.saved_bytes / scale),
                    textcoords="offset points", xytext=(4, -9), fontsize=7, color="tab:red")
    ax.set_xlabel("FLOPs recomputed (% of the step without recomputation), counted")
    ax.set_ylabel(f"saved for the backward ({unit}), measured")
    ax.legend(fontsize=8)
    finish(fig, made, title, "Recomputation: the compiler's budgets and the hand-written plans", ax)
    return describe(fig)
