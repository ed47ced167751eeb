"""Chapter 1's claims: each ``evidence(**setting)`` computes the numbers, ``decide(ev)`` the level.

Every ``evidence`` takes the claim's setting as keyword arguments (defaults: the claim's own),
and each check registers the physical changes of that setting that move its level.

The rules of thumb C02, C03 and C04 are judged by one principle. Peak training memory per
parameter is a curve in the tokens a step holds: at one sequence it sits near a floor (the
model states and the optimizer's scratch, which no batch size removes, and one sequence's
activations), and it rises with the activations. A bytes-per-parameter rule that names no batch
*holds* if it is that floor (within ``tolerance``): no step of the set-up takes less. It *holds
with a caveat* if it lies above the floor: it is then right only where a step holds a certain
number of tokens, and the caveat names that batch. Which of the two a rule is depends on the
set-up (the model's size, the sequence length): at longer sequences one sequence's activations
raise the floor to the rule, and past it. It is *wrong* if it lies below the floor, where no
training step of that set-up can be. C41, a ratio of training memories that names no batch
either, is judged at the same floor, with its caveat naming the batches where it stops holding.
"""

from __future__ import annotations

import functools

import torch

from memlab import claims
from memlab.dtypes import dtype as as_dtype
from memlab.gpus import get_gpu
from memlab.measure.peak import measure_peak
from memlab.memory.estimator import (
    batch_for_peak,
    estimate,
    largest_batch_that_fits,
)
from memlab.model.config import get_config
from memlab.model.transformer import build_model
from memlab.units import fmt_bytes

_CH1 = "chapters/01_where_the_memory_goes"
S = 2048  # tokens per sequence in every set-up below, unless a move changes it
FP32_ADAMW = dict(precision="fp32", optimizer="adamw", optimizer_impl="foreach", device="cuda")
RULE_TOLERANCE = 0.10  # a bytes-per-parameter rule "is" the floor within 10%
TOLERANCES = (0.05, 0.25, 0.5)  # alternatives printed as each rule's sensitivity
WEIGHT_FORMATS = ("fp32", "bf16", "fp16")  # the formats a model is built in below


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB ({n / 2**30:,.1f} GiB)"


def _pct(t: float) -> str:
    return f"a tolerance of {t:.0%}"


def _config(model: str, seq_len: int):
    """A preset, its context stretched to ``seq_len`` where that is longer (RoPE has no table)."""
    cfg = get_config(model)
    return cfg if seq_len <= cfg.max_seq_len else get_config(model, max_seq_len=seq_len)


# The bytes-per-parameter curve ---------------------------------------------------------------
@functools.cache
def rule_point(model: str, bytes_per_param: float, seq_len: int = S) -> dict:
    """Where a bytes-per-parameter rule sits on a model's fp32 AdamW curve (chapter: 1).

    Returns the floor (B/param at one sequence of ``seq_len``), the first batch whose peak
    reaches the rule (None if none below 2^16), and its phase and breakdown per parameter.
    """
    cfg = _config(model, seq_len)
    n = cfg.num_parameters()
    floor = estimate(cfg, batch_size=1, seq_len=seq_len, **FP32_ADAMW).peak_bytes / n
    fused = estimate(cfg, batch_size=1, seq_len=seq_len,
                     **{**FP32_ADAMW, "optimizer_impl": "fused"}).peak_bytes / n
    b = batch_for_peak(cfg, bytes_per_param * n, seq_len=seq_len, **FP32_ADAMW)
    at, phase = "", None
    if b is not None:
        e = estimate(cfg, batch_size=b, seq_len=seq_len, **FP32_ADAMW)
        phase = e.peak_phase
        at = ", ".join(f"{k.replace('_', ' ')} {v / n:.1f}" for k, v in e.breakdown().items()
                       if v / n >= 0.05) + f" B/param ({phase} phase)"
    return dict(model=cfg.name, params=n, rule=float(bytes_per_param), floor=floor,
                floor_fused=fused, batch=b, phase=phase, at_batch=at, seq_len=seq_len)


def _rule_level(p: dict, tolerance: float) -> tuple[bool, bool]:
    """(holds, caveat applies) of one rule point under the principle of this module."""
    off = p["rule"] / p["floor"] - 1
    return off >= -tolerance, off > tolerance


def _rule_words(p: dict) -> str:
    s = p.get("seq_len", S)
    where = (f"first reached at batch {p['batch']} x {s} ({p['at_batch']})" if p["batch"]
             else "not reached below batch 65,536")
    return (f"{p['model']}: {p['rule']:g} B/param against a floor of {p['floor']:.1f} "
            f"({p['floor_fused']:.1f} with fused AdamW) at batch 1 x {s}; {where}")


def _rule_part(p: dict, tol: float, says: str) -> claims.Part:
    return claims.Part(says, _rule_level(p, tol)[0],
                       f"{p['rule']:g} B/param lies below {p['model']}'s floor of "
                       f"{p['floor']:.1f} at batch 1 x {p.get('seq_len', S)}: every fp32 AdamW "
                       "step of that set-up takes more")


def _decide_rules(ev: dict, says) -> claims.Verdict:
    points, tol = ev["points"], ev["tolerance"]
    above = [p for p in points if _rule_level(p, tol)[1]]
    where = "; ".join(f"{p['model']} at batch {p['batch']} x {p.get('seq_len', S)}"
                      for p in above if p["batch"])
    return claims.judge_parts(
        "", [_rule_part(p, tol, says(p)) for p in points],
        "estimated, fp32 AdamW (foreach), CUDA conventions: "
        + "; ".join(_rule_words(p) for p in points) + ev.get("arithmetic", ""),
        caveat_applies=bool(above),
        caveat=(f"right only where a step holds that many tokens: {where}; a step with fewer "
                "takes less, down to the floor, one with more takes more"))


def _with_sensitivity(decide, ev: dict) -> claims.Verdict:
    return claims.with_sensitivity(decide, ev, "tolerance", TOLERANCES, _pct)


# C01 -------------------------------------------------------------------------------------------
def c01_evidence(model: str = "tiny", dtype: str = "fp32") -> dict:
    """Bytes per parameter measured when a model is built in ``dtype`` (chapter: 1)."""
    cfg = get_config(model)
    _, peak = measure_peak(build_model, cfg, dtype=as_dtype(dtype, WEIGHT_FORMATS), device="cpu")
    return dict(per_param=peak.end_allocated_bytes / cfg.num_parameters(), model=cfg.name,
                dtype=dtype, params=cfg.num_parameters(), buffer_tolerance=0.10)


@claims.register("C01", _CH1, "Loading one billion parameters in fp32 takes 4 GB.",
                 evidence=c01_evidence, moves=[
                     claims.Move("the weights built in bf16 instead of fp32", {"dtype": "bf16"},
                                 claims.WRONG)])
def c01(ev: dict) -> claims.Verdict:
    """Exact at 4 B/param; with a caveat when buffers add up to 10%; wrong beyond."""
    per = ev["per_param"]
    return claims.judge_parts(
        "", [claims.Part("4 bytes per parameter in fp32 (4 GB per billion)",
                         abs(per - 4) <= 4 * ev["buffer_tolerance"],
                         f"building the model in {ev['dtype']} took {per:.2f} bytes/param, "
                         f"{_gb(per * 1e9)} per billion")],
        f"measured {per:.3f} bytes/param building the {ev['params']:,}-parameter {ev['model']} "
        f"model in {ev['dtype']} (the allocator's bytes; the process's runtime is not the "
        f"claim's); arithmetic on the claim's own numbers: 10^9 x 4 bytes = {_gb(4e9)}",
        caveat_applies=per != 4.0,
        caveat=(f"the model also allocates buffers: {per:.3f} bytes/param in all, "
                f"{per / 4 - 1:.1%} over the parameters"))


# C02-C04: one principle ----------------------------------------------------------------------
def c02_evidence(models: tuple = ("llama-1b", "llama2-7b"), seq_len: int = S) -> dict:
    """The 24 B/param rule on the curves of a 1B and a 7B model, Llama-1B and Llama-2-7B (chapter: 1)."""
    n7 = get_config("llama2-7b").num_parameters()
    return dict(points=[rule_point(m, 24, seq_len) for m in models], tolerance=RULE_TOLERANCE,
                arithmetic=(f"; arithmetic on the claim's own numbers: 24 x 7e9 = 168 GB, while "
                            f"Llama-2-7B's {n7:,} parameters make {24 * n7 / 1e9:.1f} GB"))


def _c02(ev: dict) -> claims.Verdict:
    return _decide_rules(ev, lambda p: f"about 24 B/param for training {p['model']} "
                                       f"({24 * p['params'] / 1e9:.0f} GB)")


@claims.register("C02", _CH1, "Training takes about 24 bytes per parameter: 24 GB for 1B, "
                              "168 GB for 7B.", evidence=c02_evidence, moves=[
                     claims.Move("sequences of 8,192 tokens instead of 2,048 (one sequence's "
                                 "activations then raise the floor past 24)",
                                 {"seq_len": 8192}, claims.WRONG)])
def c02(ev: dict) -> claims.Verdict:
    """The 24 B/param rule judged by the module's principle, with its sensitivity."""
    return _with_sensitivity(_c02, ev)


def c03_evidence(model: str = "llama-1b", seq_len: int = S) -> dict:
    """The 20x-the-weights rule (80 B/param in fp32) on a 1B model's curve, Llama-1B (chapter: 1)."""
    return dict(points=[rule_point(model, 80, seq_len)], tolerance=RULE_TOLERANCE,
                arithmetic="; arithmetic on the claim's own numbers: 20 x 4 B = 80 B/param")


def _c03(ev: dict) -> claims.Verdict:
    return _decide_rules(ev, lambda p: f"about 20 x the fp32 weights (80 B/param) for "
                                       f"training {p['model']}")


@claims.register("C03", _CH1, "Training needs about 20 times the memory of the weights: "
                              "80 GB for a 1B model in fp32.", evidence=c03_evidence, moves=[
                     claims.Move("sequences of 16,384 tokens instead of 2,048 (one sequence's "
                                 "activations then make the floor 80 B/param)",
                                 {"seq_len": 16384}, claims.HOLDS),
                     claims.Move("sequences of 24,576 tokens instead of 2,048 (the floor "
                                 "passes 80 B/param)", {"seq_len": 24576}, claims.WRONG)])
def c03(ev: dict) -> claims.Verdict:
    """The 20x rule judged by the same principle as C02, with its sensitivity."""
    return _with_sensitivity(_c03, ev)


def c04_evidence(model: str = "llama-1b", seq_len: int = S) -> dict:
    """Both rules on one model's curve: Llama-1B, fp32 AdamW (chapter: 1)."""
    return dict(points=[rule_point(model, 24, seq_len), rule_point(model, 80, seq_len)],
                tolerance=RULE_TOLERANCE)


def _c04(ev: dict) -> claims.Verdict:
    p24, p80 = ev["points"]
    tol = ev["tolerance"]
    s = p24.get("seq_len", S)
    phases = (p24["phase"], p80["phase"])
    return claims.judge_parts(
        "", [_rule_part(p24, tol, "the 24 B/param rule is a training step's peak per parameter"),
             _rule_part(p80, tol, "the 20x rule (80 B/param) is one too")],
        f"estimated, {p24['model']} fp32 AdamW (foreach), CUDA conventions: "
        + _rule_words(p24) + "; " + _rule_words(p80)
        + f". Both are the peak per parameter of one set-up's step, at different tokens per "
        f"step (batch {p24['batch']} and {p80['batch']} x {s}), as two values of one curve must "
        f"be: the model states and the optimizer's scratch are the same {p24['floor']:.1f} "
        "B/param under both, the rest is activations",
        caveat_applies=bool(all(phases) and phases[0] != phases[1]),
        caveat=(f"the same quantity, but made of different tensors: the 24 B/param step peaks "
                f"in its {phases[0]} phase, the 80 B/param step in its {phases[1]} phase"))


@claims.register("C04", _CH1, "The 24 bytes/param rule and the 20x-the-weights rule describe "
                              "the same thing.", evidence=c04_evidence, moves=[
                     claims.Move("sequences of 8,192 tokens instead of 2,048 (24 B/param then "
                                 "lies below the floor)", {"seq_len": 8192}, claims.WRONG)])
def c04(ev: dict) -> claims.Verdict:
    """The same quantity if both rules lie on the curve; wrong if one lies below its floor."""
    return _with_sensitivity(_c04, ev)


# C05 -------------------------------------------------------------------------------------------
def c05_evidence(optimizer: str = "adamw", dtype: str = "fp32", amsgrad: bool = False,
                 working_copy: str | None = None) -> dict:
    """Adam's state bytes over the weights' bytes, measured after one step of the tiny model (chapter: 1).

    ``working_copy`` names a 16-bit copy of the weights kept beside them (the mixed precision
    of apex O2 or DeepSpeed), whose bytes are measured too.
    """
    from memlab.model.lm import measure_state
    from memlab.model.train import make_optimizer

    cfg = get_config("tiny")
    model = build_model(cfg, dtype=as_dtype(dtype, WEIGHT_FORMATS))
    params = list(model.parameters())
    if amsgrad:
        opt = torch.optim.AdamW(params, lr=1e-3, amsgrad=True)
    else:
        opt = make_optimizer(optimizer, params, lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, 16))
    model(x).float().square().mean().backward()
    opt.step()
    weights = sum(p.numel() * p.element_size() for p in params)
    copy = None
    if working_copy is not None:
        copy = sum(p.numel() * p.element_size() for p in
                   build_model(cfg, dtype=as_dtype(working_copy, WEIGHT_FORMATS)).parameters())
    return dict(optimizer=optimizer + (" (amsgrad)" if amsgrad else ""), dtype=dtype,
                params=sum(p.numel() for p in params), weights=weights,
                states=measure_state(opt, model).state_bytes, copy=copy,
                copy_dtype=working_copy, tolerance=0.01)


@claims.register("C05", _CH1, "Adam's optimizer states take twice the memory of the weights.",
                 evidence=c05_evidence, moves=[
                     claims.Move("bitsandbytes' 8-bit AdamW instead of torch's AdamW",
                                 {"optimizer": "adamw-8bit"}, claims.WRONG),
                     claims.Move("AdamW with amsgrad=True (a third state: the running maximum "
                                 "of the second moment)", {"amsgrad": True}, claims.WRONG),
                     claims.Move("mixed precision that keeps a bf16 working copy beside the "
                                 "fp32 weights Adam updates", {"working_copy": "bf16"},
                                 claims.CAVEAT)])
def c05(ev: dict) -> claims.Verdict:
    """Holds if the states are twice the weights Adam updates; caveat beside a 16-bit working copy."""
    ratio, tol = ev["states"] / ev["weights"], ev["tolerance"]
    copy = ev["copy"] / 1.0 if ev["copy"] else None
    beside = (f"; a {ev['copy_dtype']} working copy of {fmt_bytes(ev['copy'])} beside them: "
              f"the states are {ev['states'] / copy:.2f}x that copy" if copy else "")
    return claims.judge_parts(
        "", [claims.Part("Adam's states take twice the weights' memory", abs(ratio / 2 - 1) <= tol,
                         f"{ev['optimizer']}'s states take {ratio:.2f}x the {ev['dtype']} weights")],
        f"measured after one step of {ev['optimizer']} on the {ev['params']:,}-parameter tiny "
        f"model in {ev['dtype']}: states {fmt_bytes(ev['states'])} (two moments and a step "
        f"counter per tensor), weights {fmt_bytes(ev['weights'])}: {ratio:.3f}x{beside}. "
        "torch's Adam allocates each moment like its parameter, so the ratio is 2 in every "
        f"dtype the weights have; 'twice' taken as within {tol:.0%}",
        caveat_applies=bool(copy) and abs(ev["states"] / copy / 2 - 1) > tol,
        caveat=("twice the weights Adam updates; the model computes with a 16-bit copy of them, "
                f"and the states are {ev['states'] / copy:.1f}x that copy" if copy else ""))


# C39 -------------------------------------------------------------------------------------------
def c39_evidence(model: str = "llama-1b", gpu: str = "A100-80GB", seq_len: int = S) -> dict:
    """A model's fp32 AdamW peak at batch 1 on a GPU, and the largest batch that fits (chapter: 1)."""
    cfg, card = _config(model, seq_len), get_gpu(gpu)
    max_batch = largest_batch_that_fits(cfg, card.usable_bytes, seq_len=seq_len, **FP32_ADAMW)
    return dict(model=cfg.name, params=cfg.num_parameters(), gpu=card.name, seq_len=seq_len,
                peak_1=estimate(cfg, batch_size=1, seq_len=seq_len, **FP32_ADAMW).peak_bytes,
                usable=card.usable_bytes, total=card.total_bytes, max_batch=max_batch,
                peak_max=estimate(cfg, batch_size=max(max_batch, 1), seq_len=seq_len,
                                  **FP32_ADAMW).peak_bytes,
                close=0.05)


@claims.register("C39", _CH1, "An 80 GB A100 cannot train a 1B model in fp32 without memory "
                              "optimizations.", evidence=c39_evidence, moves=[
                     claims.Move("a 7B model (Llama-2-7B) instead of 1B", {"model": "llama2-7b"},
                                 claims.HOLDS)])
def c39(ev: dict) -> claims.Verdict:
    """Holds if batch 1 does not fit the usable memory; with a caveat within 5% of it; wrong below."""
    spare, s = 1 - ev["peak_1"] / ev["usable"], ev["seq_len"]
    fits = (f"the largest batch that fits is {ev['max_batch']} x {s}, with "
            f"{1 - ev['peak_max'] / ev['usable']:.1%} to spare" if ev["max_batch"]
            else "no batch fits")
    return claims.judge_parts(
        "", [claims.Part(f"an {ev['gpu']} cannot train {ev['model']} in fp32 without memory "
                         "optimizations", spare < ev["close"],
                         f"it fits with {spare:.0%} to spare at batch 1 and up to batch "
                         f"{ev['max_batch']} x {s}; larger batches need checkpointing or "
                         "accumulation")],
        f"estimated with CUDA conventions (the chapter's trace follows CPU conventions), "
        f"{ev['model']} ({ev['params'] / 1e9:.1f}B parameters) fp32 AdamW at batch 1 x {s}: "
        f"peak {fmt_bytes(ev['peak_1'])} of {fmt_bytes(ev['usable'])} usable (nvidia-smi's "
        f"{fmt_bytes(ev['total'])} minus the stated reserve): {spare:.0%} to spare; {fits}",
        caveat_applies=spare >= 0,
        caveat=f"batch 1 fits with less than {ev['close']:.0%} to spare: too close to call "
               "before the allocator's fragmentation")


# C41 -------------------------------------------------------------------------------------------
def _llama_with(params: float):
    """Llama-2-70B's shape with the layer count that comes nearest ``params``."""
    big = get_config("llama2-70b")
    per_layer = (big.num_parameters() - get_config("llama2-70b", n_layer=1).num_parameters()) / (
        big.n_layer - 1)
    layers = max(1, round((params - (big.num_parameters() - big.n_layer * per_layer))
                          / per_layer))
    if layers == big.n_layer:
        return big
    return get_config("llama2-70b", n_layer=layers, name=f"llama2-70b-{layers}L")


def c41_evidence(sizes: tuple = (50e9, 70e9, 100e9), base: str = "llama-1b",
                 batches: tuple = (1, 8), seq_len: int = S) -> dict:
    """Training peaks of Llama shapes of ``sizes`` parameters over a 1B model's, bf16-mixed (chapter: 1).

    At each batch of ``batches`` x ``seq_len`` for both; the first batch is the floor.
    """
    one = _config(base, seq_len)
    ratios = {}
    for b in batches:
        kw = dict(batch_size=b, seq_len=seq_len, precision="bf16-mixed", optimizer="adamw")
        low = estimate(one, **kw).peak_bytes
        ratios[b] = {cfg.num_parameters(): estimate(cfg, **kw).peak_bytes / low
                     for cfg in map(_llama_with, sizes)}
    return dict(ratios=ratios, base=one.name, base_params=one.num_parameters(),
                seq_len=seq_len, claimed=500.0, tolerance=0.25)


@claims.register("C41", _CH1, "Models of 50 to 100 billion parameters need up to 500 times "
                              "more memory than a 1B model.", evidence=c41_evidence, moves=[
                     claims.Move("models of 300 to 500 billion parameters instead of 50 to 100",
                                 {"sizes": (300e9, 500e9)}, claims.CAVEAT)])
def c41(ev: dict) -> claims.Verdict:
    """Holds if the largest ratio at the floor is within 25% of 500; caveat if a larger batch falls out."""
    return claims.with_sensitivity(_c41, ev, "tolerance", (0.1, 0.25, 0.5, 1.0, 5.0), _pct)


def _c41(ev: dict) -> claims.Verdict:
    (b0, floor), *others = ev["ratios"].items()
    tol, claimed, s = ev["tolerance"], ev["claimed"], ev["seq_len"]

    def near(r: dict) -> bool:
        return abs(claimed / max(r.values()) - 1) <= tol

    def span(r: dict) -> str:
        return " / ".join(f"{x:.0f}x at {n / 1e9:.0f}B" for n, x in r.items())

    off = claimed / max(floor.values())
    out = [b for b, r in others if not near(r)]
    return claims.judge_parts(
        "", [claims.Part(f"up to {claimed:.0f}x the memory of a 1B model", near(floor),
                         f"{min(floor.values()):.0f}x to {max(floor.values()):.0f}x over the "
                         f"claim's own range: the memory grows with the parameter count, and "
                         f"{claimed:.0f}x is {max(off, 1 / off):.1f} times too "
                         + ("high" if off > 1 else "low"))],
        f"estimated training peak over {ev['base']}'s ({ev['base_params'] / 1e9:.1f}B "
        f"parameters), bf16-mixed AdamW, at batch {b0} x {s}: {span(floor)} (parameters "
        + " / ".join(f"{n / ev['base_params']:.0f}x" for n in floor) + "); "
        + "; ".join(f"at batch {b} x {s}: {span(r)}" for b, r in others),
        caveat_applies=bool(out),
        caveat=(f"right where a step holds one sequence; at batch {', '.join(map(str, out))} x "
                f"{s} the ratio falls to "
                + ", ".join(f"{max(r.values()):.0f}x" for b, r in others if b in out)
                + ": activations grow with the tokens, and less than in proportion to the "
                "parameters"))
