"""Figures of chapter 4: attention's memory against T, the tiling, memory traffic, attention in a step."""

from __future__ import annotations

import matplotlib.pyplot as plt

from memlab.plot.alt import describe
from memlab.plot.style import MAX_FIGURE_WIDTH_IN, style

IMPL_STYLE = {"naive": ("tab:red", "o"), "sdpa-math": ("tab:orange", "s"),
              "sdpa-flash": ("tab:blue", "D"), "sdpa-efficient": ("tab:cyan", "v"),
              "sdpa-cudnn": ("tab:purple", "^"), "flash": ("tab:green", "P")}


def attention_memory(sweep, what: str = "saved_bytes", title: str | None = None):
    """Bytes against T on log-log axes, one line per implementation (chapter: 4).

    The fitted exponent is in the legend.

    ``sweep`` is a :class:`memlab.attention.MemorySweep`.
    """
    style()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for impl, (color, marker) in IMPL_STYLE.items():
        rows = sweep.of(impl)
        if not rows:
            continue
        k = sweep.exponent(impl, what)
        label = impl if k is None else f"{impl}: T^{k:.2f}"
        ax.loglog([r.T for r in rows], [getattr(r, what) for r in rows], marker=marker,
                  color=color, label=label, base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("bytes saved for backward" if what == "saved_bytes" else "peak bytes")
    ax.legend(fontsize=8)
    ax.set_title(title or "One attention call: memory against T", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def tiling(T: int, block: int, *, offset: int = 0, title: str | None = None):
    """The (T, S) score matrix cut into tiles (chapter: 4).

    Computed tiles, the diagonal ones masked, the skipped ones blank.
    """
    import matplotlib.patches as patches

    style()
    S = T + offset
    fig, ax = plt.subplots(figsize=(6.5, 4.5 * T / S + 0.6))
    for r0 in range(0, T, block):
        r1 = min(r0 + block, T)
        for c0 in range(0, S, block):
            c1 = min(c0 + block, S)
            if c0 > offset + r1 - 1:  # every query of the tile is before every key: skipped
                color = "white"
            elif c1 - 1 > offset + r0:  # crosses the diagonal: computed, then masked
                color = "tab:orange"
            else:
                color = "tab:blue"
            ax.add_patch(patches.Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=color,
                                           edgecolor="0.3", lw=0.8))
    ax.set_xlim(0, S)
    ax.set_ylim(T, 0)
    ax.set_aspect("equal")
    ax.set_xlabel("key position (K_j blocks)")
    ax.set_ylabel("query position (Q_i blocks)")
    handles = [patches.Patch(color="tab:blue", label="computed"),
               patches.Patch(color="tab:orange", label="computed, then masked"),
               patches.Patch(facecolor="white", edgecolor="0.3", label="skipped")]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    ax.set_title(title or f"Causal tiles: T = {T}, block {block}", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def traffic(rows, title: str | None = None):
    """Elements moved between slow and fast memory against T (chapter: 4).

    The standard algorithm, the tiled one at each M, and the bound.

    ``rows`` are dicts with ``T``, ``standard``, and per fast-memory size ``M`` the counted
    ``tiled`` elements and the paper's ``bound`` (T^2 d^2 / M).
    """
    style()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    Ts = sorted({r["T"] for r in rows})
    std = {r["T"]: r["standard"] for r in rows}
    ax.loglog(Ts, [std[T] for T in Ts], "o-", color="tab:red", label="standard (Algorithm 0)", base=2)
    for i, M in enumerate(sorted({r["M"] for r in rows})):
        sel = sorted((r for r in rows if r["M"] == M), key=lambda r: r["T"])
        color = plt.cm.viridis(0.2 + 0.6 * i / max(1, len({r['M'] for r in rows}) - 1))
        ax.loglog([r["T"] for r in sel], [r["tiled"] for r in sel], "s-", color=color,
                  label=f"tiled, M = {M:,}", base=2)
        ax.loglog([r["T"] for r in sel], [r["bound"] for r in sel], ":", color=color,
                  label=f"T²d²/M, M = {M:,}", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("elements moved, one head")
    ax.legend(fontsize=7)
    ax.set_title(title or "Memory traffic of the forward pass", fontsize=10)
    fig.tight_layout()
    return describe(fig)


def attention_in_step(rows, title: str | None = None):
    """Saved activations of a step against T, one line per attention, with attention's share (chapter: 4).

    ``rows`` are :class:`memlab.attention.StepRow` of one model.
    """
    style()
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(MAX_FIGURE_WIDTH_IN, 6.6), sharex=True)
    colors = {"eager": "tab:red", "sdpa": "tab:blue", "flash": "tab:green"}
    said = []
    for att, color in colors.items():
        sel = sorted((r for r in rows if r.attention == att), key=lambda r: r.T)
        if not sel:
            continue
        said.append(f"{att} {100 * sel[0].attention_share:.0f}% at T = {sel[0].T:,}" + (
            f" to {100 * sel[-1].attention_share:.0f}% at {sel[-1].T:,}" if len(sel) > 1 else ""))
        Ts = [r.T for r in sel]
        ax.loglog(Ts, [r.activations_bytes / 2**30 for r in sel], "o-", color=color,
                  label=f"{att} ({sel[0].how})", base=2)
        ax2.semilogx(Ts, [100 * r.attention_share for r in sel], "o-", color=color,
                     label=att, base=2)
    ax.set_ylabel("saved activations (GiB)")
    ax.legend(fontsize=9)
    ax2.set_xlabel("sequence length T")
    ax2.set_ylabel("attention's share of saved activations (%)")
    ax2.set_ylim(0, 100)
    ax2.legend(fontsize=9)
    fig.suptitle(title or "Attention inside a training step", fontsize=10)
    fig.tight_layout()
    return describe(fig, "Attention's share of the saved activations: " + "; ".join(said))
