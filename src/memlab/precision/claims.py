"""Chapter 2's claims: each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.

A claim made of several parts *holds* when every part does, *holds with a caveat* when the
part that carries it holds and another part does not (the caveat names which), and is
*wrong* when its main part fails.
"""

from __future__ import annotations

import functools
import math

import torch

from memlab import claims
from memlab.model.config import get_config
from memlab.precision.formats import (
    bitsandbytes_functional,
    probe_formats,
    relative_error,
    round_to,
    spec,
    storage_bytes,
    thresholds,
)
from memlab.precision.runs import train

_CH2 = "chapters/02_number_formats"


def g(x: float) -> str:
    return f"{x:.4g}"


# C06 -------------------------------------------------------------------------------------------
def c06_evidence() -> dict:
    """Storage bytes per value of each format (chapter: 2).

    With int8's with one fp32 scale per 4,096-value row.
    """
    from memlab.quant.functional import bits_per_parameter

    per = {f: storage_bytes(f) for f in ("fp32", "fp16", "bf16", "fp8-e4m3", "int8")}
    row = get_config("llama2-7b").d_model  # one scale per row of a 7B model's square projection
    return dict(per=per, int8_with_scales=bits_per_parameter("int8", blocksize=row) / 8,
                row=row, tolerance=0.01)


@claims.register("C06", _CH2, "fp16 and bf16 halve memory compared with fp32; int8 and fp8 "
                 "cut it to a quarter.", evidence=c06_evidence)
def c06(ev: dict) -> claims.Verdict:
    """Exact for the stored values; the caveat applies if scales move int8 beyond 1% of a quarter."""
    per = ev["per"]
    r = {f: v / per["fp32"] for f, v in per.items()}
    scaled = ev["int8_with_scales"] / per["fp32"]
    return claims.judge(
        "", r["fp16"] == r["bf16"] == 0.5 and r["fp8-e4m3"] == r["int8"] == 0.25,
        "measured storage bytes/value: " + ", ".join(f"{f} {v:g}" for f, v in per.items())
        + f"; int8 with one fp32 scale per row of {ev['row']:,}: {ev['int8_with_scales']:.4f} "
        f"bytes/value, {scaled:.4f} of fp32",
        caveat_applies=abs(scaled / 0.25 - 1) > ev["tolerance"],
        caveat=(f"for the stored values; with its scales int8 takes {scaled:.3f} of fp32, "
                f"more than {ev['tolerance']:.0%} over a quarter"),
        correction="the stored values do not take these fractions of fp32")


# C07 -------------------------------------------------------------------------------------------
def c07_evidence() -> dict:
    """bf16 and fp32's exponent bits, normal and subnormal ranges (chapter: 2).

    And where fp32's top lands in bf16.
    """
    b, f = thresholds("bf16"), thresholds("fp32")
    return dict(exp_bits={"bf16": spec("bf16").exponent_bits, "fp32": spec("fp32").exponent_bits},
                min_normal={"bf16": b.min_normal, "fp32": f.min_normal},
                min_subnormal={"bf16": b.min_subnormal, "fp32": f.min_subnormal},
                max={"bf16": b.max, "fp32": f.max}, fp32_max_in_bf16=round_to(f.max, "bf16"),
                overflow_from=b.overflow_from, overflow_to=b.overflow_to)


@claims.register("C07", _CH2, "bf16 has the same dynamic range as fp32, which prevents "
                 "overflow when converting from fp32.", evidence=c07_evidence)
def c07(ev: dict) -> claims.Verdict:
    """Same normal range holds; the caveat applies if any finite fp32 value overflows in bf16."""
    same = (ev["exp_bits"]["bf16"] == ev["exp_bits"]["fp32"]
            and ev["min_normal"]["bf16"] == ev["min_normal"]["fp32"])
    overflows = not math.isfinite(ev["fp32_max_in_bf16"])
    return claims.judge(
        "", same,
        f"both have {ev['exp_bits']['bf16']} and {ev['exp_bits']['fp32']} exponent bits, min "
        f"normal {g(ev['min_normal']['bf16'])} and {g(ev['min_normal']['fp32'])}; bf16 max "
        f"{g(ev['max']['bf16'])} vs fp32 max {g(ev['max']['fp32'])}; fp32's max converts to "
        f"{ev['fp32_max_in_bf16']} in bf16",
        caveat_applies=overflows,
        caveat=(f"the top of fp32's range overflows: every fp32 value from "
                f"{g(ev['overflow_from'])} up becomes {ev['overflow_to']} in bf16, and bf16's "
                f"smallest subnormal is {g(ev['min_subnormal']['bf16'])} against fp32's "
                f"{g(ev['min_subnormal']['fp32'])}"),
        correction="bf16's exponent range differs from fp32's")


# C08 -------------------------------------------------------------------------------------------
def c08_evidence() -> dict:
    """fp16's largest and smallest values and pi rounded to fp16 (chapter: 2)."""
    s, t = spec("fp16"), thresholds("fp16")
    return dict(max=s.max, min=s.min, pi16=round_to(math.pi, "fp16"),
                overflow_from=t.overflow_from, min_normal=t.min_normal)


@claims.register("C08", _CH2, "fp16 covers -65,504 to +65,504, and pi stored in fp16 "
                 "becomes 3.140625.", evidence=c08_evidence)
def c08(ev: dict) -> claims.Verdict:
    """Holds if both parts are exact; with a caveat if one of the two is; wrong if neither."""
    range_ok = ev["max"] == 65504 and ev["min"] == -65504
    pi_ok = ev["pi16"] == 3.140625
    return claims.judge(
        "", range_ok or pi_ok,
        f"fp16 max {ev['max']:,g}, min {ev['min']:,g}; pi -> {ev['pi16']!r}; values up to "
        f"{ev['overflow_from']:,g} (exclusive) round to the max, full precision down to "
        f"{g(ev['min_normal'])}",
        caveat_applies=not (range_ok and pi_ok),
        caveat=("only in part: " + ("the range is right, pi is not" if range_ok
                                    else "pi is right, the range is not")),
        correction="neither the range nor pi's fp16 value is as stated")


# C09 -------------------------------------------------------------------------------------------
def c09_evidence() -> dict:
    """fp32's max, min normal and min subnormal (chapter: 2)."""
    t = thresholds("fp32")
    return dict(max=t.max, min_normal=t.min_normal, min_subnormal=t.min_subnormal,
                tolerance=0.15)


def _c09(ev: dict) -> claims.Verdict:
    tol = ev["tolerance"]
    top_ok = abs(ev["max"] - 3e38) / ev["max"] < tol
    low_ok = abs(ev["min_normal"] - 3e-38) / ev["min_normal"] < tol
    return claims.judge(
        "", top_ok,
        f"fp32 max {g(ev['max'])}, min normal {g(ev['min_normal'])}, min subnormal "
        f"{g(ev['min_subnormal'])}; 'about' taken as within {tol:.0%}",
        caveat_applies=not low_ok,
        caveat=(f"the top is right, the bottom is not: the smallest normal fp32 is "
                f"{g(ev['min_normal'])}, {3e-38 / ev['min_normal']:.2g}x smaller than 3e-38, "
                f"and subnormals go down to {g(ev['min_subnormal'])}"),
        correction=f"fp32's largest value is {g(ev['max'])}")


@claims.register("C09", _CH2, "fp32 covers about 3e-38 to 3e38.", evidence=c09_evidence)
def c09(ev: dict) -> claims.Verdict:
    """Holds if both ends are within the tolerance; caveat if only the top is; wrong otherwise."""
    return claims.with_sensitivity(_c09, ev, "tolerance", (0.05, 0.15, 1.0, 2.0),
                                   lambda t: f"a tolerance of {t:.0%}")


# C10 -------------------------------------------------------------------------------------------
def c10_evidence() -> dict:
    """Pi's rounding error in bf16 and fp16, and their median relative errors (chapter: 2).

    The medians are over 10^5 values.
    """
    xs = torch.logspace(-3, 3, 100_001, dtype=torch.float64)
    return dict(pi_bf16=round_to(math.pi, "bf16"), pi_fp16=round_to(math.pi, "fp16"),
                median_bf16=relative_error(xs, "bf16").median().item(),
                median_fp16=relative_error(xs, "fp16").median().item(),
                mantissa={"bf16": spec("bf16").mantissa_bits, "fp16": spec("fp16").mantissa_bits})


@claims.register("C10", _CH2, "Pi stored in bf16 loses more precision than in fp16.",
                 evidence=c10_evidence)
def c10(ev: dict) -> claims.Verdict:
    """Holds if pi's bf16 error is larger; wrong if not (the general trend goes in the note)."""
    eb, e16 = abs(ev["pi_bf16"] - math.pi), abs(ev["pi_fp16"] - math.pi)
    general = ev["median_bf16"] > ev["median_fp16"]
    return claims.judge(
        "", eb > e16,
        f"pi -> {ev['pi_bf16']!r} in bf16 and {ev['pi_fp16']!r} in fp16: errors {g(eb)} and "
        f"{g(e16)}; over 10^5 values from 1e-3 to 1e3 the median relative error is "
        f"{g(ev['median_bf16'])} in bf16 and {g(ev['median_fp16'])} in fp16",
        caveat_applies=not general,
        caveat="for pi; over many values bf16's median error is not larger than fp16's",
        correction=(f"pi happens to round to the same value in both; in general bf16 does "
                    f"lose more: its median relative error is "
                    f"{ev['median_bf16'] / ev['median_fp16']:.1f}x fp16's, from "
                    f"{ev['mantissa']['bf16']} mantissa bits against {ev['mantissa']['fp16']}"
                    if general else "pi rounds no worse in bf16, nor do most values"))


# C11 -------------------------------------------------------------------------------------------
def c11_evidence() -> dict:
    """Pi cast to int8, rounded, and absmax-quantized (chapter: 2).

    Cast by truncation, rounded to an integer, and absmax-quantized in blocks of max 4 and 10.
    """
    from memlab.quant.functional import absmax_quantize, dequantize

    absmax = {}
    for top in (math.pi, 4.0, 10.0):
        q, state = absmax_quantize(torch.tensor([math.pi, top], dtype=torch.float32))
        absmax[top] = dequantize(q, state)[0].item()
    return dict(cast=int(torch.tensor(math.pi).to(torch.int8)), rounded=round(math.pi),
                absmax=absmax)


@claims.register("C11", _CH2, "Pi quantized to int8 becomes 3.", evidence=c11_evidence)
def c11(ev: dict) -> claims.Verdict:
    """Holds if every int8 route gives 3; caveat if only the integer routes do; wrong if none."""
    integer = ev["cast"] == 3 and ev["rounded"] == 3
    quantized = all(v == 3.0 for v in ev["absmax"].values())
    return claims.judge(
        "", integer or quantized,
        f"torch's cast .to(torch.int8) gives {ev['cast']} (it truncates toward zero), rounding "
        f"to the nearest integer gives {ev['rounded']}; absmax quantization gives "
        + ", ".join(f"{v:.6g} in a block with max {k:.6g}" for k, v in ev["absmax"].items()),
        caveat_applies=not (integer and quantized),
        caveat=("only when pi is turned into an integer (cast or rounded); int8 quantization "
                "scales each block by its absmax first, and pi then keeps two or more "
                "significant digits"),
        correction="no int8 route gives 3")


# C12 -------------------------------------------------------------------------------------------
def c12_evidence() -> dict:
    """int8's range in torch, and the codes symmetric absmax quantization uses (chapter: 2).

    From scratch and bitsandbytes.
    """
    from memlab.quant.functional import absmax_quantize

    s = spec("int8")
    q, state = absmax_quantize(torch.tensor([-5.0, 1.0, 5.0]))
    bnb = None
    bnbf = bitsandbytes_functional()
    if bnbf is not None and hasattr(bnbf, "int8_vectorwise_quant"):
        bnb = bnbf.int8_vectorwise_quant(torch.tensor([[-5.0, 1.0, 5.0]]))[0].flatten().tolist()
    return dict(type_range=(int(s.min), int(s.max)), qmax=state.qmax, codes=q.tolist(),
                bnb_codes=bnb)


@claims.register("C12", _CH2, "int8 represents -128 to 127. (Another source says -127 to 127.)",
                 evidence=c12_evidence)
def c12(ev: dict) -> claims.Verdict:
    """Holds if the type is -128..127 and symmetric quantization keeps -127..127; caveat if only the first."""
    symmetric = ev["qmax"] == 127 and min(ev["codes"]) == -127 and (
        ev["bnb_codes"] is None or min(ev["bnb_codes"]) == -127)
    bnb = (f"; bitsandbytes' int8_vectorwise_quant gives {ev['bnb_codes']}"
           if ev["bnb_codes"] is not None else "")
    return claims.judge(
        "", tuple(ev["type_range"]) == (-128, 127),
        f"torch.iinfo(int8): {ev['type_range'][0]} to {ev['type_range'][1]}; absmax "
        f"quantization uses codes -{ev['qmax']}..{ev['qmax']} (here {ev['codes']}){bnb}. Both "
        "sources are right: the type holds -128..127, symmetric quantization keeps -127..127 "
        "so that +x and -x get codes of equal size",
        caveat_applies=not symmetric,
        caveat="the type holds -128..127, but the symmetric quantizers here do not use -127..127",
        correction=f"int8 holds {ev['type_range'][0]} to {ev['type_range'][1]}")


# C13 -------------------------------------------------------------------------------------------
def c13_evidence() -> dict:
    """What this CPU does with fp8, and which catalogued GPUs have fp8 tensor cores (chapter: 2).

    The CPU is tried; the GPUs are from datasheets.
    """
    from memlab.gpus import CATALOGUE

    probe = probe_formats("cpu", ("fp8-e4m3",)).loc["fp8-e4m3"]
    return dict(
        store=bool(probe["store (cast)"]), add=bool(probe["add"]), matmul=bool(probe["matmul"]),
        gpus={gpu.name: (float(gpu.compute_capability), "fp8" in gpu.tensor_core_formats)
              for gpu in CATALOGUE})


@claims.register("C13", _CH2, "fp8 needs newer hardware such as the H100.", evidence=c13_evidence)
def c13(ev: dict) -> claims.Verdict:
    """Holds if fp8 cannot even be stored without new hardware.

    Caveat if only its fast arithmetic needs it.
    """
    with_fp8 = {n: cc for n, (cc, has) in ev["gpus"].items() if has}
    older = {n: cc for n, (cc, has) in ev["gpus"].items() if not has}
    only_newer = bool(with_fp8) and min(with_fp8.values()) > max(older.values(), default=0)
    return claims.judge(
        "", only_newer,
        f"tried on this CPU: fp8 tensors store {ev['store']}, add {ev['add']}, matmul "
        f"{ev['matmul']}; fp8 tensor cores (quoted from datasheets): {', '.join(with_fp8)}; "
        f"none on {', '.join(older)}",
        caveat_applies=ev["store"],
        caveat=(f"for fast fp8 arithmetic, and not only the H100: fp8 tensor cores come with "
                f"compute capability {min(with_fp8.values(), default=0):g} and up. Storing "
                "fp8 needs no special hardware: this CPU holds the bytes and upcasts them"),
        correction="fp8 tensor cores also exist on older GPUs in the catalogue")


# C42 -------------------------------------------------------------------------------------------
def c42_evidence() -> dict:
    """Peaks of fp32, bf16-mixed and pure bf16 AdamW for Llama-2-7B (chapter: 2).

    At seq 2048, batch 1 to 16.
    """
    from memlab.memory.estimator import estimate

    cfg = get_config("llama2-7b")
    n, S = cfg.num_parameters(), 2048
    rows = {}
    for b in (1, 2, 4, 8, 16):
        est = {p: estimate(cfg, batch_size=b, seq_len=S, precision=p, optimizer="adamw",
                           optimizer_impl="foreach", device="cuda")
               for p in ("fp32", "bf16-mixed", "bf16")}
        rows[b] = {p: e.peak_bytes for p, e in est.items()}
        if b == 1:
            state = {p: (e.parameters_bytes + e.gradients_bytes + e.optimizer_states_bytes) / n
                     for p, e in est.items()}
    from memlab.precision.memory import autocast_crossover

    cross = autocast_crossover(cfg, seq_len=S)
    return dict(peaks=rows, state=state, seq_len=S, limit=0.55,
                crossover=(cross.saved_batch, cross.peak_batch))


@claims.register("C42", _CH2, "Mixed-precision training halves training memory.",
                 evidence=c42_evidence)
def c42(ev: dict) -> claims.Verdict:
    """Holds if bf16-mixed's peak is at most 55% of fp32's at every batch; caveat at some; wrong at none."""
    ratio = {b: p["bf16-mixed"] / p["fp32"] for b, p in ev["peaks"].items()}
    pure = {b: p["bf16"] / p["fp32"] for b, p in ev["peaks"].items()}
    halved = [b for b, r in ratio.items() if r <= ev["limit"]]
    st = ev["state"]
    return claims.judge(
        "", bool(halved),
        f"estimated for a CUDA GPU, Llama-2-7B, AdamW (foreach), seq {ev['seq_len']}: peak "
        "bf16-mixed / fp32 = " + ", ".join(f"{r:.2f} at batch {b}" for b, r in ratio.items())
        + f"; parameters + gradients + AdamW states {st['bf16-mixed']:.1f} B/param mixed vs "
        f"{st['fp32']:.1f} fp32; pure bf16 / fp32: "
        + ", ".join(f"{r:.2f}" for r in pure.values())
        + f"; autocast's saved activations fall below fp32's from batch {ev['crossover'][0]}, "
        f"its peak from batch {ev['crossover'][1]}; 'halves' taken as a ratio <= {ev['limit']}",
        caveat_applies=len(halved) < len(ratio),
        caveat=f"only at batch {', '.join(map(str, halved))} of {', '.join(map(str, ratio))}",
        correction=(f"mixed precision keeps fp32 weights, fp32 gradients and fp32 AdamW states "
                    f"({st['bf16-mixed']:.0f} B/param, as in fp32) and adds 16-bit weight "
                    "copies; it changes only the activations, so the peak stays at "
                    + " / ".join(f"{r:.2f}" for r in ratio.values())
                    + " of fp32; pure bf16 training (bf16 weights, gradients and states) is "
                    "what halves it"),
        sensitivity=(f"a limit of {ev['limit']} here; would be "
                     + (f"{claims.CAVEAT} with a limit of {min(ratio.values()):.2f}"
                        if not halved else f"{claims.WRONG} below {min(ratio.values()):.2f}")))


# C14 -------------------------------------------------------------------------------------------
@functools.cache
def c14_evidence() -> dict:
    """Held-out losses of fp32, bf16 autocast and pure bf16 training (chapter: 2).

    On the chapter's runs, paired against fp32.

    The runs are the chapter's own (``MIXED_SIZES`` at this scale, on the CPU), so the claim
    costs nothing once the chapter has trained them.
    """
    import statistics

    from memlab.device import get_scale
    from memlab.gpus import CATALOGUE
    from memlab.precision.experiments import MIXED_SIZES

    size = MIXED_SIZES[get_scale()]
    kw = {k: size[k] for k in ("model", "model_overrides", "steps", "batch_size", "seq_len",
                               "lr")}
    runs = {m: train(m, device="cpu", **kw) for m in ("fp32", "bf16-autocast", "bf16-pure")}
    ref = runs["fp32"].eval_seq_loss
    delta, se = {}, {}
    for m in ("bf16-autocast", "bf16-pure"):
        d = [a - b for a, b in zip(runs[m].eval_seq_loss, ref, strict=True)]
        delta[m], se[m] = statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5
    cfg = get_config(size["model"], **size["model_overrides"])
    return dict(loss={m: r.eval_loss for m, r in runs.items()}, delta=delta, se=se, z=2.0,
                sequences=len(ref), params=cfg.num_parameters(),
                ints={f: thresholds(f).largest_exact_integer for f in ("bf16", "fp16", "fp32")},
                no_bf16_cores=[gpu.name for gpu in CATALOGUE if not gpu.bf16_tensor_cores])


def _c14(ev: dict) -> claims.Verdict:
    loss, d, se, z = ev["loss"], ev["delta"], ev["se"], ev["z"]
    better = [m for m in d if d[m] < -z * se[m]]
    return claims.judge(
        "", bool(better),
        f"measured on this page's CPU with the chapter's {ev['params']:,}-parameter model, "
        f"held-out loss over {ev['sequences']} sequences: fp32 {loss['fp32']:.4f}, bf16 autocast "
        f"{loss['bf16-autocast']:.4f}, pure bf16 {loss['bf16-pure']:.4f} nats; minus fp32's "
        "(paired, +- " + f"{z:g} SE): " + ", ".join(f"{m} {d[m]:+.4f} +- {z * se[m]:.4f}"
                                                    for m in d)
        + "; 'improves' taken as lower beyond the noise; integers exact up to "
        + ", ".join(f"{v:,} in {f}" for f, v in ev["ints"].items())
        + f"; no bf16 tensor cores (quoted from datasheets): {', '.join(ev['no_bf16_cores'])}",
        caveat_applies=len(better) < len(d),
        caveat=f"only {', '.join(better)} improved here, on a small model",
        correction=(
            "on this small model bf16 matches fp32's quality at best, it does not improve it; "
            "its speed comes from tensor cores, which some GPUs lack for bf16, and the step "
            "times are not measured on this page's device; 'poorly suited to integers' holds "
            f"in the sense that bf16 stores integers exactly only up to {ev['ints']['bf16']}"))


@claims.register("C14", _CH2, "bf16 speeds up computation and improves model quality; it is "
                 "poorly suited to integer arithmetic.", evidence=c14_evidence)
def c14(ev: dict) -> claims.Verdict:
    """Judged on quality only: holds if both bf16 modes beat fp32 beyond z SE.

    Speed is not timed on this page's CPU.
    """
    return claims.with_sensitivity(_c14, ev, "z", (0.0, 1.0, 2.0, 3.0), lambda z: f"{z:g} SE")
