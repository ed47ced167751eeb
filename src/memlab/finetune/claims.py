"""Chapter 5's claims (C23-C26).

Each ``evidence(**setting)`` computes the numbers in the claim's setting (its defaults) or in a
changed one; each ``decide(ev)`` the level, by the verdict rule (STYLE.md).
"""

from __future__ import annotations

from memlab import claims
from memlab.finetune.counts import trainable_parameters
from memlab.finetune.estimate import base_weight_bytes
from memlab.finetune.experiments import (
    FLOPS_SIZES,
    TWENTY_B_SIZES,
    finetune_context,
    finetune_flops,
    finetune_reference,
)
from memlab.finetune.lora import LoraConfig
from memlab.finetune.plan import NEOX_20B, context_sweep, twenty_b
from memlab.model.config import get_config
from memlab.units import to_unit

_CH5 = "chapters/05_finetuning"
FROZEN_BY = ("requires_grad", "optimizer")


def _gib(n: float) -> str:
    unit = "GiB" if n >= 2**30 else "MiB"
    return f"{to_unit(n, unit):.1f} {unit}"


# C23 -------------------------------------------------------------------------------------------
def c23_evidence(frozen_by: str = "requires_grad", all_linear_rank: int = 8) -> dict:
    """Counted forward and backward FLOPs per step of full fine-tuning and each frozen set-up (chapter: 5).

    ``frozen_by="optimizer"`` freezes by leaving the weights out of the optimizer, their
    ``requires_grad`` left on; ``all_linear_rank`` is the rank of the LoRA set-up on every linear.
    """
    from memlab.device import get_scale
    from memlab.errors import check_choice, check_positive_int
    from memlab.finetune.compare import SETUPS, Setup
    from memlab.finetune.flops import flops_table

    check_choice("frozen_by", frozen_by, FROZEN_BY)
    check_positive_int("all_linear_rank", all_linear_rank)
    if (frozen_by, all_linear_rank) == ("requires_grad", 8):
        t = finetune_flops()  # the chapter's table
    else:
        r = all_linear_rank
        setups = [Setup(f"LoRA all r={r}", lora=LoraConfig(r=r, alpha=2 * r,
                                                          target_modules="all-linear"))
                  if s.name == "LoRA all r=8" else s for s in SETUPS]
        t = flops_table(**FLOPS_SIZES[get_scale(None)], setups=setups, frozen_by=frozen_by)
    adapters = {s.name for s in SETUPS if s.lora is not None} | {f"LoRA all r={all_linear_rank}"}
    return dict(model=t.model, frozen_by=frozen_by,
                rows={r.name: dict(forward=r.flops.forward, backward=r.flops.backward,
                                   trainable=r.trainable_parameters,
                                   adapters=r.name in adapters)
                      for r in t.rows})


@claims.register("C23", _CH5, "Freezing weights saves computation because frozen weights need "
                 "no gradients.", evidence=c23_evidence, moves=[
                     claims.Move("weights frozen by leaving them out of the optimizer, "
                                 "requires_grad left on", {"frozen_by": "optimizer"},
                                 claims.WRONG),
                     claims.Move("LoRA on every linear at rank 48 instead of 8 (the model is "
                                 "64 wide)", {"all_linear_rank": 48}, claims.CAVEAT)])
def c23(ev: dict) -> claims.Verdict:
    """Holds if every frozen set-up counts fewer FLOPs per step than full fine-tuning, all in the backward.

    Wrong if freezing alone (no adapters) saves nothing; caveat if an adapter set-up counts as
    many FLOPs as full fine-tuning or more while freezing alone saves.
    """
    rows = ev["rows"]
    full = rows["full"]
    total = {n: r["forward"] + r["backward"] for n, r in rows.items()}
    frozen = {n: r for n, r in rows.items() if n != "full"}
    plain = {n: r for n, r in frozen.items() if not r["adapters"]}
    saves = bool(plain) and all(total[n] < total["full"] for n in plain)
    in_backward = all(r["forward"] == full["forward"] and r["backward"] < full["backward"]
                      for r in plain.values())
    costlier = [n for n, r in frozen.items() if r["adapters"] and total[n] >= total["full"]]
    listed = "; ".join(f"{n}: backward {r['backward'] / r['forward']:.2f}x its forward, step "
                       f"{total[n] / total['full']:.2f} of full's" for n, r in frozen.items())
    how = ("with requires_grad off" if ev["frozen_by"] == "requires_grad"
           else "left out of the optimizer, requires_grad on")
    kept = max((r["backward"] / full["backward"] for r in plain.values()), default=1.0)
    evidence = (f"counted by FlopCounterMode on {ev['model']} (eager attention), frozen weights "
                f"{how}: full fine-tuning's backward is {full['backward'] / full['forward']:.2f}x "
                f"its forward; {listed}. Only the weight-gradient products go: every layer above "
                "the lowest trained one still computes its input gradient, whatever the set-up")
    return claims.judge_parts("", [
        claims.Part("freezing weights saves computation", saves,
                    "frozen weights that keep requires_grad still get their gradients computed: "
                    "the step counts as many FLOPs as full fine-tuning"),
        claims.Part("because frozen weights need no gradients (the saving is in the backward)",
                    in_backward, f"the backward of freezing alone counts {kept:.2f}x full "
                                 "fine-tuning's"),
    ], evidence, caveat_applies=bool(costlier) and saves and in_backward,
        caveat=f"freezing alone saves, but adapters can add more products than it removes: "
               f"{', '.join(costlier)} counts {max((total[n] for n in costlier), default=0) / total['full']:.2f}"
               "x full fine-tuning's FLOPs per step")


# C24 -------------------------------------------------------------------------------------------
def c24_evidence(batch_size: int = 1, checkpointing: bool = False) -> dict:
    """Trainable share and LoRA / full peaks of Llama-2-7B against T, estimated (chapter: 5).

    Both in full fine-tuning's precision (what training fewer parameters saves), and LoRA with a
    16-bit base beside it; the measured peaks of the book's model too.
    """
    from memlab.finetune.experiments import finetune_compare

    if (batch_size, checkpointing) == (1, False):
        ctx = finetune_context()  # the chapter's table
    else:
        ctx = context_sweep(batch_size=batch_size, checkpointing=checkpointing, ranks=(8,),
                            targets=(("q_proj", "v_proj"),))
    cfg = get_config(ctx.model)
    cmp = finetune_compare()
    full, lora = cmp.row("full"), cmp.row("LoRA q,v r=4")
    return dict(model=ctx.model, trainable=trainable_parameters(cfg, lora=LoraConfig(r=8)),
                parameters=cfg.num_parameters(), precision=ctx.precision,
                lora_precision=ctx.lora_precision, batch_size=ctx.batch_size,
                checkpointing=ctx.checkpointing,
                ratio={r.seq_len: r.fewer_trained for r in ctx.rows},
                share={r.seq_len: r.same_activation_share for r in ctx.rows},
                base16={r.seq_len: r.lora_over_full for r in ctx.rows},
                measured=dict(device=cmp.device, full=full.peak_bytes, lora=lora.peak_bytes,
                              parameters=cmp.config.model_config().num_parameters()),
                far_less=0.5, few=0.01)


def _c24(ev: dict) -> claims.Verdict:
    ratio, share, far = ev["ratio"], ev["share"], ev["far_less"]
    lengths = sorted(ratio)
    short, long = lengths[0], lengths[-1]
    few = ev["trainable"] / ev["parameters"]
    m = ev["measured"]
    over = [T for T in lengths if ratio[T] >= far]
    ckpt = ", checkpointing on" if ev["checkpointing"] else ""
    evidence = (
        f"{ev['model']}, r=8 on q_proj and v_proj: {ev['trainable']:,} trainable parameters, "
        f"{few:.3%} of {ev['parameters']:,}; estimated peak of LoRA over full fine-tuning, both "
        f"in {ev['precision']}, batch {ev['batch_size']}{ckpt}: "
        + ", ".join(f"{ratio[T]:.2f} at {T}" for T in lengths)
        + f" tokens (saved activations {share[short]:.0%} to {share[long]:.0%} of LoRA's peak); "
        f"with the frozen base stored in {ev['lora_precision']} as well: {ev['base16'][short]:.2f}"
        f" to {ev['base16'][long]:.2f}; measured on the book's model ({m['parameters']:,} "
        f"parameters, {m['device']}, LoRA r=4 on q, v): {m['lora'] / m['full']:.2f}")
    return claims.judge_parts("", [
        claims.Part("trains far fewer parameters", few < ev["few"],
                    f"{few:.1%} of the parameters train"),
        claims.Part("and so needs far less GPU memory", ratio[short] < far,
                    f"at {short} tokens LoRA's peak is already {ratio[short]:.0%} of full "
                    "fine-tuning's: the frozen weights and the activations dominate"),
    ], evidence, caveat_applies=bool(over),
        caveat=(f"far less only up to {max((T for T in lengths if over[0] > T), default=short)} "
                f"tokens at batch {ev['batch_size']}: from {over[0]} on the activations, which LoRA "
                f"keeps, bring its peak to {ratio[over[0]]:.0%} of full fine-tuning's and more"
                if over else None))


@claims.register("C24", _CH5, "LoRA on the query and value projections trains far fewer "
                 "parameters and so needs far less GPU memory.", evidence=c24_evidence, moves=[
                     claims.Move("activation checkpointing on", {"checkpointing": True},
                                 claims.HOLDS),
                     claims.Move("a batch of 16 sequences instead of 1", {"batch_size": 16},
                                 claims.WRONG)])
def c24(ev: dict) -> claims.Verdict:
    """Holds if under ``few`` of the parameters train and LoRA's peak is under ``far_less`` of full's.

    Both peaks in full fine-tuning's precision, at the shortest length; caveat if it is not
    under ``far_less`` at a longer one.
    """
    return claims.with_sensitivity(_c24, ev, "far_less", (0.1, 0.33, 0.5, 0.67),
                                   lambda f: f"'far less' read as under {f:.0%}")


# C25 -------------------------------------------------------------------------------------------
def c25_evidence(merged: bool = False) -> dict:
    """Adapters off against the base model, and a 7B copy's bytes (chapter: 5).

    ``merged=True`` merges the adapters into the base weights before switching them off.
    """
    r = finetune_reference()
    cfg = get_config("llama2-7b")
    return dict(merged=merged, check=vars(r.merged if merged else r.unmerged),
                copy_7b=base_weight_bytes(cfg, "bf16"),
                adapters_7b=4 * trainable_parameters(cfg, lora=LoraConfig(r=8)),
                rounding=1e-4)


def _c25(ev: dict) -> claims.Verdict:
    c = ev["check"]
    close = c["tuned_differs"] and c["max_abs_diff"] <= ev["rounding"]
    same = ("bit for bit" if c["identical"]
            else f"to a max difference of {c['max_abs_diff']:.2g}")
    how = "merged into the base, then" if ev["merged"] else "kept apart and"
    evidence = (f"measured on the book's model, adapters {how} switched off: the base's logits "
                f"{same} (adapters on change them: {c['tuned_differs']}); the same weights serve "
                f"both, so no copy is made: a second copy would take {c['second_copy_bytes']:,} "
                f"bytes against {c['adapter_bytes']:,} for the adapters; for Llama-2-7B in bf16, "
                f"{_gib(ev['copy_7b'])} against {_gib(ev['adapters_7b'])}")
    return claims.judge_parts("", [
        claims.Part("with adapters switched off, the same model gives reference outputs", close,
                    f"switching the adapters off leaves the logits {c['max_abs_diff']:.2g} away "
                    "from the base model's"),
        claims.Part("so no second model copy is needed", close,
                    "the weights with adapters off do not give the base model's outputs"),
    ], evidence, caveat_applies=close and not c["identical"],
        caveat=f"the reference outputs only to rounding ({c['max_abs_diff']:.2g}), not bit for "
               "bit: merged adapters are subtracted again when switched off")


@claims.register("C25", _CH5, "With adapters switched off, the same model gives reference "
                 "outputs, so reinforcement learning from feedback needs no second model copy.",
                 evidence=c25_evidence, moves=[
                     claims.Move("adapters merged into the base weights before being switched "
                                 "off", {"merged": True}, claims.CAVEAT)])
def c25(ev: dict) -> claims.Verdict:
    """Holds if switching the (trained, non-zero) adapters off gives the base's logits bit for bit.

    Caveat if only to within ``rounding``; wrong if further.
    """
    return claims.with_sensitivity(_c25, ev, "rounding", (1e-7, 1e-6, 1e-4, 1e-2),
                                   lambda t: f"rounding read as at most {t:.0e}")


# C26 -------------------------------------------------------------------------------------------
C26_LENGTHS = (128, 256, 512, 1024, 2048)


def c26_evidence(gpu: str = TWENTY_B_SIZES["ci"]["gpu"], seq_len: int = 512) -> dict:
    """NeoX-20B shapes with an int8 or NF4 base and LoRA, against a 24 GB consumer card (chapter: 5).

    With checkpointing off and on, at several lengths; ``seq_len`` is the one judged.
    """
    from memlab.gpus import CONSUMER, get_gpu

    card = get_gpu(gpu)
    runs = {T: twenty_b(gpu=card.name, seq_len=T) for T in sorted({*C26_LENGTHS, seq_len})}
    any_run = runs[seq_len]
    return dict(parameters=NEOX_20B.num_parameters(), gpu=card.name,
                consumer=card in CONSUMER, label=card.memory_label, usable=any_run.usable_bytes,
                total=card.total_bytes, batch_size=any_run.batch_size,
                peaks={T: r.peaks for T, r in runs.items()}, weights=any_run.weights,
                seq_len=seq_len)


def _c26(ev: dict) -> claims.Verdict:
    T, usable = ev["seq_len"], ev["usable"]
    peaks = ev["peaks"][T]
    fit = {k: p <= usable for k, p in peaks.items()}
    int8 = fit["int8"] or fit["int8 + checkpointing"]
    best = min(peaks["int8"], peaks["int8 + checkpointing"])
    longest = max((L for L, p in ev["peaks"].items() if p["int8 + checkpointing"] <= usable),
                  default=None)
    kind = "consumer card" if ev["consumer"] else "card"
    listed = ", ".join(f"{k} {to_unit(p, 'GiB'):.2f} GiB" for k, p in peaks.items())
    evidence = (
        f"estimated for GPT-NeoX-20B's shapes ({ev['parameters']:,} parameters), LoRA r=16 on "
        f"every linear, batch {ev['batch_size']} x {T} tokens, base weights and adapters "
        f"{_gib(ev['weights']['int8'])} in int8, {_gib(ev['weights']['nf4-dq'])} in NF4: peaks "
        f"{listed}; the {ev['gpu']} ({ev['label']} {kind}, {to_unit(ev['total'], 'MiB'):,.0f} "
        f"MiB by nvidia-smi, quoted) has {to_unit(usable, 'GiB'):.2f} GiB usable: the int8 "
        f"set-up's margin is {to_unit(usable - best, 'GiB'):+.2f} GiB"
        + (f"; with checkpointing it fits up to {longest} tokens of those tried" if longest
           else ""))
    return claims.judge_parts("", [
        claims.Part(f"a 20B model with 8-bit weights and LoRA fits a {ev['label']} card", int8,
                    "an 8-bit base does not fit at this size; a 4-bit (NF4) base does"
                    if any(fit[k] for k in fit if k.startswith("nf4"))
                    else "neither an 8-bit nor a 4-bit base fits at this size"),
    ], evidence, caveat_applies=int8 and not fit["int8"],
        caveat=f"only with activation checkpointing at batch {ev['batch_size']} x {T}: without "
               f"it the int8 set-up needs {to_unit(peaks['int8'], 'GiB'):.2f} GiB, "
               f"{to_unit(peaks['int8'] - usable, 'GiB'):.2f} GiB more than the card has")


@claims.register("C26", _CH5, "A 20B model can be fine-tuned on a 24 GB consumer GPU using "
                 "8-bit weights and LoRA.", evidence=c26_evidence, moves=[
                     claims.Move("sequences of 128 tokens instead of 512", {"seq_len": 128},
                                 claims.HOLDS),
                     claims.Move("a 16 GB card (T4) instead of a 24 GB one", {"gpu": "T4"},
                                 claims.WRONG)])
def c26(ev: dict) -> claims.Verdict:
    """Holds if the int8 base with LoRA fits without checkpointing at the judged batch and length.

    Caveat if only with checkpointing; wrong if not at all.
    """
    return claims.with_sensitivity(_c26, ev, "seq_len", tuple(sorted(ev["peaks"])),
                                   lambda t: f"{t} tokens per sequence")
