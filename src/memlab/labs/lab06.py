"""Lab 6, "Many devices": the model states one GPU holds at each ZeRO stage, the bytes one rank
sends per step, the number of ranks whose traced per-rank peak fits a budget, and FSDP's gathered
parameters read from a measured timeline.

Every expected value is computed at check time, never typed in: per-GPU model states with
:func:`memlab.distributed.zero.model_states`; bytes sent with
:func:`memlab.distributed.comm.ring_sent_bytes` over the collectives of a step
(:data:`STEP_COLLECTIVES`), and for a step run here (:func:`gather_run`: FSDP2 over a fake process
group of several ranks, in this process) as memlab's ``CommCounter`` counted them; the per-rank
peak of an FSDP2 step traced on fake tensors (:func:`memlab.distributed.traced.trace_sharded`);
the timeline answers from :func:`gather_run`'s timelines. Each hint names one mistake and fires
only on the answer that mistake gives, computed from the same numbers the check compares with; a
wrong answer no slip explains is told what is wrong with it, never the recipe. The notebook
imports none of the functions a check compares with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from memlab.distributed.comm import CommCounter, ring_sent_bytes
from memlab.distributed.plan import ZERO_PAPER
from memlab.distributed.runs import GatherTimeline, batches, timeline_units
from memlab.distributed.sharding import DIST_CI
from memlab.distributed.strategies import wrap
from memlab.distributed.traced import ShardedTrace, trace_sharded
from memlab.distributed.zero import LAYOUTS, STAGES, check_gpus, check_stage, model_states
from memlab.errors import MemlabError, check_positive_int
from memlab.labs.grader import (
    answer_keys_problem,
    answer_number,
    call_learner,
    close_to,
    define_lab,
    fit_problem,
    merged_slips,
    named_slip,
    off_by,
)
from memlab.model.config import ModelConfig, param_groups
from memlab.model.transformer import build_model, lm_loss
from memlab.results import Record, recorded

CATEGORIES = ("parameters", "gradients", "optimizer_states")

# Exercise 6.1: the ZeRO paper's example (7.5B parameters, 64 GPUs, mixed precision), then
# parameter counts and GPU counts that do not divide evenly, so that a shard must be rounded up
# (ceil(b x Ψ / N) bytes: the bytes rounded, not the parameters), in every layout. Each case is
# checked at every stage.
PER_RANK_CASES = (
    dict(parameters=ZERO_PAPER["parameters"], gpus=ZERO_PAPER["gpus"], layout="mixed"),
    dict(parameters=1_100_048_384, gpus=3, layout="fp32"),
    dict(parameters=1_000_003, gpus=8, layout="bf16"),
    dict(parameters=124_439_808, gpus=1, layout="mixed"),
)

# Exercise 6.2: the collectives of one training step with data parallelism, each over a payload
# of Ψ values (the ZeRO paper, section 7): DDP all-reduces the gradients (a reduce-scatter plus
# an all-gather), stages 1 and 2 reduce-scatter the gradients and all-gather the updated
# parameters, stage 3 all-gathers the parameters twice (forward and backward) and
# reduce-scatters the gradients once.
STEP_COLLECTIVES = {
    0: ("all-reduce",),
    1: ("reduce-scatter", "all-gather"),
    2: ("reduce-scatter", "all-gather"),
    3: ("all-gather", "all-gather", "reduce-scatter"),
}
SENT_CASES = (
    dict(parameters=ZERO_PAPER["parameters"], gpus=ZERO_PAPER["gpus"], bytes_per_value=2),
    dict(parameters=1_100_048_384, gpus=8, bytes_per_value=4),
    dict(parameters=1_000_003, gpus=3, bytes_per_value=2),
    dict(parameters=124_439_808, gpus=1, bytes_per_value=2),
)
SENT_RTOL = 1e-6  # ring shares such as 2/3 are not exact: a float, or bytes rounded, is fine

# Exercise 6.4: one training step (forward and backward) of the chapter's CI model under FSDP2
# over a fake process group of RANKS ranks in this process (rank 0's bytes), ZeRO-3
# (reshard_after_forward=True) and ZeRO-2 (False). The questions are keys of the answer.
TIMELINE_RUN = dict(model=DIST_CI, ranks=4, batch_size=2, seq_len=64)
TIMELINE_STRATEGIES = ("zero3", "zero2")
TIMELINE_QUESTIONS = {
    "zero3 largest bytes": "the largest gathered bytes in ZeRO-3's timeline",
    "zero2 largest bytes": "the largest gathered bytes in ZeRO-2's timeline",
    "zero3 blocks": "ZeRO-3's largest gathered bytes divided by one block's parameter bytes",
    "zero2 blocks": "ZeRO-2's largest gathered bytes divided by one block's parameter bytes",
    "zero2 first largest mark": "the label of the first mark of ZeRO-2's timeline at which the "
                                "gathered bytes reach their largest value",
}
BLOCKS_RTOL = 0.01  # the ratios; the bytes are exact

# Exercise 6.3: one FSDP2 (ZeRO-3) training step of TIMELINE_RUN's model and batch, fp32 with
# AdamW, traced per rank on fake tensors; the notebook shows it on FIT_FROM ranks, and the answer
# is the smallest number of ranks, up to MAX_RANKS, whose traced per-rank peak fits the budget:
# FIT_BUDGET_SHARE of the peak on FIT_FROM ranks, which no number of ranks a power of two, nor a
# reckoning that shards everything, the model states alone or the gathered units, would give.
FIT_FROM = 2
MAX_RANKS = 16
FIT_BUDGET_SHARE = 0.79
SHARDED = ("sharded_param", "sharded_grad", "opt")  # the categories a rank holds a 1/N shard of


def _shown(args: Mapping) -> str:
    return ", ".join(f"{k}={v:,}" if isinstance(v, int) else f"{k}={v!r}" for k, v in args.items())


def _best_slip(wrong: Sequence[tuple[Mapping, object]], slips: Sequence[tuple[Callable, str]],
               same: Callable[[object, object], bool]) -> str:
    """The hint of the slip that gives the learner's answer on every wrong case, else on the first."""
    for fn, hint in slips:
        if all(same(got, fn(**args)) for args, got in wrong):
            return hint
    args, got = wrong[0]
    return next((hint for fn, hint in slips if same(got, fn(**args))), "")


# ------------------------------------------------------- 6.1 per-rank model states


def per_rank_cases() -> list[dict]:
    """Every (parameters, stage, gpus, layout) of exercise 6.1 (chapter: 6).

    Each case of :data:`PER_RANK_CASES` at every stage.
    """
    return [dict(parameters=c["parameters"], stage=s, gpus=c["gpus"], layout=c["layout"])
            for c in PER_RANK_CASES for s in STAGES]


def reference_per_rank(parameters: int, stage: int, gpus: int, layout: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) bytes one GPU holds (chapter: 6).

    From :func:`~memlab.distributed.zero.model_states`.
    """
    ms = model_states(parameters, stage, gpus, layout=layout)
    return ms.parameters, ms.gradients, ms.optimizer_states


def _states(parameters, stage, gpus, layout, *, share=None, sharded_from=(3, 2, 1),
            order=(0, 1, 2), layout_used=None) -> tuple:
    """Model states by a rule: ``share(bytes_per_parameter)`` for a sharded category;
    ``sharded_from``: the stage from which each category is sharded."""
    share = share or (lambda b: -(-b * parameters // gpus))
    per = LAYOUTS[layout_used or layout]
    out = [share(b) if stage >= first else b * parameters
           for b, first in zip(per, sharded_from, strict=True)]
    return tuple(out[i] for i in order)


STAGE_RULE = ("stage 1 shards the optimizer states, stage 2 the gradients too, stage 3 the "
              "parameters too")


def per_rank_slips() -> list[tuple[Callable, str]]:
    """Typical wrong per_rank_bytes functions, each with its hint (chapter: 6)."""
    def rule(**kw):
        return lambda parameters, stage, gpus, layout: _states(parameters, stage, gpus, layout,
                                                               **kw)

    def share(how):
        return lambda parameters, stage, gpus, layout: _states(
            parameters, stage, gpus, layout, share=lambda b: how(b, parameters, gpus))

    return [
        (share(lambda b, n, g: b * n / g), "round each shard up to whole bytes: "
                                           "ceil(bytes per parameter x Ψ / N), the book's convention"),
        (share(lambda b, n, g: b * n // g), "round each shard up (ceil), not down: the book's "
                                            "convention, so no byte is lost"),
        (share(lambda b, n, g: b * -(-n // g)), "round the bytes up, ceil(bytes per parameter "
                                                "x Ψ / N), not the parameters"),
        (rule(sharded_from=(0, 0, 0)), "stage 0 (DDP) shards nothing; " + STAGE_RULE),
        (rule(sharded_from=(2, 1, 0)), "that shards one category too many; " + STAGE_RULE),
        (rule(sharded_from=(4, 3, 2)), "that shards one category too few; " + STAGE_RULE),
        (rule(sharded_from=(1, 2, 3)), "the optimizer states are sharded first, the parameters "
                                       "last; " + STAGE_RULE),
        (rule(order=(2, 1, 0)), "return (parameters, gradients, optimizer states), in that "
                                "order"),
        (rule(layout_used="mixed"), "take the bytes per parameter from LAYOUTS[layout]: each "
                                    "layout has its own"),
        (lambda parameters, stage, gpus, layout: tuple(
            b / 1e9 for b in reference_per_rank(parameters, stage, gpus, layout)),
         "answer bytes, not GB"),
    ]


def _as_states(value) -> tuple[float, ...] | None:
    if hasattr(value, "optimizer_states"):  # a ModelStates
        value = (value.parameters, value.gradients, value.optimizer_states)
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or len(value) != 3:
        return None
    numbers = tuple(answer_number(v) for v in value)
    return None if any(v is None for v in numbers) else numbers


def _same_states(a, b) -> bool:
    return a is not None and all(close_to(x, y, 1e-12) for x, y in zip(a, b, strict=True))


def check_per_rank(answer):
    """Check a per_rank_bytes(parameters, stage, gpus, layout) function against model_states (chapter: 6)."""
    if not callable(answer):
        return False, f"answer the function per_rank_bytes itself, got {type(answer).__name__}"
    cases = per_rank_cases()
    results = []
    for args in cases:
        out, raised = call_learner(answer, args, "per_rank_bytes")
        if raised:
            return False, raised
        results.append(out)
    if all(r is None for r in results):
        return None
    wrong = []
    for args, out in zip(cases, results, strict=True):
        got = _as_states(out)
        if got is None:
            return False, (f"per_rank_bytes({_shown(args)}) returned {type(out).__name__}: return "
                           "three numbers, (parameters, gradients, optimizer states) in bytes")
        if got != reference_per_rank(**args):
            wrong.append((args, got))
    if not wrong:
        return True
    hint = _best_slip(wrong, per_rank_slips(), _same_states)
    if not hint:
        args, got = wrong[0]
        ref = reference_per_rank(**args)
        hint = "; ".join(f"its {name.replace('_', ' ')} are {off_by(g, r)}"
                         for name, g, r in zip(CATEGORIES, got, ref, strict=True) if g != r)
    return False, (f"{len(wrong)} of {len(cases)} cases not right, the first "
                   f"per_rank_bytes({_shown(wrong[0][0])}): {hint}")


# --------------------------------------------------------------- 6.2 bytes sent per step


def sent_cases() -> list[dict]:
    """Every (parameters, stage, gpus, bytes_per_value) of exercise 6.2 (chapter: 6)."""
    return [dict(parameters=c["parameters"], stage=s, gpus=c["gpus"],
                 bytes_per_value=c["bytes_per_value"]) for c in SENT_CASES for s in STAGES]


def counted_sent_cases(run: GatherRun | None = None) -> list[tuple[dict, int]]:
    """Exercise 6.2's cases of a step run here, with the bytes rank 0 sent, as counted (chapter: 6).

    :func:`gather_run`'s step at stages 3 and 2, 4-byte values: the bytes memlab's
    ``CommCounter`` counted as FSDP2 issued its collectives.
    """
    run = run or gather_run()
    return [(dict(parameters=run.parameters, stage=stage, gpus=run.ranks, bytes_per_value=4),
             sum(c["sent_bytes"] for c in run.comm[strategy].values()))
            for strategy, stage in (("zero3", 3), ("zero2", 2))]


def reference_sent_bytes(parameters: int, stage: int, gpus: int, bytes_per_value: int) -> float:
    """Bytes one rank sends in a step's collectives (:data:`STEP_COLLECTIVES`) (chapter: 6).

    Ring algorithms are assumed.
    """
    stage, gpus = check_stage(stage), check_gpus(gpus)
    check_positive_int("bytes_per_value", bytes_per_value)
    payload = parameters * bytes_per_value
    return sum(ring_sent_bytes(c, payload, gpus) for c in STEP_COLLECTIVES[stage])


def _sent(factor: Callable[[int], float], share: Callable[[int], float] = lambda g: (g - 1) / g,
          bytes_used: Callable[[int], float] = lambda b: b) -> Callable:
    return lambda parameters, stage, gpus, bytes_per_value: (
        factor(stage) * share(gpus) * parameters * bytes_used(bytes_per_value))


def sent_slips() -> list[tuple[Callable, str]]:
    """Typical wrong bytes_sent_per_step functions, each with its hint (chapter: 6)."""
    def paper(s):
        return 3 if s == 3 else 2

    return [
        (_sent(paper, share=lambda g: 1), "each rank sends (N-1)/N of a collective's payload in a "
                                          "ring; 2Ψ and 3Ψ count the payload, not what one rank "
                                          "sends"),
        (_sent(paper, share=lambda g: 1 / g), "each rank sends N-1 of the N chunks: (N-1)/N of "
                                              "the payload, not 1/N"),
        (_sent(lambda s: 2), "stage 3 gathers the parameters twice, for the forward and again "
                             "for the backward, and reduce-scatters the gradients once"),
        (_sent(lambda s: 3 if s == 1 else paper(s)),
         "that is what PyTorch's ZeroRedundancyOptimizer sends (an all-reduce of the gradients, "
         "then a broadcast of the updated parameters); ZeRO-1 as the paper describes it needs "
         "only a reduce-scatter and an all-gather"),
        (_sent(lambda s: 3 if s >= 1 else 2), "stages 1 and 2 gather the parameters once, after "
                                              "the optimizer step; only stage 3 gathers them "
                                              "twice"),
        (_sent(lambda s: 1 if s == 0 else paper(s)), "an all-reduce is a reduce-scatter plus an "
                                                     "all-gather: each rank sends 2(N-1)/N of "
                                                     "the payload"),
        (_sent(paper, bytes_used=lambda b: 1), "multiply by bytes_per_value: answer bytes, not "
                                               "values"),
        (_sent(paper, bytes_used=lambda b: 8 * b), "bits and bytes are different units: answer "
                                                   "bytes"),
    ]


def check_sent(answer, rtol: float = SENT_RTOL):
    """Check a bytes_sent_per_step(parameters, stage, gpus, bytes_per_value) function (chapter: 6).

    It is held to ring collectives.
    """
    if not callable(answer):
        return False, (f"answer the function bytes_sent_per_step itself, got "
                       f"{type(answer).__name__}")
    cases = [(args, reference_sent_bytes(**args), "") for args in sent_cases()]
    cases += [(args, counted, " (counted in the step run here)")
              for args, counted in counted_sent_cases()]
    results = []
    for args, _, _ in cases:
        out, raised = call_learner(answer, args, "bytes_sent_per_step")
        if raised:
            return False, raised
        results.append(out)
    if all(r is None for r in results):
        return None
    wrong = []
    for (args, expected, where), out in zip(cases, results, strict=True):
        got = answer_number(out)
        if got is None:
            return False, (f"bytes_sent_per_step({_shown(args)}) returned "
                           f"{type(out).__name__}: return a number of bytes")
        if not close_to(got, expected, rtol):
            wrong.append((args, got, expected, where))
    if not wrong:
        return True
    hint = _best_slip([(args, got) for args, got, _, _ in wrong], sent_slips(),
                      lambda a, b: close_to(a, b, rtol))
    args, got, expected, where = wrong[0]
    return False, (f"{len(wrong)} of {len(cases)} cases not right, the first "
                   f"bytes_sent_per_step({_shown(args)}){where}: "
                   + (hint or off_by(got, expected)))


# ---------------------------------------------------- 6.3 how many ranks: a traced step


@functools.cache
def traced_rank_step(ranks: int) -> ShardedTrace:
    """One FSDP2 (ZeRO-3) step of :data:`TIMELINE_RUN`'s model on ``ranks`` ranks, traced (chapter: 6).

    fp32, AdamW, rank 0's bytes, on fake tensors: :func:`memlab.distributed.traced.trace_sharded`.
    """
    return trace_sharded(TIMELINE_RUN["model"], ranks, reshard_after_forward=True,
                         precision="fp32", batch_size=TIMELINE_RUN["batch_size"],
                         seq_len=TIMELINE_RUN["seq_len"])


def shown_rank_step() -> ShardedTrace:
    """The step exercise 6.3 shows: :func:`traced_rank_step` on :data:`FIT_FROM` ranks (chapter: 6)."""
    return traced_rank_step(FIT_FROM)


def rank_budget_bytes() -> int:
    """The per-rank budget of exercise 6.3 (chapter: 6).

    :data:`FIT_BUDGET_SHARE` of the traced peak on :data:`FIT_FROM` ranks.
    """
    return int(FIT_BUDGET_SHARE * traced_rank_step(FIT_FROM).peak_bytes)


def _first_ranks(fits: Callable[[int], bool], candidates=None) -> int | None:
    return next((n for n in (candidates or range(FIT_FROM, MAX_RANKS + 1)) if fits(n)), None)


def smallest_ranks(budget: int | None = None) -> int | None:
    """The smallest number of ranks whose traced per-rank peak fits ``budget`` (chapter: 6).

    From :data:`FIT_FROM` to :data:`MAX_RANKS`, else None; the budget is :func:`rank_budget_bytes`
    unless given.
    """
    budget = rank_budget_bytes() if budget is None else budget
    return _first_ranks(lambda n: traced_rank_step(n).peak_bytes <= budget)


def ranks_slips() -> list[tuple[float, str]]:
    """The answers typical reckonings from the step on FIT_FROM ranks give, with hints (chapter: 6).

    Each scales the shown step's bytes by FIT_FROM / N in its own wrong way; a power of two is
    the traced answer's next one. None equals the right answer.
    """
    shown, budget = traced_rank_step(FIT_FROM), rank_budget_bytes()
    at = shown.peak_by_category
    sharded = sum(at[c] for c in SHARDED)
    gathered = at["unsharded_param"] + at["all_gather"]

    def scaled(part: int, rest: int) -> int | None:
        return _first_ranks(lambda n: rest + part * FIT_FROM / n <= budget)

    expected = smallest_ranks(budget)
    powers = [n for n in range(FIT_FROM, MAX_RANKS + 1) if n & (n - 1) == 0]
    picks = [
        (scaled(shown.peak_bytes, 0), "only this rank's shards shrink with N (the sharded "
                                      "parameters, gradients and optimizer states); the "
                                      "activations, the gathered units, the collectives' buffers "
                                      "and the temporaries stay what they are"),
        (scaled(shown.model_state_bytes, 0), "compare the per-rank peak, not the model states: "
                                             "the activations, the gathered units and the "
                                             "temporaries come on top of them"),
        (scaled(sharded + gathered, shown.peak_bytes - sharded - gathered),
         "the gathered parameters (unsharded_param) and the all-gather buffer hold whole units "
         "whatever N: they do not shrink with it"),
        (None if expected is None else _first_ranks(lambda n: n >= expected, powers),
         "N may be any whole number, not only a power of two"),
    ]
    return merged_slips([(-1.0 if n is None else float(n), hint) for n, hint in picks
                         if n != expected])


def check_ranks(answer):
    """Check the predicted smallest number of ranks whose traced per-rank peak fits (chapter: 6)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of ranks, an int, got {type(answer).__name__}"
    if got != int(got) or not FIT_FROM <= got <= MAX_RANKS:
        return False, f"answer a whole number of ranks from {FIT_FROM} to {MAX_RANKS}, got {got:g}"
    budget = rank_budget_bytes()
    return fit_problem(
        int(got), smallest_ranks(budget), budget=budget, slips=ranks_slips,
        peak=lambda n: traced_rank_step(n).peak_bytes,
        over="on {count} ranks the traced per-rank peak is {peak:,} bytes, more than the budget "
             "of {budget:,}",
        under="{count} ranks fit, but fewer fit too: answer the smallest number")


# ------------------------------------------------- 6.4 reading a gathered-parameter timeline


@dataclass(frozen=True)
class GatherRun:
    """One training step (forward and backward) under FSDP2, on rank 0 of ``ranks`` fake ranks.

    It gives what the step gathered and sent.
    """

    model: str
    config: dict  # the ModelConfig's fields
    ranks: int
    batch_size: int
    seq_len: int
    parameters: int
    unit_bytes: dict[str, int]  # the fp32 parameter bytes of each kind of FSDP unit
    # strategy -> the marks in order: (label, bytes of parameters held gathered at that mark)
    timelines: dict[str, tuple[tuple[str, int], ...]]
    # strategy -> collective -> {"calls", "bytes" (payload), "sent_bytes" (rank 0, ring)}
    comm: dict[str, dict[str, dict[str, int]]]

    @property
    def block_bytes(self) -> int:
        """fp32 parameter bytes of one transformer block (chapter: 6)."""
        return self.unit_bytes["block"]

    def as_dict(self) -> dict:
        """The run as a plain dict (chapter: 6)."""
        return asdict(self)


def unit_bytes(cfg: ModelConfig, bytes_per_parameter: int = 4) -> dict[str, int]:
    """Parameter bytes of the FSDP units (chapter: 6).

    The embedding, one block, the final norm with the head.
    """
    embed, block, head = param_groups(cfg)
    return {"embedding": bytes_per_parameter * sum(embed),
            "block": bytes_per_parameter * sum(block),
            "final norm and head": bytes_per_parameter * sum(head)}


@functools.cache
def gather_run(ranks: int = TIMELINE_RUN["ranks"]) -> GatherRun:
    """Measure :data:`TIMELINE_RUN`'s step under ZeRO-3 and ZeRO-2 (FSDP2) (chapter: 6).

    On ``ranks`` fake ranks in this process.

    A fake process group stands in for the other ranks: its collectives move no data (the
    values are not trained), but rank 0 allocates, gathers and frees its parameters as on a
    cluster. The marks are :class:`~memlab.distributed.runs.GatherTimeline`'s: each block's
    forward and backward, start and end, and each collective as it is issued.
    """
    check_positive_int("ranks", ranks)
    if ranks < 2:
        raise MemlabError(f"ranks must be at least 2 for anything to be gathered, got {ranks}")
    import torch.distributed as dist

    if not dist.is_available():
        raise MemlabError(f"a gather timeline needs torch.distributed, which torch "
                          f"{torch.__version__} here lacks")
    if dist.is_initialized():
        raise MemlabError(f"a process group (backend {dist.get_backend()!r}) is already "
                          "initialised; gather_run makes its own fake one: call it from a "
                          "process without one")
    from torch.testing._internal.distributed.fake_pg import FakeStore

    cfg, B, T = TIMELINE_RUN["model"], TIMELINE_RUN["batch_size"], TIMELINE_RUN["seq_len"]
    x, y = batches(cfg, 1, B, T)[0]  # (B, T) token ids and targets
    timelines, comm = {}, {}
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        for strategy in TIMELINE_STRATEGIES:
            w = wrap(strategy, build_model(cfg, seed=0), device=torch.device("cpu"))
            counter = CommCounter()
            timeline = GatherTimeline(w.inner, timeline_units(w.inner))
            counter.probe = timeline.mark
            with counter, timeline:
                loss = lm_loss(w.model(x), y)
                loss.backward()
            counter.probe = None
            timelines[strategy] = tuple((label, int(b)) for label, b in timeline.events)
            comm[strategy] = counter.summary()
            del w, loss
    finally:
        dist.destroy_process_group()
    return GatherRun(model=cfg.name, config=asdict(cfg), ranks=ranks, batch_size=B, seq_len=T,
                     parameters=cfg.num_parameters(), unit_bytes=unit_bytes(cfg),
                     timelines=timelines, comm=comm)


def timeline_answers(run: GatherRun | None = None) -> dict[str, object]:
    """The answers of exercise 6.4, read from a measured :class:`GatherRun` (chapter: 6)."""
    run = run or gather_run()
    out: dict[str, object] = {}
    for strategy in TIMELINE_STRATEGIES:
        out[f"{strategy} largest bytes"] = max(b for _, b in run.timelines[strategy])
        out[f"{strategy} blocks"] = out[f"{strategy} largest bytes"] / run.block_bytes
    z2 = run.timelines["zero2"]
    out["zero2 first largest mark"] = next(label for label, b in z2
                                           if b == out["zero2 largest bytes"])
    return {key: out[key] for key in TIMELINE_QUESTIONS}


def _bytes_slips(strategy: str, run: GatherRun) -> list[tuple[float, str]]:
    values = [b for _, b in run.timelines[strategy]]
    other = "zero2" if strategy == "zero3" else "zero3"
    largest = max(values)
    return merged_slips([
        (float(max(b for _, b in run.timelines[other])),
         f"that is {other}'s largest; this key asks for {strategy}'s"),
        (float(sum(values)), "the largest value of the timeline, not the sum of its marks"),
        (float(values[-1]), "the largest value over all the marks, not the last one"),
        *([(float(run.parameters * 4), "the largest value the timeline shows, not all the "
                                       "model's parameters")] if run.parameters * 4 != largest
          else []),
        (largest / 2**20, "answer bytes, not MiB"),
        (largest / 1e6, "answer bytes, not MB"),
    ])


def _blocks_slips(strategy: str, run: GatherRun) -> list[tuple[float, str]]:
    answers = timeline_answers(run)
    ratio = answers[f"{strategy} blocks"]
    other = "zero2" if strategy == "zero3" else "zero3"
    return merged_slips([
        (answers[f"{other} blocks"], f"that is {other}'s ratio; this key asks for {strategy}'s"),
        (1 / ratio, "divide the largest gathered bytes by the block's bytes, not the other way"),
        (ratio * 4, "divide by the block's bytes (block_bytes), not its parameter count"),
        (float(round(ratio)), "do not round: besides the blocks, other units (the embedding, "
                              "the head) can be gathered too"),
    ])


def check_timeline(answer, rtol: float = BLOCKS_RTOL):
    """Check the answers read from the measured ZeRO-3 and ZeRO-2 timelines (chapter: 6)."""
    problem = answer_keys_problem(answer, TIMELINE_QUESTIONS, "TIMELINE_QUESTIONS")
    if problem:
        return False, problem
    run = gather_run()
    expected = timeline_answers(run)
    wrong = []
    for key, value in expected.items():
        got = answer[key]
        if isinstance(value, str):
            why = _mark_problem(got, value, run)
            if why:
                wrong.append(f"{key!r}: {why}")
            continue
        number = answer_number(got)
        if number is None:
            wrong.append(f"{key!r}: answer a number")
            continue
        strategy = key.split()[0]
        if key.endswith("bytes"):
            if number != value:
                hint = named_slip(number, _bytes_slips(strategy, run), 1e-9)
                wrong.append(f"{key!r}: {hint or off_by(number, value)}")
        elif not close_to(number, value, rtol):
            hint = named_slip(number, _blocks_slips(strategy, run), rtol)
            wrong.append(f"{key!r}: {hint or off_by(number, value)}")
    if not wrong:
        return True
    return False, f"{len(wrong)} of {len(expected)} not right: " + "; ".join(wrong)


def _mark_problem(got, expected: str, run: GatherRun) -> str:
    """Why ``got`` is not the first mark of ZeRO-2's largest value ('' when it is)."""
    if not isinstance(got, str):
        return f"answer a mark's label (a string), got {type(got).__name__}"
    label = got.strip()
    z2 = run.timelines["zero2"]
    labels = [m for m, _ in z2]
    if label.casefold() == expected.casefold():
        return ""
    if label not in labels:
        return f"{got!r} is not a label of ZeRO-2's timeline; labels look like {labels[0]!r}"
    largest = max(b for _, b in z2)
    first = labels.index(label)
    at = z2[first][1]
    if at == largest:
        return ("that mark holds the largest value too, but it is reached earlier: answer the "
                "first mark that holds it")
    if label.startswith("backward") or first > labels.index(expected):
        return ("the largest value is reached earlier, in the forward: ZeRO-2 keeps each block "
                "gathered from its forward to its backward, so nothing is freed before the "
                "backward starts")
    return "at that mark fewer units are gathered than later in the forward"


def recorded_gather() -> Record | None:
    """The chapter's recorded CPU run of every strategy (``distributed-memory``), or None (chapter: 6).

    Several processes over gloo, so that each collective really moves data between ranks.
    """
    return recorded("distributed-memory", device="cpu", scale="ci")


lab = define_lab("lab06", "Many devices")

lab.exercise(
    "6.1",
    "a per_rank_bytes(parameters, stage, gpus, layout) function giving the (parameters, "
    "gradients, optimizer states) bytes one GPU holds at ZeRO stage 0-3, shards rounded up",
    check=check_per_rank,
)
lab.exercise(
    "6.2",
    "a bytes_sent_per_step(parameters, stage, gpus, bytes_per_value) function giving what one "
    "rank sends in a step's collectives, ring algorithms, and what a step run here counted",
    check=check_sent,
    rtol=SENT_RTOL,
)
lab.exercise(
    "6.3",
    "the smallest number of ranks whose traced per-rank peak of an FSDP2 step fits the budget, "
    "predicted from the step traced on FIT_FROM ranks",
    check=check_ranks,
    dimensionless=True,
)
lab.exercise(
    "6.4",
    "the largest gathered bytes of the measured ZeRO-3 and ZeRO-2 timelines, in bytes and in "
    "blocks, and the first mark at which ZeRO-2's is reached",
    check=check_timeline,
    rtol=BLOCKS_RTOL,
)
