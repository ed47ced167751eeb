"""Every claim's level moves with real evidence, and every level is reachable.

Two kinds of test. The *moves*: each check declares physical changes of its setting (another
size, another implementation) and the level its real evidence then gives; here
``decide(evidence(**setting))`` must give that level, and it must differ from the claim's own.
The *cases*: each check's ``decide`` is fed its real evidence changed by hand so that the claim
comes out at each level, which shows where the thresholds sit.

The real evidence of the claims that train a model (C14, C16-C19) is computed once per process;
those are slow.
"""

from __future__ import annotations

import copy

import pytest

from memlab.book import import_rooms
from memlab.claims import CAVEAT, CHECKS, HOLDS, JUDGED, NOT_JUDGED, WRONG, verdicts

import_rooms("claims")  # every part's checks registered


def _pt(ev, i=0, **kw):
    ev = copy.deepcopy(ev)
    ev["points"][i].update(kw)
    return ev


def _set(ev, path, value):
    ev = copy.deepcopy(ev)
    d = ev
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    return ev


def _c23_lora_backward(ev, factor):
    """Every LoRA row's backward at ``factor`` times full fine-tuning's."""
    ev = copy.deepcopy(ev)
    full = ev["rows"]["full"]
    for name, r in ev["rows"].items():
        if name.startswith("LoRA"):
            r["backward"] = int(factor * full["backward"])
    return ev


def _c23_freezing_saves_nothing(ev):
    """Freezing alone (no adapters) with a backward as long as full fine-tuning's."""
    ev = copy.deepcopy(ev)
    for name, r in ev["rows"].items():
        if name != "full" and not r["adapters"]:
            r["backward"] = ev["rows"]["full"]["backward"]
    return ev


def _c26_peaks(ev, int8, int8_ckpt):
    """The int8 peaks at the judged length, as multiples of the usable bytes."""
    ev = copy.deepcopy(ev)
    peaks = ev["peaks"][ev["seq_len"]]
    peaks["int8"] = int(int8 * ev["usable"])
    peaks["int8 + checkpointing"] = int(int8_ckpt * ev["usable"])
    return ev


def _c44_flops(ev, flops, attentions=None):
    """Chapter 7: the judged plan adding ``flops`` of the step with these attentions (all)."""
    ev = copy.deepcopy(ev)
    for att, trade in ev["trades"].items():
        if attentions is None or att in attentions:
            trade["flops"] = flops
    return ev


def _runs(ev, strategy, **kw):
    """Chapter 6: set fields of one strategy's run in the evidence."""
    ev = copy.deepcopy(ev)
    ev["runs"][strategy].update(kw)
    return ev


def _rec(ev, strategy, **kw):
    """C35: set fields of one strategy in the recorded GPU run."""
    ev = copy.deepcopy(ev)
    ev["recorded"][strategy].update(kw)
    return ev


def _rule_cases(n_points):
    """C02/C03/C04: move each rule relative to its floor."""
    def at(ev, factor):
        ev = copy.deepcopy(ev)
        for p in ev["points"]:
            p["rule"] = p["floor"] * factor
        return ev
    return {HOLDS: lambda ev: at(ev, 1.02), CAVEAT: lambda ev: at(ev, 3.0),
            WRONG: lambda ev: at(ev, 0.5)}


def _c04_caveat(ev):  # the two points peak in different phases: made of different tensors
    ev = copy.deepcopy(ev)
    ev["points"][1]["phase"] = "optimizer" if ev["points"][0]["phase"] != "optimizer" else "forward"
    return ev


def _c41_ratios(at_floor, above):
    """C41: the largest ratio at the first batch and at the others."""
    def f(ev):
        ev = copy.deepcopy(ev)
        for i, r in enumerate(ev["ratios"].values()):
            for n in r:
                r[n] = at_floor if i == 0 else above
        return ev
    return f


def _c20_flops(*exponents):
    """C20: counted flash FLOPs growing as T**k over each doubling from T = 512."""
    def f(ev):
        counts, T, c = {512: 1.0e6}, 512, 1.0e6
        for k in exponents:
            c, T = c * 2**k, 2 * T
            counts[T] = c
        return {**ev, "flash_flops": counts}
    return f


def _c22_cache(ev, cache_times_group):
    """C22: every shared variant's KV cache at ``cache_times_group`` / group of MHA's."""
    ev = copy.deepcopy(ev)
    for r in ev["rows"].values():
        r["cache"] = min(1.0, cache_times_group / r["group"])
    return ev


def _c27_times(eager_ms, compiled_ms, compile_s=None):
    """C27: quiet paired samples at these step times (and compile time)."""
    def f(ev):
        ev = {**ev, "samples": ([eager_ms] * 9, [compiled_ms] * 9)}
        return ev if compile_s is None else {**ev, "compile_s": compile_s}
    return f


def _c43_timed(ratios):
    by_tokens = dict(zip((1, 16, 2048), ratios, strict=True))

    def f(ev):
        return {**ev, "label": "recorded on a test GPU",
                "timed": {"int8": by_tokens, "llm-int8": by_tokens}}
    return f


def _rows(ev, keep):
    return {**ev, "rows": [r for r in ev["rows"] if keep(r)]}


def _c46_all(ev, cut, ratio):
    ev = copy.deepcopy(ev)
    for c in ev["cases"]:
        c["cut"] = cut
    for f in ev["fits"]:
        f["ratio"] = ratio
    return ev


def _c47_larger(ev, checkpointing, larger):
    ev = copy.deepcopy(ev)
    for r in ev["rows"]:
        if r["checkpointing"] == checkpointing:
            r["larger"] = larger
    return ev


CASES = {
    "C01": {HOLDS: lambda ev: {**ev, "per_param": 4.0}, CAVEAT: lambda ev: {**ev, "per_param": 4.2},
            WRONG: lambda ev: {**ev, "per_param": 8.0}},
    "C02": _rule_cases(2),
    "C03": _rule_cases(1),
    "C04": {HOLDS: lambda ev: ev, CAVEAT: _c04_caveat,
            WRONG: lambda ev: _pt(ev, 0, rule=ev["points"][0]["floor"] * 0.5)},
    "C05": {HOLDS: lambda ev: ev,
            CAVEAT: lambda ev: {**ev, "copy": ev["weights"] // 2, "copy_dtype": "bf16"},
            WRONG: lambda ev: {**ev, "states": 3 * ev["weights"]}},
    "C06": {HOLDS: lambda ev: ev,
            CAVEAT: lambda ev: {**ev, "int8_with_scales": 1.5},
            WRONG: lambda ev: _set(ev, ("per", "bf16"), 4)},
    "C07": {HOLDS: lambda ev: {**ev, "source_max_converted": 3.3e38, "overflow_from": None,
                               "overflow_count": 0},
            WRONG: lambda ev: ev},
    "C08": {HOLDS: lambda ev: ev, WRONG: lambda ev: {**ev, "stored": 3.14}},
    "C09": {HOLDS: lambda ev: ev, WRONG: lambda ev: {**ev, "min_normal": 1e-45}},
    "C10": {HOLDS: lambda ev: {**ev, "bf16": 3.0}, WRONG: lambda ev: ev},
    "C11": {HOLDS: lambda ev: {**ev, "absmax": {k: 3.0 for k in ev["absmax"]}},
            CAVEAT: lambda ev: ev,
            WRONG: lambda ev: {**ev, "cast": 4, "rounded": 4}},
    "C12": {HOLDS: lambda ev: ev, WRONG: lambda ev: {**ev, "type_range": (-127, 127)}},
    "C13": {HOLDS: lambda ev: ev, WRONG: lambda ev: _set(ev, ("gpus", "T4"), (7.5, True))},
    "C14": {HOLDS: lambda ev: {**ev, "delta": {m: -1.0 for m in ev["delta"]},
                               "speed": {"label": "recorded on a test GPU",
                                         "speedup": {m: 2.0 for m in ev["delta"]}}},
            WRONG: lambda ev: {**ev, "delta": {m: 1.0 for m in ev["delta"]}},
            NOT_JUDGED: lambda ev: {**ev, "delta": {m: -1.0 for m in ev["delta"]}, "speed": None}},
    "C15": {HOLDS: lambda ev: {**ev, "stored": {**ev["stored"], **ev["naive"]},
                               "default": {**ev["default"], **ev["naive"]}},
            CAVEAT: lambda ev: {**ev, "stored": {**ev["stored"], **ev["naive"]}},
            WRONG: lambda ev: ev},
    "C16": {HOLDS: lambda ev: {**ev, "model_bits": 4.0, "checkpoint_bits": 4.0},
            CAVEAT: lambda ev: {**ev, "model_bits": 4.0, "checkpoint_bits": 4.5},
            WRONG: lambda ev: {**ev, "model_bits": 5.0}},
    "C17": {HOLDS: lambda ev: {**ev, "delta": {k: 1.0 for k in ev["delta"]}},
            CAVEAT: lambda ev: {**ev, "delta": {k: (1.0 if i else 0.0)
                                                for i, k in enumerate(ev["delta"])}},
            WRONG: lambda ev: {**ev, "delta": {k: 0.0 for k in ev["delta"]}}},
    "C18": {HOLDS: lambda ev: {**ev, "excess": {"fp32": 0.0, "int8": 1.0, "llm-int8": 0.0}},
            CAVEAT: lambda ev: {**ev, "excess": {"fp32": 0.0, "int8": 0.0, "llm-int8": 0.0},
                                "layer_error": {"int8": 1.0, "llm-int8": 0.1}},
            WRONG: lambda ev: {**ev, "excess": {"fp32": 0.0, "int8": 1.0, "llm-int8": 1.0}}},
    "C19": {HOLDS: lambda ev: {**ev, "trained_scale": True, "change": 1.0,
                               "layers": {"attn.q_proj": 0.5}},
            CAVEAT: lambda ev: {**ev, "trained_scale": True, "change": 1.0,
                                "layers": {"attn.q_proj": 0.5, "mlp.up_proj": 0.0}},
            WRONG: lambda ev: ev},
    "C39": {HOLDS: lambda ev: {**ev, "peak_1": ev["usable"] * 2},
            CAVEAT: lambda ev: {**ev, "peak_1": ev["usable"] * 0.98},
            WRONG: lambda ev: ev},
    "C41": {HOLDS: _c41_ratios(500.0, 500.0), CAVEAT: _c41_ratios(500.0, 300.0),
            WRONG: lambda ev: ev},
    "C42": {HOLDS: lambda ev: {**ev, "peaks": {b: {**p, "bf16-mixed": p["fp32"] // 2}
                                               for b, p in ev["peaks"].items()}},
            CAVEAT: lambda ev: {**ev, "peaks": {b: {**p, "bf16-mixed": p["fp32"] // (2 if b > 4
                                                                                     else 1)}
                                                for b, p in ev["peaks"].items()}},
            WRONG: lambda ev: ev},
    "C20": {HOLDS: _c20_flops(1.05, 1.02), CAVEAT: _c20_flops(1.8, 1.05),
            WRONG: lambda ev: ev},
    "C21": {HOLDS: lambda ev: {**ev, "memory": {2048: 12.0, 4096: 18.0},
                               "speed": {"label": "recorded on a GPU", "ratios": {2048: 3.0}}},
            CAVEAT: lambda ev: {**ev, "memory": {2048: 12.0, 4096: 18.0},
                                "speed": {"label": "recorded on a GPU",
                                          "ratios": {1024: 1.1, 2048: 3.0}}},
            WRONG: lambda ev: {**ev, "memory": {T: 2.0 for T in ev["memory"]}},
            NOT_JUDGED: lambda ev: {**ev, "speed": None}},
    "C22": {HOLDS: lambda ev: ev, CAVEAT: lambda ev: _c22_cache(ev, 1.5),
            WRONG: lambda ev: _c22_cache(ev, 1e9)},
    "C27": {HOLDS: _c27_times(10.0, 5.0, compile_s=0.5),
            CAVEAT: _c27_times(10.0, 9.0),
            WRONG: _c27_times(10.0, 20.0),
            NOT_JUDGED: lambda ev: {**ev, "record": None}},
    "C23": {HOLDS: lambda ev: _c23_lora_backward(ev, 0.1),
            CAVEAT: lambda ev: _c23_lora_backward(ev, 3.0),
            WRONG: _c23_freezing_saves_nothing},
    "C24": {HOLDS: lambda ev: {**ev, "ratio": {T: 0.3 for T in ev["ratio"]}},
            CAVEAT: lambda ev: {**ev, "ratio": {T: 0.3 if min(ev["ratio"]) == T else 0.8
                                                for T in ev["ratio"]}},
            WRONG: lambda ev: {**ev, "ratio": {T: 0.8 for T in ev["ratio"]}}},
    "C25": {HOLDS: lambda ev: _set(_set(ev, ("check", "identical"), True),
                                   ("check", "max_abs_diff"), 0.0),
            CAVEAT: lambda ev: _set(_set(ev, ("check", "identical"), False),
                                    ("check", "max_abs_diff"), 1e-6),
            WRONG: lambda ev: _set(_set(ev, ("check", "identical"), False),
                                   ("check", "max_abs_diff"), 0.5)},
    "C26": {HOLDS: lambda ev: _c26_peaks(ev, 0.5, 0.5), CAVEAT: lambda ev: _c26_peaks(ev, 2, 0.5),
            WRONG: lambda ev: _c26_peaks(ev, 2, 2)},
    "C28": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: _runs(ev, "ddp", ranks=[
                {**k, "parameters": k["parameters"] // 2} for k in ev["runs"]["ddp"]["ranks"]])},
    "C29": {NOT_JUDGED: lambda ev: ev,
            WRONG: lambda ev: _runs(ev, "ddp", model_states=[
                x // 4 for x in ev["runs"]["ddp"]["model_states"]])},
    "C30": {HOLDS: lambda ev: _runs(ev, "zero3", activations=ev["runs"]["ddp"]["activations"]
                                    / ev["world"]),
            WRONG: lambda ev: ev, NOT_JUDGED: lambda ev: {**ev, "world": 1}},
    "C31": {HOLDS: lambda ev: _set(ev, ("peak_cut", 3), float(ev["gpus"])), CAVEAT: lambda ev: ev,
            WRONG: lambda ev: _set(ev, ("limits", 1), 2.0)},
    "C32": {HOLDS: lambda ev: _runs(_runs(ev, "zero1", comm=ev["runs"]["ddp"]["comm"]), "zero3",
                                    comm=ev["runs"]["ddp"]["comm"]),
            CAVEAT: lambda ev: ev,
            WRONG: lambda ev: {**ev, "stages": ["zero1", "zero3"]}},
    "C33": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: {**ev, "timeline": [[e, 5 * ev["block"]] for e, _ in ev["timeline"]]}},
    "C34": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: _runs(ev, "hsdp", model_states=ev["runs"]["ddp"]["model_states"]),
            NOT_JUDGED: lambda ev: {**ev, "world": 2, "runs": {  # 2 ranks: factors 2 and 1 only
                "ddp": ev["runs"]["ddp"], "zero3": {**ev["runs"]["zero3"], "shard_size": 2,
                                                    "model_states": [x // 2 for x in ev["runs"][
                                                        "ddp"]["model_states"]]}}}},
    "C35": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: _rec(ev, "offload", seconds=ev["recorded"]["zero3"]["seconds"] / 2),
            NOT_JUDGED: lambda ev: {**ev, "recorded": None}},
    "C36": {NOT_JUDGED: lambda ev: ev, WRONG: lambda ev: _set(ev, ("ddp", "T5-11B"), 1)},
    "C37": {HOLDS: lambda ev: {**ev, "sizes": {"V100-80GB": "80 GB"},
                               "paper": {**ev["paper"], "gpu": "V100-80GB"}},
            WRONG: lambda ev: ev},
    "C38": {HOLDS: lambda ev: ev, WRONG: lambda ev: {**ev, "tp_share": [1.0, 1.0]},
            NOT_JUDGED: lambda ev: {**ev, "dp_world": 1}},
    "C40": {HOLDS: lambda ev: ev,
            CAVEAT: lambda ev: _set(ev, ("ratios", next(iter(ev["ratios"]))), 1.3),
            WRONG: lambda ev: _set(ev, ("fits", "besiroglu-refit", "tokens_per_param"), 80.0)},
    "C44": {HOLDS: lambda ev: _c44_flops(ev, 0.01),
            CAVEAT: lambda ev: _c44_flops(ev, 0.01, (ev["attention"],)),
            WRONG: lambda ev: ev},
    "C43": {HOLDS: _c43_timed((0.5, 0.6, 0.7)), CAVEAT: _c43_timed((1.5, 1.2, 0.7)),
            WRONG: _c43_timed((1.5, 1.2, 1.1)), NOT_JUDGED: lambda ev: {**ev, "timed": {}}},
    "C45": {HOLDS: lambda ev: _rows(ev, lambda r: r["setup"] == "full"
                                    and r["batch_size"] * r["seq_len"] <= 8192),
            CAVEAT: lambda ev: _rows(ev, lambda r: r["setup"] == "full"),
            WRONG: lambda ev: ev},
    "C46": {HOLDS: lambda ev: _c46_all(ev, 0.3, 2.0),
            CAVEAT: lambda ev: _set(_set(_c46_all(ev, 0.1, 1.2), ("cases", 0, "cut"), 0.3),
                                    ("fits", 0, "ratio"), 2.0),
            WRONG: lambda ev: ev},
    "C48": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: _set(ev, ("rows", -1, "activations_bytes"),
                                   2 * ev["rows"][-1]["activations_bytes"])},
    "C47": {HOLDS: lambda ev: _c47_larger(ev, False, "logits"),
            CAVEAT: lambda ev: ev,
            WRONG: lambda ev: _c47_larger(ev, True, "blocks")},
    "C49": {HOLDS: lambda ev: {**ev, "parameters": int(ev["stated"])}, WRONG: lambda ev: ev},
    "C50": {HOLDS: lambda ev: ev,
            WRONG: lambda ev: {**ev, "flops": 3 * ev["dense_flops"]}},
    "C51": {HOLDS: lambda ev: {**ev, "traced_states_bytes": ev["whole_states_bytes"] // ev["ranks"],
                               "formula_states_bytes": ev["whole_states_bytes"] // ev["ranks"]},
            WRONG: lambda ev: ev},
}
# C28-C34 and C38 launch processes (torchrun, about 30 s); their evidence is shared
TRAINING = {"C14", "C16", "C17", "C18", "C19", "C22", "C24", "C25", "C28", "C29", "C30", "C31",
            "C32", "C33", "C34", "C38"}


def test_every_claim_has_cases_for_the_levels_it_can_reach():
    """Wrong and at least one other level; a caveat only where the claim's setting has one.

    Under the verdict rule a claim with no condition of its own setting has no caveat to reach,
    and one whose deciding part is unmeasurable here may never hold: each lists what it can.
    """
    assert set(CASES) == set(CHECKS)
    for claim, cases in CASES.items():
        assert set(cases) <= set(JUDGED) | {NOT_JUDGED}, claim
        assert WRONG in cases and len(cases) >= 2, claim


def _params():
    for claim in sorted(CASES):
        marks = [pytest.mark.slow] if claim in TRAINING else []
        for level in CASES[claim]:
            yield pytest.param(claim, level, id=f"{claim}-{level.replace(' ', '_')}", marks=marks)


_EVIDENCE: dict = {}


@pytest.mark.parametrize("claim, level", list(_params()))
def test_each_level_is_reached_by_changed_evidence(claim, level):
    if claim not in _EVIDENCE:
        _EVIDENCE[claim] = CHECKS[claim].evidence()
    ev = CASES[claim][level](copy.deepcopy(_EVIDENCE[claim]))
    v = CHECKS[claim].decide(ev)
    assert v.verdict == level, (claim, v)
    assert v.evidence
    if level != HOLDS:
        assert v.note  # the caveat, the correction, or why it is not judged


@pytest.mark.parametrize("claim", sorted(set(CASES) - TRAINING))
def test_the_real_evidence_gives_the_published_verdict(claim):
    """The page's verdict is decide(evidence()); no level is set anywhere else."""
    real = CHECKS[claim].decide(CHECKS[claim].evidence())
    assert real.verdict == verdicts([claim])[0].verdict


def test_at_least_one_claim_holds_plainly_and_none_compares_constants():
    levels = {v.claim: v.verdict for v in verdicts([c for c in CHECKS if c not in TRAINING])}
    assert HOLDS in levels.values()
    assert levels["C08"] == HOLDS  # exactly right: fp16's range and pi


def test_c21_names_the_half_that_failed():
    """A recorded speed-up below 2x with the memory in range is wrong for the speed half only."""
    ev = {**CHECKS["C21"].evidence(), "memory": {2048: 12.0, 4096: 18.0},
          "speed": {"label": "recorded", "ratios": {2048: 1.2}}}
    v = CHECKS["C21"].decide(ev)
    assert v.verdict == WRONG and "speed-up" in v.note and "memory ratio" not in v.note


# The moves: one physical change of a claim's setting, its real evidence, another level ----------
def _move_params():
    for claim in sorted(CHECKS):
        for i, m in enumerate(CHECKS[claim].moves):
            marks = [pytest.mark.slow] if m.slow or claim in TRAINING else []
            yield pytest.param(claim, i, id=f"{claim}-move{i}", marks=marks)


@pytest.mark.parametrize("claim", sorted(CHECKS))
def test_every_claim_declares_a_physical_change_that_moves_it(claim):
    moves = CHECKS[claim].moves
    assert moves, f"{claim} declares no claims.Move"
    assert all(m.change and m.setting for m in moves), claim


@pytest.mark.parametrize("claim, i", list(_move_params()))
def test_a_physical_change_moves_the_level(claim, i):
    """decide(evidence(**setting)) of each move: its declared level, not the claim's own."""
    check = CHECKS[claim]
    move = check.moves[i]
    own = verdicts([claim])[0].verdict
    moved = check.decide(check.evidence(**move.setting))
    assert moved.verdict == move.level, (claim, move.change, moved)
    assert moved.verdict != own, (claim, move.change, own)
    if moved.verdict != HOLDS:
        assert moved.note
