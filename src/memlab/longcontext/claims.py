"""Chapter 8's claims (C45-C48).

Each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.
"""

from __future__ import annotations

from memlab import claims
from memlab.finetune.compare import SETUPS
from memlab.finetune.estimate import estimate_finetune
from memlab.longcontext.offload import offload_study
from memlab.longcontext.where import length_table
from memlab.model.config import get_config
from memlab.model.step import StepSpec

_CH8 = "chapters/08_long_context"
GB = 1e9


def _setups(names) -> tuple:
    by_name = {s.name: s for s in SETUPS}
    return tuple(by_name[n] for n in names)


# C45 -------------------------------------------------------------------------------------------
C45_SETUPS = tuple(s.name for s in SETUPS)  # chapter 5's set-ups
C45_BATCHES = (1, 2, 4, 8)
C45_SEQ_LENS = (2048, 4096, 8192)


def c45_evidence(model: str = "llama3.1-8b", setups=C45_SETUPS, batch_sizes=C45_BATCHES,
                 seq_lens=C45_SEQ_LENS, checkpointing: bool = True) -> dict:
    """Activations against weights and optimizer, and GB per billion, per set-up (chapter: 8).

    For each of chapter 5's set-ups at each batch and length, estimated (held to traces in
    chapter 5's tests): the persistent states (weights, gradients, optimizer states), the rest
    of the peak (activations and temporaries) over them, and the peak in GB per billion
    parameters. Full fine-tuning in bf16 mixed precision with AdamW; the adapters on a bf16 base.
    """
    n = get_config(model).num_parameters()
    rows = []
    for setup in _setups(setups):
        precision = "bf16-mixed" if setup.name == "full" else "bf16"
        for T in seq_lens:
            for B in batch_sizes:
                e = estimate_finetune(StepSpec(model, batch_size=B, seq_len=T, precision=precision,
                                               checkpointing=checkpointing,
                                               prepare=None if setup.name == "full" else setup))
                states = e.parameters_bytes + e.gradients_bytes + e.optimizer_states_bytes
                rows.append(dict(setup=setup.name, batch_size=B, seq_len=T, precision=precision,
                                 states_bytes=states, peak_bytes=e.peak_bytes,
                                 activations_over_states=(e.peak_bytes - states) / states,
                                 gb_per_billion=e.peak_bytes / GB / (n / GB)))
    return dict(model=model, parameters=n, checkpointing=checkpointing, rows=rows,
                not_nearly=0.5, about=(16 / 1.3, 16 * 1.3))


def _c45(ev: dict) -> claims.Verdict:
    rows = ev["rows"]
    small = min((r["batch_size"] * r["seq_len"], r["batch_size"]) for r in rows)
    smallest = [r for r in rows if (r["batch_size"] * r["seq_len"], r["batch_size"]) == small]
    over = [r for r in rows if r["activations_over_states"] > ev["not_nearly"]]
    over_small = [r for r in smallest if r["activations_over_states"] > ev["not_nearly"]]
    full = [r for r in smallest if r["setup"] == "full"]
    lo, hi = ev["about"]
    per_b = {r["setup"]: r["gb_per_billion"] for r in smallest}

    def at(r):
        return f"{r['setup']} at {r['batch_size']} x {r['seq_len']:,}"

    worst = max(rows, key=lambda r: r["activations_over_states"])
    text = (f"{ev['model']}, chapter 5's set-ups, {'with' if ev['checkpointing'] else 'without'} "
            f"checkpointing, batch x length from {smallest[0]['batch_size']} x "
            f"{smallest[0]['seq_len']:,} up: activations and temporaries over weights, "
            f"gradients and optimizer states reach {worst['activations_over_states']:.2f} "
            f"({at(worst)}); at the smallest size the peak is "
            + ", ".join(f"{k} {v:.1f}" for k, v in per_b.items()) + " GB per billion parameters")
    parts = [
        claims.Part("activations don't add nearly as much memory as the weights and optimizer",
                    not over_small,
                    "already at the smallest size they add more than half for "
                    + ", ".join(f"{at(r)} ({r['activations_over_states']:.2f} x)"
                                for r in over_small)),
        claims.Part("about 16 GB per billion parameters",
                    bool(full) and all(lo <= r["gb_per_billion"] <= hi for r in full),
                    "full fine-tuning's peak is " + ", ".join(f"{r['gb_per_billion']:.1f}"
                                                              for r in full)
                    + " GB per billion" if full else "no full fine-tuning set-up was estimated"),
    ]
    return claims.judge_parts(
        "", parts, text, caveat_applies=bool(over),
        caveat=("only for small micro-batches: activations add more than half of the weights "
                "and optimizer from " + ", ".join(at(r) for r in over[:3])))


@claims.register("C45", _CH8, "In fine-tuning, activations don't add nearly as much memory as "
                 "the weights and optimizer; budget about 16 GB of GPU memory per billion "
                 "parameters.", evidence=c45_evidence, moves=[
                     claims.Move("full fine-tuning alone (no adapters), at micro-batches of up "
                                 "to 4 x 4,096 tokens", {"setups": ("full",),
                                                         "batch_sizes": (1, 2, 4),
                                                         "seq_lens": (2048, 4096)},
                                 claims.HOLDS),
                     claims.Move("full fine-tuning alone, at micro-batches up to 8 x 8,192",
                                 {"setups": ("full",)}, claims.CAVEAT)])
def c45(ev: dict) -> claims.Verdict:
    """Wrong if some set-up's activations exceed half its states at the smallest size.

    Also wrong if full fine-tuning's peak is outside 16 GB per billion by 30%; a caveat where
    larger micro-batches cross the half.
    """
    return claims.with_sensitivity(_c45, ev, "not_nearly", (0.25, 0.5, 1.0),
                                   lambda t: f"'not nearly as much' as at most {t:.0%}")


# C46 -------------------------------------------------------------------------------------------
C46_SETUPS = ("full", "LoRA all r=8", "QLoRA q,v r=8")


def c46_evidence(model: str = "llama3.1-8b", setups=C46_SETUPS, batch_sizes=(1, 4, 8),
                 seq_lens=(2048, 8192, 32768), gpu: str = "H100") -> dict:
    """Offloading the checkpointed activations: the cut and the batch that fits (chapter: 8).

    Estimated (the estimator held to traces in the tests, the hooks' bytes measured on the CPU),
    for chapter 5's set-ups with full checkpointing, on one GPU of ``gpu``'s memory.
    """
    study = offload_study(model, setups=_setups(setups), batch_sizes=batch_sizes,
                          seq_lens=seq_lens, gpu=gpu)
    return dict(study.as_dict(), about_cut=0.2, about_ratio=1.6)


def _c46(ev: dict) -> claims.Verdict:
    cuts = [c["cut"] for c in ev["cases"]]
    ratios = [f["ratio"] for f in ev["fits"] if f["ratio"] is not None]
    best = max(ev["cases"], key=lambda c: c["cut"])
    text = (f"{ev['model']}, {', '.join(dict.fromkeys(c['setup'] for c in ev['cases']))}, full "
            f"checkpointing: offloading cuts the peak by {min(cuts):.0%} to {max(cuts):.0%} "
            f"(most: {best['setup']} at {best['batch_size']} x {best['seq_len']:,}); the largest "
            f"batch on one {ev['gpu']} grows by x{min(ratios):.2f} to x{max(ratios):.2f}"
            if ratios else "no batch fits")
    parts = [
        claims.Part("cuts VRAM by about 30%", max(cuts) >= ev["about_cut"],
                    f"it cuts at most {max(cuts):.0%}: the logits, the weights and the optimizer "
                    "stay"),
        claims.Part("fits about twice the batch", bool(ratios) and max(ratios) >= ev["about_ratio"],
                    f"the batch grows by at most x{max(ratios):.2f}" if ratios
                    else "no batch fits either way"),
    ]
    return claims.judge_parts(
        "", parts, text,
        caveat_applies=min(cuts) < ev["about_cut"] or (bool(ratios)
                                                       and min(ratios) < ev["about_ratio"]),
        caveat=(f"only where the units' inputs are a large share of the peak (a deep model, a "
                f"small vocabulary, long sequences): elsewhere the cut is {min(cuts):.0%}"))


@claims.register("C46", _CH8, "Offloading the checkpointed activations to CPU memory cuts VRAM by "
                 "about 30% and fits about twice the batch.", evidence=c46_evidence, moves=[
                     claims.Move("QLoRA of Llama-2-70B (80 blocks, a 32,000-entry vocabulary) at "
                                 "2,048 and 4,096 tokens", {"model": "llama2-70b",
                                                            "setups": ("QLoRA q,v r=8",),
                                                            "seq_lens": (2048, 4096)},
                                 claims.CAVEAT)])
def c46(ev: dict) -> claims.Verdict:
    """Wrong if no setting cuts 20% or fits 1.6 times the batch; a caveat where only some do."""
    return _c46(ev)


# C47 -------------------------------------------------------------------------------------------
def c47_evidence(model: str = "llama3.1-8b", seq_lens=(2048, 8192, 32768, 131072),
                 loss_chunks: int = 1) -> dict:
    """The logits against the blocks' saved activations by length, with and without checkpointing.

    Estimated (held to traces in the tests) for one sequence in bf16 mixed precision (chapter: 8).
    """
    t = length_table(model, seq_lens, loss_chunks=loss_chunks)
    return t.as_dict()


def _c47(ev: dict) -> claims.Verdict:
    rows = ev["rows"]
    longest = max(r["seq_len"] for r in rows)
    ck = next(r for r in rows if r["seq_len"] == longest and r["checkpointing"])
    no = next(r for r in rows if r["seq_len"] == longest and not r["checkpointing"])
    same = {ckpt: {r["larger"] for r in rows if r["checkpointing"] == ckpt} for ckpt in (False, True)}
    k = ev["loss_chunks"]
    text = (f"{ev['model']} ({ev['vocab_size']:,}-entry vocabulary), one sequence"
            f"{f', the loss in {k} chunks' if k > 1 else ''}: "
            f"at {longest:,} tokens the logits hold {ck['logits_bytes'] / 2**30:.1f} GiB at "
            f"their highest; the blocks save {ck['blocks_bytes'] / 2**30:.1f} GiB with full "
            f"checkpointing and {no['blocks_bytes'] / 2**30:.1f} GiB without. The larger at "
            f"every length: with checkpointing {'/'.join(sorted(same[True]))}, without "
            f"{'/'.join(sorted(same[False]))}: every piece but an eager softmax grows linearly in T")
    parts = [claims.Part("the output logits, not the transformer blocks, set the peak memory at "
                         "long sequence lengths", ck["larger"] == "logits",
                         f"the blocks' saved activations are larger even with checkpointing "
                         f"({ck['blocks_bytes'] / 2**30:.1f} against "
                         f"{ck['logits_bytes'] / 2**30:.1f} GiB at {longest:,} tokens)")]
    return claims.judge_parts(
        "", parts, text, caveat_applies=no["larger"] == "blocks",
        caveat=(f"only with activation checkpointing: without it the blocks save "
                f"{no['blocks_bytes'] / no['logits_bytes']:.1f} x the logits, at every length "
                "(the answer depends on checkpointing, not on the length)"))


@claims.register("C47", _CH8, "With a large vocabulary, the output logits, not the transformer "
                 "blocks, set the peak memory at long sequence lengths.",
                 evidence=c47_evidence, moves=[
                     claims.Move("Llama-2-7B's 32,000-entry vocabulary instead of 128,256",
                                 {"model": "llama2-7b"}, claims.WRONG),
                     claims.Move("the loss computed in 32 chunks", {"loss_chunks": 32},
                                 claims.WRONG)])
def c47(ev: dict) -> claims.Verdict:
    """Holds if the logits exceed the checkpointed blocks at the longest length.

    A caveat when without checkpointing the blocks are larger; wrong if they are larger even with
    checkpointing.
    """
    return _c47(ev)


# C48 -------------------------------------------------------------------------------------------
C48_RANKS = (2, 4, 8, 16, 32, 64)
EXCHANGES = ("ring", "all-gather")


def c48_evidence(model: str = "llama3.1-8b", tokens_per_rank: int = 2048, ranks=C48_RANKS,
                 exchange: str = "ring") -> dict:
    """One rank's bytes as the sequence grows with the ranks, each holding a fixed share (chapter: 8).

    Estimated for the book's ring (:func:`memlab.longcontext.context_parallel.context_parallel_table`,
    held to a trace over a fake process group and to a measured ring over gloo in the tests),
    bf16 mixed precision, full checkpointing, one sequence. ``exchange='all-gather'`` is Llama 3's
    context parallelism instead (Dubey et al. 2024, "The Llama 3 Herd of Models", section
    3.3.2): every rank gathers the whole sequence's keys and values for each layer, so one
    layer's K and V and their gradients, for all T tokens, are added at the peak.
    """
    from memlab.errors import check_choice
    from memlab.longcontext.context_parallel import context_parallel_table
    from memlab.memory.activations import COMPUTE_BYTES

    check_choice("exchange", exchange, EXCHANGES)
    cfg = get_config(model)
    rows = []
    for r in context_parallel_table(cfg, tokens_per_rank=tokens_per_rank, ranks=tuple(ranks)):
        gathered = 0
        if exchange == "all-gather":
            kv = r.seq_len * cfg.kv_heads * cfg.head_dim * COMPUTE_BYTES["bf16-mixed"]
            gathered = 4 * kv  # K and V of every token, and their gradients, one layer
        # what the passes hold beyond the model states: the saved activations and the ring's
        # buffers and scores (the whole peak can sit in the optimizer step, which hides them)
        acts = r.saved_activations_bytes + r.ring_buffer_bytes + r.ring_scores_bytes
        rows.append(dict(ranks=r.ranks, seq_len=r.seq_len, tokens_per_rank=r.tokens_per_rank,
                         model_states_bytes=r.model_states_bytes,
                         activations_bytes=acts + gathered,
                         peak_bytes=r.peak_bytes + gathered, peak_phase=r.peak_phase,
                         kv_bytes_sent_per_step=r.kv_bytes_sent_per_step))
    return dict(model=model, tokens_per_rank=tokens_per_rank, exchange=exchange, rows=rows,
                constant_within=0.01)


def _c48(ev: dict) -> claims.Verdict:
    rows = ev["rows"]
    spread = max(max(v) / min(v) - 1 for v in ([r["activations_bytes"] for r in rows],
                                               [r["peak_bytes"] for r in rows]))
    first, last = rows[0], rows[-1]
    text = (f"{ev['model']}, {ev['tokens_per_rank']:,} tokens per rank ({ev['exchange']}): from "
            f"{first['ranks']} ranks ({first['seq_len']:,} tokens) to {last['ranks']} "
            f"({last['seq_len']:,}), one rank's peak goes from {first['peak_bytes'] / 2**30:.2f} to "
            f"{last['peak_bytes'] / 2**30:.2f} GiB, and its saved activations with the ring's "
            f"buffers and scores from "
            f"{first['activations_bytes'] / 2**30:.2f} to {last['activations_bytes'] / 2**30:.2f} "
            f"GiB; the key/value bytes it sends per step grow from "
            f"{first['kv_bytes_sent_per_step'] / 2**30:.1f} to "
            f"{last['kv_bytes_sent_per_step'] / 2**30:.1f} GiB")
    parts = [claims.Part("the context length grows linearly with the number of GPUs at constant "
                         "memory per GPU", spread <= ev["constant_within"],
                         f"one rank's bytes grow by {spread:.0%} from {first['ranks']} to "
                         f"{last['ranks']} ranks")]
    return claims.judge_parts("", parts, text)


@claims.register("C48", _CH8, "Ring attention lets the context length grow linearly with the "
                 "number of GPUs at constant memory per GPU.", evidence=c48_evidence, moves=[
                     claims.Move("Llama 3's all-gather context parallelism instead of a ring: "
                                 "each rank gathers every token's keys and values per layer",
                                 {"exchange": "all-gather"}, claims.WRONG)])
def c48(ev: dict) -> claims.Verdict:
    """Holds if one rank's bytes stay within ``constant_within`` as the ranks and the sequence grow."""
    return _c48(ev)
