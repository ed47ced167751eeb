"""Chapter 3's claims (C15-C19, C43).

Each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.

Quality verdicts come from the book's small model (its parameter count is in the evidence):
they say what happens at that size, and chapter 3 sets published large-model figures beside
them as quoted citations.
"""

from __future__ import annotations

import functools
import math

from memlab import claims
from memlab.quant.compare import GROUP_SIZE, compare_schemes
from memlab.quant.outliers import NORMED_INPUTS, outlier_study
from memlab.quant.published import GPTQ, LLM_INT8
from memlab.quant.qat import MOVED, gain, qat_vs_ptq_ci
from memlab.quant.sizes import memory_20b, neox_20b_groups

_CH3 = "chapters/03_quantization"
CLAIMED_GB = {"fp32": 80, "fp16": 40, "int8 (per-row absmax)": 20, "nf4": 10}
CLAIMED_BITS = {"fp32": 32, "fp16": 16, "int8 (per-row absmax)": 8, "nf4": 4}
TWO_SE_MISS = math.erfc(2 / math.sqrt(2))  # chance that noise alone crosses 2 SE, two-sided


def published_beside(source: str, model: str) -> str:
    """Quoted large-model figures of one paper's model as nats above its 16-bit row (chapter: 3).

    As "RTN 4-bit +0.234, ...".
    """
    from memlab.quant.published import PUBLISHED

    rows = [r for r in PUBLISHED if r.source == source and r.model == model]
    ref = {r.setting: r.value for r in rows}
    return ", ".join(f"{r.setting} {math.log(r.value / ref[r.reference]):+.3f}" for r in rows
                     if r.reference and r.setting != r.reference)


# C15 -------------------------------------------------------------------------------------------
@functools.cache
def c15_evidence() -> dict:
    """GPT-NeoX-20B's parameter count and stored GB per format against the claim's GB (chapter: 3)."""
    n = sum(neox_20b_groups().values())
    rows = {r.scheme: r for r in memory_20b()}
    return dict(params=n, naive={k: n * b / 8 / 1e9 for k, b in CLAIMED_BITS.items()},
                stored={k: r.weights_gb for k, r in rows.items()},
                bits={k: r.bits_per_param for k, r in rows.items()}, tolerance=0.05)


@claims.register("C15", _CH3, "A 20B-parameter model needs 80 GB in fp32, 40 GB in fp16, "
                 "20 GB in int8 and 10 GB in 4-bit.", evidence=c15_evidence)
def c15(ev: dict) -> claims.Verdict:
    """Holds if every stored size is within 5% of the claim.

    Caveat if only n x bits / 8 is; wrong otherwise.
    """
    tol = ev["tolerance"]

    def near(x, k):
        return abs(x / CLAIMED_GB[k] - 1) <= tol

    naive_ok = all(near(ev["naive"][k], k) for k in CLAIMED_GB)
    off = [k for k in CLAIMED_GB if not near(ev["stored"][k], k)]
    stored = ", ".join(f"{k} {v:.1f} GB" for k, v in ev["stored"].items())
    return claims.judge(
        "", naive_ok,
        f"computed for GPT-NeoX-20B's shape ({ev['params']:,} parameters): n x bits / 8 gives "
        + " / ".join(f"{ev['naive'][k]:.1f}" for k in CLAIMED_GB)
        + f" GB; the stored tensors (scales included, embeddings, head and norms in 16-bit): "
        f"{stored}; arithmetic on the claim's own numbers (20e9 x bits / 8) gives the claimed "
        f"figures by construction; 'needs' taken as within {tol:.0%}",
        caveat_applies=bool(off),
        caveat=(f"right as n x bits / 8 for the weights alone; the stored model is larger in "
                f"{', '.join(off)} (NF4: {ev['stored']['nf4']:.1f} GB, scales add "
                f"{ev['bits']['nf4'] - 4:.2f} bit per weight and the embeddings stay 16-bit); "
                "training or generating adds activations, the KV cache and the CUDA context"),
        correction="even n x bits / 8 for a real 20B model differs from the claimed figures")


# C16 -------------------------------------------------------------------------------------------
def c16_evidence() -> dict:
    """Stored bits per parameter of the book's model in three formats (chapter: 3).

    NF4, NF4 with double quantization, and 4-bit RTN.
    """
    comp = compare_schemes(None, device="cpu")
    n_all = comp.fp32_bytes / 4
    return dict(params=int(n_all),
                linear_bits={k: comp.row(k).bits_per_param for k in ("nf4", "nf4-dq", "rtn-4")},
                model_bits=8 * comp.row("nf4").total_bytes / n_all, tolerance=0.05)


@claims.register("C16", _CH3, "A 4-bit model costs exactly half a byte per parameter.",
                 evidence=c16_evidence)
def c16(ev: dict) -> claims.Verdict:
    """Holds if the whole NF4 model is 4 bits/param exactly; caveat within 5% ('about'); wrong beyond."""
    lb, mb = ev["linear_bits"], ev["model_bits"]
    block = round(32 / (lb["nf4"] - 4)) if lb["nf4"] > 4 else 0
    return claims.judge(
        "", abs(mb / 4 - 1) <= ev["tolerance"],
        f"measured from the stored tensors of the book's {ev['params']:,}-parameter model: "
        f"block linears {lb['nf4']:.3f} bits/weight in NF4, {lb['nf4-dq']:.3f} with double "
        f"quantization, {lb['rtn-4']:.3f} for 4-bit zero-point in groups of {GROUP_SIZE}; "
        f"whole model in NF4 {mb:.2f} bits/param (embedding, norms and head in bf16)",
        caveat_applies=mb != 4.0,
        caveat=f"about half a byte, not exactly: {mb:.3f} bits/param",
        correction=(f"4-bit codes cost half a byte, but each block of {block} weights also "
                    f"stores an fp32 absmax: {lb['nf4']:.2f} bits per weight, "
                    f"{lb['nf4-dq']:.3f} with double quantization, and the layers left in "
                    f"16-bit raise the whole model to {mb:.2f} bits/param"),
        sensitivity=f"a tolerance of {ev['tolerance']:.0%} here; would be {claims.CAVEAT} "
                    f"with a tolerance of {mb / 4 - 1:.0%} or more")


# C17 -------------------------------------------------------------------------------------------
def c17_evidence() -> dict:
    """Paired held-out loss differences against fp32, with standard errors, for every scheme (chapter: 3)."""
    comp = compare_schemes(None, device="cpu")
    rows = [r for r in comp.rows if r.scheme != "fp32"]
    return dict(delta={r.scheme: r.loss_delta for r in rows},
                se={r.scheme: r.loss_delta_se for r in rows},
                sequences=comp.config.eval_sequences, params=int(comp.fp32_bytes / 4),
                ref_excess=comp.row("fp32").excess, z=2.0,
                published=published_beside(GPTQ, "OPT-175B"))


def _c17(ev: dict) -> claims.Verdict:
    d, se, z = ev["delta"], ev["se"], ev["z"]
    raised = [k for k in d if d[k] > z * se[k]]
    lowered = [k for k in d if d[k] < -z * se[k]]
    within = [k for k in d if k not in raised and k not in lowered]
    edge = min(d, key=lambda k: abs(abs(d[k]) - z * se[k]) / max(se[k], 1e-12))

    def pm(k: str) -> str:
        return f"{d[k]:+.4f} +- {z * se[k]:.4f}"

    m = len(d)
    return claims.judge(
        "", bool(raised),
        f"measured on the book's {ev['params']:,}-parameter model (not a large LLM), held-out "
        f"loss minus fp32's on the same {ev['sequences']} sequences, nats (+- {z:g} paired "
        f"standard errors): " + ", ".join(f"{k} {pm(k)}" for k in d)
        + f"; fp32 is {ev['ref_excess']:.4f} above the optimum. {m} comparisons at {z:g} SE: "
        f"noise alone would push about {m * TWO_SE_MISS:.1f} of them across by chance. "
        f"Nearest the edge: {edge} ({pm(edge)}). Quoted for large models, nats above fp16 from "
        f"{GPTQ}'s WikiText2 perplexities: OPT-175B {ev['published']}",
        caveat_applies=bool(within or lowered),
        caveat=(f"it depends on bits and method: raised beyond the noise by {', '.join(raised)}; "
                f"within {z:g} SE of fp32: {', '.join(within) or 'none'}"
                + (f"; lower than fp32: {', '.join(lowered)}" if lowered else "")),
        correction=f"no scheme raised the held-out loss beyond {z:g} standard errors here")


@claims.register("C17", _CH3, "Quantization degrades model quality. (How much, for which "
                 "scheme and bit width?)", evidence=c17_evidence)
def c17(ev: dict) -> claims.Verdict:
    """Holds if every scheme raises the loss beyond z SE; caveat if some do; wrong if none does."""
    return claims.with_sensitivity(_c17, ev, "z", (1.0, 2.0, 3.0, 4.0), lambda z: f"{z:g} SE")


# C18 -------------------------------------------------------------------------------------------
def c18_evidence() -> dict:
    """Outlier columns found, and int8 against LLM.int8() on the model with injected outliers (chapter: 3)."""
    st = outlier_study(None, device="cpu")
    rows = {r.scheme: r for r in st.rows}
    i8, llm = rows["injected int8"], rows["injected llm-int8"]
    most = max(st.found, key=lambda f: f.outlier_columns)
    busiest = max(st.found, key=lambda f: f.outlier_columns / f.features)
    normed = max(f.outlier_columns for f in st.found if f.layer.split(".")[-1] in
                 {t.split(".")[-1] for ts in NORMED_INPUTS.values() for t in ts})
    k = st.sweep_alpha.index(max(st.sweep_alpha))
    return dict(
        threshold=st.threshold, most=(most.layer, most.outlier_columns), normed=normed,
        busiest=(busiest.layer, busiest.outlier_columns, busiest.features),
        injected=len(st.channels), alpha=st.alpha,
        layer_error={"int8": i8.mean_layer_error, "llm-int8": llm.mean_layer_error},
        excess={"int8": i8.excess, "llm-int8": llm.excess},
        sweep=(st.sweep_alpha[k], st.sweep_int8[k], st.sweep_llm_int8[k]),
        ratio_needed=2.0, quality_margin=0.01,
        published=published_beside(LLM_INT8, "13B"))


def _c18(ev: dict) -> claims.Verdict:
    le, ex = ev["layer_error"], ev["excess"]
    ratio = le["int8"] / le["llm-int8"]
    quality_gap = ex["int8"] - ex["llm-int8"]
    most, busiest = ev["most"], ev["busiest"]
    return claims.judge(
        "", ratio > ev["ratio_needed"],
        f"measured on the book's small model: the layer with the most outlier columns "
        f"({most[0]}) has {most[1]} at |x| >= {ev['threshold']:g} (inputs from a norm: at "
        f"most {ev['normed']}); with {ev['injected']} outlier features injected "
        f"(x{ev['alpha']:g}), mean layer output error int8 {le['int8']:.4f} vs LLM.int8() "
        f"{le['llm-int8']:.4f} ({ratio:.1f}x), held-out loss above optimum {ex['int8']:.4f} vs "
        f"{ex['llm-int8']:.4f} nats; at x{ev['sweep'][0]:g} one layer's error is "
        f"{ev['sweep'][1]:.3f} vs {ev['sweep'][2]:.3f}; 'preserves' taken as a layer error "
        f"over {ev['ratio_needed']:g}x smaller and a held-out loss lower by more than "
        f"{ev['quality_margin']} nats. Quoted for a 13B model, nats above 32-bit from "
        f"{LLM_INT8}'s C4 perplexities: {ev['published']}",
        caveat_applies=quality_gap <= ev["quality_margin"],
        caveat=("outliers must be present, and the gain shows in the layer error (the "
                "mechanism) more than in quality at this size: the inputs that come from a norm "
                "have none of their own (they were injected, as Dettmers et al. 2022 find them "
                "from about 6.7B parameters), and plain int8 loses little held-out loss here; "
                "where outliers are many rather than few (this model's "
                f"{busiest[0].split('.', 2)[-1]}: {busiest[1]} of {busiest[2]} input columns) "
                "LLM.int8() multiplies most of the layer in 16-bit"),
        correction=f"LLM.int8() did not cut the layer error by more than "
                   f"{ev['ratio_needed']:g}x here")


@claims.register("C18", _CH3, "LLM.int8() keeps outlier features in 16-bit and the rest in "
                 "int8, and so preserves quality where plain int8 fails.", evidence=c18_evidence)
def c18(ev: dict) -> claims.Verdict:
    """Holds if the layer error falls over 2x and the loss by the margin; caveat if only the error does."""
    return claims.with_sensitivity(_c18, ev, "ratio_needed", (1.5, 2.0, 5.0, 10.0),
                                   lambda r: f"a required ratio of {r:g}x")


# C43 -------------------------------------------------------------------------------------------
def c43_evidence() -> dict:
    """Recorded GPU timings of int8 layers if any, and a roofline (chapter: 3).

    The roofline of one 8192 x 8192 layer per GPU.
    """
    from memlab.gpus import CATALOGUE, compute_bound_from, roofline_matmul_s
    from memlab.results import recorded

    rec = recorded("quant-speed")
    timed = {}
    for r in () if rec is None else rec.value().rows:
        if r.kind in ("int8", "llm-int8"):
            timed.setdefault(r.kind, {})[r.tokens] = r.vs_bf16
    d = 8192
    roof = {}
    for gpu in CATALOGUE:
        if "int8" not in dict(gpu.peak_tera_ops) or not gpu.bandwidth_bytes_per_s:
            continue
        c16 = "bf16" if "bf16" in dict(gpu.peak_tera_ops) else "fp16"
        base = {n: roofline_matmul_s(gpu, n, d, d, compute=c16, weight_bytes=2)
                for n in (1, 4096)}
        roof[gpu.name] = dict(
            from_tokens=compute_bound_from(gpu, d, d, compute=c16, weight_bytes=1),
            w8a8={n: roofline_matmul_s(gpu, n, d, d, compute="int8", weight_bytes=1,
                                       activation_bytes=1) / base[n] for n in base},
            w8a16={n: roofline_matmul_s(gpu, n, d, d, compute=c16, weight_bytes=1) / base[n]
                   for n in base})
    return dict(label=rec.label if rec is not None else "", timed=timed, roofline=roof, d=d)


@claims.register("C43", _CH3, "Integer (int8) arithmetic makes inference faster.",
                 evidence=c43_evidence)
def c43(ev: dict) -> claims.Verdict:
    """Judged on recorded timings only.

    Pure int8 GEMM and LLM.int8() are each faster everywhere, somewhere, or nowhere.
    """
    roof = ev["roofline"]
    words = "; ".join(
        f"{name}: compute-bound from {r['from_tokens']} tokens, int8 x int8 / 16-bit time "
        f"{r['w8a8'][1]:.2f} at 1 token and {r['w8a8'][4096]:.2f} at 4,096; int8 weights "
        f"with 16-bit arithmetic {r['w8a16'][1]:.2f} and {r['w8a16'][4096]:.2f}"
        for name, r in roof.items())
    roofline = (f"estimated by roofline for one {ev['d']:,} x {ev['d']:,} layer from quoted "
                f"peaks and bandwidths: {words}. Below the compute-bound point both int8 kernels "
                "gain only by reading fewer weight bytes, which weight-only quantization gets "
                "without integer arithmetic; above it int8 arithmetic can gain up to its 2x "
                "peak")
    timed = ev["timed"]
    if not timed:
        return claims.not_judged(
            "", roofline,
            "no GPU timing is recorded: speed is judged on measured times of a pure int8 "
            "matmul and of LLM.int8(), never on a list of tensor-core features; the roofline "
            "says where int8 arithmetic could win",
            command="memlab run quant-speed --scale full --out results/")
    faster = {k: [n for n, r in v.items() if r < 1] for k, v in timed.items()}
    any_faster = any(faster.values())
    everywhere = all(len(f) == len(timed[k]) for k, f in faster.items())
    return claims.judge(
        "", any_faster,
        f"{ev['label']}: layer time / bf16 = " + "; ".join(
            f"{k} " + ", ".join(f"{r:.2f} at {n} tokens" for n, r in v.items())
            for k, v in timed.items()) + f". {roofline}",
        caveat_applies=not everywhere,
        caveat="faster only at " + "; ".join(
            f"{k}: {', '.join(map(str, f)) or 'no'} tokens" for k, f in faster.items()),
        correction="every int8 kernel timed ran slower than bf16: it saves memory, not time")


# C19 -------------------------------------------------------------------------------------------
CLAIM_BITS = 3  # the chapter's QAT setting; at 2 bits QAT's gain over PTQ is far larger


def c19_evidence() -> dict:
    """LSQ's learned step sizes and PyTorch's default fake quantization, at 3 bits (chapter: 3)."""
    r = qat_vs_ptq_ci(CLAIM_BITS)
    t = r.torch_fake_quant
    return dict(result=r, moved=MOVED, change=r.scale_change_median,
                default_learns=bool(t.scale_is_parameter and t.scale_gets_grad))


@claims.register("C19", _CH3, "Quantization-aware training learns the quantization scale "
                 "factors during training.", evidence=c19_evidence)
def c19(ev: dict) -> claims.Verdict:
    """Holds if learned scales move and torch's default QAT learns them.

    Caveat if only LSQ's do; wrong if they do not move.
    """
    r = ev["result"]
    t = r.torch_fake_quant
    per_layer = ", ".join(f"{s.median_ratio:.3f}" for s in r.scales)
    kind = ("Parameter" if t.scale_is_parameter else "buffer" if t.scale_is_buffer
            else "not found")
    default = (t.default_qat_weight or "none").rsplit(".", 1)[-1]
    evidence = (
        f"LSQ (a learned step size per row) at {r.bits} bits on the chapter's small model, "
        f"{r.steps} fine-tuning steps at lr {r.lr:g} (measured, CPU): the step sizes moved "
        f"from their absmax/qmax start by a median {ev['change']:.1%} per row "
        f"(per-layer median learned/initial {per_layer}; min/max QAT's step sizes, which "
        f"follow the weights, moved {r.minmax_change_median:.1%}); excess loss PTQ "
        f"{r.ptq.excess:.4f}, QAT with learned scales {r.qat.excess:.4f}, QAT with min/max "
        f"scales {r.qat_minmax.excess:.4f}, fine-tune then PTQ {r.control.excess:.4f} nats; "
        f"torch {t.torch_version}: default QAT weight fake-quantize {default}, scale a "
        f"{kind}, gets a gradient: {t.scale_gets_grad}, changes with the observed data "
        f"alone: {t.scale_follows_data}; learnable variant: {t.learnable or 'none'} (scale "
        f"a Parameter: {t.learnable_scale_is_parameter}, exported by "
        f"torch.ao.quantization: {t.learnable_public}); 'learns' taken as a median change "
        f"above {ev['moved']:.0%}")
    mostly_weights = abs(r.learned_scale_gain) < 0.5 * abs(r.qat_gain)
    caveat = (
        "only QAT methods that make the scale a trained parameter learn it (LSQ; PACT "
        f"for activation clipping); PyTorch's default QAT fake quantization ({default}) "
        f"keeps the scale in a {kind} computed from the observed min/max, which "
        "training does not update"
        + (f"; its learned-scale variant is {t.learnable}"
           + ("" if t.learnable_public else ", not exported") if t.learnable else "")
        + f". Here, held-out loss lowered by (nats, negative = raised, +- 2 paired "
        f"standard errors): learning the scale instead of recomputing it from min/max "
        f"{gain(r.qat_minmax, r.qat)}; QAT instead of PTQ {gain(r.ptq, r.qat)}; QAT "
        f"instead of as much fp32 fine-tuning, then PTQ {gain(r.control, r.qat)}"
        + ("; most of QAT's gain comes from the weights adapting to the grid, not from "
           "learning the scale" if mostly_weights else
           "; learning the scale accounts for much of QAT's gain"))
    return claims.judge(
        "", ev["change"] > ev["moved"], evidence,
        caveat_applies=not ev["default_learns"], caveat=caveat,
        correction=(
            f"with learned step sizes (LSQ) the scales barely moved (median "
            f"{ev['change']:.2%}); QAT lowers PTQ's excess loss by {r.qat_gain:.4f} nats, which "
            "comes from the weights adapting to a fixed grid, and PyTorch's default "
            f"fake quantization ({default}) computes its scale from the observed min/max "
            "rather than learning it"))
