"""Figures of chapter 9 on the mixture of experts: one rank's bytes under expert parallelism.

Every function takes rows :mod:`memlab.moe` computes and returns the ``Figure``; nothing here
runs a step or measures.
"""

from __future__ import annotations

import numpy as np

from memlab.errors import MemlabError
from memlab.plot.alt import describe
from memlab.plot.panels import finish, one_ax, pick_unit
from memlab.plot.style import style

RANK_PARTS = (  # key of an expert_parallel_table row: label, colour
    ("replicated", "everything but the routed experts: weights, gradients, moments", "tab:gray"),
    ("experts", "this rank's experts: weights, gradients, moments", "tab:blue"),
    ("expert_activation_bytes", "its experts' saved activations", "tab:orange"),
)


def _rank_parts(r: dict) -> dict[str, float]:
    per = r["model_states_bytes"] / (r["replicated_parameters"] + r["expert_parameters"])
    return {"replicated": per * r["replicated_parameters"],
            "experts": per * r["expert_parameters"],
            "expert_activation_bytes": r["expert_activation_bytes"]}


def expert_parallel_share(rows, ax=None, unit: str | None = None, title: str | None = None):
    """One rank's bytes by part against its even share, per model and degree (chapter: 9).

    ``rows``: :func:`memlab.moe.ep_run.expert_parallel_table`'s, each with ``whole_states_bytes``
    (the whole model's weights, gradients and moments) added.
    """
    rows = list(rows)
    if not rows or any("whole_states_bytes" not in r for r in rows):
        raise MemlabError("expert_parallel_share needs expert_parallel_table rows with "
                          "whole_states_bytes added")
    parts = [_rank_parts(r) for r in rows]
    unit, scale = pick_unit(unit, max(sum(p.values()) for p in parts))
    style()
    fig, ax, made = one_ax(ax, (7.0, 4.6))
    xs = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for key, label, color in RANK_PARTS:
        h = np.array([p[key] / scale for p in parts])
        ax.bar(xs, h, bottom=bottom, width=0.6, color=color, label=label)
        bottom += h
    share = [r["whole_states_bytes"] / r["ranks"] / scale for r in rows]
    ax.plot(xs, share, linestyle="none", marker="_", markersize=22, markeredgewidth=2.5,
            color="black", zorder=4, label="its share: the model's states over N")
    ax.set_xticks(xs, [f"{r['model']}\nN = {r['ranks']}" for r in rows], fontsize=7)
    ax.set_ylabel(f"one rank ({unit})")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    finish(fig, made, title, f"One rank of expert parallelism, {rows[0]['precision']}, "
                             f"{rows[0]['tokens']:,} tokens per rank")
    return describe(fig)
