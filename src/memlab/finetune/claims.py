"""Chapter 5's claims (C23-C26).

Each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.
"""

from __future__ import annotations

from memlab import claims
from memlab.finetune.counts import trainable_parameters
from memlab.finetune.estimate import base_weight_bytes
from memlab.finetune.experiments import (
    finetune_compare,
    finetune_context,
    finetune_flops,
    finetune_reference,
)
from memlab.finetune.lora import LoraConfig
from memlab.finetune.plan import NEOX_20B, twenty_b
from memlab.model.config import get_config
from memlab.units import to_unit

_CH5 = "chapters/05_finetuning"


def _gib(n: float) -> str:
    unit = "GiB" if n >= 2**30 else "MiB"
    return f"{to_unit(n, unit):.1f} {unit}"


# C23 -------------------------------------------------------------------------------------------
def c23_evidence() -> dict:
    """Counted forward and backward FLOPs per step of three set-ups (chapter: 5).

    The set-ups are full fine-tuning, the last block and LoRA.
    """
    t = finetune_flops()
    return dict(model=t.model, rows={r.name: dict(forward=r.flops.forward, backward=r.flops.backward,
                                                  trainable=r.trainable_parameters)
                                     for r in t.rows},
                kept_share=0.4)


def _c23(ev: dict) -> claims.Verdict:
    rows = ev["rows"]
    full = rows["full"]
    total = {n: r["forward"] + r["backward"] for n, r in rows.items()}
    frozen = {n: r for n, r in rows.items() if n != "full"}
    saves = all(total[n] < total["full"] for n in frozen)
    lora = {n: r for n, r in frozen.items() if n.startswith("LoRA")}
    kept = {n: r["backward"] / full["backward"] for n, r in lora.items()}
    most_kept = max(kept.values()) if kept else 0.0
    parts = "; ".join(f"{n}: backward {r['backward'] / r['forward']:.2f}x its forward, step "
                      f"{total[n] / total['full']:.2f} of full's" for n, r in frozen.items())
    return claims.judge(
        "", saves,
        f"counted by FlopCounterMode on {ev['model']} (eager attention): full fine-tuning's "
        f"backward is {full['backward'] / full['forward']:.2f}x its forward; {parts}",
        caveat_applies=saves and most_kept >= ev["kept_share"],
        caveat="only the weight-gradient products go: every layer above the lowest trained one "
               f"still computes its input gradient, so LoRA keeps up to {most_kept:.0%} of full "
               "fine-tuning's backward (and adds its own small products to the forward)",
        correction="a frozen set-up here does as many FLOPs per step as full fine-tuning or "
                   "more: the adapters' products outweigh the weight gradients it skips")


@claims.register("C23", _CH5, "Freezing weights saves computation because frozen weights need "
                 "no gradients.", evidence=c23_evidence)
def c23(ev: dict) -> claims.Verdict:
    """Holds if every frozen set-up counts fewer FLOPs per step than full fine-tuning.

    Caveat if LoRA still does at least ``kept_share`` of full's backward; wrong if one does not
    save.
    """
    return claims.with_sensitivity(_c23, ev, "kept_share", (0.25, 0.4, 0.6, 0.9),
                                   lambda s: f"a kept share of {s:.0%} of the backward")


# C24 -------------------------------------------------------------------------------------------
def c24_evidence() -> dict:
    """Trainable share and LoRA / full peaks of Llama-2-7B against T (chapter: 5).

    The peaks are estimated, with the activations' share, beside the measured peaks of the book's
    model.
    """
    ctx = finetune_context()
    cfg = get_config(ctx.model)
    cmp = finetune_compare()
    full, lora = cmp.row("full"), cmp.row("LoRA q,v r=4")
    return dict(model=ctx.model, trainable=trainable_parameters(cfg, lora=LoraConfig(r=8)),
                parameters=cfg.num_parameters(), precision=ctx.precision,
                lora_precision=ctx.lora_precision,
                ratio={r.seq_len: r.lora_over_full for r in ctx.rows},
                share={r.seq_len: r.activation_share for r in ctx.rows},
                measured=dict(device=cmp.device, full=full.peak_bytes, lora=lora.peak_bytes),
                far_less=0.5, dominated=0.5)


def _c24(ev: dict) -> claims.Verdict:
    ratio, share, far = ev["ratio"], ev["share"], ev["far_less"]
    short, long = min(ratio), max(ratio)
    few = ev["trainable"] / ev["parameters"]
    m = ev["measured"]
    holds = few < 0.01 and ratio[short] < far
    return claims.judge(
        "", holds,
        f"{ev['model']}, r=8 on q_proj and v_proj: {ev['trainable']:,} trainable parameters, "
        f"{few:.3%} of {ev['parameters']:,}; estimated peak of LoRA ({ev['lora_precision']} "
        f"base) over full fine-tuning ({ev['precision']}), batch 1: {ratio[short]:.2f} at "
        f"{short} tokens, {ratio[long]:.2f} at {long}, where saved activations are "
        f"{share[long]:.0%} of LoRA's peak; measured on the book's model ({m['device']}, LoRA "
        f"r=4 on q, v): {m['lora'] / m['full']:.2f}",
        caveat_applies=holds and share[long] >= ev["dominated"],
        caveat=f"the parameters go, the activations stay: at {long} tokens they are "
               f"{share[long]:.0%} of LoRA's peak, which is then {ratio[long]:.0%} of full "
               "fine-tuning's, because every block still saves what the input gradients need",
        correction=f"at {short} tokens LoRA's peak is already {ratio[short]:.0%} of full "
                   "fine-tuning's: the frozen weights and the activations dominate")


@claims.register("C24", _CH5, "LoRA on the query and value projections trains far fewer "
                 "parameters and so needs far less GPU memory.", evidence=c24_evidence)
def c24(ev: dict) -> claims.Verdict:
    """Holds if under 1% of the parameters train and LoRA's peak is far under full's.

    LoRA's peak at the shortest context must be under ``far_less`` of full's. Caveat if saved
    activations are at least ``dominated`` of LoRA's peak at the longest; wrong otherwise.
    """
    return claims.with_sensitivity(_c24, ev, "far_less", (0.1, 0.33, 0.5, 0.67),
                                   lambda f: f"'far less' read as under {f:.0%}")


# C25 -------------------------------------------------------------------------------------------
def c25_evidence() -> dict:
    """Adapters off against the base model, kept apart and merged, and a 7B copy's bytes (chapter: 5)."""
    r = finetune_reference()
    cfg = get_config("llama2-7b")
    return dict(unmerged=vars(r.unmerged), merged=vars(r.merged),
                copy_7b=base_weight_bytes(cfg, "bf16"),
                adapters_7b=4 * trainable_parameters(cfg, lora=LoraConfig(r=8)))


@claims.register("C25", _CH5, "With adapters switched off, the same model gives reference "
                 "outputs, so reinforcement learning from feedback needs no second model copy.",
                 evidence=c25_evidence)
def c25(ev: dict) -> claims.Verdict:
    """Holds if switching the adapters off gives the base's logits bit for bit.

    The adapters are trained and non-zero. Caveat if merged adapters do not; wrong if kept-apart
    ones do not.
    """
    u, m = ev["unmerged"], ev["merged"]
    holds = u["identical"] and u["tuned_differs"]
    same = ("bit for bit" if u["identical"]
            else f"to a max difference of {u['max_abs_diff']:.2g}")
    return claims.judge(
        "", holds,
        f"measured on the book's model: adapters off give the base's logits {same}"
        f" (adapters on change them: {u['tuned_differs']}); a second copy would take "
        f"{u['second_copy_bytes']:,} bytes against {u['adapter_bytes']:,} for the adapters; "
        f"for Llama-2-7B in bf16, {_gib(ev['copy_7b'])} against {_gib(ev['adapters_7b'])}",
        caveat_applies=holds and not m["identical"],
        caveat="only while the adapters are kept apart: once merged, switching them off "
               "subtracts B A again, which restores the weights to rounding, not bit for bit "
               f"(max logit difference {m['max_abs_diff']:.2g})",
        correction="switching the adapters off does not give the base model's logits here")


# C26 -------------------------------------------------------------------------------------------
def c26_evidence() -> dict:
    """NeoX-20B shapes with an int8 or NF4 base and LoRA, against a 24 GB card (chapter: 5).

    With checkpointing off and on, at several lengths.
    """
    runs = {T: twenty_b(seq_len=T) for T in (256, 512, 1024, 2048)}
    any_run = runs[512]
    return dict(parameters=NEOX_20B.num_parameters(), gpu=any_run.gpu,
                usable=any_run.usable_bytes, batch_size=any_run.batch_size,
                peaks={T: r.peaks for T, r in runs.items()}, weights=any_run.weights,
                seq_len=512)


def _c26(ev: dict) -> claims.Verdict:
    T, usable = ev["seq_len"], ev["usable"]
    peaks = ev["peaks"][T]
    fit = {k: p <= usable for k, p in peaks.items()}
    int8 = fit["int8"] or fit["int8 + checkpointing"]
    listed = ", ".join(f"{k} {_gib(p)}" for k, p in peaks.items())
    return claims.judge(
        "", int8,
        f"estimated for GPT-NeoX-20B's shapes ({ev['parameters']:,} parameters), LoRA r=16 on "
        f"every linear, batch {ev['batch_size']} x {T} tokens, base weights and adapters "
        f"{_gib(ev['weights']['int8'])} in int8, {_gib(ev['weights']['nf4-dq'])} in NF4: peaks "
        f"{listed}, against the {ev['gpu']}'s {_gib(usable)} usable",
        caveat_applies=int8 and not fit["int8"],
        caveat=f"only with activation checkpointing, at batch {ev['batch_size']} x {T}: without "
               f"it the int8 set-up needs {_gib(peaks['int8'])}",
        correction=("an 8-bit base does not fit at this size; a 4-bit (NF4) base does"
                    if any(fit[k] for k in fit if k.startswith("nf4"))
                    else "neither an 8-bit nor a 4-bit base fits at this size"))


@claims.register("C26", _CH5, "A 20B model can be fine-tuned on a 24 GB consumer GPU using "
                 "8-bit weights and LoRA.", evidence=c26_evidence)
def c26(ev: dict) -> claims.Verdict:
    """Holds if the int8 base with LoRA fits without checkpointing.

    It must fit at the stated batch and length. Caveat if only with it; wrong if not at all.
    """
    return claims.with_sensitivity(_c26, ev, "seq_len", tuple(sorted(ev["peaks"])),
                                   lambda t: f"{t} tokens per sequence")
