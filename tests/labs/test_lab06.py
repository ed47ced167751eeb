"""Lab 6's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import itertools

import pytest

from memlab.distributed.comm import ring_sent_bytes
from memlab.distributed.plan import ZERO_PAPER, ZERO_PAPER_QUOTED_GB
from memlab.distributed.traced import trace_sharded
from memlab.distributed.zero import LAYOUTS, STAGES, comm_volume, model_states
from memlab.errors import MemlabError
from memlab.labs.grader import get_lab
from memlab.labs.lab06 import (
    FIT_BUDGET_SHARE,
    FIT_FROM,
    MAX_RANKS,
    PER_RANK_CASES,
    SENT_CASES,
    SENT_RTOL,
    SHARDED,
    TIMELINE_QUESTIONS,
    TIMELINE_RUN,
    counted_sent_cases,
    gather_run,
    per_rank_cases,
    per_rank_slips,
    rank_budget_bytes,
    ranks_slips,
    recorded_gather,
    reference_per_rank,
    reference_sent_bytes,
    sent_cases,
    sent_slips,
    shown_rank_step,
    smallest_ranks,
    timeline_answers,
    traced_rank_step,
    unit_bytes,
)
from memlab.units import to_unit


@pytest.fixture(scope="module")
def run():
    return gather_run()


def test_the_lab_has_its_exercises():
    assert get_lab("lab06").ids == ("6.1", "6.2", "6.3", "6.4")


# ------------------------------------------------------------- 6.1 per-rank model states


def per_rank_bytes(parameters, stage, gpus, layout):  # the lab's reference solution
    p, g, k = LAYOUTS[layout]

    def held(b, split):
        return -(-b * parameters // gpus) if split else b * parameters

    return held(p, stage >= 3), held(g, stage >= 2), held(k, stage >= 1)


def test_the_zero_papers_example_is_in_the_cases():
    cases = per_rank_cases()
    paper = [c for c in cases if c["parameters"] == ZERO_PAPER["parameters"]
             and c["gpus"] == ZERO_PAPER["gpus"] and c["layout"] == "mixed"]
    assert [c["stage"] for c in paper] == list(STAGES)
    for c in paper:
        quoted = ZERO_PAPER_QUOTED_GB[c["stage"]]
        assert to_unit(sum(reference_per_rank(**c)), "GB") == pytest.approx(quoted, rel=3e-3)
    assert {c["layout"] for c in PER_RANK_CASES} == set(LAYOUTS)


def test_the_cases_tell_the_roundings_apart():
    """Some case's shard is not whole, and rounding its bytes differs from rounding its parameters."""
    def differ(case):
        n, g = case["parameters"], case["gpus"]
        return any(len({-(-b * n // g), b * n // g, b * -(-n // g)}) == 3
                   for b in LAYOUTS[case["layout"]])

    assert any(differ(c) for c in PER_RANK_CASES)


def test_reference_is_model_states():
    for c in per_rank_cases():
        ms = model_states(c["parameters"], c["stage"], c["gpus"], layout=c["layout"])
        assert reference_per_rank(**c) == per_rank_bytes(**c)
        assert sum(reference_per_rank(**c)) == ms.total


def test_per_rank_correct(lab, capsys, printed):
    assert lab.check("6.1", per_rank_bytes).ok
    assert printed() == "✅ 6.1 correct"

    def as_floats(parameters, stage, gpus, layout):
        return [float(v) for v in per_rank_bytes(parameters, stage, gpus, layout)]

    def as_model_states(parameters, stage, gpus, layout):
        return model_states(parameters, stage, gpus, layout=layout)

    assert lab.check("6.1", as_floats).ok and lab.check("6.1", as_model_states).ok
    capsys.readouterr()


def test_per_rank_slips_differ_from_the_reference():
    cases = per_rank_cases()
    for fn, hint in per_rank_slips():
        assert any(tuple(fn(**c)) != reference_per_rank(**c) for c in cases), hint


@pytest.mark.parametrize(("index", "words"), [
    (0, "round each shard up to whole bytes"),
    (1, "round each shard up (ceil), not down"),
    (2, "round the bytes up, ceil(bytes per parameter x Ψ / N), not the parameters"),
    (3, "stage 0 (DDP) shards nothing"),
    (4, "one category too many"),
    (5, "one category too few"),
    (6, "the optimizer states are sharded first"),
    (7, "return (parameters, gradients, optimizer states), in that order"),
    (8, "take the bytes per parameter from LAYOUTS[layout]"),
    (9, "answer bytes, not GB"),
])
def test_per_rank_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = per_rank_slips()[index]
    assert lab.check("6.1", fn).status == "not yet"
    line = printed()
    assert words in line and "cases not right, the first per_rank_bytes(parameters=" in line


def test_per_rank_stub_and_bad_answers(lab, capsys, printed):
    def stub(parameters, stage, gpus, layout):
        """Not written yet."""

    assert lab.check("6.1", stub).status == "not attempted"
    assert lab.check("6.1", None).status == "not attempted"
    capsys.readouterr()
    assert lab.check("6.1", 3).status == "not yet"
    assert "answer the function per_rank_bytes itself, got int" in printed()
    assert lab.check("6.1", lambda *a: 16).status == "not yet"
    assert "returned int: return three numbers" in printed()

    def broken(parameters, stage, gpus, layout):
        raise KeyError(layout)

    assert lab.check("6.1", broken).status == "not yet"
    assert "raised KeyError" in printed()

    def off(parameters, stage, gpus, layout):
        return tuple(v + 1 for v in per_rank_bytes(parameters, stage, gpus, layout))

    assert lab.check("6.1", off).status == "not yet"
    line = printed()  # no slip explains it: what is wrong, never the recipe
    assert f"{len(per_rank_cases())} of {len(per_rank_cases())} cases not right" in line
    assert "its parameters are slightly too large" in line and "stage 1 shards" not in line


# ----------------------------------------------------------------- 6.2 bytes sent per step


def bytes_sent_per_step(parameters, stage, gpus, bytes_per_value):  # the reference solution
    return (3 if stage == 3 else 2) * (gpus - 1) / gpus * parameters * bytes_per_value


def test_reference_is_ring_collectives():
    for c in sent_cases():
        payload = c["parameters"] * c["bytes_per_value"]
        n = c["gpus"]
        if c["stage"] == 3:
            by_hand = 2 * ring_sent_bytes("all-gather", payload, n) + ring_sent_bytes(
                "reduce-scatter", payload, n)
        else:
            by_hand = ring_sent_bytes("all-reduce", payload, n)
        assert reference_sent_bytes(**c) == pytest.approx(by_hand, rel=1e-12)
        assert reference_sent_bytes(**c) == pytest.approx(bytes_sent_per_step(**c), rel=1e-12)
        # the ZeRO paper's volumes are the payloads: (N-1)/N of them per rank
        volume = comm_volume(c["parameters"], c["stage"], bytes_per_value=c["bytes_per_value"])
        assert reference_sent_bytes(**c) == pytest.approx(volume * (n - 1) / n, rel=1e-12)


def test_sent_correct(lab, capsys):
    assert lab.check("6.2", bytes_sent_per_step).ok
    assert lab.check("6.2", lambda *a: round(bytes_sent_per_step(*a))).ok  # whole bytes: within
    assert not lab.check("6.2", lambda *a: bytes_sent_per_step(*a) * (1 + 2 * SENT_RTOL)).ok
    capsys.readouterr()


def test_counted_collectives_match_the_formula(run):
    """The bytes rank 0 sent in the measured FSDP2 step are the formula's at stages 3 and 2."""
    cases = counted_sent_cases(run)
    assert [c["stage"] for c, _ in cases] == [3, 2]
    for args, counted in cases:
        strategy = {3: "zero3", 2: "zero2"}[args["stage"]]
        assert counted == sum(c["sent_bytes"] for c in run.comm[strategy].values())
        assert counted == pytest.approx(reference_sent_bytes(**args), rel=1e-9)


def test_the_counted_case_is_named_when_only_it_is_wrong(lab, printed, run):
    def wrong_at_four_ranks(parameters, stage, gpus, bytes_per_value):
        return bytes_sent_per_step(parameters, stage, gpus, bytes_per_value) * (
            2 if (gpus, bytes_per_value) == (run.ranks, 4) else 1)

    assert lab.check("6.2", wrong_at_four_ranks).status == "not yet"
    line = printed()
    assert "2 of 18 cases not right" in line and "(counted in the step run here)" in line


def test_sent_slips_differ_from_the_reference():
    cases = sent_cases()
    assert {c["gpus"] for c in SENT_CASES} >= {1, ZERO_PAPER["gpus"]}
    for fn, hint in sent_slips():
        assert any(abs(fn(**c) - reference_sent_bytes(**c)) > 1e-6 * reference_sent_bytes(**c)
                   for c in cases), hint


@pytest.mark.parametrize(("index", "words"), [
    (0, "each rank sends (N-1)/N of a collective's payload"),
    (1, "(N-1)/N of the payload, not 1/N"),
    (2, "stage 3 gathers the parameters twice"),
    (3, "that is what PyTorch's ZeroRedundancyOptimizer sends"),
    (4, "stages 1 and 2 gather the parameters once"),
    (5, "an all-reduce is a reduce-scatter plus an all-gather"),
    (6, "multiply by bytes_per_value"),
    (7, "bits and bytes are different units"),
])
def test_sent_mistakes_get_their_hint(lab, printed, index, words):
    fn, _ = sent_slips()[index]
    assert lab.check("6.2", fn).status == "not yet"
    assert words in printed()


def test_sent_stub_and_bad_answers(lab, capsys, printed):
    def stub(parameters, stage, gpus, bytes_per_value):
        """Not written yet."""

    assert lab.check("6.2", stub).status == "not attempted"
    capsys.readouterr()
    assert lab.check("6.2", "2Ψ").status == "not yet"
    assert "answer the function bytes_sent_per_step itself, got str" in printed()
    assert lab.check("6.2", lambda *a: "many").status == "not yet"
    assert "returned str: return a number of bytes" in printed()
    assert lab.check("6.2", lambda *a: 1.01 * bytes_sent_per_step(*a)).status == "not yet"
    line = printed()
    assert "cases not right, the first bytes_sent_per_step(parameters=" in line
    assert line.endswith("1% too large")  # no slip: how far off, never the recipe


# ------------------------------------------------------------ 6.3 how many ranks, traced


def _reckoned(shown, budget, *, part=None, keep=None) -> int | None:
    """The notebook's reckoning from the step on FIT_FROM ranks: ``part`` shrinks as FIT_FROM / N,
    ``keep`` stays (by default: the shards shrink, everything else stays)."""
    at = shown.peak_by_category
    part = sum(at[c] for c in SHARDED) if part is None else part
    keep = shown.peak_bytes - part if keep is None else keep
    return next((n for n in range(FIT_FROM, MAX_RANKS + 1)
                 if keep + part * FIT_FROM / n <= budget), None)


def test_the_traced_step_is_what_the_exercise_says():
    shown, budget = shown_rank_step(), rank_budget_bytes()
    assert shown.gpus == FIT_FROM and shown.reshard_after_forward and shown.precision == "fp32"
    assert budget == int(FIT_BUDGET_SHARE * shown.peak_bytes)
    assert shown == trace_sharded(TIMELINE_RUN["model"], FIT_FROM, batch_size=shown.batch_size,
                                  seq_len=shown.seq_len)
    n = smallest_ranks()
    assert n is not None and n & (n - 1)  # not a power of two
    assert traced_rank_step(n).peak_bytes <= budget < traced_rank_step(n - 1).peak_bytes
    # the shards shrink as 1/N (padding aside), the rest does not
    other = traced_rank_step(n)
    for c in SHARDED:
        assert other.peak_by_category[c] <= shown.peak_by_category[c] * FIT_FROM / n * 1.05 + 64
    assert other.peak_by_category["act"] == shown.peak_by_category["act"]


def test_ranks_correct(lab, capsys):
    shown, budget = shown_rank_step(), rank_budget_bytes()
    assert _reckoned(shown, budget) == smallest_ranks()  # the reasoning gives the traced answer
    assert lab.check("6.3", smallest_ranks()).ok and lab.check("6.3", float(smallest_ranks())).ok
    capsys.readouterr()


def test_ranks_mistakes_get_their_hint(lab, printed):
    shown, budget = shown_rank_step(), rank_budget_bytes()
    at = shown.peak_by_category
    gathered = at["unsharded_param"] + at["all_gather"]
    sharded = sum(at[c] for c in SHARDED)
    expected = smallest_ranks()
    for answer, words in [
        (_reckoned(shown, budget, part=shown.peak_bytes, keep=0), "only this rank's shards shrink"),
        (_reckoned(shown, budget, part=shown.model_state_bytes, keep=0),
         "compare the per-rank peak, not the model states"),
        (_reckoned(shown, budget, part=sharded + gathered), "hold whole units whatever N"),
        (8, "not only a power of two"),
    ]:
        assert answer != expected
        assert lab.check("6.3", answer).status == "not yet"
        assert words in printed()


def test_ranks_slips_never_name_the_right_answer():
    values = [v for v, _ in ranks_slips()]
    assert float(smallest_ranks()) not in values and len(values) == len(set(values)) == 4


def test_ranks_other_answers(lab, capsys, printed):
    n = smallest_ranks()
    assert lab.check("6.3", None).status == "not attempted"
    capsys.readouterr()
    for answer, words in [
        (n + 1, f"{n + 1} ranks fit, but fewer fit too"),
        (MAX_RANKS + 1, f"answer a whole number of ranks from {FIT_FROM} to {MAX_RANKS}"),
        (1, "from 2"), (4.5, "got 4.5"), ("five", "answer a number of ranks, an int, got str"),
    ]:
        assert lab.check("6.3", answer).status == "not yet"
        line = printed()
        assert words in line and (answer != n + 1 or str(n) not in line.split(":", 1)[1])


# ------------------------------------------------------------ 6.4 the measured timeline


def _answers(run) -> dict:  # the reference solution
    out = {}
    for strategy in ("zero3", "zero2"):
        largest = max(b for _, b in run.timelines[strategy])
        out[f"{strategy} largest bytes"] = largest
        out[f"{strategy} blocks"] = largest / run.block_bytes
    out["zero2 first largest mark"] = next(
        label for label, b in run.timelines["zero2"] if b == out["zero2 largest bytes"])
    return out


def test_the_run_shows_what_the_questions_ask(run):
    """ZeRO-3 holds a block and the next one fetched ahead at most; ZeRO-2 holds every unit, first
    at the head's forward, a label that occurs once; the bytes are fp32 parameters."""
    cfg = TIMELINE_RUN["model"]
    assert run.ranks == TIMELINE_RUN["ranks"] >= 2 and run.parameters == cfg.num_parameters()
    assert run.unit_bytes == unit_bytes(cfg)
    assert sum(run.unit_bytes.values()) + (cfg.n_layer - 1) * run.block_bytes == 4 * run.parameters
    z3 = [b for _, b in run.timelines["zero3"]]
    z2 = [b for _, b in run.timelines["zero2"]]
    assert max(z3) == 2 * run.block_bytes and z3.count(0) >= cfg.n_layer
    assert max(z2) == 4 * run.parameters  # every unit gathered at once
    first = timeline_answers(run)["zero2 first largest mark"]
    assert first == "forward head starts"
    assert [label for label, _ in run.timelines["zero2"]].count(first) == 1
    assert set(timeline_answers(run)) == set(TIMELINE_QUESTIONS) == set(_answers(run))


def test_timeline_correct(lab, capsys, run):
    answer = _answers(run)
    assert answer == timeline_answers(run)
    assert lab.check("6.4", answer).ok
    answer["zero2 blocks"] = round(answer["zero2 blocks"], 2)  # within the tolerance
    answer["zero2 first largest mark"] = f"  {answer['zero2 first largest mark'].upper()} "
    assert lab.check("6.4", answer).ok
    capsys.readouterr()


@pytest.mark.parametrize(("key", "value", "words"), [
    ("zero3 largest bytes", lambda a, r: a["zero2 largest bytes"], "that is zero2's largest"),
    ("zero2 largest bytes", lambda a, r: sum(b for _, b in r.timelines["zero2"]),
     "not the sum of its marks"),
    ("zero2 largest bytes", lambda a, r: a["zero2 largest bytes"] / 2**20, "answer bytes, not MiB"),
    ("zero3 largest bytes", lambda a, r: 4 * r.parameters, "not all the model's parameters"),
    ("zero2 blocks", lambda a, r: round(a["zero2 blocks"]), "do not round"),
    ("zero2 blocks", lambda a, r: 4 * a["zero2 blocks"], "not its parameter count"),
    ("zero2 blocks", lambda a, r: 1 / a["zero2 blocks"], "not the other way"),
    ("zero3 blocks", lambda a, r: a["zero2 blocks"], "that is zero2's ratio"),
    ("zero2 first largest mark", lambda a, r: "forward head ends",
     "holds the largest value too, but it is reached earlier"),
    ("zero2 first largest mark", lambda a, r: "backward block 2 starts",
     "the largest value is reached earlier, in the forward"),
    ("zero2 first largest mark", lambda a, r: "forward block 1 starts",
     "fewer units are gathered than later in the forward"),
    ("zero2 first largest mark", lambda a, r: "the end of the forward",
     "is not a label of ZeRO-2's timeline"),
    ("zero2 first largest mark", lambda a, r: 11, "answer a mark's label (a string), got int"),
])
def test_timeline_mistakes_get_their_hint(lab, printed, run, key, value, words):
    answer = _answers(run)
    answer[key] = value(answer, run)
    assert lab.check("6.4", answer).status == "not yet"
    line = printed()
    assert f"1 of {len(TIMELINE_QUESTIONS)} not right: {key!r}" in line and words in line


def test_timeline_stub_and_bad_answers(lab, capsys, printed, run):
    assert lab.check("6.4", dict.fromkeys(TIMELINE_QUESTIONS)).status == "not attempted"
    assert lab.check("6.4", None).status == "not attempted"
    capsys.readouterr()
    assert lab.check("6.4", [1, 2]).status == "not yet"
    assert "answer a dict with the keys of TIMELINE_QUESTIONS" in printed()
    answer = _answers(run)
    answer["zero3 blocks"] = "one"
    assert lab.check("6.4", answer).status == "not yet"
    assert "answer a number" in printed()


def test_the_recorded_run_has_several_ranks_and_their_collectives(run):
    """The payload evidence is a run of several processes, whose collectives moved data: its
    timelines have what the measured run has, its DDP and ZeRO-1 payloads are 2 and 3 x Ψ."""
    record = recorded_gather()
    if record is None:
        pytest.skip("no recorded CPU run of distributed-memory in results/")
    res = record.value()
    assert record.label.startswith("recorded on ") and res.world_size >= 2
    assert res.backend == "gloo" and res.config["name"] == TIMELINE_RUN["model"].name
    runs = {r.strategy: r for r in res.runs}
    for strategy in ("zero3", "zero2"):
        assert max(b for _, b in runs[strategy].gather_timeline) == \
            max(b for _, b in run.timelines[strategy])
    psi4 = 4 * res.parameters
    assert runs["ddp"].ranks[0].comm_volume_bytes == 2 * psi4
    assert runs["zero1"].ranks[0].comm_volume_bytes == 3 * psi4


def test_gather_run_refuses_bad_input():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    with pytest.raises(MemlabError, match="ranks must be at least 2"):
        gather_run(1)
    with pytest.raises(MemlabError, match="ranks must be a positive integer, got 0"):
        gather_run(0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with pytest.raises(MemlabError, match="already initialised"):
            gather_run(3)
    finally:
        dist.destroy_process_group()


def test_the_slips_are_apart():
    """Every pair of 6.2's slips gives another value on some case."""
    cases = sent_cases()
    fns = [fn for fn, _ in sent_slips()]
    for a, b in itertools.combinations(fns, 2):
        assert any(abs(a(**c) - b(**c)) > 1e-6 * max(abs(a(**c)), 1.0) for c in cases)
