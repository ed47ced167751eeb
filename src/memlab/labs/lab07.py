"""Lab 7, "Trading compute for memory": a training step's FLOPs from its config, what
checkpointing every k-th block saves and costs, the micro-batch whose traced peak fits a memory
budget, and the set-up a memory planner says is cheapest.

Every expected value is computed at check time, never typed in: the FLOPs with
:func:`memlab.compute.flops.step_flops` and, for one small case, PyTorch's ``FlopCounterMode``
itself (:func:`memlab.measure.step.trace_step` with ``count_flops=True``); the saved bytes with
:func:`memlab.memory.estimator.estimate` and the recomputed FLOPs with ``step_flops``'s
``recompute`` (PyTorch's early stop on); the micro-batch from the peak of each micro-batch's
step with its accumulation, traced by ``trace_step``; the set-up with
:func:`memlab.compute.plan.plan_training`. Each hint names one mistake and fires only on the
answer that mistake gives, computed from the same numbers the check compares with; a wrong answer
no slip explains is told what is wrong with it, never the recipe. The notebook imports none of the
functions a check compares with.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence

from memlab.compute.flops import ATTENTION_BACKWARD, matmul_parameters, step_flops
from memlab.compute.plan import MemoryPlan, PlanRow, plan_training
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.labs.grader import (
    answer_number,
    answers_on_cases,
    best_slip,
    close_to,
    define_lab,
    fit_problem,
    merged_slips,
    off_by,
    two_numbers,
)
from memlab.measure.step import StepMemory, trace_step
from memlab.memory.activations import saved_tensors
from memlab.memory.estimator import estimate
from memlab.model.config import PRECISIONS, ModelConfig, get_config
from memlab.units import to_unit

# Exercise 7.1: configs of both styles, with and without GQA, at several sequence lengths;
# COUNTED_CASE is also traced under FlopCounterMode when the check runs.
FLOP_CASES = {
    "gpt2, batch 8 x 1024": dict(model="gpt2", batch_size=8, seq_len=1024),
    "llama2-7b, batch 1 x 4096": dict(model="llama2-7b", batch_size=1, seq_len=4096),
    "llama3-8b (GQA), batch 1 x 8192": dict(model="llama3-8b", batch_size=1, seq_len=8192),
    "llama-1b (GQA), batch 4 x 512": dict(model="llama-1b", batch_size=4, seq_len=512),
    "tiny (GQA), batch 2 x 32": dict(model="tiny", batch_size=2, seq_len=32),
}
COUNTED_CASE = "tiny (GQA), batch 2 x 32"
FLOP_RTOL = 1e-9  # FLOPs are whole numbers; a float computed on the way is fine

# Exercise 7.2: checkpointing every k-th block, for numbers of blocks k does not divide, for
# k = 1 (every block) and for k = L (block 0 only), in several precisions.
EVERY_K_CASES = {
    "llama2-7b, 1 x 4096, bf16-mixed, k=3": dict(model="llama2-7b", batch_size=1, seq_len=4096,
                                                 k=3, precision="bf16-mixed"),
    "gpt2, 8 x 1024, fp32, k=5": dict(model="gpt2", batch_size=8, seq_len=1024, k=5,
                                      precision="fp32"),
    "llama-1b, 4 x 2048, bf16-mixed, k=4": dict(model="llama-1b", batch_size=4, seq_len=2048,
                                                k=4, precision="bf16-mixed"),
    "llama3-8b, 1 x 8192, bf16, k=32": dict(model="llama3-8b", batch_size=1, seq_len=8192,
                                            k=32, precision="bf16"),
    "gpt2, 4 x 1024, bf16-mixed, k=1": dict(model="gpt2", batch_size=4, seq_len=1024, k=1,
                                            precision="bf16-mixed"),
}
PIECES = ("block", "block input", "outside the blocks")  # the keys of saved_pieces

# Exercise 7.3: a global batch of sequences per optimizer step, run as micro-batches whose
# gradients accumulate (fp32, AdamW, no checkpointing). The notebook shows the whole batch's step,
# traced; the answer is the largest micro-batch dividing the global batch whose step, with its
# accumulation, has a traced peak within the budget: MICRO_BUDGET_SHARE of the whole step's
# peak, where the accumulated gradients decide, and the answer is not a power of two.
MICRO_JOB = dict(model="tiny", global_batch=12, seq_len=64, precision="fp32")
MICRO_BUDGET_SHARE = 0.43

# Exercise 7.4: small planner calls (few GPU counts), and the most GPUs a set-up may use.
PLAN_GPU_COUNTS = (1, 2, 4, 8)
PLAN_CASES = {
    "llama2-7b on A100-80GB, up to 8 GPUs": dict(model="llama2-7b", gpu="A100-80GB",
                                                 global_batch=64, seq_len=4096, max_gpus=8),
    "llama2-7b on A100-80GB, 1 GPU": dict(model="llama2-7b", gpu="A100-80GB", global_batch=64,
                                          seq_len=4096, max_gpus=1),
    "llama-1b on A100-40GB, up to 8 GPUs": dict(model="llama-1b", gpu="A100-40GB",
                                                global_batch=64, seq_len=2048, max_gpus=8),
}
SENTENCE_DIGITS = 1  # the sentence's numbers: GiB and GPU-seconds to one decimal


def _show(value) -> str:
    if isinstance(value, ModelConfig):
        return f"<{value.name} config>"
    if isinstance(value, MemoryPlan):
        return f"<plan for {value.model} on {value.gpu}>"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


# ------------------------------------------------------------ 7.1 FLOPs from the config


def flop_case_args(case: str) -> dict:
    """Exercise 7.1's arguments of a :data:`FLOP_CASES` case: cfg, batch_size, seq_len (chapter: 7)."""
    check_choice("case", case, FLOP_CASES)
    c = FLOP_CASES[case]
    return dict(cfg=get_config(c["model"]), batch_size=c["batch_size"], seq_len=c["seq_len"])


def reference_step_flops(cfg: ModelConfig, batch_size: int, seq_len: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of one training step as PyTorch's counter counts them (chapter: 7).

    From :func:`step_flops`.
    """
    f = step_flops(cfg, batch_size=batch_size, seq_len=seq_len)
    return f.forward, f.backward


@functools.cache
def counted_step_flops(case: str = COUNTED_CASE) -> tuple[int, int]:
    """(forward, backward) FLOPs of one case of :data:`FLOP_CASES` (chapter: 7).

    Counted by FlopCounterMode on fake tensors.
    """
    args = flop_case_args(case)
    traced = trace_step(args["cfg"], batch_size=args["batch_size"], seq_len=args["seq_len"],
                        count_flops=True)
    return traced.flops_by_phase["forward"], traced.flops_by_phase["backward"]


def expected_step_flops(case: str) -> tuple[int, int]:
    """What exercise 7.1 expects for one case (chapter: 7).

    The counter's count for :data:`COUNTED_CASE`, step_flops' for the others.
    """
    if case == COUNTED_CASE:
        return counted_step_flops(case)
    return reference_step_flops(**flop_case_args(case))


def flops_by_terms(cfg: ModelConfig, batch_size: int, seq_len: int, *, attention: float = 1.0,
                   head: bool = True, attention_backward: float | None = None,
                   kv_heads: int | None = None, mlp_matrices: int | None = None,
                   every_parameter: bool = False) -> tuple[int, int]:
    """(forward, backward) FLOPs term by term, each term switchable (chapter: 7).

    The right count and its typical slips.

    ``attention`` scales the attention term (0: left out, 0.5: causal halving);
    ``attention_backward`` replaces SDPA's backward-over-forward ratio; ``kv_heads`` and
    ``mlp_matrices`` replace the config's; ``every_parameter`` counts 2 and 4 FLOPs per
    parameter (embeddings, norms and biases included) per token, 6ND's reading.
    """
    if attention_backward is None and cfg.attention not in ATTENTION_BACKWARD:
        raise MemlabError(f"attention {cfg.attention!r} has no counted backward ratio; accepted: "
                          f"{', '.join(ATTENTION_BACKWARD)}, or pass attention_backward")
    B, T = batch_size, seq_len
    BT = B * T
    if every_parameter:
        n = cfg.num_parameters()
        return 2 * BT * n, 4 * BT * n
    C, L, V, nh, hs, F = (cfg.d_model, cfg.n_layer, cfg.vocab_size, cfg.n_head, cfg.head_dim,
                          cfg.ffn_dim)
    kv = (cfg.kv_heads if kv_heads is None else kv_heads) * hs
    mats = (2 if cfg.style == "gpt2" else 3) if mlp_matrices is None else mlp_matrices
    linear = 2 * BT * L * (C * nh * hs + 2 * C * kv + nh * hs * C + mats * C * F)
    head_f = 2 * BT * C * V if head else 0
    att = attention * L * 2 * (2 * B * nh * T * T * hs)  # q k^T and att v
    ratio = ATTENTION_BACKWARD[cfg.attention] if attention_backward is None else attention_backward
    return round(linear + att + head_f), round(2 * linear + ratio * att + 2 * head_f)


def flop_slips() -> list[tuple[Callable, str]]:
    """Typical wrong step_flops_from_config functions, each with its hint (chapter: 7)."""
    def slip(**kw):
        return lambda cfg, batch_size, seq_len: flops_by_terms(cfg, batch_size, seq_len, **kw)

    return [
        (slip(attention=0.0), "add attention's two matmuls in every block: the scores q k^T "
                              "and the weighted values, each 2·B·nh·T·T·hs FLOPs forward; they "
                              "have no weights, so a parameter count misses them"),
        (slip(head=False), "count the head's matmul, 2·B·T·C·V FLOPs forward (a tied head is "
                           "still a matmul)"),
        (slip(attention_backward=2.0), "SDPA's backward counts 2.5x its forward, not 2x: its "
                                       "formula recomputes the scores (5 matmuls against 2); "
                                       "2x is a plain matmul's, and PaLM's 12LCT"),
        (slip(attention=0.5), "the counter counts the whole T x T square: the causal mask does "
                              "not halve the count"),
        (slip(every_parameter=True), "count the parameters a token multiplies "
                                     "(matmul_parameters): embedding lookups, norms and biases "
                                     "are no matmuls; 6ND with every parameter overcounts"),
        (lambda cfg, batch_size, seq_len: flops_by_terms(cfg, batch_size, seq_len,
                                                         kv_heads=cfg.n_head),
         "with GQA, k_proj and v_proj have n_kv_head heads of hs, not n_head"),
        (lambda cfg, batch_size, seq_len: flops_by_terms(
            cfg, batch_size, seq_len, mlp_matrices=5 - (2 if cfg.style == "gpt2" else 3)),
         "GPT-2's MLP has two matrices (c_fc, c_proj), Llama's SwiGLU three (gate, up, down)"),
        (lambda cfg, batch_size, seq_len: reference_step_flops(cfg, batch_size, seq_len)[::-1],
         "return (forward, backward), in that order"),
    ]


def _same_pair(a, b, rtol: float = FLOP_RTOL) -> bool:
    return a is not None and all(close_to(x, y, rtol) for x, y in zip(a, b, strict=True))


def _which_wrong(got: tuple[float, float], expected: tuple[int, int], rtol: float,
                 names: tuple[str, str]) -> str:
    ok = [close_to(g, e, rtol) for g, e in zip(got, expected, strict=True)]
    off = [off_by(g, e) for g, e in zip(got, expected, strict=True)]
    if ok[0] and not ok[1]:
        return f"its {names[0]} is right, its {names[1]} is {off[1]}"
    if ok[1] and not ok[0]:
        return f"its {names[1]} is right, its {names[0]} is {off[0]}"
    return f"its {names[0]} is {off[0]}, its {names[1]} {off[1]}"


def check_step_flops(answer, rtol: float = FLOP_RTOL):
    """Check a step_flops_from_config(cfg, batch_size, seq_len) function (chapter: 7).

    It is held to step_flops and the counter.
    """
    if not callable(answer):
        return False, (f"answer the function step_flops_from_config itself, got "
                       f"{type(answer).__name__}")
    results, verdict = answers_on_cases(answer, FLOP_CASES, flop_case_args, "step_flops_from_config",
                                        show=_show)
    if verdict is not ...:
        return verdict
    wrong = []
    for case, out in results.items():
        got = two_numbers(out)
        if got is None:
            return False, (f"step_flops_from_config on {case!r} returned {type(out).__name__}: "
                           "return two numbers, (forward, backward) FLOPs")
        expected = expected_step_flops(case)
        if not _same_pair(got, expected, rtol):
            wrong.append((case, got, expected))
    if not wrong:
        return True
    first, got, expected = wrong[0]
    hint = best_slip([(flop_case_args(c), g) for c, g, _ in wrong], flop_slips(),
                     lambda a, b: _same_pair(a, b, rtol))
    counted = " (counted by FlopCounterMode)" if first == COUNTED_CASE else ""
    return False, (f"{len(wrong)} of {len(FLOP_CASES)} cases not right, the first {first!r}"
                   f"{counted}: {_which_wrong(got, expected, rtol, ('forward', 'backward'))}"
                   + (f"; {hint}" if hint else ""))


# ------------------------------------------------ 7.2 checkpointing every k-th block


def every_k_args(case: str) -> dict:
    """The arguments exercise 7.2 passes for one case of :data:`EVERY_K_CASES` (chapter: 7).

    cfg, batch_size, seq_len, k, precision.
    """
    check_choice("case", case, EVERY_K_CASES)
    c = dict(EVERY_K_CASES[case])
    return dict(cfg=get_config(c.pop("model")), **c)


def saved_pieces(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str) -> dict[str, int]:
    """Bytes of :data:`PIECES` (chapter: 7).

    What one block saves, one block's input, what is saved outside the blocks.

    From :func:`memlab.memory.activations.saved_tensors`: a block's full list without
    checkpointing; the input a checkpointed block keeps, and what the step saves once (the final
    norm, the head's log-softmax, the loss, RoPE tables or positions), from the list with
    every block checkpointed.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, PRECISIONS)
    none = saved_tensors(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                         checkpointing=False)
    full = saved_tensors(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                         checkpointing=True)
    return {"block": sum(t.bytes for t in none if t.scope == "layer"),
            "block input": sum(t.bytes for t in full if t.scope == "layer"),
            "outside the blocks": sum(t.bytes for t in full if t.scope in ("model", "head"))}


def reference_every_k(cfg: ModelConfig, batch_size: int, seq_len: int, k: int,
                      precision: str) -> tuple[int, int]:
    """(saved activation bytes, recomputed FLOPs) of checkpointing every k-th block (chapter: 7).

    From estimate and step_flops.
    """
    check_positive_int("k", k)
    plan = f"every-{k}"
    saved = estimate(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                     checkpointing=plan).saved_activations_bytes
    extra = step_flops(cfg, batch_size=batch_size, seq_len=seq_len, checkpointing=plan).recompute
    return saved, extra


def _block_forward(cfg: ModelConfig, B: int, T: int) -> tuple[int, int]:
    """Forward FLOPs of one block, and of its last matmul (down_proj or c_proj)."""
    C, V = cfg.d_model, cfg.vocab_size
    linear = 2 * B * T * (matmul_parameters(cfg) - C * V) // cfg.n_layer
    return linear + 4 * B * cfg.n_head * T * T * cfg.head_dim, 2 * B * T * cfg.ffn_dim * C


def every_k_byte_slips() -> list[tuple[Callable, str]]:
    """Typical wrong saved-bytes answers of exercise 7.2, per case, with hints (chapter: 7)."""
    def pieces(cfg, batch_size, seq_len, precision):
        p = saved_pieces(cfg, batch_size, seq_len, precision)
        return p["block"], p["block input"], p["outside the blocks"]

    def rule(kept: Callable[[int, int], int], outside=True, swap=False):
        def fn(cfg, batch_size, seq_len, k, precision):
            block, x, out = pieces(cfg, batch_size, seq_len, precision)
            n, L = kept(cfg.n_layer, k), cfg.n_layer
            if swap:
                block, x = x, block
            return (out if outside else 0) + n * x + (L - n) * block
        return fn

    def plan(name):
        return lambda cfg, batch_size, seq_len, k, precision: estimate(
            cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
            checkpointing=name(k)).saved_activations_bytes

    return [
        (rule(lambda L, k: L // k), "the checkpointed blocks are 0, k, 2k, ...: ceil(L / k) "
                                    "of them, not L // k"),
        (rule(lambda L, k: -(-L // k), outside=False),
         "add what is saved outside the blocks, once: the final norm, the head's "
         "log-softmax, the loss (saved_pieces' 'outside the blocks')"),
        (plan(lambda k: True), "only every k-th block is checkpointed: the others keep their "
                               "full list"),
        (plan(lambda k: f"segments-{k}"), "that is segments of k blocks (segments-k), each "
                                          "recomputed whole from one saved input; every-k "
                                          "checkpoints single blocks and the others keep "
                                          "everything"),
        (rule(lambda L, k: -(-L // k), swap=True), "it is the checkpointed blocks that keep "
                                                   "only their input; the others keep their "
                                                   "full list"),
        (lambda cfg, batch_size, seq_len, k, precision: reference_every_k(
            cfg, batch_size, seq_len, k, precision)[0] / 2**30, "answer bytes, not GiB"),
    ]


def every_k_flop_slips() -> list[tuple[Callable, str]]:
    """Typical wrong recomputed-FLOPs answers of exercise 7.2, per case, with hints (chapter: 7)."""
    def rule(kept: Callable[[int, int], int], early_stop=True, head=False):
        def fn(cfg, batch_size, seq_len, k, precision):
            block, last = _block_forward(cfg, batch_size, seq_len)
            n = kept(cfg.n_layer, k)
            extra = n * (block - (last if early_stop else 0))
            return extra + (2 * batch_size * seq_len * cfg.d_model * cfg.vocab_size if head
                            else 0)
        return fn

    def ceil(L, k):
        return -(-L // k)

    return [
        (rule(ceil, early_stop=False), "PyTorch's checkpoint stops recomputing early: once the "
                                       "tensors the backward needs are back, it stops, so each "
                                       "checkpointed block's last matmul (down_proj, GPT-2's "
                                       "c_proj) is not run again"),
        (rule(lambda L, k: L // k), "the checkpointed blocks are 0, k, 2k, ...: ceil(L / k) of "
                                    "them, not L // k"),
        (rule(lambda L, k: L // k, early_stop=False),
         "ceil(L / k) checkpointed blocks, not L // k; and the recomputation stops early, "
         "before each block's last matmul"),
        (rule(ceil, head=True), "the head is not checkpointed: nothing recomputes it"),
        (lambda cfg, batch_size, seq_len, k, precision: step_flops(
            cfg, batch_size=batch_size, seq_len=seq_len,
            checkpointing=f"segments-{k}").recompute,
         "that is segments of k blocks (segments-k); every-k recomputes the k-th blocks only"),
        (lambda cfg, batch_size, seq_len, k, precision: step_flops(
            cfg, batch_size=batch_size, seq_len=seq_len).forward,
         "not one whole extra forward: only the checkpointed blocks run again"),
    ]


def check_every_k(answer, rtol: float = FLOP_RTOL):
    """Check an every_k_prediction(cfg, batch_size, seq_len, k, precision) function (chapter: 7).

    It is held to estimate and step_flops.
    """
    if not callable(answer):
        return False, f"answer the function every_k_prediction itself, got {type(answer).__name__}"
    results, verdict = answers_on_cases(answer, EVERY_K_CASES, every_k_args, "every_k_prediction",
                                        show=_show)
    if verdict is not ...:
        return verdict
    wrong = {0: [], 1: []}  # by element: saved bytes, recomputed FLOPs
    first = None
    for case, out in results.items():
        got = two_numbers(out)
        if got is None:
            return False, (f"every_k_prediction on {case!r} returned {type(out).__name__}: "
                           "return two numbers, (saved activation bytes, extra FLOPs)")
        expected = reference_every_k(**every_k_args(case))
        tols = (1e-12, rtol)  # bytes exact
        bad = [i for i in (0, 1) if not close_to(got[i], expected[i], tols[i])]
        for i in bad:
            wrong[i].append((every_k_args(case), got[i]))
        if bad and first is None:
            first = (case, bad)
    if first is None:
        return True
    n_wrong = sum(1 for case, out in results.items()
                  if not _same_pair(two_numbers(out), reference_every_k(**every_k_args(case)), rtol))
    parts = []
    for i, (name, slips, tol) in enumerate((("saved bytes", every_k_byte_slips(), 1e-12),
                                            ("extra FLOPs", every_k_flop_slips(), rtol))):
        if wrong[i]:
            hint = best_slip(wrong[i], slips, lambda a, b, tol=tol: close_to(a, b, tol))
            if not hint:
                args, got = wrong[i][0]
                hint = f"the first {off_by(got, reference_every_k(**args)[i])}"
            parts.append(f"the {name} are not right in {len(wrong[i])} case(s) ({hint})")
    return False, (f"{n_wrong} of {len(EVERY_K_CASES)} cases not right, the first "
                   f"{first[0]!r}: " + "; ".join(parts))


# ------------------------------------------------- 7.3 micro-batch and accumulation


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, largest first (chapter: 7)."""
    check_positive_int("n", n)
    return [d for d in range(n, 0, -1) if n % d == 0]


@functools.cache
def traced_micro_step(micro_batch: int) -> StepMemory:
    """:data:`MICRO_JOB`'s step as micro-batches of ``micro_batch`` sequences, traced (chapter: 7).

    With global_batch // micro_batch accumulation steps; on fake tensors.
    """
    G = MICRO_JOB["global_batch"]
    if micro_batch not in divisors(G):
        raise MemlabError(f"micro_batch must divide the global batch {G}, got {micro_batch!r}; "
                          f"accepted: {', '.join(map(str, divisors(G)))}")
    return trace_step(MICRO_JOB["model"], batch_size=micro_batch, seq_len=MICRO_JOB["seq_len"],
                      precision=MICRO_JOB["precision"], grad_accum_steps=G // micro_batch)


def whole_batch_step() -> StepMemory:
    """The step exercise 7.3 shows: the whole global batch at once, no accumulation (chapter: 7)."""
    return traced_micro_step(MICRO_JOB["global_batch"])


def micro_budget_bytes() -> int:
    """The budget of exercise 7.3: :data:`MICRO_BUDGET_SHARE` of the whole step's peak (chapter: 7)."""
    return int(MICRO_BUDGET_SHARE * whole_batch_step().peak_bytes)


def largest_micro_batch(budget: int | None = None) -> int | None:
    """The largest micro-batch dividing the global batch whose traced peak fits (chapter: 7).

    ``budget`` defaults to :func:`micro_budget_bytes`; None when not even one sequence fits.
    """
    budget = micro_budget_bytes() if budget is None else budget
    return next((m for m in divisors(MICRO_JOB["global_batch"])
                 if traced_micro_step(m).peak_bytes <= budget), None)


def micro_slips() -> list[tuple[float, str]]:
    """The answers typical reckonings give for exercise 7.3, each with its hint (chapter: 7).

    Each reckons a micro-batch's peak from the whole step's trace in its own wrong way, or
    searches the traced peaks wrongly; none equals the right answer.
    """
    whole, budget = whole_batch_step(), micro_budget_bytes()
    G = MICRO_JOB["global_batch"]
    at = whole.phase_breakdown[whole.peak_phase]
    fixed = at["parameters"] + at["optimizer_states"]
    per_sequence = (whole.peak_bytes - fixed) / G
    ds = divisors(G)

    def largest(fits, candidates=ds) -> int | None:
        return next((m for m in candidates if fits(m)), None)

    expected = largest_micro_batch(budget)
    picks = [
        (largest(lambda m: fixed + per_sequence * m <= budget),
         "while gradients accumulate, the earlier micro-batches' gradients stay alive through "
         "the next forward and backward passes: they are on top of the micro-batch's "
         "activations"),
        (largest(lambda m: whole.peak_bytes * m / G <= budget),
         "only the activations and temporaries shrink with the micro-batch: the weights and "
         "AdamW's states stay whole"),
        (largest(lambda m: traced_micro_step(m).peak_bytes <= budget,
                 [d for d in ds if d & (d - 1) == 0]),
         "any divisor of the global batch will do, not only powers of two"),
        (next((m for m in reversed(ds) if traced_micro_step(m).peak_bytes <= budget), None),
         "the largest micro-batch that fits, not the smallest: fewer, larger micro-batches keep "
         "the GPU busier for the same global batch"),
    ]
    return merged_slips([(-1.0 if m is None else float(m), hint) for m, hint in picks
                         if m != expected])


def check_micro_batch(answer):
    """Check the predicted largest micro-batch whose traced step fits the budget (chapter: 7)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a micro-batch, a number of sequences, got {type(answer).__name__}"
    G = MICRO_JOB["global_batch"]
    if got != int(got) or int(got) not in divisors(G):
        return False, (f"the micro-batch must divide the global batch ({G}) so that micro-batch "
                       f"x accumulation steps is the global batch; got {got:g}")
    budget = micro_budget_bytes()
    return fit_problem(
        int(got), largest_micro_batch(budget), budget=budget, slips=micro_slips,
        peak=lambda m: traced_micro_step(m).peak_bytes,
        over="at micro-batch {count} the traced peak is {peak:,} bytes, more than the budget of "
             "{budget:,}",
        under="micro-batch {count} fits, but a larger one fits too")


# ----------------------------------------------------------------- 7.4 the planner


@functools.cache
def lab_plan(model: str, gpu: str, global_batch: int, seq_len: int) -> MemoryPlan:
    """The planner's set-ups for one case of :data:`PLAN_CASES` (chapter: 7).

    On :data:`PLAN_GPU_COUNTS` GPUs.
    """
    return plan_training(model, gpu, global_batch=global_batch, seq_len=seq_len,
                         gpu_counts=PLAN_GPU_COUNTS)


def plan_case_args(case: str) -> dict:
    """The arguments exercise 7.4 passes for one case of :data:`PLAN_CASES`: plan, max_gpus (chapter: 7)."""
    check_choice("case", case, PLAN_CASES)
    c = PLAN_CASES[case]
    return dict(plan=lab_plan(c["model"], c["gpu"], c["global_batch"], c["seq_len"]),
                max_gpus=c["max_gpus"])


def _qualifies(row: PlanRow, max_gpus: int) -> bool:
    return row.trains == "full" and row.gpus <= max_gpus


def reference_setup(plan: MemoryPlan, max_gpus: int) -> PlanRow:
    """The cheapest row of the plan that trains the full model on at most ``max_gpus`` GPUs (chapter: 7)."""
    check_positive_int("max_gpus", max_gpus)
    row = next((r for r in plan.rows if _qualifies(r, max_gpus)), None)
    if row is None:
        raise MemlabError(f"no set-up training the full model fits {plan.gpu} on at most "
                          f"{max_gpus} GPUs")
    return row


def justification(row: PlanRow) -> str:
    """A sentence naming a row's per-GPU peak in GiB and its GPU-seconds, to one decimal (chapter: 7)."""
    return (f"{row.label} is the cheapest set-up that trains every weight: an estimated "
            f"{to_unit(row.per_gpu_peak_bytes, 'GiB'):.{SENTENCE_DIGITS}f} GiB per GPU and "
            f"{row.gpu_seconds:.{SENTENCE_DIGITS}f} GPU-seconds per optimizer step.")


def setup_slips() -> list[tuple[Callable, str]]:
    """Typical wrong ways to pick a row of a plan, each with its hint (chapter: 7)."""
    def among(plan, max_gpus, key, limit=True):
        rows = [r for r in plan.rows if r.trains == "full" and (not limit or r.gpus <= max_gpus)]
        return min(rows, key=key) if rows else None

    return [
        (lambda plan, max_gpus: next((r for r in plan.rows if r.gpus <= max_gpus), None),
         "train the full model: LoRA and QLoRA rows train adapters only"),
        (lambda plan, max_gpus: among(plan, max_gpus, lambda r: r.gpu_seconds, limit=False),
         "use at most max_gpus GPUs"),
        (lambda plan, max_gpus: among(plan, max_gpus, lambda r: r.per_gpu_peak_bytes),
         "the cheapest set-up costs the fewest estimated GPU-seconds; the smallest per-GPU peak "
         "is not the criterion"),
        (lambda plan, max_gpus: among(plan, max_gpus, lambda r: r.step_s),
         "the cost is GPU-seconds (gpus x step_s): more GPUs finish a step sooner but cost more"),
        (lambda plan, max_gpus: among(plan, max_gpus, lambda r: -r.gpu_seconds),
         "the rows are sorted cheapest first: take the first that qualifies, not the last"),
    ]


def _as_row(choice, plan: MemoryPlan) -> PlanRow | str:
    """The row a choice names (a label, an index into plan.rows, or a row), or why it names none."""
    if isinstance(choice, PlanRow):
        return choice if choice in plan.rows else "that row is not one of this plan's rows"
    if isinstance(choice, bool):
        return f"answer a row's label or its index in plan.rows, got {choice!r}"
    if isinstance(choice, int) or (answer_number(choice) is not None and not isinstance(choice, str)):
        i = answer_number(choice)
        if i != int(i) or not 0 <= i < len(plan.rows):
            return f"index {choice!r} is not a row of plan.rows (0 to {len(plan.rows) - 1})"
        return plan.rows[int(i)]
    if isinstance(choice, str):
        label = choice.strip().casefold()
        row = next((r for r in plan.rows if r.label.casefold() == label), None)
        return row or f"{choice!r} is not the label of a row of the plan"
    return f"answer a row's label or its index in plan.rows, got {type(choice).__name__}"


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def sentence_problem(sentence, row: PlanRow) -> str:
    """Why a sentence does not give a row's peak and GPU-seconds ('' when it does) (chapter: 7).

    The sentence must give the row's per-GPU peak in GiB and its GPU-seconds to one decimal.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        return f"the second value is a sentence (a string), got {type(sentence).__name__}"
    numbers = [float(n.replace(",", "")) for n in _NUMBER.findall(sentence)]
    tol = 0.5 * 10 ** -SENTENCE_DIGITS + 1e-9

    def said(value):
        return any(abs(n - value) <= tol for n in numbers)

    peak = to_unit(row.per_gpu_peak_bytes, "GiB")
    problems = []
    if not said(peak):
        if said(to_unit(row.per_gpu_peak_bytes, "GB")):
            problems.append("give the per-GPU peak in GiB (2^30 bytes), not GB")
        else:
            problems.append("give its per-GPU peak in GiB, to one decimal")
    elif "GiB" not in sentence:
        problems.append("name the peak's unit, GiB")
    if not said(row.gpu_seconds):
        if said(row.step_s) and not math.isclose(row.step_s, row.gpu_seconds):
            problems.append("give its GPU-seconds (gpus x step_s, gpu_seconds), not the step's "
                            "seconds")
        else:
            problems.append("give its estimated GPU-seconds per step, to one decimal")
    return "; ".join(problems)


def check_setup(answer):
    """Check a pick_setup(plan, max_gpus) function (chapter: 7).

    It must give the cheapest full-training row and a sentence with its numbers.
    """
    if not callable(answer):
        return False, f"answer the function pick_setup itself, got {type(answer).__name__}"
    results, verdict = answers_on_cases(answer, PLAN_CASES, plan_case_args, "pick_setup",
                                        show=_show)
    if verdict is not ...:
        return verdict
    wrong = []
    for case, out in results.items():
        args = plan_case_args(case)
        plan, max_gpus = args["plan"], args["max_gpus"]
        if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence) or len(out) != 2:
            return False, (f"pick_setup on {case!r} returned {type(out).__name__}: return "
                           "(label or index, sentence)")
        choice, sentence = out
        row = _as_row(choice, plan)
        if isinstance(row, str):
            wrong.append(f"{case!r}: {row}")
            continue
        expected = reference_setup(plan, max_gpus)
        if not (_qualifies(row, max_gpus) and close_to(row.gpu_seconds, expected.gpu_seconds,
                                                       1e-12)):
            hint = next((h for fn, h in setup_slips() if fn(plan, max_gpus) == row), "")
            if not hint:
                hint = ("that row does not train the full model" if row.trains != "full" else
                        f"that row uses {row.gpus} GPUs, more than {max_gpus}"
                        if row.gpus > max_gpus else
                        "a row that qualifies costs fewer GPU-seconds")
            wrong.append(f"{case!r}: {hint}")
            continue
        why = sentence_problem(sentence, row)
        if why:
            wrong.append(f"{case!r}: the row is right, the sentence is not: {why}")
    if not wrong:
        return True
    return False, f"{len(wrong)} of {len(PLAN_CASES)} not right: " + "; ".join(wrong)


lab = define_lab("lab07", "Trading compute for memory")

lab.exercise(
    "7.1",
    "a step_flops_from_config(cfg, batch_size, seq_len) function giving a training step's "
    "(forward, backward) FLOPs as PyTorch's FlopCounterMode counts them",
    check=check_step_flops,
    rtol=FLOP_RTOL,
)
lab.exercise(
    "7.2",
    "an every_k_prediction(cfg, batch_size, seq_len, k, precision) function giving the saved "
    "activation bytes and the recomputed FLOPs of checkpointing every k-th block",
    check=check_every_k,
    rtol=FLOP_RTOL,
)
lab.exercise(
    "7.3",
    "the largest micro-batch dividing the global batch whose step, with its gradient "
    "accumulation, has a traced peak within the budget, predicted from the whole batch's step",
    check=check_micro_batch,
    dimensionless=True,
)
lab.exercise(
    "7.4",
    "a pick_setup(plan, max_gpus) function: the cheapest row training the full model on at most "
    "max_gpus GPUs, and a sentence giving its per-GPU peak in GiB and its GPU-seconds",
    check=check_setup,
    dimensionless=True,
)
