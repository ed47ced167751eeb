"""Chapter 2's claims: each ``evidence(**setting)`` computes the numbers, ``decide(ev)`` the level.

Each claim is split into the parts its words state (:class:`memlab.claims.Part`) and judged by
the verdict rule (:func:`memlab.claims.judge_parts`): a false part makes it *wrong*, a part
this build cannot measure makes it *not judged here*, and a caveat is a condition of the
claim's own setting (a block size, a batch, a quantizer) that other evidence turns off. What
follows from a format's definition is said in the evidence and never lowers a level. Each
``evidence`` takes the claim's setting as keyword arguments (the format, the value stored,
the GPU, the model and precision), and each check registers the moves that change the level.
"""

from __future__ import annotations

import functools
import math

import torch

from memlab import claims
from memlab.errors import MemlabError, check_choice
from memlab.model.config import get_config
from memlab.precision.formats import (
    FLOAT_FORMATS,
    bitsandbytes_functional,
    probe_formats,
    relative_error,
    representable,
    round_to,
    spec,
    storage_bytes,
    thresholds,
)
from memlab.precision.runs import train

_CH2 = "chapters/02_number_formats"


def g(x: float) -> str:
    return f"{x:.4g}"


def _named(x: float) -> str:
    """A value stored, by name when it is pi."""
    return "pi" if x == math.pi else f"{x:.6g}"


# C06 -------------------------------------------------------------------------------------------
def c06_evidence(halves=("fp16", "bf16"), quarters=("int8", "fp8-e4m3", "fp8-e5m2"),
                 blocksize: int | None = None, model: str = "llama2-7b") -> dict:
    """Storage bytes per value of each format, and int8's with its fp32 scales (chapter: 2).

    One scale per ``blocksize`` values; by default one per row of ``model``'s square projection.
    """
    from memlab.quant.functional import bits_per_parameter

    block = blocksize or get_config(model).d_model
    per = {f: storage_bytes(f) for f in ("fp32", *halves, *quarters)}
    return dict(halves=list(halves), quarters=list(quarters), per=per, block=block,
                int8_with_scales=bits_per_parameter("int8", blocksize=block) / 8,
                tolerance=0.01)


@claims.register("C06", _CH2, "fp16 and bf16 halve memory compared with fp32; int8 and fp8 "
                 "cut it to a quarter.", evidence=c06_evidence, moves=[
                     claims.Move("int8 stored in blocks of 64 values with one fp32 scale each "
                                 "(bitsandbytes' blockwise layout) instead of one scale per "
                                 "4,096-value row", {"blocksize": 64}, claims.CAVEAT)])
def c06(ev: dict) -> claims.Verdict:
    """Each stated fraction exact for the stored values; caveat if int8's scales add over 1%."""
    per = ev["per"]
    r = {f: v / per["fp32"] for f, v in per.items()}
    scaled = ev["int8_with_scales"] / per["fp32"]
    parts = [claims.Part(f"{f} halves memory", r[f] == 0.5, f"{f} takes {r[f]:g} of fp32")
             for f in ev["halves"]]
    parts += [claims.Part(f"{f} cuts it to a quarter", r[f] == 0.25,
                          f"{f} takes {r[f]:g} of fp32") for f in ev["quarters"]]
    return claims.judge_parts(
        "", parts,
        "measured storage bytes/value: " + ", ".join(f"{f} {v:g}" for f, v in per.items())
        + f"; int8 with one fp32 scale per {ev['block']:,} values: "
        f"{ev['int8_with_scales']:.4f} bytes/value, {scaled:.4f} of fp32; scales counted "
        f"when they add more than {ev['tolerance']:.0%} to a quarter",
        caveat_applies="int8" in ev["quarters"] and abs(scaled / 0.25 - 1) > ev["tolerance"],
        caveat=(f"for the stored values; int8 with one fp32 scale per {ev['block']:,} values "
                f"takes {scaled:.3f} of fp32, more than {ev['tolerance']:.0%} over a quarter"))


# C07 -------------------------------------------------------------------------------------------
def _convert(x: float, target: str, rounding: str) -> float:
    """``x`` converted to ``target`` by round to nearest, or by truncation (bf16 only)."""
    if rounding == "nearest":
        return round_to(x, target)
    if target != "bf16":
        raise MemlabError(f"rounding 'toward_zero' is the truncation of an fp32 to its top 16 "
                          f"bits, so it converts to bf16 only; got target {target!r}")
    bits = torch.tensor(x, dtype=torch.float32).view(torch.int32) & ~0xFFFF
    return bits.view(torch.float32).item()


def _count_from(fmt: str, x: float) -> int:
    """How many positive finite values of ``fmt`` are at or above ``x``."""
    s = spec(fmt)
    if s.bits <= 16:
        return int((representable(fmt) >= x).sum())
    lo = torch.tensor(x, dtype=torch.float64).to(torch.float32)
    if lo.double().item() < x:
        lo = torch.nextafter(lo, torch.tensor(math.inf))
    hi = torch.tensor(s.max, dtype=torch.float32)
    return int(hi.view(torch.int32) - lo.view(torch.int32)) + 1


def c07_evidence(source: str = "fp32", target: str = "bf16", rounding: str = "nearest") -> dict:
    """Both formats' normal ranges and subnormals, and where ``source``'s top lands (chapter: 2).

    ``rounding`` is the conversion's: 'nearest' (torch's cast) or 'toward_zero' (truncation).
    """
    check_choice("float format", source, FLOAT_FORMATS)
    check_choice("float format", target, FLOAT_FORMATS)
    check_choice("rounding", rounding, ("nearest", "toward_zero"))
    s, t = spec(source), spec(target)
    top = _convert(s.max, target, rounding)
    first = thresholds(target).overflow_from if rounding == "nearest" else math.inf
    over = not math.isfinite(top)
    return dict(
        source=source, target=target, rounding=rounding,
        exp_bits={"source": s.exponent_bits, "target": t.exponent_bits},
        top_binade={"source": math.frexp(s.max)[1] - 1, "target": math.frexp(t.max)[1] - 1},
        min_normal={"source": s.min_normal, "target": t.min_normal},
        min_subnormal={"source": s.min_subnormal, "target": t.min_subnormal},
        max={"source": s.max, "target": t.max}, source_max_converted=top,
        overflow_from=first if over else None,
        overflow_count=_count_from(source, first) if over else 0)


@claims.register("C07", _CH2, "bf16 has the same dynamic range as fp32, which prevents "
                 "overflow when converting from fp32.", evidence=c07_evidence, moves=[
                     claims.Move("fp32 converted to bf16 by truncation (keeping its top 16 "
                                 "bits) instead of round to nearest",
                                 {"rounding": "toward_zero"}, claims.HOLDS)])
def c07(ev: dict) -> claims.Verdict:
    """Same binades of normals; no finite source value overflows. Wrong if either fails."""
    src, tgt = ev["source"], ev["target"]
    mn, mx, sub, tb = ev["min_normal"], ev["max"], ev["min_subnormal"], ev["top_binade"]
    same = mn["source"] == mn["target"] and tb["source"] == tb["target"]
    span = {k: f"{g(mn[k])} (2^{math.log2(mn[k]):.0f}) to {g(mx[k])}" for k in mn}
    over = ev["overflow_from"] is not None
    how = "round to nearest" if ev["rounding"] == "nearest" else "truncation"
    return claims.judge_parts("", [
        claims.Part(f"{tgt} has the same dynamic range as {src}", same,
                    f"{tgt}'s normals span {span['target']}, {src}'s {span['source']}"),
        claims.Part(f"which prevents overflow when converting from {src}", not over,
                    f"every {src} value from {g(ev['overflow_from'] or 0)} up "
                    f"({ev['overflow_count']:,} values of each sign, {src}'s largest "
                    f"{g(mx['source'])} among them) becomes {ev['source_max_converted']} in "
                    f"{tgt}: {how} carries the top of {src}'s last binade past "
                    f"{tgt}'s largest value {g(mx['target'])}; below that no {src} value "
                    "overflows")],
        f"{ev['exp_bits']['target']} and {ev['exp_bits']['source']} exponent bits; normal "
        f"numbers from {span['target']} in {tgt}, from {span['source']} in {src} (the top "
        f"binade 2^{tb['target']} and 2^{tb['source']}); {src}'s largest value converts to "
        f"{ev['source_max_converted']} in {tgt} by {how}; 'dynamic range' read as the span of "
        f"the normal numbers. Subnormals reach {g(sub['target'])} in {tgt} and "
        f"{g(sub['source'])} in {src}: fewer mantissa bits give fewer subnormal binades")


# C08 -------------------------------------------------------------------------------------------
def c08_evidence(fmt: str = "fp16", value: float = math.pi) -> dict:
    """A format's largest and smallest values and ``value`` rounded to it (chapter: 2)."""
    s, t = spec(fmt), thresholds(fmt)
    return dict(fmt=fmt, value=value, max=s.max, min=s.min, stored=round_to(value, fmt),
                overflow_from=t.overflow_from, min_normal=t.min_normal)


@claims.register("C08", _CH2, "fp16 covers -65,504 to +65,504, and pi stored in fp16 "
                 "becomes 3.140625.", evidence=c08_evidence, moves=[
                     claims.Move("bf16 in place of fp16", {"fmt": "bf16"}, claims.WRONG)])
def c08(ev: dict) -> claims.Verdict:
    """Both parts exact, or wrong."""
    f = ev["fmt"]
    return claims.judge_parts("", [
        claims.Part(f"{f} covers -65,504 to +65,504", ev["max"] == 65504 and ev["min"] == -65504,
                    f"it covers {ev['min']:,g} to {ev['max']:,g}"),
        claims.Part(f"pi stored in {f} becomes 3.140625", ev["stored"] == 3.140625,
                    f"{_named(ev['value'])} becomes {ev['stored']!r}")],
        f"{f} max {ev['max']:,g}, min {ev['min']:,g}; {_named(ev['value'])} -> {ev['stored']!r}; "
        f"values up to {ev['overflow_from']:,g} (exclusive) round to the max, full precision "
        f"down to {g(ev['min_normal'])}")


# C09 -------------------------------------------------------------------------------------------
C09_STATED = (3e-38, 3e38)  # the claim's ends


def c09_evidence(fmt: str = "fp32") -> dict:
    """A format's max, min normal and min subnormal (chapter: 2)."""
    t = thresholds(fmt)
    return dict(fmt=fmt, max=t.max, min_normal=t.min_normal, min_subnormal=t.min_subnormal,
                tolerance=0.5)


def _decades(a: float, b: float) -> float:
    return abs(math.log10(a / b))


def _c09(ev: dict) -> claims.Verdict:
    tol, f = ev["tolerance"], ev["fmt"]
    low, high = C09_STATED
    d_low, d_high = _decades(ev["min_normal"], low), _decades(ev["max"], high)
    return claims.judge_parts("", [
        claims.Part("the top is about 3e38", d_high <= tol,
                    f"{f}'s largest value is {g(ev['max'])}"),
        claims.Part("the bottom is about 3e-38", d_low <= tol,
                    f"{f}'s smallest normal value is {g(ev['min_normal'])}")],
        f"{f} max {g(ev['max'])} ({d_high:.2f} decades from 3e38), min normal "
        f"{g(ev['min_normal'])} ({d_low:.2f} decades from 3e-38); 'about' read on the log scale the range is stated on: each end within "
        f"{tol:g} decades (a factor of {10 ** tol:.2g}); below the smallest normal, subnormals "
        f"with fewer bits reach {g(ev['min_subnormal'])}")


@claims.register("C09", _CH2, "fp32 covers about 3e-38 to 3e38.", evidence=c09_evidence,
                 moves=[claims.Move("fp16 in place of fp32", {"fmt": "fp16"}, claims.WRONG)])
def c09(ev: dict) -> claims.Verdict:
    """Holds if both ends lie within the tolerance (in decades) of the stated ones; wrong if not."""
    return claims.with_sensitivity(_c09, ev, "tolerance", (0.07, 0.25, 0.5, 1.0),
                                   lambda t: f"a tolerance of a factor of {10 ** t:.2g}")


# C10 -------------------------------------------------------------------------------------------
def c10_evidence(value: float = math.pi) -> dict:
    """``value``'s rounding in bf16 and fp16, and their median relative errors (chapter: 2).

    The medians are over 10^5 values.
    """
    xs = torch.logspace(-3, 3, 100_001, dtype=torch.float64)
    return dict(value=value, bf16=round_to(value, "bf16"), fp16=round_to(value, "fp16"),
                median_bf16=relative_error(xs, "bf16").median().item(),
                median_fp16=relative_error(xs, "fp16").median().item(),
                mantissa={"bf16": spec("bf16").mantissa_bits, "fp16": spec("fp16").mantissa_bits})


@claims.register("C10", _CH2, "Pi stored in bf16 loses more precision than in fp16.",
                 evidence=c10_evidence, moves=[
                     claims.Move("0.1 stored in place of pi", {"value": 0.1}, claims.HOLDS)])
def c10(ev: dict) -> claims.Verdict:
    """Holds if the value's bf16 error is larger than its fp16 error; wrong if not."""
    x, name = ev["value"], _named(ev["value"])
    eb, e16 = abs(ev["bf16"] - x), abs(ev["fp16"] - x)
    ratio = ev["median_bf16"] / ev["median_fp16"]
    return claims.judge_parts("", [
        claims.Part(f"{name} stored in bf16 loses more precision than in fp16", eb > e16,
                    f"{name} rounds to {ev['bf16']!r} in both, with the same error; over many "
                    f"values bf16 does lose more: its median relative error is {ratio:.1f}x "
                    f"fp16's, from {ev['mantissa']['bf16']} mantissa bits against "
                    f"{ev['mantissa']['fp16']}" if eb == e16 else
                    f"{name} rounds no worse in bf16 than in fp16")],
        f"{name} -> {ev['bf16']!r} in bf16 and {ev['fp16']!r} in fp16: errors {g(eb)} and "
        f"{g(e16)}; over 10^5 values from 1e-3 to 1e3 the median relative error is "
        f"{g(ev['median_bf16'])} in bf16 and {g(ev['median_fp16'])} in fp16")


# C11 -------------------------------------------------------------------------------------------
def c11_evidence(value: float = math.pi, blocks=(math.pi, 4.0, 10.0)) -> dict:
    """``value`` cast to int8, rounded, and absmax-quantized in blocks of each largest value (chapter: 2).

    Each block holds ``value`` and its largest magnitude.
    """
    from memlab.quant.functional import absmax_quantize, dequantize

    absmax = {}
    for top in blocks:
        q, state = absmax_quantize(torch.tensor([value, top], dtype=torch.float32))
        absmax[top] = dequantize(q, state)[0].item()
    return dict(value=value, cast=int(torch.tensor(value).to(torch.int8)),
                rounded=int(round_to(value, "int8")), absmax=absmax)


@claims.register("C11", _CH2, "Pi quantized to int8 becomes 3.", evidence=c11_evidence, moves=[
    claims.Move("pi quantized by absmax in a block whose largest magnitude is 127 (a scale of "
                "1) instead of blocks whose largest is pi, 4 or 10", {"blocks": (127.0,)},
                claims.HOLDS)])
def c11(ev: dict) -> claims.Verdict:
    """Holds if every int8 route gives 3; caveat if only the scale-1 routes do; wrong if none."""
    integer = ev["cast"] == 3 and ev["rounded"] == 3
    scaled = {k: v for k, v in ev["absmax"].items() if v != 3.0}
    name = _named(ev["value"])
    return claims.judge_parts("", [
        claims.Part(f"{name} quantized to int8 becomes 3", integer or not scaled,
                    f"it becomes {ev['cast']} by a cast and {ev['rounded']} by rounding")],
        f"torch's cast .to(torch.int8) gives {ev['cast']} (it truncates toward zero), rounding "
        f"to the nearest integer gives {ev['rounded']}; absmax quantization gives "
        + ", ".join(f"{v:.6g} in a block with max {_named(k)}" for k, v in ev["absmax"].items()),
        caveat_applies=integer and bool(scaled),
        caveat=(f"when {name} becomes an integer with a scale of 1 (a cast or rounding); int8 "
                "quantization with absmax scaling keeps it as "
                + ", ".join(f"{v:.6g} in a block with max {_named(k)}" for k, v in scaled.items())))


# C12 -------------------------------------------------------------------------------------------
def c12_evidence(fmt: str = "int8") -> dict:
    """An integer type's range in torch, and the codes symmetric absmax quantization uses (chapter: 2).

    From scratch, and from bitsandbytes for int8.
    """
    from memlab.quant.functional import absmax_quantize

    s = spec(check_choice("integer format", fmt, ("int8", "int4")))
    q, state = absmax_quantize(torch.tensor([-5.0, 1.0, 5.0]), bits=s.bits)
    bnb = None
    bnbf = bitsandbytes_functional()
    if fmt == "int8" and bnbf is not None and hasattr(bnbf, "int8_vectorwise_quant"):
        bnb = bnbf.int8_vectorwise_quant(torch.tensor([[-5.0, 1.0, 5.0]]))[0].flatten().tolist()
    return dict(fmt=fmt, type_range=(int(s.min), int(s.max)), qmax=state.qmax, codes=q.tolist(),
                bnb_codes=bnb)


@claims.register("C12", _CH2, "int8 represents -128 to 127. (Another source says -127 to 127.)",
                 evidence=c12_evidence,
                 moves=[claims.Move("int4 in place of int8", {"fmt": "int4"}, claims.WRONG)])
def c12(ev: dict) -> claims.Verdict:
    """Holds if the type holds -128..127 and symmetric quantization keeps -127..127."""
    lo, hi = ev["type_range"]
    codes = [c for c in (ev["codes"], ev["bnb_codes"]) if c is not None]
    symmetric = ev["qmax"] == 127 and all(min(c) == -127 and max(c) == 127 for c in codes)
    bnb = (f"; bitsandbytes' int8_vectorwise_quant gives {ev['bnb_codes']}"
           if ev["bnb_codes"] is not None else "")
    return claims.judge_parts("", [
        claims.Part(f"{ev['fmt']} represents -128 to 127", (lo, hi) == (-128, 127),
                    f"it represents {lo} to {hi}"),
        claims.Part("another source's -127 to 127: the codes symmetric quantization uses",
                    symmetric, f"symmetric absmax quantization uses -{ev['qmax']} to "
                    f"{ev['qmax']}")],
        f"torch's {ev['fmt']}: {lo} to {hi}; absmax quantization uses codes "
        f"-{ev['qmax']}..{ev['qmax']} (here {ev['codes']}){bnb}. Both sources are right: the "
        "type holds one more negative value than positive, and symmetric quantization leaves "
        "it unused so that +x and -x get codes of equal size")


# C13 -------------------------------------------------------------------------------------------
def c13_evidence(gpu: str = "H100") -> dict:
    """What this CPU does with fp8, and which catalogued GPUs have fp8 tensor cores (chapter: 2).

    The CPU is tried; the GPUs are from datasheets. ``gpu`` is the claim's example.
    """
    from memlab.gpus import CATALOGUE, get_gpu

    probe = probe_formats("cpu", ("fp8-e4m3",)).loc["fp8-e4m3"]
    return dict(
        store=bool(probe["store (cast)"]), add=bool(probe["add"]), matmul=bool(probe["matmul"]),
        example=get_gpu(gpu).name,
        gpus={x.name: (float(x.compute_capability), "fp8" in x.tensor_core_formats)
              for x in CATALOGUE})


@claims.register("C13", _CH2, "fp8 needs newer hardware such as the H100.", evidence=c13_evidence,
                 moves=[claims.Move("the A100 as the example instead of the H100",
                                    {"gpu": "A100-80GB"}, claims.WRONG)])
def c13(ev: dict) -> claims.Verdict:
    """Holds if fp8 tensor cores come only with the newest GPUs and the example has them."""
    with_fp8 = {n: cc for n, (cc, has) in ev["gpus"].items() if has}
    older = {n: cc for n, (cc, has) in ev["gpus"].items() if not has}
    newer = bool(with_fp8) and min(with_fp8.values()) > max(older.values(), default=0)
    ex = ev["example"]
    return claims.judge_parts("", [
        claims.Part("fp8 needs newer hardware", newer,
                    "fp8 tensor cores also come with older GPUs: "
                    + ", ".join(f"the {n} (compute capability {cc:.1f})" for n, cc in with_fp8.items()
                                if cc <= max(older.values(), default=0))),
        claims.Part(f"such as the {ex}", ex in with_fp8,
                    f"the {ex} (compute capability {ev['gpus'][ex][0]:.1f}) has no fp8 tensor "
                    "cores")],
        f"fp8 tensor cores (quoted from datasheets): {', '.join(with_fp8)}, compute capability "
        f"{min(with_fp8.values(), default=0):.1f} and up; none on {', '.join(older)}. Tried on "
        f"this CPU: fp8 tensors store {ev['store']}, add {ev['add']}, matmul {ev['matmul']}: "
        "any device stores fp8 as bytes and can widen it to multiply; arithmetic in fp8 is "
        "what needs the tensor cores")


# C42 -------------------------------------------------------------------------------------------
def c42_evidence(model: str = "llama2-7b", seq_len: int = 2048, batches=(1, 2, 4, 8, 16),
                 precision: str = "bf16-mixed") -> dict:
    """Peaks of fp32, ``precision`` and pure bf16 AdamW training for ``model`` (chapter: 2).

    Estimated with a CUDA GPU's conventions, at each batch of ``batches``.
    """
    from memlab.memory.estimator import estimate
    from memlab.precision.memory import autocast_crossover

    cfg = get_config(model)
    n = cfg.num_parameters()
    modes = dict.fromkeys(("fp32", precision, "bf16"))
    rows, state = {}, {}
    for b in batches:
        est = {p: estimate(cfg, batch_size=b, seq_len=seq_len, precision=p, optimizer="adamw",
                           optimizer_impl="foreach", device="cuda") for p in modes}
        rows[b] = {p: e.peak_bytes for p, e in est.items()}
        state = {p: (e.parameters_bytes + e.gradients_bytes + e.optimizer_states_bytes) / n
                 for p, e in est.items()}
    cross = (autocast_crossover(cfg, seq_len=seq_len, precision=precision)
             if precision.endswith("-mixed") else None)
    return dict(model=cfg.name, precision=precision, peaks=rows, state=state, seq_len=seq_len,
                limit=0.55, crossover=(cross.saved_batch, cross.peak_batch) if cross else None)


@claims.register("C42", _CH2, "Mixed-precision training halves training memory.",
                 evidence=c42_evidence, moves=[
                     claims.Move("pure bf16 training (bf16 weights, gradients and AdamW states) "
                                 "instead of bf16 mixed precision", {"precision": "bf16"},
                                 claims.CAVEAT)])
def c42(ev: dict) -> claims.Verdict:
    """Holds if the peak is at most 55% of fp32's at every batch; caveat at some; wrong at none."""
    p = ev["precision"]
    ratio = {b: r[p] / r["fp32"] for b, r in ev["peaks"].items()}
    pure = {b: r["bf16"] / r["fp32"] for b, r in ev["peaks"].items()}
    halved = [b for b, r in ratio.items() if r <= ev["limit"]]
    st = ev["state"]
    cross = ("" if ev["crossover"] is None else
             f"; autocast's saved activations fall below fp32's from batch {ev['crossover'][0]}, "
             f"its peak from batch {ev['crossover'][1]}")
    stays = " / ".join(f"{r:.2f}" for r in ratio.values())
    found = (f"{p} keeps fp32 weights, fp32 gradients and fp32 AdamW states ({st[p]:.0f} "
             "B/param, as in fp32) and adds 16-bit weight copies; it changes only the "
             f"activations, so the peak stays at {stays} of fp32; pure bf16 training (bf16 "
             "weights, gradients and states) is what halves it" if p.endswith("-mixed")
             else f"the peak of {p} stays at {stays} of fp32")
    missed = ", ".join(f"{ratio[b]:.3f} at batch {b}" for b in ratio if b not in halved)
    return claims.judge_parts(
        "", [claims.Part("mixed-precision training halves training memory", bool(halved),
                         found)],
        f"estimated for a CUDA GPU, {ev['model']}, AdamW (foreach), seq {ev['seq_len']}: peak "
        f"{p} / fp32 = " + ", ".join(f"{r:.2f} at batch {b}" for b, r in ratio.items())
        + f"; parameters + gradients + AdamW states {st[p]:.1f} B/param {p} vs "
        f"{st['fp32']:.1f} fp32; pure bf16 / fp32: " + ", ".join(f"{r:.2f}" for r in pure.values())
        + f"{cross}; 'halves' taken as a ratio <= {ev['limit']}",
        caveat_applies=len(halved) < len(ratio),
        caveat=(f"only at batch {', '.join(map(str, halved))} of {', '.join(map(str, ratio))}: "
                f"{missed}, above {ev['limit']}"),
        sensitivity=(f"a limit of {ev['limit']} here; would be "
                     + (f"{claims.CAVEAT} with a limit of {min(ratio.values()):.2f}"
                        if not halved else f"{claims.WRONG} below {min(ratio.values()):.2f}")))


# C14 -------------------------------------------------------------------------------------------
C14_COMMAND = "memlab run step-times --scale full --out results/"  # on a CUDA GPU


def _recorded_speedups(modes) -> dict | None:
    """bf16 modes' step-time speed-ups over fp32 from a recorded GPU run, or None."""
    from memlab.results import recorded

    for name in ("step-times", "mixed-precision"):
        rec = recorded(name)
        if rec is not None:
            times = rec.value() if name == "step-times" else rec.value().step_times
            if times.measured:
                return dict(label=rec.label, speedup={r.mode: r.speedup_vs_fp32
                                                      for r in times.rows if r.mode in modes})
    return None


@functools.cache
def c14_evidence(modes=("bf16-autocast", "bf16-pure"), baseline: str = "fp32",
                 setting: str = "token-mean") -> dict:
    """Held-out losses of ``modes`` paired against ``baseline`` on the chapter's runs (chapter: 2).

    The runs are the chapter's own (``MIXED_SIZES`` at this scale, on the CPU, in ``setting``:
    'token-mean', or 'accumulation' with the loss divided by K), so the claim costs nothing
    once the chapter has trained them. Step-time speed-ups come from a recorded GPU run.
    """
    import statistics

    from memlab.device import get_scale
    from memlab.gpus import CATALOGUE
    from memlab.precision.experiments import MIXED_SIZES

    check_choice("setting", setting, ("token-mean", "accumulation"))
    size = MIXED_SIZES[get_scale()]
    kw = {k: size[k] for k in ("model", "model_overrides", "steps", "batch_size", "seq_len",
                               "lr")}
    if setting == "accumulation":
        kw.update(loss_divisor=size["accumulation"], setting="accumulation")
    runs = {m: train(m, device="cpu", **kw) for m in (baseline, *modes)}
    ref = runs[baseline].eval_seq_loss
    delta, se = {}, {}
    for m in modes:
        d = [a - b for a, b in zip(runs[m].eval_seq_loss, ref, strict=True)]
        delta[m], se[m] = statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5
    cfg = get_config(size["model"], **size["model_overrides"])
    return dict(baseline=baseline, setting=setting, loss={m: r.eval_loss for m, r in runs.items()},
                delta=delta, se=se, z=2.0, sequences=len(ref), params=cfg.num_parameters(),
                speed=_recorded_speedups(modes),
                ints={f: thresholds(f).largest_exact_integer for f in ("bf16", "fp16", "fp32")},
                no_bf16_cores=[gpu.name for gpu in CATALOGUE if not gpu.bf16_tensor_cores])


def _c14(ev: dict) -> claims.Verdict:
    loss, d, se, z, base = ev["loss"], ev["delta"], ev["se"], ev["z"], ev["baseline"]
    improved = {m: d[m] < -z * se[m] for m in d}
    ints, speed = ev["ints"], ev["speed"]
    fast = None if speed is None else all((speed["speedup"].get(m) or 0) > 1 for m in d)
    names = {m: m.replace("-autocast", " autocast").replace("bf16-pure", "pure bf16")
             for m in loss}
    timed = ("step times not recorded on a GPU" if speed is None else
             f"step time speed-up over fp32 {speed['label']}: "
             + ", ".join(f"{m} {speed['speedup'].get(m)}" for m in d))
    return claims.judge_parts("", [
        claims.Part("bf16 speeds up computation", fast,
                    "a GPU timing, from bf16 tensor cores (none on "
                    + ", ".join(ev["no_bf16_cores"]) + ", by their datasheets); this page's "
                    "device is a CPU and no GPU record of step-times is stored" if speed is None
                    else "the recorded bf16 steps are not all faster than fp32's"),
        claims.Part("bf16 improves model quality", all(improved.values()),
                    f"on this {ev['params']:,}-parameter model the held-out loss is not lower "
                    f"than {names[base]}'s beyond the noise in "
                    + ", ".join(names[m] for m, ok in improved.items() if not ok)
                    + f"; bf16 matches {names[base]}'s quality, it does not improve it"),
        claims.Part("it is poorly suited to integer arithmetic",
                    ints["bf16"] < min(ints["fp16"], ints["fp32"]),
                    f"bf16 stores integers exactly up to {ints['bf16']:,}, fp16 up to "
                    f"{ints['fp16']:,}, fp32 up to {ints['fp32']:,}")],
        f"measured on this page's CPU with the chapter's {ev['params']:,}-parameter model "
        f"({ev['setting']}), held-out loss over {ev['sequences']} sequences: "
        + ", ".join(f"{names[m]} {v:.4f}" for m, v in loss.items())
        + f" nats; minus {names[base]}'s (paired, +- {z:g} SE): "
        + ", ".join(f"{names[m]} {d[m]:+.4f} +- {z * se[m]:.4f}" for m in d)
        + "; 'improves' taken as lower beyond the noise in every bf16 mode trained; integers "
        "exact up to " + ", ".join(f"{v:,} in {f}" for f, v in ints.items()) + f"; {timed}",
        command=C14_COMMAND)


@claims.register("C14", _CH2, "bf16 speeds up computation and improves model quality; it is "
                 "poorly suited to integer arithmetic.", evidence=c14_evidence, moves=[
                     claims.Move("quality compared with fp16 without a loss scale under "
                                 "gradient accumulation (the loss divided by K), instead of "
                                 "with fp32 on the token mean; the chapter's runs",
                                 {"modes": ("bf16-autocast",), "baseline": "fp16-autocast",
                                  "setting": "accumulation"}, claims.NOT_JUDGED, slow=True)])
def c14(ev: dict) -> claims.Verdict:
    """Speed from a GPU record (else not judged), quality beyond z SE, integers from the format."""
    return claims.with_sensitivity(_c14, ev, "z", (0.0, 1.0, 2.0, 3.0), lambda z: f"{z:g} SE")
