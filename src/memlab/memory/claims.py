"""Chapter 1's claims: each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.

The rules of thumb C02, C03 and C04 are judged by one principle. Peak training memory per
parameter is a curve in the tokens a step holds: at one sequence it sits near a floor (the
model states and the optimizer's scratch, which no batch size removes), and it rises with
the activations. A bytes-per-parameter rule that names no batch *holds* if it is that floor
(within ``tolerance``): then it is right at every batch. It *holds with a caveat* if it lies
above the floor: it is then right at one point of the curve, which the verdict names. It is
*wrong* if it lies below the floor, where no training step of that set-up can be.
"""

from __future__ import annotations

import functools

from memlab import claims
from memlab.gpus import get_gpu
from memlab.measure.peak import measure_peak
from memlab.memory.estimator import (
    batch_for_peak,
    estimate,
    largest_batch_that_fits,
    optimizer_state_bytes,
)
from memlab.model.config import get_config
from memlab.model.transformer import build_model
from memlab.units import fmt_bytes

_CH1 = "chapters/01_where_the_memory_goes"
S = 2048  # tokens per sequence in every set-up below
FP32_ADAMW = dict(precision="fp32", optimizer="adamw", optimizer_impl="foreach", device="cuda")
RULE_TOLERANCE = 0.10  # a bytes-per-parameter rule "is" the floor within 10%
TOLERANCES = (0.05, 0.25, 0.5)  # alternatives printed as each rule's sensitivity


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB ({n / 2**30:,.1f} GiB)"


def _pct(t: float) -> str:
    return f"a tolerance of {t:.0%}"


# The bytes-per-parameter curve ---------------------------------------------------------------
@functools.cache
def rule_point(model: str, bytes_per_param: float) -> dict:
    """Where a bytes-per-parameter rule sits on a model's fp32 AdamW curve at sequence 2048 (chapter: 1).

    Returns the floor (B/param at one sequence), the first batch whose peak reaches the rule
    (None if none below 2^16), and the breakdown per parameter at that batch.
    """
    cfg = get_config(model)
    n = cfg.num_parameters()
    floor = estimate(cfg, batch_size=1, seq_len=S, **FP32_ADAMW).peak_bytes / n
    fused = estimate(cfg, batch_size=1, seq_len=S, **{**FP32_ADAMW,
                                                      "optimizer_impl": "fused"}).peak_bytes / n
    b = batch_for_peak(cfg, bytes_per_param * n, seq_len=S, **FP32_ADAMW)
    at = ""
    if b is not None:
        e = estimate(cfg, batch_size=b, seq_len=S, **FP32_ADAMW)
        at = ", ".join(f"{k.replace('_', ' ')} {v / n:.1f}" for k, v in e.breakdown().items()
                       if v / n >= 0.05) + f" B/param ({e.peak_phase} phase)"
    return dict(model=cfg.name, params=n, rule=float(bytes_per_param), floor=floor,
                floor_fused=fused, batch=b, at_batch=at)


def _rule_level(p: dict, tolerance: float) -> tuple[bool, bool]:
    """(holds, caveat applies) of one rule point under the principle of this module."""
    off = p["rule"] / p["floor"] - 1
    return off >= -tolerance, off > tolerance


def _rule_words(p: dict) -> str:
    where = (f"first reached at batch {p['batch']} x {S} ({p['at_batch']})" if p["batch"]
             else "not reached below batch 65,536")
    return (f"{p['model']}: {p['rule']:g} B/param against a floor of {p['floor']:.1f} "
            f"({p['floor_fused']:.1f} with fused AdamW) at batch 1 x {S}; {where}")


def _decide_rules(statement: str, ev: dict, correction: str) -> claims.Verdict:
    points, tol = ev["points"], ev["tolerance"]
    levels = [_rule_level(p, tol) for p in points]
    holds = all(h for h, _ in levels)
    above = any(c for _, c in levels)
    where = "; ".join(f"{p['model']} at batch {p['batch']} x {S}" for p in points if p["batch"])
    return claims.judge(
        statement, holds,
        "estimated, fp32 AdamW (foreach), CUDA conventions: "
        + "; ".join(_rule_words(p) for p in points) + ev.get("arithmetic", ""),
        caveat_applies=above,
        caveat=(f"a rule that names no batch is right at one batch only: {where}; it counts "
                "activations for that many tokens on top of the floor"),
        correction=correction)


def _with_sensitivity(decide, ev: dict) -> claims.Verdict:
    return claims.with_sensitivity(decide, ev, "tolerance", TOLERANCES, _pct)


# C01 -------------------------------------------------------------------------------------------
def c01_evidence() -> dict:
    """Bytes per parameter measured when the tiny model is built in fp32 (chapter: 1)."""
    cfg = get_config("tiny")
    _, peak = measure_peak(build_model, cfg, device="cpu")
    return dict(per_param=peak.end_allocated_bytes / cfg.num_parameters(),
                params=cfg.num_parameters(), buffer_tolerance=0.10)


@claims.register("C01", _CH1, "Loading one billion parameters in fp32 takes 4 GB.",
                 evidence=c01_evidence)
def c01(ev: dict) -> claims.Verdict:
    """Exact at 4 B/param; with a caveat when buffers add up to 10%; wrong beyond."""
    per = ev["per_param"]
    return claims.judge(
        "", abs(per - 4) <= 4 * ev["buffer_tolerance"],
        f"measured {per:.3f} bytes/param building a {ev['params']:,}-parameter model in fp32; "
        f"arithmetic on the claim's own numbers: 10^9 x 4 bytes = {_gb(4e9)}",
        caveat_applies=per != 4.0,
        caveat=(f"the model also allocates buffers: {per:.3f} bytes/param in all, "
                f"{per / 4 - 1:.1%} over the parameters"),
        correction=f"building the model took {per:.2f} bytes/param, not 4")


# C02-C04: one principle ----------------------------------------------------------------------
def c02_evidence() -> dict:
    """The 24 B/param rule on Llama-1B and Llama-2-7B's curves (chapter: 1)."""
    n7 = get_config("llama2-7b").num_parameters()
    return dict(points=[rule_point("llama-1b", 24), rule_point("llama2-7b", 24)],
                tolerance=RULE_TOLERANCE,
                arithmetic=(f"; arithmetic on the claim's own numbers: 24 x 7e9 = 168 GB, while "
                            f"Llama-2-7B's {n7:,} parameters make {24 * n7 / 1e9:.1f} GB"))


def _c02(ev: dict) -> claims.Verdict:
    lo = min(p["floor"] for p in ev["points"])
    return _decide_rules("", ev, correction=f"24 B/param is below the floor of {lo:.1f}: "
                                             "every fp32 AdamW step takes more")


@claims.register("C02", _CH1, "Training takes about 24 bytes per parameter: 24 GB for 1B, "
                              "168 GB for 7B.", evidence=c02_evidence)
def c02(ev: dict) -> claims.Verdict:
    """The 24 B/param rule judged by the module's principle, with its sensitivity."""
    return _with_sensitivity(_c02, ev)


def c03_evidence() -> dict:
    """The 20x-the-weights rule (80 B/param in fp32) on Llama-1B's curve (chapter: 1)."""
    return dict(points=[rule_point("llama-1b", 80)], tolerance=RULE_TOLERANCE,
                arithmetic="; arithmetic on the claim's own numbers: 20 x 4 B = 80 B/param")


def _c03(ev: dict) -> claims.Verdict:
    return _decide_rules("", ev, correction=f"80 B/param is below the floor of "
                                             f"{ev['points'][0]['floor']:.1f}")


@claims.register("C03", _CH1, "Training needs about 20 times the memory of the weights: "
                              "80 GB for a 1B model in fp32.", evidence=c03_evidence)
def c03(ev: dict) -> claims.Verdict:
    """The 20x rule judged by the same principle as C02, with its sensitivity."""
    return _with_sensitivity(_c03, ev)


def c04_evidence() -> dict:
    """Both rules on one model's curve: Llama-1B, fp32 AdamW (chapter: 1)."""
    return dict(points=[rule_point("llama-1b", 24), rule_point("llama-1b", 80)],
                tolerance=RULE_TOLERANCE)


def _c04(ev: dict) -> claims.Verdict:
    p24, p80 = ev["points"]
    tol = ev["tolerance"]
    (h24, above24), (h80, above80) = _rule_level(p24, tol), _rule_level(p80, tol)
    same_point = p24["batch"] is not None and p24["batch"] == p80["batch"]
    return claims.judge(
        "", h24 and h80,
        "estimated, Llama-1B fp32 AdamW (foreach), CUDA conventions: " + _rule_words(p24)
        + "; " + _rule_words(p80),
        caveat_applies=(above24 or above80) and not same_point,
        caveat=(f"they describe the same quantity, the peak per parameter on one curve, but "
                f"at different batches: 24 B/param at batch {p24['batch']} and 80 at batch "
                f"{p80['batch']} x {S}; the model states and the optimizer's scratch are the "
                f"same {p24['floor']:.1f} B/param in both, the rest is activations"),
        correction="one of the two lies below the floor, so it cannot be the same quantity")


@claims.register("C04", _CH1, "The 24 bytes/param rule and the 20x-the-weights rule describe "
                              "the same thing.", evidence=c04_evidence)
def c04(ev: dict) -> claims.Verdict:
    """Same quantity if both rules lie on the curve; the same point only at one batch."""
    return _with_sensitivity(_c04, ev)


# C05 -------------------------------------------------------------------------------------------
def c05_evidence() -> dict:
    """Adam's state bytes over weight bytes in four set-ups, Llama-2-7B (chapter: 1)."""
    cfg = get_config("llama2-7b")
    n = cfg.num_parameters()
    return dict(same_dtype={
        "fp32 AdamW": optimizer_state_bytes(cfg, "fp32", "adamw") / (4 * n),
        "pure bf16 AdamW": optimizer_state_bytes(cfg, "bf16", "adamw") / (2 * n)},
        other={
        "8-bit AdamW, vs fp32 weights": optimizer_state_bytes(cfg, "fp32", "adamw-8bit")
        / (4 * n),
        "fp32 AdamW, vs a bf16 weight copy": optimizer_state_bytes(cfg, "fp32", "adamw")
        / (2 * n)})


@claims.register("C05", _CH1, "Adam's optimizer states take twice the memory of the weights.",
                 evidence=c05_evidence)
def c05(ev: dict) -> claims.Verdict:
    """Holds where the moments share the weights' dtype; the caveat if other set-ups differ."""
    two = {k: abs(v - 2) < 0.01 for d in (ev["same_dtype"], ev["other"]) for k, v in d.items()}
    differ = [k for k in ev["other"] if not two[k]]
    return claims.judge(
        "", all(two[k] for k in ev["same_dtype"]),
        "computed, states / weights: " + "; ".join(
            f"{k} {v:.2f}x" for d in (ev["same_dtype"], ev["other"]) for k, v in d.items()),
        caveat_applies=bool(differ),
        caveat=f"when the moments have the weights' dtype; not for: {', '.join(differ)}",
        correction="even with moments in the weights' dtype the ratio is not 2")


# C39 -------------------------------------------------------------------------------------------
def c39_evidence() -> dict:
    """Llama-1B fp32 AdamW on an A100-80GB: peak at batch 1 and the largest batch that fits (chapter: 1)."""
    cfg, a100 = get_config("llama-1b"), get_gpu("A100-80GB")
    max_batch = largest_batch_that_fits(cfg, a100.usable_bytes, seq_len=S, **FP32_ADAMW)
    return dict(peak_1=estimate(cfg, batch_size=1, seq_len=S, **FP32_ADAMW).peak_bytes,
                usable=a100.usable_bytes, total=a100.total_bytes, max_batch=max_batch,
                peak_max=estimate(cfg, batch_size=max(max_batch, 1), seq_len=S,
                                  **FP32_ADAMW).peak_bytes,
                close=0.05)


@claims.register("C39", _CH1, "An 80 GB A100 cannot train a 1B model in fp32 without memory "
                              "optimizations.", evidence=c39_evidence)
def c39(ev: dict) -> claims.Verdict:
    """Holds if batch 1 does not fit the usable memory; with a caveat within 5% of it; wrong below."""
    spare = 1 - ev["peak_1"] / ev["usable"]
    return claims.judge(
        "", spare < ev["close"],
        f"estimated with CUDA conventions (the chapter's trace follows CPU conventions), "
        f"Llama-1B fp32 AdamW at batch 1 x {S}: peak {fmt_bytes(ev['peak_1'])} of "
        f"{fmt_bytes(ev['usable'])} usable (nvidia-smi's {fmt_bytes(ev['total'])} minus the "
        f"stated reserve): {spare:.0%} to spare; the largest batch that fits is "
        f"{ev['max_batch']} x {S}, with {1 - ev['peak_max'] / ev['usable']:.1%} to spare",
        caveat_applies=spare >= 0,
        caveat=f"batch 1 fits with less than {ev['close']:.0%} to spare: too close to call "
               "before the allocator's fragmentation",
        correction=f"it fits with {spare:.0%} to spare at batch 1 and up to batch "
                   f"{ev['max_batch']} x {S}; larger batches need checkpointing or "
                   "accumulation")


# C41 -------------------------------------------------------------------------------------------
def _llama_with(params: float):
    """Llama-2-70B's shape with the layer count that comes nearest ``params``."""
    big = get_config("llama2-70b")
    per_layer = (big.num_parameters() - get_config("llama2-70b", n_layer=1).num_parameters()) / (
        big.n_layer - 1)
    layers = max(1, round((params - (big.num_parameters() - big.n_layer * per_layer))
                          / per_layer))
    return get_config("llama2-70b", n_layer=layers, name=f"llama2-70b-{layers}L")


def c41_evidence() -> dict:
    """Training peaks of 50B, 70B and 100B Llama shapes over Llama-1B's, bf16-mixed AdamW (chapter: 1)."""
    kw = dict(batch_size=1, seq_len=S, precision="bf16-mixed", optimizer="adamw")
    one = get_config("llama-1b")
    base = estimate(one, **kw).peak_bytes
    ratios = {}
    for cfg in (_llama_with(50e9), get_config("llama2-70b"), _llama_with(100e9)):
        ratios[cfg.num_parameters()] = estimate(cfg, **kw).peak_bytes / base
    return dict(ratios=ratios, base_params=one.num_parameters(), claimed=500.0,
                factor=2.0)


@claims.register("C41", _CH1, "Models of 50 to 100 billion parameters need up to 500 times "
                              "more memory than a 1B model.", evidence=c41_evidence)
def c41(ev: dict) -> claims.Verdict:
    """Holds if the largest ratio is within 25% of 500; caveat within a factor ``factor``; wrong beyond."""
    top = max(ev["ratios"].values())
    off = ev["claimed"] / top
    span = " / ".join(f"{r:.0f}x at {n / 1e9:.0f}B" for n, r in ev["ratios"].items())
    params = " / ".join(f"{n / ev['base_params']:.0f}x" for n in ev["ratios"])
    return claims.judge(
        "", off <= ev["factor"] and 1 / off <= ev["factor"],
        f"estimated training peak over Llama-1B's, bf16-mixed AdamW, batch 1 x {S}: {span} "
        f"(parameters {params})",
        caveat_applies=not 0.8 <= off <= 1.25,
        caveat=f"the right order, but the largest ratio is {top:.0f}x, not {ev['claimed']:.0f}x",
        correction=(f"{min(ev['ratios'].values()):.0f}x to {top:.0f}x over the claim's own "
                    "range of 50B to 100B parameters: the memory grows with the parameter "
                    f"count, and {ev['claimed']:.0f}x is {off:.1f} times too high"),
        sensitivity=(f"a factor of {ev['factor']:g} allowed here; would be "
                     f"{claims.CAVEAT} with a factor of {off:.1f} or more"))
