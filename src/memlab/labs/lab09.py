"""Lab 9, "Mixture of experts": total and active parameters, one rank's parameter bytes under
expert parallelism, the rows an all-to-all dispatch sends, and the capacity factor that drops no
row of a measured routing.

Every expected value is computed at check time, never typed in: the parameters counted by
PyTorch on each model built on the meta device (the active ones: all of them less the experts a
token does not reach, each expert's size read from the model); one rank's parameter bytes from a
step traced over a fake process group (:func:`memlab.moe.ep_run.trace_expert_parallel`), and for
the full-size cases from :func:`memlab.moe.ep_run.expert_parallel_bytes`; the dispatch's bytes
counted by the all-to-all of :class:`memlab.moe.expert_parallel.ExpertParallelMoE`, run on real
tensors as rank 0 of a fake process group, and for the full-size case by
:func:`memlab.moe.ep_run.all_to_all_bytes`; the rows dropped at each capacity factor measured by
running the MoE block. Each hint names one mistake and fires only on the answer that mistake
gives; the notebook imports none of the functions a check compares with.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

import torch

from memlab.errors import MemlabError, check_choice
from memlab.labs.cases import check_cases
from memlab.labs.grader import answer_number, define_lab, named_slip
from memlab.model.config import ModelConfig, MoEConfig, get_config, param_groups
from memlab.model.moe import MoE, Routing
from memlab.moe.ep_run import DEEPSEEK_V3_LIKE, all_to_all_bytes, expert_parallel_bytes
from memlab.moe.measured import HotExpert

# Exercise 9.1: the presets and two configs the chapter does not show.
SWITCH_LIKE = replace(get_config("tiny-moe"), name="switch-like (8 experts, top 1)",
                      moe=MoEConfig(experts=8, top_k=1, d_ff=96, norm_topk_prob=False))
SHARED_LIKE = replace(get_config("tiny-moe"), name="shared-like (16 experts, top 4, shared)",
                      moe=MoEConfig(experts=16, top_k=4, d_ff=32, shared_d_ff=128))
PARAM_CASES = ("tiny-moe", "mixtral-8x7b", "qwen1.5-moe-a2.7b", SWITCH_LIKE.name,
               SHARED_LIKE.name)
_CONFIGS = {c.name: c for c in (SWITCH_LIKE, SHARED_LIKE, DEEPSEEK_V3_LIKE)}

# Exercise 9.2: one rank's parameter bytes; the small cases traced, the large by formula.
RANK_CASES = {
    "tiny-moe over 2 ranks, fp32": dict(model="tiny-moe", ranks=2, precision="fp32"),
    "tiny-moe over 4 ranks, bf16": dict(model="tiny-moe", ranks=4, precision="bf16"),
    f"{SHARED_LIKE.name} over 8 ranks, fp32": dict(model=SHARED_LIKE.name, ranks=8,
                                                   precision="fp32"),
    "mixtral-8x7b over 8 ranks, bf16-mixed": dict(model="mixtral-8x7b", ranks=8,
                                                  precision="bf16-mixed"),
    "deepseek-v3-like over 64 ranks, bf16-mixed": dict(model="deepseek-v3-like", ranks=64,
                                                       precision="bf16-mixed"),
}
TRACED_RANK_CASES = tuple(c for c, v in RANK_CASES.items()
                          if v["model"] not in ("mixtral-8x7b", "deepseek-v3-like"))
PARAM_BYTES = {"fp32": 4, "bf16": 2, "bf16-mixed": 4}  # the weights a rank stores

# Exercise 9.3: the bytes rank 0 sends in one block's forward dispatch, balanced routing.
DISPATCH_CASES = {
    "tiny-moe, 64 tokens over 2 ranks, fp32": dict(model="tiny-moe", tokens=64, ranks=2,
                                                    dtype="fp32"),
    "tiny-moe, 96 tokens over 4 ranks, bf16": dict(model="tiny-moe", tokens=96, ranks=4,
                                                    dtype="bf16"),
    f"{SWITCH_LIKE.name}, 32 tokens over 8 ranks, fp32": dict(model=SWITCH_LIKE.name, tokens=32,
                                                              ranks=8, dtype="fp32"),
    "deepseek-v3-like, 4096 tokens over 64 ranks, bf16": dict(model="deepseek-v3-like",
                                                              tokens=4096, ranks=64, dtype="bf16"),
}
COUNTED_DISPATCH_CASES = tuple(DISPATCH_CASES)[:3]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# Exercise 9.4: the book's small MoE block with a router that favours expert 0 a little.
CAPACITY_JOB = dict(model="tiny-moe", batch_size=4, seq_len=64, hot_logit=0.4, seed=0)
CAPACITY_STEP = 0.05  # the answer is a multiple of this


def _config(name: str) -> ModelConfig:
    return _CONFIGS[name] if name in _CONFIGS else get_config(name)


def _show(value) -> str:
    if isinstance(value, ModelConfig):
        return f"<{value.name} config>"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


# ------------------------------------------------------------ 9.1 total and active parameters


def param_case_args(case: str) -> dict:
    """Exercise 9.1's argument of a :data:`PARAM_CASES` case: cfg (chapter: 9)."""
    check_choice("case", case, PARAM_CASES)
    return dict(cfg=_config(case))


@functools.cache
def counted_parameters(case: str) -> tuple[int, int]:
    """(total, active) counted by PyTorch on the model built on the meta device (chapter: 9).

    Active: every parameter less those of the E - k experts of each block a token does not
    reach (each expert's size counted on the model).
    """
    from memlab.model.transformer import build_model, count_parameters

    cfg = param_case_args(case)["cfg"]
    model = build_model(cfg, device="meta")
    total = count_parameters(model)
    unused = 0
    for block in model.modules():
        if isinstance(block, MoE):
            per_expert = count_parameters(block.experts[0])
            unused += (block.moe.experts - block.moe.top_k) * per_expert
    return total, total - unused


def parameters_by_terms(cfg: ModelConfig, *, expert_matrices: int = 3, router: bool = True,
                        shared_active: bool = True, active_experts: int | None = None,
                        attention_per_expert: bool = False) -> tuple[int, int]:
    """(total, active) from the shapes, right or slipped (chapter: 9).

    ``active_experts`` None: top-k; ``attention_per_expert``: each expert a whole block.
    """
    m, C, L = cfg.moe, cfg.d_model, cfg.n_layer
    dense_block = cfg.num_parameters() - L * m.block_parameters(C)  # all but the MoE MLPs
    expert = expert_matrices * C * m.d_ff
    shared = m.block_parameters(C) - m.experts * 3 * C * m.d_ff - C * m.experts
    attention = 0
    if attention_per_expert:  # a whole block per expert: its attention and norms as well
        attention = sum(param_groups(replace(cfg, moe=None, d_ff=m.d_ff))[1]) - 3 * C * m.d_ff
    per_layer = (C * m.experts if router else 0) + shared + m.experts * (expert + attention)
    k = m.top_k if active_experts is None else active_experts
    active = (C * m.experts if router else 0) + (shared if shared_active else 0) + k * expert
    return dense_block + L * per_layer, dense_block + L * active


def parameter_slips() -> list[tuple[Callable, str]]:
    """Typical wrong moe_parameters functions, each with its hint (chapter: 9)."""
    def slip(**kw):
        return lambda cfg: parameters_by_terms(cfg, **kw)

    def every(cfg):
        return parameters_by_terms(cfg, active_experts=cfg.moe.experts)

    return [
        (slip(attention_per_expert=True), "the experts replace only the MLP: attention, norms "
                                          "and embeddings are held once per block, not per expert"),
        (slip(expert_matrices=2), "an expert is a SwiGLU MLP: three matrices (gate, up, down)"),
        (slip(router=False), "count the router, a (E, C) matrix in every block, in both"),
        (every, "a token passes through its top-k experts only: the active count has k experts "
                "per block, not E"),
        (slip(shared_active=False), "every token passes through the shared expert (and its "
                                    "gate): it is active"),
        (lambda cfg: parameters_by_terms(cfg)[::-1], "return (total, active), in that order"),
    ]


def check_moe_parameters(answer):
    """Check a moe_parameters(cfg) function against PyTorch's counts (chapter: 9)."""
    return check_cases(answer, "moe_parameters", PARAM_CASES, param_case_args,
                       counted_parameters, parameter_slips, pair=True, counted=PARAM_CASES,
                       counted_word="counted by PyTorch", show=_show, quantity="parameters",
                       names=("total", "active"))


# ------------------------------------------------------------ 9.2 one rank's parameter bytes


def rank_case_args(case: str) -> dict:
    """Exercise 9.2's arguments of a :data:`RANK_CASES` case: cfg, ranks, param_bytes (chapter: 9)."""
    check_choice("case", case, RANK_CASES)
    c = RANK_CASES[case]
    return dict(cfg=_config(c["model"]), ranks=c["ranks"], param_bytes=PARAM_BYTES[c["precision"]])


@functools.cache
def traced_rank(case: str):
    """One rank of a :data:`TRACED_RANK_CASES` case's step, traced over a fake process group (chapter: 9)."""
    from memlab.moe.ep_run import trace_expert_parallel

    check_choice("case", case, TRACED_RANK_CASES)
    c = RANK_CASES[case]
    return trace_expert_parallel(_config(c["model"]), c["ranks"], batch_size=2, seq_len=32,
                                 precision=c["precision"])


def expected_rank_bytes(case: str) -> int:
    """A rank's parameter bytes: traced for the small cases, by formula for the large (chapter: 9)."""
    if case in TRACED_RANK_CASES:
        return traced_rank(case).parameters_bytes
    a = rank_case_args(case)
    return expert_parallel_bytes(a["cfg"], a["ranks"], tokens=1,
                                 param_bytes=a["param_bytes"]).parameters_bytes


def rank_bytes_by_terms(cfg: ModelConfig, ranks: int, param_bytes: int, *,
                        replicated_share: bool = False, experts_whole: bool = False,
                        replicated: bool = True) -> int:
    """One rank's parameter bytes, right or slipped (chapter: 9)."""
    m = cfg.moe
    experts = cfg.n_layer * m.experts * 3 * cfg.d_model * m.d_ff
    rest = cfg.num_parameters() - experts
    mine = experts if experts_whole else experts // ranks
    kept = (rest / ranks if replicated_share else rest) if replicated else 0
    return round(param_bytes * (mine + kept))


def rank_slips() -> list[tuple[Callable, str]]:
    """Typical wrong rank_parameter_bytes functions, each with its hint (chapter: 9)."""
    def slip(**kw):
        return lambda cfg, ranks, param_bytes: rank_bytes_by_terms(cfg, ranks, param_bytes, **kw)

    return [
        (slip(replicated_share=True), "expert parallelism splits the experts only: attention, "
                                      "router, norms and embeddings stay whole on every rank"),
        (slip(experts_whole=True), "each rank keeps E/N of every block's experts, not all of them"),
        (slip(replicated=False), "a rank holds the replicated part too: everything but the "
                                 "routed experts"),
    ]


def check_rank_bytes(answer):
    """Check a rank_parameter_bytes(cfg, ranks, param_bytes) function (chapter: 9)."""
    return check_cases(answer, "rank_parameter_bytes", tuple(RANK_CASES), rank_case_args,
                       expected_rank_bytes, rank_slips, pair=False, counted=TRACED_RANK_CASES,
                       counted_word="traced", show=_show)


# ------------------------------------------------------------ 9.3 the dispatch's bytes


def dispatch_case_args(case: str) -> dict:
    """Exercise 9.3's arguments of a case: tokens, top_k, ranks, d_model, value_bytes (chapter: 9)."""
    check_choice("case", case, DISPATCH_CASES)
    c = DISPATCH_CASES[case]
    cfg = _config(c["model"])
    return dict(tokens=c["tokens"], top_k=cfg.moe.top_k, ranks=c["ranks"], d_model=cfg.d_model,
                value_bytes=torch.finfo(DTYPES[c["dtype"]]).bits // 8)


@functools.cache
def counted_dispatch_bytes(case: str) -> int:
    """The bytes rank 0's forward dispatch sent to other ranks, counted on real tensors (chapter: 9).

    One MoE block, balanced routing, as rank 0 of a fake process group of ``ranks`` (its
    all-to-alls return at once; the block counts the rows and bytes it hands them).
    """
    from memlab.distributed.traced import fake_process_group
    from memlab.moe.expert_parallel import ExpertParallelMoE

    check_choice("case", case, COUNTED_DISPATCH_CASES)
    c = DISPATCH_CASES[case]
    cfg = _config(c["model"])
    torch.manual_seed(0)
    layer = MoE(cfg.d_model, cfg.moe).to(DTYPES[c["dtype"]])
    with fake_process_group(c["ranks"], "count the dispatch"), torch.no_grad():
        ep = ExpertParallelMoE(layer)
        ep.routing = Routing.balanced(cfg.moe.experts)
        ep(torch.randn(1, c["tokens"], cfg.d_model, dtype=DTYPES[c["dtype"]]))
        return ep.stats["dispatch_forward"]


def expected_dispatch_bytes(case: str) -> int:
    """Counted for the small cases, by the chapter's formula for the full-size one (chapter: 9)."""
    if case in COUNTED_DISPATCH_CASES:
        return counted_dispatch_bytes(case)
    a = dispatch_case_args(case)
    cfg = _config(DISPATCH_CASES[case]["model"])
    counts = Routing.balanced(cfg.moe.experts).counts(a["tokens"] * a["top_k"])
    return all_to_all_bytes([counts] * a["ranks"], a["d_model"], a["value_bytes"],
                            rank=0)["dispatch_forward"]


def dispatch_by_terms(tokens: int, top_k: int, ranks: int, d_model: int, value_bytes: int, *,
                      own: bool = False, slots: bool = True, both: bool = False) -> int:
    """Rank 0's forward dispatch bytes, right or slipped (chapter: 9)."""
    rows = tokens * (top_k if slots else 1)
    remote = rows if own else rows * (ranks - 1) // ranks
    return remote * d_model * value_bytes * (2 if both else 1)


def dispatch_slips() -> list[tuple[Callable, str]]:
    """Typical wrong dispatch_bytes functions, each with its hint (chapter: 9)."""
    def slip(**kw):
        return lambda tokens, top_k, ranks, d_model, value_bytes: dispatch_by_terms(
            tokens, top_k, ranks, d_model, value_bytes, **kw)

    return [
        (slip(own=True), "the rows for this rank's own experts stay here: only (ranks - 1)/ranks of "
                         "them cross to other ranks"),
        (slip(slots=False), "each token goes to top_k experts: the dispatch sends N·k rows, "
                            "one per (token, slot)"),
        (slip(both=True), "count the forward dispatch only: the combine sends the outputs back "
                          "in a second all-to-all"),
    ]


def check_dispatch_bytes(answer):
    """Check a dispatch_bytes(tokens, top_k, ranks, d_model, value_bytes) function (chapter: 9)."""
    return check_cases(answer, "dispatch_bytes", tuple(DISPATCH_CASES), dispatch_case_args,
                       expected_dispatch_bytes, dispatch_slips, pair=False,
                       counted=COUNTED_DISPATCH_CASES, counted_word="counted", show=_show)


# ------------------------------------------------------------ 9.4 the capacity factor


@functools.cache
def _capacity_layer() -> tuple[MoE, torch.Tensor]:
    cfg = get_config(CAPACITY_JOB["model"])
    torch.manual_seed(CAPACITY_JOB["seed"])
    layer = MoE(cfg.d_model, cfg.moe)
    x = torch.randn(CAPACITY_JOB["batch_size"], CAPACITY_JOB["seq_len"], cfg.d_model)
    HotExpert(CAPACITY_JOB["hot_logit"])(layer)  # expert 0's logit raised a little
    return layer, x


def measured_rows() -> tuple[int, ...]:
    """Rows per expert the block routes for :data:`CAPACITY_JOB`'s batch, measured (chapter: 9)."""
    return measured_drops(None)[1]


@functools.cache
def measured_drops(capacity_factor: float | None) -> tuple[int, tuple[int, ...]]:
    """(rows dropped, rows routed per expert) of the block run at ``capacity_factor`` (chapter: 9)."""
    if capacity_factor is not None and not capacity_factor > 0:
        raise MemlabError(f"capacity_factor must be a positive number, got {capacity_factor!r}")
    layer, x = _capacity_layer()
    layer.moe = replace(layer.moe, capacity_factor=capacity_factor)
    with torch.no_grad():
        layer(x)
    return layer.dropped, tuple(layer.rows)


def capacity_tokens() -> int:
    """N, the tokens of :data:`CAPACITY_JOB`'s batch (chapter: 9)."""
    return CAPACITY_JOB["batch_size"] * CAPACITY_JOB["seq_len"]


def _smallest_factor(rows_needed: int, rows_of: Callable[[float], int]) -> float:
    """The smallest multiple of CAPACITY_STEP whose capacity holds ``rows_needed`` rows."""
    j = 1
    while rows_of(round(j * CAPACITY_STEP, 10)) < rows_needed:
        j += 1
    return round(j * CAPACITY_STEP, 10)


def fewest_drops_factor() -> float:
    """The smallest capacity factor, a multiple of CAPACITY_STEP, that drops no row (chapter: 9)."""
    m = get_config(CAPACITY_JOB["model"]).moe
    N = capacity_tokens()
    return _smallest_factor(max(measured_rows()), lambda c: replace(m, capacity_factor=c).capacity(N))


def capacity_slips() -> list[tuple[float, str]]:
    """The answers typical reckonings give for exercise 9.4, each with its hint (chapter: 9)."""
    m = get_config(CAPACITY_JOB["model"]).moe
    N, rows = capacity_tokens(), measured_rows()
    right = fewest_drops_factor()
    picks = [
        (_smallest_factor(max(rows), lambda c: math.ceil(c * N / m.experts)),
         "the capacity counts rows, N·k of them shared by E experts: ceil(c·N·k/E)"),
        (1.0, "a capacity factor of 1 holds the mean, N·k/E rows: the busiest expert gets more"),
        (_smallest_factor(sorted(rows)[-2], lambda c: replace(m, capacity_factor=c).capacity(N)),
         "size the capacity for the busiest expert, not the second"),
    ]
    return [(c, hint) for c, hint in picks if not math.isclose(c, right)]


def check_capacity_answer(answer):
    """Check the smallest capacity factor that drops no row of the measured routing (chapter: 9)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a capacity factor, a number, got {type(answer).__name__}"
    steps = got / CAPACITY_STEP
    if not got > 0 or abs(steps - round(steps)) > 1e-9:
        return False, f"answer a positive multiple of {CAPACITY_STEP}, got {got:g}"
    got = round(round(steps) * CAPACITY_STEP, 10)
    right = fewest_drops_factor()
    if math.isclose(got, right):
        return True
    hint = named_slip(got, capacity_slips(), 1e-9)
    dropped = measured_drops(got)[0]
    why = (f"at c = {got:g} the block drops {dropped} rows (measured)" if dropped
           else f"c = {got:g} drops no row, but a smaller factor drops none either")
    return False, why + (f": {hint}" if hint else "")


lab = define_lab("lab09", "Mixture of experts")

lab.exercise(
    "9.1",
    "a moe_parameters(cfg) function giving an MoE model's total and active parameters",
    check=check_moe_parameters,
)
lab.exercise(
    "9.2",
    "a rank_parameter_bytes(cfg, ranks, param_bytes) function giving the weights one rank of "
    "expert parallelism holds",
    check=check_rank_bytes,
)
lab.exercise(
    "9.3",
    "a dispatch_bytes(tokens, top_k, ranks, d_model, value_bytes) function giving the bytes one "
    "rank's forward dispatch sends to the other ranks",
    check=check_dispatch_bytes,
)
lab.exercise(
    "9.4",
    "the smallest capacity factor that drops no row of the measured routing",
    check=check_capacity_answer,
    dimensionless=True,
)
