"""Chapter 3's claims (C15-C19, C43).

Each ``evidence(**setting)`` computes the numbers in the claim's setting (its keyword
arguments' defaults), each ``decide(ev)`` the level, and each check registers the physical
changes of the setting that move it.

Quality verdicts come from the book's small model (its parameter count is in the evidence):
they say what happens at that size, and chapter 3 sets published large-model figures beside
them as quoted citations.
"""

from __future__ import annotations

import functools
import math

from memlab import claims
from memlab.errors import MemlabError
from memlab.quant.compare import GROUP_SIZE, compare_schemes
from memlab.quant.outliers import NORMED_INPUTS, outlier_study
from memlab.quant.published import GPTQ, LLM_INT8
from memlab.quant.qat import MOVED, SCALE_MODES, gain, qat_vs_ptq_ci
from memlab.quant.sizes import memory_20b, neox_20b_groups

_CH3 = "chapters/03_quantization"
CLAIMED_GB = {"fp32": 80, "fp16": 40, "int8 (per-row absmax)": 20, "nf4": 10}
CLAIMED_BITS = {"fp32": 32, "fp16": 16, "int8 (per-row absmax)": 8, "nf4": 4}
TWO_SE_MISS = math.erfc(2 / math.sqrt(2))  # chance that noise alone crosses 2 SE, two-sided
SCHEME_BITS = {"bf16": 16, "int8": 8, "llm-int8": 8, "nf4": 4, "fp4": 4, "nf4-dq": 4,
               "rtn-4": 4, "gptq-4": 4, "rtn-3": 3, "gptq-3": 3}  # code bits of each scheme
BNB_4BIT_BLOCK = 64  # bitsandbytes' default weights per absmax for NF4 and FP4


def _pct(t: float) -> str:
    return f"a tolerance of {t:.0%}"


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
def c15_evidence(blocksize: int = BNB_4BIT_BLOCK, quantize_embeddings: bool = False) -> dict:
    """GPT-NeoX-20B's parameter count and stored GB per format against the claim's GB (chapter: 3).

    ``blocksize`` and ``quantize_embeddings`` are :func:`memlab.quant.sizes.memory_20b`'s;
    their defaults are bitsandbytes'.
    """
    n = sum(neox_20b_groups().values())
    rows = {r.scheme: r for r in memory_20b(blocksize=blocksize,
                                            quantize_embeddings=quantize_embeddings)}
    default = {r.scheme: r.weights_gb for r in memory_20b()}
    return dict(params=n, naive={k: n * b / 8 / 1e9 for k, b in CLAIMED_BITS.items()},
                stored={k: r.weights_gb for k, r in rows.items()},
                bits={k: r.bits_per_param for k, r in rows.items()}, default=default,
                blocksize=blocksize, quantize_embeddings=quantize_embeddings, tolerance=0.05)


def _near(x: float, k: str, tol: float) -> bool:
    return abs(x / CLAIMED_GB[k] - 1) <= tol


@claims.register("C15", _CH3, "A 20B-parameter model needs 80 GB in fp32, 40 GB in fp16, "
                 "20 GB in int8 and 10 GB in 4-bit.", evidence=c15_evidence, moves=[
                     claims.Move("the embeddings and the head stored in each format too "
                                 "(bitsandbytes' Embedding8bit / Embedding4bit) and one 4-bit "
                                 "absmax per 4,096 weights instead of 64",
                                 {"blocksize": 4096, "quantize_embeddings": True},
                                 claims.CAVEAT)])
def c15(ev: dict) -> claims.Verdict:
    """Each format's stored GB within 5% of the claim's; a caveat if only a non-default layout gets there."""
    return claims.with_sensitivity(_c15, ev, "tolerance", (0.05, 0.1, 0.25), _pct)


def _c15(ev: dict) -> claims.Verdict:
    tol, st = ev["tolerance"], ev["stored"]
    layout = ("bitsandbytes' defaults: embeddings, head and norms in 16-bit, one 4-bit absmax "
              f"per {BNB_4BIT_BLOCK} weights" if not ev["quantize_embeddings"]
              and ev["blocksize"] == BNB_4BIT_BLOCK else
              f"embeddings and head {'in each format' if ev['quantize_embeddings'] else 'in 16-bit'}"
              f", one 4-bit absmax per {ev['blocksize']:,} weights")
    parts = [claims.Part(f"{CLAIMED_GB[k]} GB in {k.split(' ')[0]}", _near(st[k], k, tol),
                         f"the stored model takes {st[k]:.1f} GB ({ev['bits'][k]:.3f} bits per "
                         "block-linear weight, scales included)")
             for k in CLAIMED_GB]
    off_default = [k for k in CLAIMED_GB if not _near(ev["default"][k], k, tol)]
    return claims.judge_parts(
        "", parts,
        f"computed for GPT-NeoX-20B's shape ({ev['params']:,} parameters) from the bits each "
        f"format stores per weight ({layout}): " + ", ".join(f"{k} {v:.1f} GB" for k, v in st.items())
        + "; n x bits / 8 gives " + " / ".join(f"{ev['naive'][k]:.1f}" for k in CLAIMED_GB)
        + " GB, the claim's figures for the codes alone: a quantized model also stores its "
        f"scales; 'needs' taken as within {tol:.0%}",
        caveat_applies=bool(off_default),
        caveat=("right only with this layout: with bitsandbytes' defaults the model takes "
                + ", ".join(f"{ev['default'][k]:.1f} GB in {k.split(' ')[0]}"
                            for k in off_default)))


# C16 -------------------------------------------------------------------------------------------
PER_TENSOR = "absmax-4 per tensor"  # every tensor 4-bit, one fp32 absmax each: no 16-bit layer


def _per_tensor_bits(model) -> tuple[float, float]:
    """(bits per block-linear weight, bits per parameter) storing every tensor as 4-bit absmax codes."""
    from memlab.model.transformer import block_linears
    from memlab.quant.functional import absmax_quantize, stored_bytes

    linear = {id(m.weight) for m in block_linears(model).values()}
    sizes = {True: [0, 0], False: [0, 0]}  # is a block linear -> [parameters, stored bytes]
    for p in model.parameters():
        q, st = absmax_quantize(p.detach(), 4, granularity="tensor")
        acc = sizes[id(p) in linear]
        acc[0] += p.numel()
        acc[1] += stored_bytes(q, st)
    (n_lin, b_lin), (n_rest, b_rest) = sizes[True], sizes[False]
    return 8 * b_lin / n_lin, 8 * (b_lin + b_rest) / (n_lin + n_rest)


def c16_evidence(scheme: str = "nf4") -> dict:
    """Stored bits per parameter of the book's model in a 4-bit scheme, beside NF4-DQ and RTN (chapter: 3).

    ``scheme`` is one of chapter 3's 4-bit schemes (bitsandbytes' NF4 by default) or
    ``PER_TENSOR``: every tensor, embedding and norms included, as 4-bit absmax codes with one
    fp32 absmax each.
    """
    from memlab.model.lm import reference_model

    accepted = ("nf4", "fp4", "nf4-dq", "rtn-4", "gptq-4", PER_TENSOR)
    if scheme not in accepted:
        raise MemlabError(f"scheme {scheme!r}; accepted: {', '.join(accepted)}")
    comp = compare_schemes(None, device="cpu")
    n_all = comp.fp32_bytes / 4
    if scheme == PER_TENSOR:  # the codes and the absmax are the whole state: saved as held
        linear, model = _per_tensor_bits(reference_model(None, device="cpu").model)
        saved = model
        layout = "every tensor, embedding, norms and head included"
    else:
        r = comp.row(scheme)
        linear, model = r.bits_per_param, 8 * r.total_bytes / n_all
        saved = 8 * (r.saved_bytes + r.other_bytes) / n_all
        layout = "embedding, norms and head in bf16"
    return dict(params=int(n_all), scheme=scheme, layout=layout, linear=linear,
                linear_bits={k: comp.row(k).bits_per_param for k in ("nf4", "nf4-dq", "rtn-4")},
                model_bits=model, checkpoint_bits=saved, exact=0.01)


@claims.register("C16", _CH3, "A 4-bit model costs exactly half a byte per parameter.",
                 evidence=c16_evidence, moves=[
                     claims.Move("every tensor stored in 4-bit, embedding, norms and head "
                                 "included, with one fp32 absmax per tensor instead of one per "
                                 "block of 64", {"scheme": PER_TENSOR}, claims.HOLDS)])
def c16(ev: dict) -> claims.Verdict:
    """Holds if the whole model is 4 bits/param to ``exact``; wrong otherwise, with its sensitivity."""
    return claims.with_sensitivity(_c16, ev, "exact", (0.01, 0.1, 0.5, 1.0),
                                   lambda t: f"'exactly' taken as within {t:g} bit")


def _c16(ev: dict) -> claims.Verdict:
    lb, mb, ex = ev["linear_bits"], ev["model_bits"], ev["exact"]
    block = round(32 / (lb["nf4"] - 4)) if lb["nf4"] > 4 else 0
    ck = ev["checkpoint_bits"]
    return claims.judge_parts(
        "", [claims.Part("exactly half a byte (4 bits) per parameter", abs(mb - 4) <= ex,
                         f"the {ev['scheme']} model stores {mb:.3f} bits/param: 4-bit codes cost "
                         f"half a byte, but each block of {block} weights also stores an fp32 "
                         f"absmax ({lb['nf4']:.2f} bits per weight in NF4, {lb['nf4-dq']:.3f} "
                         "with double quantization), and the layers a library leaves in 16-bit "
                         "add the rest")],
        f"measured from the stored tensors of the book's {ev['params']:,}-parameter model: "
        f"{ev['scheme']} ({ev['layout']}) {ev['linear']:.3f} bits per block-linear weight, "
        f"{mb:.3f} bits per parameter of the whole model; bitsandbytes' block linears "
        f"{lb['nf4']:.3f} bits/weight in NF4, {lb['nf4-dq']:.3f} with double quantization, "
        f"{lb['rtn-4']:.3f} for 4-bit zero-point in groups of {GROUP_SIZE}; a saved checkpoint "
        f"{ck:.3f} bits/param",
        caveat_applies=abs(ck - 4) > ex,
        caveat=("in memory; a saved checkpoint also holds the quantization state's code book "
                f"and metadata: {ck:.3f} bits/param"))


# C17 -------------------------------------------------------------------------------------------
def c17_evidence(bits: int | None = None) -> dict:
    """Paired held-out loss differences against fp32, with standard errors, per scheme (chapter: 3).

    Every scheme of the chapter, or those of ``bits`` code bits only.
    """
    if bits is not None and bits not in set(SCHEME_BITS.values()):
        raise MemlabError(f"bits {bits!r}; accepted: "
                          f"{', '.join(map(str, sorted(set(SCHEME_BITS.values()))))} or None")
    comp = compare_schemes(None, device="cpu")
    rows = [r for r in comp.rows if r.scheme != "fp32"
            and (bits is None or SCHEME_BITS[r.scheme] == bits)]
    return dict(delta={r.scheme: r.loss_delta for r in rows},
                se={r.scheme: r.loss_delta_se for r in rows},
                bits={r.scheme: SCHEME_BITS[r.scheme] for r in rows},
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

    def with_bits(ks: list[str]) -> str:
        return ", ".join(f"{k} ({ev['bits'][k]}-bit)" for k in ks) or "none"

    m = len(d)
    return claims.judge_parts(
        "", [claims.Part("quantization degrades quality", bool(raised),
                         f"no scheme raised the held-out loss beyond {z:g} standard errors here "
                         f"({', '.join(d)})")],
        f"measured on the book's {ev['params']:,}-parameter model (not a large LLM), held-out "
        f"loss minus fp32's on the same {ev['sequences']} sequences, nats (+- {z:g} paired "
        f"standard errors): " + ", ".join(f"{k} {pm(k)}" for k in d)
        + f"; fp32 is {ev['ref_excess']:.4f} above the optimum. {m} comparisons at {z:g} SE: "
        f"noise alone would push about {m * TWO_SE_MISS:.1f} of them across by chance. "
        f"Nearest the edge: {edge} ({pm(edge)}). Quoted for large models, nats above fp16 from "
        f"{GPTQ}'s WikiText2 perplexities: OPT-175B {ev['published']}",
        caveat_applies=bool(within or lowered),
        caveat=(f"measurably only for some bit widths and methods at this model's size: raised "
                f"beyond the noise by {with_bits(raised)}; within {z:g} SE of fp32: "
                f"{with_bits(within)}" + (f"; below fp32 by more: {with_bits(lowered)}"
                                          if lowered else "")))


@claims.register("C17", _CH3, "Quantization degrades model quality. (How much, for which "
                 "scheme and bit width?)", evidence=c17_evidence, moves=[
                     claims.Move("8-bit quantization only (int8 and LLM.int8())", {"bits": 8},
                                 claims.WRONG)])
def c17(ev: dict) -> claims.Verdict:
    """Holds if every scheme raises the loss beyond z SE; caveat if some do; wrong if none does."""
    return claims.with_sensitivity(_c17, ev, "z", (1.0, 2.0, 3.0, 4.0), lambda z: f"{z:g} SE")


# C18 -------------------------------------------------------------------------------------------
SCRATCH_TOLERANCE = 0.01  # from-scratch LLM.int8() against bitsandbytes', relative to max |y|


def c18_evidence(alpha: float = 32.0, n_channels: int = 4) -> dict:
    """Outlier columns found, and int8 against LLM.int8() on the model with injected outliers (chapter: 3).

    ``alpha`` and ``n_channels`` are :func:`memlab.quant.outliers.outlier_study`'s: how much
    larger the injected outlier features are, and how many.
    """
    st = outlier_study(None, alpha=alpha, n_channels=n_channels, device="cpu")
    rows = {r.scheme: r for r in st.rows}
    most = max(st.found, key=lambda f: f.outlier_columns)
    busiest = max(st.found, key=lambda f: f.outlier_columns / f.features)
    normed = max(f.outlier_columns for f in st.found if f.layer.split(".")[-1] in
                 {t.split(".")[-1] for ts in NORMED_INPUTS.values() for t in ts})
    k = st.sweep_alpha.index(max(st.sweep_alpha))
    inj = {s: rows[f"injected {s}"] for s in ("fp32", "int8", "llm-int8")}
    return dict(
        threshold=st.threshold, most=(most.layer, most.outlier_columns), normed=normed,
        busiest=(busiest.layer, busiest.outlier_columns, busiest.features),
        injected=len(st.channels), alpha=st.alpha, scratch_vs_bnb=st.scratch_vs_bnb,
        layer_error={s: inj[s].mean_layer_error for s in ("int8", "llm-int8")},
        excess={s: r.excess for s, r in inj.items()},
        sweep=(st.sweep_alpha[k], st.sweep_int8[k], st.sweep_llm_int8[k]),
        ratio_needed=2.0, quality_margin=0.01,
        published=published_beside(LLM_INT8, "13B"))


def _c18(ev: dict) -> claims.Verdict:
    le, ex, margin = ev["layer_error"], ev["excess"], ev["quality_margin"]
    ratio = le["int8"] / le["llm-int8"]
    lost = {s: ex[s] - ex["fp32"] for s in ("int8", "llm-int8")}
    int8_fails = lost["int8"] > margin
    most, busiest = ev["most"], ev["busiest"]
    preserves = (lost["llm-int8"] <= margin if int8_fails else ratio > ev["ratio_needed"])
    return claims.judge_parts(
        "", [claims.Part("LLM.int8() keeps outlier features in 16-bit and the rest in int8",
                         ev["scratch_vs_bnb"] <= SCRATCH_TOLERANCE,
                         f"bitsandbytes' Linear8bitLt differs from that decomposition by "
                         f"{ev['scratch_vs_bnb']:.1e} of max |y|"),
             claims.Part("and so preserves quality where plain int8 fails", preserves,
                         f"LLM.int8() loses {lost['llm-int8']:.4f} nats where plain int8 loses "
                         f"{lost['int8']:.4f}" if int8_fails else
                         f"LLM.int8() did not cut the layer error by more than "
                         f"{ev['ratio_needed']:g}x ({ratio:.1f}x)")],
        f"measured on the book's small model: from-scratch LLM.int8() (outlier columns in "
        f"16-bit, the rest int8) against bitsandbytes' Linear8bitLt: {ev['scratch_vs_bnb']:.1e} "
        f"of max |y|; the layer with the most outlier columns ({most[0]}) has {most[1]} at |x| "
        f">= {ev['threshold']:g} (inputs from a norm: at most {ev['normed']}; where outliers are "
        f"many rather than few, as in {busiest[0].split('.', 2)[-1]}'s {busiest[1]} of "
        f"{busiest[2]} input columns, LLM.int8() multiplies most of the layer in 16-bit); with "
        f"{ev['injected']} outlier features injected (x{ev['alpha']:g}), mean layer output "
        f"error int8 {le['int8']:.4f} vs LLM.int8() {le['llm-int8']:.4f} ({ratio:.1f}x), held-out "
        f"loss above fp32's {lost['int8']:+.4f} vs {lost['llm-int8']:+.4f} nats; at "
        f"x{ev['sweep'][0]:g} one layer's error is {ev['sweep'][1]:.3f} vs {ev['sweep'][2]:.3f}; "
        f"'plain int8 fails' taken as a held-out loss over {margin} nats above fp32's, "
        f"'preserves' as LLM.int8()'s within {margin} nats of it (where plain int8 does not "
        f"fail: a layer error over {ev['ratio_needed']:g}x smaller). Quoted for a 13B model, "
        f"nats above 32-bit from {LLM_INT8}'s C4 perplexities: {ev['published']}",
        caveat_applies=not int8_fails,
        caveat=(f"at this outlier size (x{ev['alpha']:g} on {ev['injected']} features of a small "
                f"model) plain int8 does not fail: it loses {lost['int8']:.4f} nats, and "
                "LLM.int8()'s gain shows in the layer error, not yet in quality; outlier "
                "features this large arise on their own from about 6.7B parameters (Dettmers "
                "et al. 2022); the inputs from a norm have none of their own here"))


@claims.register("C18", _CH3, "LLM.int8() keeps outlier features in 16-bit and the rest in "
                 "int8, and so preserves quality where plain int8 fails.", evidence=c18_evidence,
                 moves=[claims.Move("injected outlier features 128 times the rest instead of 32 "
                                    "(plain int8 then fails in held-out loss)", {"alpha": 128.0},
                                    claims.HOLDS, slow=True)])
def c18(ev: dict) -> claims.Verdict:
    """Holds if it preserves quality where int8 fails; caveat if int8 does not fail; wrong else."""
    return claims.with_sensitivity(_c18, ev, "ratio_needed", (1.5, 2.0, 5.0, 10.0),
                                   lambda r: f"a required ratio of {r:g}x")


# C43 -------------------------------------------------------------------------------------------
def c43_evidence(device: str = "cuda") -> dict:
    """Int8 layer timings against the device's inference dtype, and a GPU roofline (chapter: 3).

    On ``"cuda"`` the timings are a recorded GPU run of ``quant-speed`` (bitsandbytes' int8
    layers against bf16), if any; on ``"cpu"`` they are measured here
    (:func:`memlab.quant.speed.cpu_int8_speed`, against fp32). The roofline is of one
    8192 x 8192 layer on each GPU of the catalogue.
    """
    from memlab.gpus import CATALOGUE, compute_bound_from, roofline_matmul_s
    from memlab.results import recorded

    if device not in ("cuda", "cpu"):
        raise MemlabError(f"device {device!r}; accepted: cuda, cpu")
    timed, label, baseline = {}, "", "bf16"
    if device == "cuda":
        rec = recorded("quant-speed")
        for r in () if rec is None else rec.value().rows:
            if r.kind in ("int8", "llm-int8"):
                timed.setdefault(r.kind, {})[r.tokens] = r.vs_bf16
        label = rec.label if rec is not None else ""
    else:
        from memlab.quant.speed import CPU_INT8, cpu_int8_speed

        t = cpu_int8_speed()
        timed = {CPU_INT8: {n: i8 / fp for n, (fp, i8) in t["rows"].items()}}
        label = (f"measured on this CPU ({t['capability']}, {t['engine']}, one thread, the "
                 f"fastest of 20 calls), one {t['d']:,} x {t['d']:,} layer")
        baseline = "fp32"
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
    return dict(device=device, label=label, baseline=baseline, timed=timed, roofline=roof, d=d)


@claims.register("C43", _CH3, "Integer (int8) arithmetic makes inference faster.",
                 evidence=c43_evidence, moves=[
                     claims.Move("inference on this CPU instead of a GPU: PyTorch's int8 "
                                 "dynamic-quantized linear (fbgemm) timed against fp32",
                                 {"device": "cpu"}, claims.HOLDS)])
def c43(ev: dict) -> claims.Verdict:
    """Judged on measured timings only: int8 faster everywhere, somewhere, or nowhere.

    The claim names no device; the book's setting is LLM inference on a GPU, judged from a
    recorded GPU run, and a CPU measurement judges it on the CPU.
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
    timed, base = ev["timed"], ev["baseline"]
    part = "int8 arithmetic makes inference faster"
    if not timed:
        return claims.judge_parts(
            "", [claims.Part(part, None,
                             "no GPU timing is recorded: speed is judged on measured times of "
                             "a pure int8 matmul and of LLM.int8(), never on a list of "
                             "tensor-core features; the roofline says where int8 arithmetic "
                             "could win")],
            roofline, command="memlab run quant-speed --scale full --out results/")
    faster = {k: [n for n, r in v.items() if r < 1] for k, v in timed.items()}
    everywhere = all(len(f) == len(timed[k]) for k, f in faster.items())
    return claims.judge_parts(
        "", [claims.Part(part, any(faster.values()),
                         f"every int8 kernel timed ran slower than {base}: it saves memory, "
                         "not time")],
        f"{ev['label']}: layer time / {base} = " + "; ".join(
            f"{k} " + ", ".join(f"{r:.2f} at {n:,} token{'s' if n > 1 else ''}"
                                for n, r in v.items())
            for k, v in timed.items()) + f". {roofline}",
        caveat_applies=not everywhere,
        caveat="faster only at " + "; ".join(
            f"{k}: {', '.join(map(str, f)) or 'no'} tokens" for k, f in faster.items()))


# C19 -------------------------------------------------------------------------------------------
CLAIM_BITS = 3  # the chapter's QAT setting; at 2 bits QAT's gain over PTQ is far larger


def c19_evidence(scale_mode: str = "minmax", bits: int = CLAIM_BITS) -> dict:
    """How a QAT run's scales change in fine-tuning, and what PyTorch's default QAT does (chapter: 3).

    ``scale_mode`` is the book's QAT (:data:`memlab.quant.qat.SCALE_MODES`): ``"minmax"``, the
    scale computed from the weights' min/max as PyTorch's default fake quantization computes
    it from what it observes (QAT as Jacob et al. 2018, arXiv:1712.05877, define it), or ``"learned"``, LSQ's
    step sizes trained as parameters (Esser et al. 2019). Both come from one run.
    """
    if scale_mode not in SCALE_MODES:
        raise MemlabError(f"scale_mode {scale_mode!r}; accepted: {', '.join(SCALE_MODES)}")
    r = qat_vs_ptq_ci(bits)
    learned = scale_mode == "learned"
    return dict(result=r, scale_mode=scale_mode, moved=MOVED, trained_scale=learned,
                change=r.scale_change_median if learned else r.minmax_change_median,
                layers={s.name: s.moved_share for s in r.scales} if learned else {})


@claims.register("C19", _CH3, "Quantization-aware training learns the quantization scale "
                 "factors during training.", evidence=c19_evidence, moves=[
                     claims.Move("LSQ instead of min/max scales: the step sizes made trained "
                                 "parameters (Esser et al. 2019)", {"scale_mode": "learned"},
                                 claims.HOLDS)])
def c19(ev: dict) -> claims.Verdict:
    """Holds if the QAT's scales are trained parameters that moved; caveat if some layers' did not."""
    r, moved = ev["result"], ev["moved"]
    t = r.torch_fake_quant
    per_layer = ", ".join(f"{s.median_ratio:.3f}" for s in r.scales)
    kind = ("Parameter" if t.scale_is_parameter else "buffer" if t.scale_is_buffer
            else "not found")
    default = (t.default_qat_weight or "none").rsplit(".", 1)[-1]
    still = [n.removeprefix("blocks.") for n, share in ev["layers"].items() if share == 0]
    learned = ev["trained_scale"] and ev["change"] > moved
    how = ("LSQ: a step size per row, a trained parameter" if ev["scale_mode"] == "learned" else
           "min/max: each row's step size recomputed from its weights at every step, no "
           "gradient, as PyTorch's default fake quantization computes its scale")
    evidence = (
        f"QAT at {r.bits} bits on the chapter's small model ({how}), {r.steps} fine-tuning "
        f"steps at lr {r.lr:g} (measured, CPU): its step sizes moved by a median "
        f"{ev['change']:.1%} (LSQ's learned ones {r.scale_change_median:.1%}, per-layer median "
        f"learned/initial {per_layer}; min/max QAT's, following the weights, "
        f"{r.minmax_change_median:.1%}); excess loss PTQ {r.ptq.excess:.4f}, QAT with learned "
        f"scales {r.qat.excess:.4f}, QAT with min/max scales {r.qat_minmax.excess:.4f}, "
        f"fine-tune then PTQ {r.control.excess:.4f} nats; held-out loss lowered by (nats, +- 2 "
        f"paired standard errors) learning the scale instead of recomputing it "
        f"{gain(r.qat_minmax, r.qat)}, QAT instead of PTQ {gain(r.ptq, r.qat)}; torch "
        f"{t.torch_version}: default QAT weight fake-quantize {default}, scale a {kind}, gets a "
        f"gradient: {t.scale_gets_grad}, changes with the observed data alone: "
        f"{t.scale_follows_data}; learnable variant: {t.learnable or 'none'} (scale a "
        f"Parameter: {t.learnable_scale_is_parameter}, exported by torch.ao.quantization: "
        f"{t.learnable_public}); 'learns' taken as a trained scale whose median change is "
        f"above {moved:.0%}")
    return claims.judge_parts(
        "", [claims.Part("QAT learns the scale factors during training", learned,
                         "QAT trains the weights through the rounding; its scales are learned "
                         "only where a method makes them trained parameters (LSQ, PACT). "
                         f"PyTorch's default QAT ({default}) keeps the scale in a {kind} "
                         "computed from the observed min/max, which no gradient updates, and "
                         f"min/max QAT here moved its scales {ev['change']:.1%} by following "
                         "the weights, not by learning them" if not ev["trained_scale"] else
                         f"the trained step sizes barely moved (median {ev['change']:.2%})")],
        evidence,
        caveat_applies=learned and bool(still),
        caveat=(f"learned in some layers only: in {', '.join(still)} no row's step size "
                f"moved by more than {moved:.0%}"))
