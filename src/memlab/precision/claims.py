"""Chapter 2's claims, each judged from a computed result."""

from __future__ import annotations

import functools
import math

import torch

from memlab import claims
from memlab.model.transformer import get_config
from memlab.precision.formats import (
    bitsandbytes_functional,
    probe_formats,
    relative_error,
    round_to,
    same_number,
    spec,
    storage_bytes,
    thresholds,
)
from memlab.precision.mixed import train

_CH2 = "chapters/02_number_formats"


def g(x: float) -> str:
    return f"{x:.4g}"

@claims.register("C06", _CH2, "fp16 and bf16 halve memory compared with fp32; int8 and fp8 "
                 "cut it to a quarter.")
def c06():
    per = {f: storage_bytes(f) for f in ("fp32", "fp16", "bf16", "fp8-e4m3", "int8")}
    ratios = {f: per[f] / per["fp32"] for f in per}
    halves = ratios["fp16"] == ratios["bf16"] == 0.5
    quarter = ratios["fp8-e4m3"] == ratios["int8"] == 0.25
    return claims.judge(
        "", halves and quarter,
        "measured storage bytes/value: " + ", ".join(f"{f} {v:g}" for f, v in per.items()),
        caveat="for the stored tensors themselves; an int8 or fp8 tensor needs scales too "
               "(chapter 3), and a training step keeps fp32 copies under mixed precision "
               "(claim C42)")

@claims.register("C07", _CH2, "bf16 has the same dynamic range as fp32, which prevents "
                 "overflow when converting from fp32.")
def c07():
    b, f = thresholds("bf16"), thresholds("fp32")
    same_normal_range = (spec("bf16").exponent_bits == spec("fp32").exponent_bits
                         and b.min_normal == f.min_normal)
    top = round_to(f.max, "bf16")
    return claims.judge(
        "", same_normal_range,
        f"both have {spec('bf16').exponent_bits} exponent bits and min normal "
        f"{g(b.min_normal)}; bf16 max {g(b.max)} vs fp32 max {g(f.max)}; fp32's max "
        f"converts to {top} in bf16",
        caveat=f"the top of fp32's range overflows: every fp32 value from {g(b.overflow_from)} "
               f"up becomes {b.overflow_to} in bf16, and bf16's smallest subnormal is "
               f"{g(b.min_subnormal)} against fp32's {g(f.min_subnormal)}")

@claims.register("C08", _CH2, "fp16 covers -65,504 to +65,504, and pi stored in fp16 "
                 "becomes 3.140625.")
def c08():
    s, pi16 = spec("fp16"), round_to(math.pi, "fp16")
    t = thresholds("fp16")
    return claims.judge(
        "", s.max == 65504 and s.min == -65504 and pi16 == 3.140625,
        f"fp16 max {s.max:,g}, min {s.min:,g}; pi -> {pi16!r}",
        caveat=f"values up to {t.overflow_from:,g} (exclusive) still round to the max; from "
               f"{t.overflow_from:,g} they become inf. Near zero, fp16 keeps full precision "
               f"only down to {g(t.min_normal)}")

@claims.register("C09", _CH2, "fp32 covers about 3e-38 to 3e38.")
def c09():
    t = thresholds("fp32")
    top_ok = abs(t.max - 3e38) / t.max < 0.15
    low_ok = abs(t.min_normal - 3e-38) / t.min_normal < 0.15
    return claims.judge(
        "", top_ok,
        f"fp32 max {g(t.max)}, min normal {g(t.min_normal)}, min subnormal "
        f"{g(t.min_subnormal)}",
        caveat=None if low_ok else (
            f"the top is right, the bottom is not: the smallest normal fp32 is "
            f"{g(t.min_normal)}, {3e-38 / t.min_normal:.2g}x smaller than 3e-38, and "
            f"subnormals go down to {g(t.min_subnormal)}"),
        correction=f"fp32's largest value is {g(t.max)}")

@claims.register("C10", _CH2, "Pi stored in bf16 loses more precision than in fp16.")
def c10():
    e16, eb = abs(round_to(math.pi, "fp16") - math.pi), abs(round_to(math.pi, "bf16") - math.pi)
    xs = torch.logspace(-3, 3, 100_001, dtype=torch.float64)
    med16 = relative_error(xs, "fp16").median().item()
    medb = relative_error(xs, "bf16").median().item()
    return claims.judge(
        "", eb > e16,
        f"pi -> {round_to(math.pi, 'bf16')!r} in bf16 and {round_to(math.pi, 'fp16')!r} in "
        f"fp16: errors {g(eb)} and {g(e16)}",
        correction=f"pi happens to round to the same value in both; in general bf16 does "
                   f"lose more: over 10^5 values from 1e-3 to 1e3 its median relative error "
                   f"is {medb / med16:.1f}x fp16's ({g(medb)} vs {g(med16)}), from "
                   f"{spec('bf16').mantissa_bits} mantissa bits against "
                   f"{spec('fp16').mantissa_bits}")

@claims.register("C11", _CH2, "Pi quantized to int8 becomes 3.")
def c11():
    table = same_number(math.pi)
    naive = table.loc["int8, cast", "stored"]
    absmax = table[table.index.str.startswith("int8, absmax")]["stored"]
    return claims.judge(
        "", bool(naive == 3.0),
        f"a plain cast gives {naive:g}; absmax quantization gives "
        + " or ".join(f"{v:.6g}" for v in absmax) + " (blocks with max "
        + " and ".join(i.split()[-1] for i in absmax.index) + ")",
        caveat="only for a plain cast to an integer; int8 quantization scales each block by "
               "its absmax first, and pi then keeps two or more significant digits")

@claims.register("C12", _CH2, "int8 represents -128 to 127. (Another source says -127 to 127.)")
def c12():
    s = spec("int8")
    from memlab.quant.functional import absmax_quantize

    q, state = absmax_quantize(torch.tensor([-5.0, 1.0, 5.0]))
    codes = f"absmax quantization uses codes -{state.qmax}..{state.qmax} (here {q.tolist()})"
    bnbf = bitsandbytes_functional()
    if bnbf is not None and hasattr(bnbf, "int8_vectorwise_quant"):
        bq = bnbf.int8_vectorwise_quant(torch.tensor([[-5.0, 1.0, 5.0]]))[0]
        codes += f"; bitsandbytes' int8_vectorwise_quant gives {bq.flatten().tolist()}"
    return claims.judge(
        "", (s.min, s.max) == (-128.0, 127.0),
        f"torch.iinfo(int8): {int(s.min)} to {int(s.max)}; {codes}",
        caveat="both are right: the type holds -128..127, symmetric quantization keeps "
               "-127..127 so that +x and -x get codes of equal size")

@claims.register("C13", _CH2, "fp8 needs newer hardware such as the H100.")
def c13():
    from memlab.gpus import CATALOGUE

    probe = probe_formats("cpu", ("fp8-e4m3",)).loc["fp8-e4m3"]
    fp8_gpus = [gpu.name for gpu in CATALOGUE if "fp8" in gpu.tensor_core_formats]
    older = [gpu.name for gpu in CATALOGUE if gpu.name not in fp8_gpus]
    newest_older = max(float(get.compute_capability) for get in CATALOGUE
                       if get.name in older)
    only_newer = bool(fp8_gpus) and all(
        float(gpu.compute_capability) > newest_older for gpu in CATALOGUE
        if gpu.name in fp8_gpus)
    min_cc = min(gpu.compute_capability for gpu in CATALOGUE if gpu.name in fp8_gpus)
    return claims.judge(
        "", only_newer,
        f"on this CPU fp8 tensors store: {bool(probe['store (cast)'])}, add: "
        f"{bool(probe['add'])}, matmul: {bool(probe['matmul'])} (tried); fp8 tensor cores "
        f"(datasheets): {', '.join(fp8_gpus)}; none on {', '.join(older)}",
        caveat=f"for fast fp8 arithmetic, and not only the H100: fp8 tensor cores come "
               f"with compute capability {min_cc} and up ({', '.join(fp8_gpus)}). Storing "
               "fp8 needs no special hardware; any device holds the bytes and upcasts them")


_CH2 = "chapters/02_number_formats"


@claims.register("C42", _CH2, "Mixed-precision training halves training memory.")
@functools.cache
def c42():
    from memlab.memory.training import estimate

    cfg = get_config("llama2-7b")
    n, S = cfg.num_parameters(), 2048
    batches = (1, 8)
    limit = 0.55  # 'halves': the mixed peak at most 55% of fp32's

    def est(b, precision):
        return estimate(cfg, batch_size=b, seq_len=S, precision=precision,
                        optimizer="adamw", optimizer_impl="foreach", device="cuda")

    rows = {b: {p: est(b, p) for p in ("fp32", "bf16-mixed", "bf16")} for b in batches}
    ratio = {b: rows[b]["bf16-mixed"].peak_bytes / rows[b]["fp32"].peak_bytes
             for b in batches}
    pure = {b: rows[b]["bf16"].peak_bytes / rows[b]["fp32"].peak_bytes for b in batches}
    mixed1, fp32_1 = rows[1]["bf16-mixed"], rows[1]["fp32"]
    state = {p: (e.weights_bytes + e.gradients_bytes + e.optimizer_bytes) / n
             for p, e in rows[1].items()}
    cast = sum(t.bytes * (cfg.n_layer if t.scope == "layer" else 1) for t in mixed1.saved
               if "cast" in t.name and "weight" in t.name)
    act = mixed1.activations_bytes / fp32_1.activations_bytes
    act_no_cast = (mixed1.activations_bytes - cast) / fp32_1.activations_bytes

    def gib(x):
        return f"{x / 2**30:.1f} GiB"

    evidence = (
        "estimated with chapter 1's closed form for a CUDA GPU, Llama-2-7B, AdamW "
        f"(foreach), seq {S}: peak bf16-mixed / fp32 = "
        + ", ".join(f"{ratio[b]:.2f} at batch {b} ({gib(rows[b]['bf16-mixed'].peak_bytes)} "
                    f"vs {gib(rows[b]['fp32'].peak_bytes)})" for b in batches)
        + f"; parameters + gradients + AdamW states {state['bf16-mixed']:.1f} B/param "
        f"mixed vs {state['fp32']:.1f} fp32; saved activations x{act:.2f} "
        f"(x{act_no_cast:.2f} without the {gib(cast)} weight-cast cache); pure bf16: "
        + ", ".join(f"{pure[b]:.2f}" for b in batches)
        + f"; 'halves' taken as a ratio <= {limit} at every batch"
    )
    return claims.judge(
        "", all(r <= limit for r in ratio.values()), evidence,
        correction=(
            f"mixed precision keeps fp32 weights, fp32 gradients and fp32 AdamW states "
            f"({state['bf16-mixed']:.0f} B/param, as in fp32) and adds 16-bit weight copies; "
            f"it saves activation memory only, so the peak falls to "
            + " / ".join(f"{ratio[b]:.2f}" for b in batches)
            + f" of fp32 at batch {' / '.join(map(str, batches))} x {S}; pure bf16 "
            "training (bf16 weights, gradients and states) is what halves it"),
    )

@claims.register("C14", _CH2, "bf16 speeds up computation and improves model quality; it is "
                 "poorly suited to integer arithmetic.")
@functools.cache
def c14():
    from memlab.gpus import CATALOGUE
    from memlab.precision.formats import thresholds

    kw = dict(model="tiny", model_overrides=dict(vocab_size=128, name="tiny-v128"),
              steps=50, batch_size=8, seq_len=32, lr=1e-2, device="cpu")
    runs = {m: train(m, **kw) for m in ("fp32", "bf16-autocast", "bf16-pure")}
    loss = {m: r.eval_loss for m, r in runs.items()}
    margin = 0.01  # nats: 'improves' needs a held-out loss lower than fp32's by more
    improves = all(loss[m] is not None and loss[m] < loss["fp32"] - margin
                   for m in ("bf16-autocast", "bf16-pure"))
    ints = {f: thresholds(f).largest_exact_integer for f in ("bf16", "fp16", "fp32")}
    no_bf16_cores = [g.name for g in CATALOGUE if not g.bf16_tensor_cores]
    evidence = (
        f"held-out loss on the chapter's task (measured, CPU): fp32 {loss['fp32']:.3f}, "
        f"bf16 autocast {loss['bf16-autocast']:.3f}, pure bf16 {loss['bf16-pure']:.3f} nats "
        f"('improves' taken as lower by more than {margin}); integers exact up to "
        + ", ".join(f"{v:,} in {f}" for f, v in ints.items())
        + f"; no bf16 tensor cores (datasheets): {', '.join(no_bf16_cores)}")
    return claims.judge(
        "", improves, evidence,
        correction=(
            "bf16 matches fp32's quality at best (autocast), it does not improve it; its speed "
            "comes from tensor cores, which some GPUs lack for bf16, and the step times are "
            "not measured on this page's device; 'poorly suited to integers' holds in the "
            f"sense that bf16 stores integers exactly only up to {ints['bf16']}"),
    )
