"""Figures of chapter 3: quantization levels, the scheme trade-off, layer errors, outliers, 8-bit AdamW."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.plot.style import style


# Chapter 3: quantization ---------------------------------------------------------------------------
def quant_levels(x, schemes: dict, title: str | None = None):
    """Values and the levels each scheme can store, one row per scheme (chapter: 3).

    ``schemes`` maps a label to ``(levels, dequantized)``: the representable values (1-D) and
    ``x`` after the round trip.
    """
    import torch

    style()
    x = torch.as_tensor(x).flatten().float()
    fig, axes = plt.subplots(len(schemes), 1, figsize=(8, 1.5 * len(schemes)), sharex=True,
                             squeeze=False)
    for ax, (label, (levels, back)) in zip(axes[:, 0], schemes.items(), strict=True):
        for v in torch.as_tensor(levels).flatten().tolist():
            ax.axvline(v, color="0.8", lw=0.6, zorder=1)
        ax.plot(x.tolist(), [0.6] * len(x), "o", ms=3, color="tab:blue", label="value")
        ax.plot(torch.as_tensor(back).flatten().tolist(), [0.3] * len(x), "o", ms=3,
                color="tab:red", label="stored")
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center")
    axes[0, 0].legend(loc="upper left", fontsize=8, ncols=2)
    axes[-1, 0].set_xlabel("value (grey lines: the levels the codes stand for)")
    fig.suptitle(title or "What a scheme can store", fontsize=10)
    fig.tight_layout()
    return fig


def scheme_tradeoff(comparison, title: str | None = None):
    """Weight bits per parameter against held-out loss above the optimum, per scheme (chapter: 3)."""
    style()
    rows = comparison.rows
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        color = "tab:green" if r.scheme.startswith("gptq") else (
            "tab:orange" if r.scheme.startswith("rtn") else "tab:blue")
        ax.plot(r.bits_per_param, r.excess, "o", color=color)
        ax.annotate(r.scheme, (r.bits_per_param, r.excess), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits per weight of the block linears, scales included (measured)")
    ax.set_ylabel("held-out loss above the optimum (nats)")
    ax.set_title(title or "Memory against quality on the book's model")
    fig.tight_layout()
    return fig


def layer_errors(comparison, schemes=None, title: str | None = None):
    """Relative output error of every block linear, one line per scheme (chapter: 3)."""
    style()
    errs = comparison.layer_errors
    schemes = [s for s in (schemes or errs) if s != "fp32"]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for s in schemes:
        names = list(errs[s])
        ax.plot(range(len(names)), [errs[s][n] for n in names], "o-", ms=3, label=s)
    ax.set_xticks(range(len(names)), [n.replace("blocks.", "") for n in names], rotation=60,
                  ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("||y_q - y|| / ||y||")
    ax.legend(fontsize=7, ncols=2)
    ax.set_title(title or "Output error per layer (calibration inputs)")
    fig.tight_layout()
    return fig


def outlier_sweep(study, title: str | None = None):
    """One layer's output error as injected outlier features grow: plain int8 against LLM.int8() (chapter: 3)."""
    style()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(study.sweep_alpha, study.sweep_int8, "o-", label="int8 vector-wise (threshold 0)")
    ax.plot(study.sweep_alpha, study.sweep_llm_int8, "s-",
            label=f"LLM.int8() (threshold {study.threshold:g})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"outlier size: {len(study.channels)} features multiplied by")
    ax.set_ylabel("relative output error")
    ax.legend(fontsize=8)
    ax.set_title(title or f"{study.sweep_layer}: outlier features and int8")
    fig.tight_layout()
    return fig


def optimizer_curves(comparison, title: str | None = None):
    """Training loss per step for each optimizer, on the same batches (chapter: 3)."""
    style()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for run in comparison.runs:
        ax.plot(range(len(run.losses)), run.losses, lw=1.2,
                label=f"{run.optimizer}: {run.bytes_per_param:.2f} B/param of state")
    ax.axhline(comparison.runs[0].quality.best_loss, color="0.5", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats)")
    ax.legend(fontsize=8)
    ax.set_title(title or "AdamW against 8-bit AdamW")
    fig.tight_layout()
    return fig
