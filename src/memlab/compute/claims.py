"""Chapter 7's claims (C40, C44).

Each ``evidence()`` computes the numbers, each ``decide(ev)`` the level.
"""

from __future__ import annotations

from dataclasses import replace

from memlab import claims
from memlab.compute.checkpointing import checkpointing_curve
from memlab.compute.experiments import checkpointing_costs_experiment, scaling_grid_run
from memlab.compute.flops import step_flops
from memlab.compute.scaling import (
    CHINCHILLA_FLOPS_QUOTED,
    CHINCHILLA_PARAMS_QUOTED,
    CHINCHILLA_SEQ_LEN_QUOTED,
    CHINCHILLA_TOKENS_QUOTED,
    PUBLISHED,
    compute_optimal,
    n_opt_exponent,
)
from memlab.model.config import get_config

_CH7 = "chapters/07_compute_for_memory"

# The step C44 is judged on: Llama-2-7B's shapes at a batch where activations dominate.
C44_STEP = dict(model="llama2-7b", batch_size=8, seq_len=4096, precision="bf16-mixed")


# C40 -------------------------------------------------------------------------------------------
# The sizes the claim is quoted for (Chinchilla's 70B, today's 7B-70B models), at the length of
# the runs behind the law (CHINCHILLA_SEQ_LEN_QUOTED, Gopher's context).
C40_MODELS = ("llama2-7b", "llama3-8b", "llama2-70b")
C40_LONG = 32768  # a long-context length, shown beside the claim's setting


def _six_nd_ratio(name: str, T: int) -> float:
    """Counted FLOPs of one sequence of T tokens over 6ND (N every parameter)."""
    cfg = get_config(name)
    # RoPE has no learned positions to run out of: the same shapes with room for T positions
    cfg = replace(cfg, max_seq_len=max(cfg.max_seq_len, T), attention="sdpa")
    # step_flops is PyTorch's counter's count (held to it in the tests)
    return step_flops(cfg, batch_size=1, seq_len=T).total / (6 * cfg.num_parameters() * T)


def c40_evidence(models=C40_MODELS, seq_len: int = CHINCHILLA_SEQ_LEN_QUOTED) -> dict:
    """A step's counted FLOPs against 6ND, and Chinchilla's fits with a refit (chapter: 7).

    The counted FLOPs of one ``seq_len``-token sequence are held to 6ND for each of ``models``
    (defaults: the claim's sizes at Chinchilla's length), and shown at :data:`C40_LONG` tokens
    beside them. It also gives the tokens per parameter each quoted fit implies at
    Chinchilla's budget, and the grid fitted here.
    """
    models = tuple(models)
    ratios = {name: _six_nd_ratio(name, seq_len) for name in models}
    longer = {name: _six_nd_ratio(name, C40_LONG) for name in models} if seq_len < C40_LONG \
        else {}
    fits = {}
    for key, law in PUBLISHED.items():
        opt = compute_optimal(law, CHINCHILLA_FLOPS_QUOTED)
        fits[key] = dict(tokens_per_param=opt.tokens_per_param, n_opt=opt.n_opt,
                         exponent=n_opt_exponent(law), label=law.label)
    g = scaling_grid_run()
    grid = dict(exponent_free=n_opt_exponent(g.fit_free),
                exponent_fixed=n_opt_exponent(g.fit_fixed),
                tokens_per_param=[o.tokens_per_param for o in g.optimal_fixed],
                entropy_in_e_interval=g.entropy_in_e_interval, scale=g.scale, device=g.device)
    return dict(seq_len=seq_len, ratios=ratios, longer=longer, long_seq_len=C40_LONG,
                fits=fits, grid=grid,
                chinchilla_ratio=CHINCHILLA_TOKENS_QUOTED / CHINCHILLA_PARAMS_QUOTED,
                within=0.1, about=(10.0, 40.0), together=(0.4, 0.6))


def _c40(ev: dict) -> claims.Verdict:
    lo, hi = ev["about"]
    refit, hoffmann = ev["fits"]["besiroglu-refit"], ev["fits"]["hoffmann-approach-3"]
    T = ev["seq_len"]
    close = {m: abs(r - 1) <= ev["within"] for m, r in ev["ratios"].items()}
    worst = max(ev["ratios"], key=lambda m: ev["ratios"][m])
    g = ev["grid"]
    text = (f"at the length of the runs behind the law ({T:,} tokens), counted FLOPs over 6ND, "
            "one sequence: " + ", ".join(f"{m} {r:.3f}" for m, r in ev["ratios"].items())
            + f". Quoted fits at Chinchilla's budget: Besiroglu et al.'s refit of Hoffmann et "
              f"al.'s data gives {refit['tokens_per_param']:.1f} tokens per parameter (N grows "
              f"as C^{refit['exponent']:.2f}); the approach-3 constants Hoffmann et al. "
              f"published imply {hoffmann['tokens_per_param']:.1f}, which the refit traces to "
              f"their fit; Chinchilla itself is {ev['chinchilla_ratio']:.0f}. The grid fitted "
              f"here ({g['scale']}, {g['device']}) grows N as C^{g['exponent_fixed']:.2f} with E "
              f"fixed to the entropy")
    if ev["longer"]:
        text += (f". Outside the claim's setting, at {ev['long_seq_len']:,} tokens, attention "
                 "takes 6ND to " + ", ".join(f"{m} {r:.2f}" for m, r in ev["longer"].items()))
    held = [m for m, ok in close.items() if ok]
    missed = [m for m, ok in close.items() if not ok]
    parts = [
        claims.Part("compute-optimal training scales parameters and data together",
                    ev["together"][0] <= refit["exponent"] <= ev["together"][1],
                    f"the refit grows N as C^{refit['exponent']:.2f}, not near C^0.5"),
        claims.Part("about 20 tokens per parameter", lo <= refit["tokens_per_param"] <= hi,
                    f"the refit gives {refit['tokens_per_param']:.1f} tokens per parameter"),
        claims.Part("training compute of about 6 x parameters x tokens", bool(held),
                    f"at {T:,} tokens the counted FLOPs are {ev['ratios'][worst]:.2f} x 6ND "
                    f"({worst}): attention's 12LCT per token is left out"),
    ]
    return claims.judge_parts(
        "", parts, text, caveat_applies=bool(held and missed),
        caveat=(f"6ND is within {ev['within']:.0%} of the counted FLOPs only for "
                f"{', '.join(held)}; for {', '.join(missed)} it is "
                + ", ".join(f"{ev['ratios'][m]:.2f} x" for m in missed)
                + " (attention is a larger share of a narrower model's step)"))


@claims.register("C40", _CH7, "Compute-optimal training scales parameters and data together "
                 "(about 20 tokens per parameter; training compute of about 6 x parameters x "
                 "tokens).", evidence=c40_evidence, moves=[
                     claims.Move("the same models trained on 32,768-token sequences "
                                 "(long-context training) instead of the law's 2,048",
                                 {"seq_len": C40_LONG}, claims.WRONG),
                     claims.Move("a 124M-parameter model (GPT-2's shapes) beside them, at the "
                                 "same length", {"models": C40_MODELS + ("gpt2",)},
                                 claims.CAVEAT)])
def c40(ev: dict) -> claims.Verdict:
    """Holds if the refit matches the quoted fits and 6ND is close to the counted FLOPs.

    The refit's tokens per parameter must be in ``about`` and its N exponent in ``together``,
    and 6ND within ``within`` of the counted FLOPs at the setting's length: for every model,
    or a caveat naming the models it misses; wrong if it misses them all or a fit part fails.
    """
    return claims.with_sensitivity(_c40, ev, "within", (0.05, 0.1, 0.25),
                                   lambda t: f"6ND within {t:.0%}")


# C44 -------------------------------------------------------------------------------------------
def c44_evidence(plan: str = "full", attention: str = "sdpa") -> dict:
    """What a checkpointing plan removes and adds for Llama-2-7B, and the plans' time (chapter: 7).

    ``plan`` checkpointing, as commonly meant every block (``full``), with ``attention`` and
    with the other implementation: saved bytes estimated (held to the trace) and FLOPs counted.
    The plans' time is measured here on the book's model.
    """
    other = "eager" if attention == "sdpa" else "sdpa"
    trades = {}
    for att in (attention, other):
        c = checkpointing_curve(C44_STEP["model"], batch_size=C44_STEP["batch_size"],
                                seq_len=C44_STEP["seq_len"], precision=C44_STEP["precision"],
                                attention=att, plans=(plan,))
        r = c.row(plan)
        trades[att] = dict(saving=c.saving(plan), flops=r.recompute_share,
                           flops_whole=r.recompute_share_whole, saved=r.saved_bytes)
    costs = checkpointing_costs_experiment()
    measured = {p.plan: dict(time=costs.time_ratio(p.plan) - 1,
                             flops=costs.flops_ratio(p.plan) - 1) for p in costs.plans}
    return dict(step=C44_STEP, plan=plan, attention=attention, trades=trades,
                measured=measured, device=costs.device, measured_model=costs.setup["model"],
                nearly_free=0.05, substantial=0.25)


def _c44(ev: dict) -> claims.Verdict:
    free, big = ev["nearly_free"], ev["substantial"]
    plan, att, s = ev["plan"], ev["attention"], ev["step"]
    own = ev["trades"][att]
    other_att = next(a for a in ev["trades"] if a != att)
    other = ev["trades"][other_att]
    m = ev["measured"].get(plan)
    text = (f"{s['model']}, batch {s['batch_size']} x {s['seq_len']}, {s['precision']}, {att} "
            f"attention: {plan} checkpointing removes {own['saving']:.1%} of the saved "
            f"activations and adds {own['flops']:.1%} to the step's FLOPs as PyTorch's counter "
            f"counts them ({own['flops_whole']:.1%} with no early stop); with {other_att} "
            f"attention it removes {other['saving']:.1%} for {other['flops']:.1%} more")
    if m is not None:
        text += (f"; measured on {ev['device']} ({ev['measured_model']}), {plan} checkpointing "
                 f"took {m['time']:+.0%} time per step for {m['flops']:+.0%} FLOPs")
    cost = (f"{plan} checkpointing recomputes, adding {own['flops']:.1%} to the step's FLOPs "
            f"({own['flops_whole']:.1%} without the early stop)"
            + (f" and {m['time']:+.0%} to its time measured here" if m is not None else ""))
    parts = [
        claims.Part("activation checkpointing saves memory", own["saving"] >= big,
                    f"{plan} checkpointing removes only {own['saving']:.1%} of the saved "
                    f"activations with {att} attention"),
        claims.Part("at no cost", own["flops"] <= free, cost),
    ]
    other_ok = other["saving"] >= big and other["flops"] <= free
    return claims.judge_parts(
        "", parts, text, caveat_applies=not other_ok,
        caveat=(f"only with {att} attention: with {other_att} the same plan removes "
                f"{other['saving']:.1%} of the saved activations for {other['flops']:.1%} "
                "more FLOPs"))


@claims.register("C44", _CH7, "Activation checkpointing saves memory at no cost.",
                 evidence=c44_evidence, moves=[
                     claims.Move("selective recomputation (the attention core only) with eager "
                                 "attention, instead of checkpointing every block with SDPA",
                                 {"plan": "selective", "attention": "eager"}, claims.CAVEAT)])
def c44(ev: dict) -> claims.Verdict:
    """Holds if the plan removes ``substantial`` of the saved activations for ``nearly_free`` FLOPs.

    The plan is checkpointing as commonly meant (every block) unless the setting names another.
    A caveat if the other attention implementation misses either; wrong if this one does.
    """
    return claims.with_sensitivity(_c44, ev, "nearly_free", (0.01, 0.05, 0.1, 0.3),
                                   lambda t: f"'no cost' read as at most {t:.0%} more FLOPs")
