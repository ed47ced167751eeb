"""Chapter 3's claims, each judged from a computed result: C15-C19, C43."""

from __future__ import annotations

import functools

from memlab import claims
from memlab.quant.compare import GROUP_SIZE, compare_schemes
from memlab.quant.outliers import NORMED_INPUTS, outlier_study
from memlab.quant.qat import MOVED, gain, qat_vs_ptq_ci
from memlab.quant.sizes import memory_20b, neox_20b_groups

_CH3 = "chapters/03_quantization"


@claims.register("C15", _CH3, "A 20B-parameter model needs 80 GB in fp32, 40 GB in fp16, "
                 "20 GB in int8 and 10 GB in 4-bit.")
@functools.cache
def c15():
    rows = {r.scheme: r for r in memory_20b()}
    naive = [rows[k].claimed_gb for k in ("fp32", "fp16", "int8 (per-row absmax)", "nf4")]
    arithmetic = [round(x) for x in naive] == [80, 40, 20, 10]
    four = rows["nf4"]
    dq = rows["nf4 + double quant"]
    evidence = (
        "computed for GPT-NeoX-20B's shape (" + f"{sum(neox_20b_groups().values()):,}"
        + " parameters): n x bits / 8 gives " + " / ".join(f"{x:.0f}" for x in naive)
        + " GB; with the stored scales and the embeddings, head and norms in 16-bit: "
        + ", ".join(f"{k} {r.weights_gb:.1f} GB" for k, r in rows.items()))
    return claims.judge(
        "", arithmetic, evidence,
        caveat=(f"right as n x bits / 8 for the weights alone; a real 4-bit model stores "
                f"{four.weights_gb:.1f} GB in NF4 ({dq.weights_gb:.1f} GB with double "
                f"quantization): scales add {four.bits_per_param - 4:.2f} bit per weight and "
                "the embeddings stay 16-bit; training or generating adds activations, the "
                "KV cache and the CUDA context on top"),
        correction="the arithmetic n x bits / 8 does not give the claimed figures")

@claims.register("C16", _CH3, "A 4-bit model costs exactly half a byte per parameter.")
@functools.cache
def c16():
    comp = compare_schemes(None, device="cpu")  # the full comparison, cached for C17
    nf4, dq, rtn = comp.row("nf4"), comp.row("nf4-dq"), comp.row("rtn-4")
    n_all = comp.fp32_bytes / 4
    exact = abs(nf4.total_bytes / n_all - 0.5) < 1e-9
    block = round(32 / (nf4.bits_per_param - 4))  # one fp32 absmax per block: 4 + 32 / block bits
    evidence = (
        f"measured from the stored tensors of the book's model: block linears "
        f"{nf4.bits_per_param:.3f} bits/param in NF4, {dq.bits_per_param:.3f} with double "
        f"quantization, {rtn.bits_per_param:.3f} for 4-bit zero-point in groups of "
        f"{GROUP_SIZE}; whole model in NF4 {8 * nf4.total_bytes / n_all:.2f} bits/param "
        "(embedding, norms and head in bf16)")
    return claims.judge(
        "", exact, evidence,
        correction=(f"4-bit codes cost half a byte, but each block of {block} weights also stores "
                    f"an fp32 absmax: {nf4.bits_per_param:.2f} bits ({nf4.bits_per_param / 8:.4f} "
                    f"bytes) per weight, {dq.bits_per_param:.3f} with double quantization, and "
                    "the layers left in 16-bit raise the whole model's average further"))

@claims.register("C17", _CH3, "Quantization degrades model quality. (How much, for which "
                 "scheme and bit width?)")
@functools.cache
def c17():
    comp = compare_schemes(None, device="cpu")
    ref = comp.row("fp32").excess
    rows = {r.scheme: r for r in comp.rows}
    delta = {k: r.loss_delta for k, r in rows.items()}
    # a change counts only beyond two paired standard errors over the held-out sequences
    seen = {k: abs(r.loss_delta) > 2 * r.loss_delta_se for k, r in rows.items() if k != "fp32"}
    eight_ok = not any(seen[k] and delta[k] > 0 for k in ("bf16", "int8", "llm-int8"))
    low_hurts = seen["rtn-3"] and delta["rtn-3"] > 0

    def pm(k: str) -> str:
        return f"{delta[k]:+.4f} +- {2 * rows[k].loss_delta_se:.4f}"

    evidence = ("measured on the book's model, held-out loss minus fp32's on the same "
                f"{comp.config.eval_sequences} sequences, nats (+- 2 paired standard errors): "
                + ", ".join(f"{k} {pm(k)}" for k in rows if k != "fp32")
                + f"; fp32 is {ref:.4f} above the optimum")
    within = [k for k, v in seen.items() if not v]
    return claims.judge(
        "", low_hurts, evidence,
        caveat=("it depends on bits and method: 16- and 8-bit schemes do not raise the loss "
                f"beyond the noise{'' if eight_ok else ' (not all of them here)'}, 4-bit "
                f"costs {pm('nf4')} (NF4) and {pm('rtn-4')} (RTN), 3-bit RTN {pm('rtn-3')}; "
                f"GPTQ cuts the 3-bit cost to {pm('gptq-3')}; within two standard errors of "
                f"fp32: {', '.join(within) or 'none'}"),
        correction="3-bit round-to-nearest did not raise the held-out loss beyond the noise here")

@claims.register("C18", _CH3, "LLM.int8() keeps outlier features in 16-bit and the rest in "
                 "int8, and so preserves quality where plain int8 fails.")
@functools.cache
def c18():
    st = outlier_study(None, device="cpu")
    rows = {r.scheme: r for r in st.rows}
    i8, llm = rows["injected int8"], rows["injected llm-int8"]
    found = max(f.outlier_columns for f in st.found)
    busiest = max(st.found, key=lambda f: f.outlier_columns / f.features)
    normed = max(f.outlier_columns for f in st.found if f.layer.split(".")[-1] in
                 {t.split(".")[-1] for ts in NORMED_INPUTS.values() for t in ts})
    ratio = i8.mean_layer_error / llm.mean_layer_error
    k = st.sweep_alpha.index(max(st.sweep_alpha))
    evidence = (
        f"measured: the trained model's largest layer has {found} input columns at "
        f"|x| >= {st.threshold:g} (inputs from a norm: {normed}); with "
        f"{len(st.channels)} outlier features injected (x{st.alpha:g}), mean layer output error "
        f"int8 {i8.mean_layer_error:.4f} vs LLM.int8() {llm.mean_layer_error:.4f}, held-out loss "
        f"above optimum {i8.excess:.4f} vs {llm.excess:.4f} nats; at x{st.sweep_alpha[k]:g} one "
        f"layer's error is {st.sweep_int8[k]:.3f} vs {st.sweep_llm_int8[k]:.3f}")
    return claims.judge(
        "", ratio > 2, evidence,
        caveat=("outliers must be present: in this small model the inputs that come from a norm "
                "have none of their own (they were injected, as Dettmers et al. 2022 find them "
                "from about 6.7B parameters), and at this size even plain int8 loses little "
                "held-out loss, so the gain shows in the layer error (the mechanism) more than "
                "in quality; where outliers are many rather than few (this model's "
                f"{busiest.layer.split('.', 2)[-1]}: {busiest.outlier_columns} of "
                f"{busiest.features} input columns) LLM.int8() multiplies most of the layer "
                "in 16-bit; and the outlier columns still use int8 weights in bitsandbytes, so "
                "LLM.int8()'s error grows with the outlier size too"),
        correction="LLM.int8() did not reduce the layer error by more than half here")

@claims.register("C43", _CH3, "Integer (int8) arithmetic makes inference faster.")
@functools.cache
def c43():
    from memlab.gpus import CATALOGUE
    from memlab.results import recorded

    rec = recorded("quant-speed")
    with_int8 = [g.name for g in CATALOGUE if "int8" in g.tensor_core_formats]
    if rec is not None and rec.result.get("rows"):
        rows = [r for r in rec.result["rows"] if r["kind"] == "llm-int8"]
        faster = all(r["vs_bf16"] < 1 for r in rows)
        evidence = (f"{rec.label}: LLM.int8() layer time / bf16 = "
                    + ", ".join(f"{r['vs_bf16']:.2f} at {r['tokens']} tokens" for r in rows))
    else:
        faster = len(with_int8) == len(CATALOGUE)
        evidence = ("not timed here (no GPU record stored); int8 tensor cores (datasheets) on: "
                    + ", ".join(with_int8) + f" of {len(CATALOGUE)} GPUs in the catalogue")
    return claims.judge(
        "", faster, evidence,
        caveat=("int8 tensor cores give twice fp16's peak, but LLM.int8() spends time "
                "quantizing inputs, dequantizing outputs and handling outlier columns; it is "
                "reported slower than fp16 at small and medium sizes (Dettmers et al. 2022, "
                "arXiv:2208.07339, timing int8 against fp16 matrix multiplication), and weight-only 4/8-bit speed-ups at batch 1 come from "
                "reading fewer weight bytes, not from integer arithmetic"),
        correction=("LLM.int8() ran slower than bf16 at every measured shape: it saves memory, "
                    "not time"))


CLAIM_BITS = 3  # the chapter's QAT setting; at 2 bits QAT's gain over PTQ is far larger


@claims.register("C19", _CH3, "Quantization-aware training learns the quantization scale "
                 "factors during training.")
@functools.cache
def c19():
    r = qat_vs_ptq_ci(CLAIM_BITS)
    t = r.torch_fake_quant
    moved = r.scale_change_median > MOVED
    per_layer = ", ".join(f"{s.median_ratio:.3f}" for s in r.scales)
    kind = ("Parameter" if t.scale_is_parameter else "buffer" if t.scale_is_buffer
            else "not found")
    default = (t.default_qat_weight or "none").rsplit(".", 1)[-1]
    evidence = (
        f"LSQ (a learned step size per row) at {r.bits} bits on the chapter's model, "
        f"{r.steps} fine-tuning steps at lr {r.lr:g} (measured, CPU): the step sizes moved "
        f"from their absmax/qmax start by a median {r.scale_change_median:.1%} per row "
        f"(per-layer median learned/initial {per_layer}; min/max QAT's step sizes, which "
        f"follow the weights, moved {r.minmax_change_median:.1%}); excess loss PTQ "
        f"{r.ptq.excess:.4f}, QAT with learned scales {r.qat.excess:.4f}, QAT with min/max "
        f"scales {r.qat_minmax.excess:.4f}, fine-tune then PTQ {r.control.excess:.4f} nats; "
        f"torch {t.torch_version}: default QAT weight fake-quantize {default}, scale a "
        f"{kind}, gets a gradient: {t.scale_gets_grad}, changes with the observed data "
        f"alone: {t.scale_follows_data}; learnable variant: {t.learnable or 'none'} (scale "
        f"a Parameter: {t.learnable_scale_is_parameter}, exported by "
        f"torch.ao.quantization: {t.learnable_public}); 'learns' taken as a median change "
        f"above {MOVED:.0%}")
    default_learns = bool(t.scale_is_parameter and t.scale_gets_grad)
    mostly_weights = abs(r.learned_scale_gain) < 0.5 * abs(r.qat_gain)
    caveat = None
    if not default_learns:
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
        "", moved, evidence, caveat=caveat,
        correction=(
            f"with learned step sizes (LSQ) the scales barely moved (median "
            f"{r.scale_change_median:.2%}); QAT lowers PTQ's excess loss by {r.qat_gain:.4f} nats, which "
            "comes from the weights adapting to a fixed grid, and PyTorch's default "
            f"fake quantization ({default}) computes its scale from the observed min/max "
            "rather than learning it"),
    )
