"""Figures of chapter 3.

Quantization levels, the scheme trade-off, layer errors, GPTQ column by column, outliers, 8-bit
AdamW.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.plot.alt import describe
from memlab.plot.style import MAX_FIGURE_WIDTH_IN, style


# Chapter 3: quantization ---------------------------------------------------------------------------
def quant_levels(x, schemes: dict, title: str | None = None):
    """Values and the levels each scheme can store, one row per scheme (chapter: 3).

    ``schemes`` maps a label to ``(levels, dequantized)``: the representable values (1-D) and
    ``x`` after the round trip.
    """
    import torch

    style()
    x = torch.as_tensor(x).flatten().float()
    fig, axes = plt.subplots(len(schemes), 1, figsize=(MAX_FIGURE_WIDTH_IN, 1.5 * len(schemes)), sharex=True,
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
    return describe(fig)


SCHEME_STYLE = {  # scheme family -> (color, markers in order of appearance)
    "float": ("0.35", "o^"), "int8": ("tab:blue", "sD"), "4-bit": ("tab:purple", "ovP"),
    "rtn": ("tab:orange", "os"), "gptq": ("tab:green", "os"),
}


def _family(scheme: str) -> str:
    if scheme in ("fp32", "bf16", "fp16"):
        return "float"
    if "int8" in scheme:
        return "int8"
    return scheme.split("-")[0] if scheme.startswith(("rtn", "gptq")) else "4-bit"


def scheme_tradeoff(comparison, title: str | None = None):
    """Held-out loss minus fp32's, +- 2 paired SE, per scheme (chapter: 3).

    Ordered by bits per linear weight.

    One column per scheme (most bits on the left), labelled with its name and its bits per
    weight of the block linears, scales included: the schemes that store 4 to 4.5 bits sit too
    close on a bits axis to label, so the axis is the ranking and the ticks carry the bits.
    """
    style()
    rows = sorted(comparison.rows, key=lambda r: -r.bits_per_param)
    fig, ax = plt.subplots(figsize=(8, 4))
    used: dict[str, int] = {}
    for i, r in enumerate(rows):
        fam = _family(r.scheme)
        color, markers = SCHEME_STYLE[fam]
        marker = markers[used.get(fam, 0) % len(markers)]
        used[fam] = used.get(fam, 0) + 1
        ax.errorbar(i, r.loss_delta, yerr=2 * r.loss_delta_se, fmt=marker, color=color, ms=6,
                    capsize=4, lw=1.4)
    ax.axhline(0, color="0.6", lw=0.8, ls="--")
    ax.set_xticks(range(len(rows)), [f"{r.scheme}\n{r.bits_per_param:.2f}" for r in rows],
                  fontsize=8)
    ax.set_xlabel("scheme, and bits per weight of the block linears with scales (measured)")
    ax.set_ylabel("held-out loss minus fp32's (nats)")
    ax.set_title(title or "Quality against bits on the book's model: paired difference +- 2 SE")
    fig.tight_layout()
    return describe(fig)


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
    ax.set_title(title or "Output error per layer (held-out inputs)")
    fig.tight_layout()
    return describe(fig)


def outlier_sweep(study, title: str | None = None):
    """One layer's output error as injected outlier features grow (chapter: 3).

    Plain int8 against LLM.int8().
    """
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
    return describe(fig)


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
    return describe(fig)


def gptq_propagation(layer_run, title: str | None = None):
    """GPTQ on one layer, column by column (chapter: 3).

    The compensation each weight received, the rounding errors, and the output error as columns are
    rounded.

    ``layer_run`` is a :class:`memlab.quant.compare.GptqLayerColumns`. Columns are in processing
    order; dashed lines mark GPTQ's lazy blocks, thin grey lines its groups.
    """
    import torch

    style()
    tr = layer_run.run
    W, seen, Wq, R = (t.float() for t in (tr.weight, tr.seen, tr.quantized, layer_run.rtn))
    n = W.shape[1]
    fig, axes = plt.subplots(3, 1, figsize=(MAX_FIGURE_WIDTH_IN, 8.4), sharex=True, layout="constrained",
                             gridspec_kw={"height_ratios": [1.3, 1, 1]})

    update = (seen - W).numpy()  # (out, in)
    lim = float(torch.quantile((seen - W).abs().flatten(), 0.99)) or 1.0
    im = axes[0].imshow(update, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim,
                        interpolation="nearest", extent=(-0.5, n - 0.5, W.shape[0] - 0.5, -0.5))
    fig.colorbar(im, ax=list(axes), shrink=0.3, anchor=(0.0, 1.0), pad=0.01,
                 label="compensation (weight units)")
    axes[0].set_ylabel("output row")
    axes[0].set_title("compensation each weight received from earlier columns before it was "
                      "rounded (seen - trained)", fontsize=9)

    def rms(t):
        return t.pow(2).mean(dim=0).sqrt().numpy()  # (in,)

    cols = range(n)
    axes[1].plot(cols, rms(seen - W), lw=1, color="tab:purple", label="compensation received")
    axes[1].plot(cols, rms(seen - Wq), lw=1, color="tab:green",
                 label="GPTQ rounding error (of the compensated column)")
    axes[1].plot(cols, rms(W - R), lw=1, color="tab:orange", alpha=0.8,
                 label="RTN rounding error (of the trained column)")
    axes[1].set_ylabel("RMS over rows")
    axes[1].legend(fontsize=7.5, loc="upper left", ncols=1)

    path = layer_run.path
    axes[2].plot(path["columns"], path["rtn"], "-", color="tab:orange",
                 label="RTN: rounded columns, the rest as trained")
    axes[2].plot(path["columns"], path["gptq"], "-", color="tab:green",
                 label="GPTQ: rounded columns, the rest compensated")
    axes[2].set_ylabel("relative output error\n(calibration inputs)")
    axes[2].set_xlabel(f"input column of {layer_run.layer}, in processing order")
    axes[2].legend(fontsize=7.5, loc="upper left")

    for ax in axes:
        if tr.group_size:
            for g in range(tr.group_size, n, tr.group_size):
                ax.axvline(g - 0.5, color="0.85", lw=0.6, zorder=0)
        for b in range(tr.blocksize, n, tr.blocksize):
            ax.axvline(b - 0.5, color="0.3", lw=1, ls="--", zorder=0)
    fig.suptitle(title or f"GPTQ {layer_run.bits}-bit on {layer_run.layer}: error passed "
                 f"on to later columns (lazy blocks of {tr.blocksize}, groups of "
                 f"{tr.group_size})", fontsize=10)
    return describe(fig)
