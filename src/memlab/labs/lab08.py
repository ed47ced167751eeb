"""Lab 8, "Long context and large vocabularies": the bytes the LM head and the loss hold, the
number of loss chunks whose traced forward pass fits a budget, the host bytes of offloaded
activations, and the state bytes of Adafactor.

Every expected value is computed at check time, never typed in: the head's bytes with
:func:`memlab.memory.activations.head_peaks` and, for one small case, the traced backward pass
(:func:`memlab.measure.step.trace_step`: the temporaries at its peak are the head's two fp32
gradients); the loss chunks from ``trace_step(..., loss_chunks=K)`` at each K; the host bytes
from a real step with ``offload_activations=True`` (:func:`memlab.measure.step.measure_step`,
its ``offloaded["host_bytes"]``); Adafactor's bytes from ``torch.optim.Adafactor``'s own state
after one step (:func:`memlab.longcontext.optimizers.measured_state_bytes`). Each hint names one
mistake and fires only on the answer that mistake gives, computed from the same numbers the
check compares with; a wrong answer no slip explains is told how far off it is, never the
recipe. The notebook imports none of the functions a check compares with.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from memlab.errors import MemlabError, check_choice
from memlab.labs.cases import check_cases
from memlab.labs.grader import (
    answer_number,
    define_lab,
    fit_problem,
    merged_slips,
)
from memlab.longcontext.context_parallel import fake_ring, ring_rank_bytes
from memlab.longcontext.optimizers import measured_state_bytes
from memlab.measure.step import (
    StepMemory,
    default_dtype,
    measure_step,
    param_dtype,
    trace_step,
)
from memlab.memory.activations import COMPUTE_BYTES, head_peaks
from memlab.memory.context import kv_bytes_sent_per_step
from memlab.model.config import ModelConfig, get_config
from memlab.model.transformer import build_model

# Exercise 8.1: the head's bytes for the chapter's presets at long context, and one small case
# whose backward half is also traced (the temporaries at the traced backward peak).
HEAD_CASES = {
    "llama3.1-8b, 1 x 8192, bf16-mixed": dict(model="llama3.1-8b", batch_size=1, seq_len=8192,
                                              precision="bf16-mixed"),
    "qwen2.5-7b, 1 x 4096, bf16": dict(model="qwen2.5-7b", batch_size=1, seq_len=4096,
                                       precision="bf16"),
    "gpt2, 8 x 1024, fp32": dict(model="gpt2", batch_size=8, seq_len=1024, precision="fp32"),
    "tiny, 2 x 64, bf16-mixed": dict(model="tiny", batch_size=2, seq_len=64,
                                     precision="bf16-mixed"),
}
TRACED_HEAD_CASE = "tiny, 2 x 64, bf16-mixed"
OLD_VOCAB_MODEL = "llama2-7b"  # a 32k vocabulary: the slip of taking another model's V

# Exercise 8.2: a small model with a large vocabulary, so that the head decides the forward
# peak; the budget is LOSS_BUDGET_SHARE of the unchunked step's traced forward peak, and the
# smallest K that fits it is not a power of two.
LOSS_JOB = dict(model="tiny", vocab_size=8192, batch_size=2, seq_len=128,
                precision="bf16-mixed")
LOSS_BUDGET_SHARE = 0.52
MAX_LOSS_CHUNKS = 16  # the search stops here; the answer is well below it

# Exercise 8.3: checkpointed steps with activation offloading, measured on real tensors.
OFFLOAD_CASES = {
    "tiny, 2 x 64, bf16-mixed": dict(model="tiny", batch_size=2, seq_len=64,
                                     precision="bf16-mixed"),
    "tiny, 2 x 64, bf16": dict(model="tiny", batch_size=2, seq_len=64, precision="bf16"),
    "tiny-gpt2, 4 x 32, fp32": dict(model="tiny-gpt2", batch_size=4, seq_len=32,
                                    precision="fp32"),
    "tiny, 1 x 128, fp16-mixed": dict(model="tiny", batch_size=1, seq_len=128,
                                      precision="fp16-mixed"),
}

# Exercise 8.4: torch.optim.Adafactor's state after one step, for small models built on the CPU.
ADAFACTOR_CASES = {
    "tiny, fp32": dict(model="tiny", precision="fp32"),
    "tiny, bf16": dict(model="tiny", precision="bf16"),
    "tiny-gpt2, fp32": dict(model="tiny-gpt2", precision="fp32"),
}
PARAM_BYTES = {"fp32": 4, "bf16": 2}  # what 8.4's cases store their parameters in

# Exercise 8.5: one rank's ring attention over N ranks, one attention layer's forward and
# backward; the small cases run over a fake process group and count the bytes sent, the last
# is Llama 3.1 8B's layer at 128k tokens over 8 ranks, by formula.
RING_CASES = {
    "4 ranks, fp32": dict(batch=2, heads=4, kv_heads=2, tokens_per_rank=16, head_dim=8,
                          dtype="fp32"),
    "2 ranks, bf16": dict(batch=2, heads=4, kv_heads=2, tokens_per_rank=16, head_dim=8,
                          dtype="bf16"),
    "8 ranks, bf16": dict(batch=1, heads=4, kv_heads=1, tokens_per_rank=8, head_dim=16,
                          dtype="bf16"),
}
RING_WORLDS = {"4 ranks, fp32": 4, "2 ranks, bf16": 2, "8 ranks, bf16": 8}
RING_FORMULA_CASE = dict(model="llama3.1-8b", seq_len=131072, world=8, dtype="bf16")
RING_FORMULA_NAME = "llama3.1-8b, 1 x 131072 over 8 ranks, bf16"


def _show(value) -> str:
    if isinstance(value, ModelConfig):
        return f"<{value.name} config>"
    if isinstance(value, list) and len(value) > 4:
        return f"<{len(value)} shapes>"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else repr(value)


def _check_cases(answer, name: str, cases: Sequence[str], args_of: Callable, expected_of: Callable,
                 slips: Callable, *, pair: bool, counted: Sequence[str], counted_word: str):
    """Check a learner's function on every case, exactly: True, or (False, what is wrong)."""
    return check_cases(answer, name, cases, args_of, expected_of, slips, pair=pair,
                       counted=counted, counted_word=counted_word, show=_show)


# ------------------------------------------------------------- 8.1 the logits' bytes


def head_case_args(case: str) -> dict:
    """Exercise 8.1's arguments of a :data:`HEAD_CASES` case (chapter: 8).

    cfg, batch_size, seq_len, precision.
    """
    check_choice("case", case, HEAD_CASES)
    c = dict(HEAD_CASES[case])
    return dict(cfg=get_config(c.pop("model")), **c)


@functools.cache
def traced_head_step(case: str = TRACED_HEAD_CASE) -> StepMemory:
    """The training step of one :data:`HEAD_CASES` case, traced on fake tensors (chapter: 8)."""
    args = head_case_args(case)
    return trace_step(args["cfg"], batch_size=args["batch_size"], seq_len=args["seq_len"],
                      precision=args["precision"])


def traced_head_backward(case: str = TRACED_HEAD_CASE) -> int:
    """The temporaries at a traced step's backward peak: the head's two fp32 gradients (chapter: 8)."""
    return traced_head_step(case).phase_breakdown["backward"]["temporaries"]


def expected_head_bytes(case: str) -> tuple[int, int]:
    """What exercise 8.1 expects for one case: head_peaks', the backward traced on one (chapter: 8)."""
    args = head_case_args(case)
    forward, backward = head_peaks(args["cfg"], args["batch_size"], args["seq_len"],
                                   args["precision"])
    if case == TRACED_HEAD_CASE:
        backward = traced_head_backward(case)
    return forward, backward


def head_bytes_by_terms(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str, *,
                        fp32_copy: bool = True, gradient_bytes: int | None = 4,
                        gradients: int = 2, vocab: int | None = None,
                        copy_always: bool = False) -> tuple[int, int]:
    """(forward, backward) bytes of the head and loss, term by term, right or slipped (chapter: 8).

    ``gradient_bytes`` None: the compute dtype's; ``vocab`` replaces the config's;
    ``copy_always`` adds an fp32 copy under fp32 too.
    """
    V = cfg.vocab_size if vocab is None else vocab
    BTV, cb = batch_size * seq_len * V, COMPUTE_BYTES[precision]
    copy = BTV * 4 if fp32_copy and (cb != 4 or copy_always) else 0
    gb = cb if gradient_bytes is None else gradient_bytes
    return BTV * cb + copy, gradients * BTV * gb


def head_slips() -> list[tuple[Callable, str]]:
    """Typical wrong head_bytes functions, each with its hint (chapter: 8)."""
    old_vocab = get_config(OLD_VOCAB_MODEL).vocab_size

    def slip(**kw):
        return lambda cfg, batch_size, seq_len, precision: head_bytes_by_terms(
            cfg, batch_size, seq_len, precision, **kw)

    return [
        (slip(fp32_copy=False), "under a 16-bit compute dtype the loss upcasts the logits: "
                                "the forward pass holds them in 16 bits and an fp32 copy"),
        (slip(gradient_bytes=None), "the loss's gradients are fp32 (it computes in fp32), "
                                    "not the compute dtype"),
        (slip(gradients=1), "the backward pass holds two fp32 (B, T, V) gradients at once: "
                            "log-softmax's output's and its input's"),
        (slip(copy_always=True), "in fp32 the logits already are fp32: no second copy"),
        (slip(vocab=old_vocab), f"take each model's own vocabulary (cfg.vocab_size), not "
                                f"{OLD_VOCAB_MODEL}'s"),
        (lambda cfg, batch_size, seq_len, precision: head_bytes_by_terms(
            cfg, batch_size, seq_len, precision)[::-1], "return (forward, backward), in that order"),
    ]


def check_head_bytes(answer):
    """Check a head_bytes(cfg, batch_size, seq_len, precision) function (chapter: 8).

    It is held to head_peaks, and on one case its backward to a trace.
    """
    return _check_cases(answer, "head_bytes", tuple(HEAD_CASES), head_case_args,
                        expected_head_bytes, head_slips, pair=True, counted=(TRACED_HEAD_CASE,),
                        counted_word="its backward traced")


# ------------------------------------------------------------------ 8.2 loss chunks


def loss_job_config() -> ModelConfig:
    """The model of exercise 8.2: :data:`LOSS_JOB`'s preset with its vocabulary (chapter: 8)."""
    return replace(get_config(LOSS_JOB["model"]), vocab_size=LOSS_JOB["vocab_size"])


def forward_peak(step: StepMemory) -> int:
    """The bytes alive at the highest point of a step's forward pass (chapter: 8)."""
    return sum(step.phase_breakdown["forward"].values())


@functools.cache
def traced_chunked_step(loss_chunks: int) -> StepMemory:
    """:data:`LOSS_JOB`'s step with the loss over ``loss_chunks`` chunks, traced (chapter: 8)."""
    if isinstance(loss_chunks, bool) or not isinstance(loss_chunks, int) or loss_chunks < 1:
        raise MemlabError(f"loss_chunks must be a whole number >= 1, got {loss_chunks!r}")
    return trace_step(loss_job_config(), batch_size=LOSS_JOB["batch_size"],
                      seq_len=LOSS_JOB["seq_len"], precision=LOSS_JOB["precision"],
                      loss_chunks=loss_chunks)


def unchunked_step() -> StepMemory:
    """The step exercise 8.2 shows: :data:`LOSS_JOB` with the whole (B, T, V) logits, traced (chapter: 8)."""
    return traced_chunked_step(1)


def loss_budget_bytes() -> int:
    """The budget of exercise 8.2: :data:`LOSS_BUDGET_SHARE` of the unchunked forward peak (chapter: 8)."""
    return int(LOSS_BUDGET_SHARE * forward_peak(traced_chunked_step(1)))


def fewest_loss_chunks(budget: int | None = None) -> int | None:
    """The smallest K whose traced forward peak fits ``budget``, None up to MAX_LOSS_CHUNKS (chapter: 8)."""
    budget = loss_budget_bytes() if budget is None else budget
    return next((k for k in range(1, MAX_LOSS_CHUNKS + 1)
                 if forward_peak(traced_chunked_step(k)) <= budget), None)


def loss_chunk_slips() -> list[tuple[float, str]]:
    """The answers typical reckonings give for exercise 8.2, each with its hint (chapter: 8).

    None of them equals the right answer.
    """
    whole, budget = traced_chunked_step(1), loss_budget_bytes()
    at = whole.phase_breakdown["forward"]
    fixed = forward_peak(whole) - at["activations"]
    ks = range(1, MAX_LOSS_CHUNKS + 1)
    expected = fewest_loss_chunks(budget)
    picks = [
        (next((k for k in ks if k & (k - 1) == 0
               and forward_peak(traced_chunked_step(k)) <= budget), None),
         "any number of chunks will do, not only powers of two"),
        (next((k for k in ks if fixed + at["activations"] / k <= budget), None),
         "only the head's bytes shrink with K: the blocks' saved activations stay whole"),
    ]
    return merged_slips([(-1.0 if k is None else float(k), hint) for k, hint in picks
                         if k != expected])


def check_loss_chunks_answer(answer):
    """Check the predicted smallest K whose traced forward peak fits the budget (chapter: 8)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of loss chunks, got {type(answer).__name__}"
    if got != int(got) or not 1 <= got <= MAX_LOSS_CHUNKS:
        return False, f"answer a whole number of chunks from 1 to {MAX_LOSS_CHUNKS}, got {got:g}"
    budget = loss_budget_bytes()
    return fit_problem(
        int(got), fewest_loss_chunks(budget), budget=budget, slips=loss_chunk_slips,
        peak=lambda k: forward_peak(traced_chunked_step(k)),
        over="with {count} chunks the traced forward peak is {peak:,} bytes, more than the "
             "budget of {budget:,}",
        under="{count} chunks fit, but fewer fit too")


# ------------------------------------------------------------ 8.3 activation offloading


def offload_case_args(case: str) -> dict:
    """Exercise 8.3's arguments of an :data:`OFFLOAD_CASES` case (chapter: 8).

    cfg, batch_size, seq_len, precision.
    """
    check_choice("case", case, OFFLOAD_CASES)
    c = dict(OFFLOAD_CASES[case])
    return dict(cfg=get_config(c.pop("model")), **c)


@functools.cache
def measured_offload_step(case: str) -> StepMemory:
    """One :data:`OFFLOAD_CASES` case's checkpointed, offloaded step on real CPU tensors (chapter: 8)."""
    args = offload_case_args(case)
    return measure_step(args["cfg"], device="cpu", batch_size=args["batch_size"],
                        seq_len=args["seq_len"], precision=args["precision"],
                        checkpointing=True, offload_activations=True)


def measured_host_bytes(case: str) -> int:
    """The bytes a measured step kept on the host at the end of its forward pass (chapter: 8)."""
    return measured_offload_step(case).offloaded["host_bytes"]


def host_bytes_by_terms(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str, *,
                        blocks: int = 0, element_bytes: int | None = None) -> int:
    """L x B x T x C x bytes, with ``blocks`` added to L and the residual's bytes replaced (chapter: 8).

    The residual stream is fp32 under fp32 and the mixed precisions, bf16 in pure bf16.
    """
    eb = element_bytes if element_bytes is not None else (2 if precision == "bf16" else 4)
    return (cfg.n_layer + blocks) * batch_size * seq_len * cfg.d_model * eb


def offload_slips() -> list[tuple[Callable, str]]:
    """Typical wrong offloaded_bytes functions, each with its hint (chapter: 8)."""
    def slip(**kw):
        return lambda cfg, batch_size, seq_len, precision: host_bytes_by_terms(
            cfg, batch_size, seq_len, precision, **kw)

    return [
        (lambda cfg, batch_size, seq_len, precision: host_bytes_by_terms(
            cfg, batch_size, seq_len, precision, element_bytes=COMPUTE_BYTES[precision]),
         "under mixed precision the residual stream, a block's input, stays fp32: the 16-bit "
         "copies are the matmuls' inputs inside the block"),
        (slip(element_bytes=4), "in pure bf16 the residual stream is bf16, 2 bytes"),
        (slip(blocks=1), "count one input per checkpointed block, L of them: the head's input "
                         "is not a block's"),
        (slip(blocks=-1), "every block is checkpointed, block 0 too: L inputs"),
    ]


def check_offloaded_bytes(answer):
    """Check an offloaded_bytes(cfg, batch_size, seq_len, precision) function (chapter: 8).

    It is held to the host bytes of measured steps.
    """
    return _check_cases(answer, "offloaded_bytes", tuple(OFFLOAD_CASES), offload_case_args,
                        measured_host_bytes, offload_slips, pair=False,
                        counted=tuple(OFFLOAD_CASES), counted_word="measured")


# --------------------------------------------------------------- 8.4 Adafactor's state


@functools.cache
def parameter_shapes(model: str, precision: str) -> tuple[tuple[int, ...], ...]:
    """The shapes of a model's distinct trainable parameters, in order (chapter: 8).

    Built on the CPU as :func:`measured_state_bytes` builds it; a tied weight counts once.
    """
    check_choice("precision", precision, PARAM_BYTES)
    with default_dtype(param_dtype(precision)):
        built = build_model(get_config(model), seed=0)
    return tuple(tuple(p.shape) for p in built.parameters() if p.requires_grad)


def adafactor_case_args(case: str) -> dict:
    """Exercise 8.4's arguments of an :data:`ADAFACTOR_CASES` case: shapes, param_bytes (chapter: 8)."""
    check_choice("case", case, ADAFACTOR_CASES)
    c = ADAFACTOR_CASES[case]
    return dict(shapes=[list(s) for s in parameter_shapes(c["model"], c["precision"])],
                param_bytes=PARAM_BYTES[c["precision"]])


@functools.cache
def measured_adafactor_bytes(case: str) -> int:
    """torch.optim.Adafactor's state bytes after one step of an :data:`ADAFACTOR_CASES` case (chapter: 8)."""
    check_choice("case", case, ADAFACTOR_CASES)
    c = ADAFACTOR_CASES[case]
    return measured_state_bytes(get_config(c["model"]), c["precision"], "adafactor")


def adafactor_bytes_by_terms(shapes, param_bytes: int, *, steps: bool = True,
                             factored: bool = True, moments: int = 1,
                             vector_bytes: int | None = None) -> int:
    """Adafactor's state bytes with switches, the right count and its slips (chapter: 8).

    Shazeer and Stern, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost": a 2-D
    weight keeps a row and a column of its second moment, a vector a whole one; PyTorch adds an
    fp32 step tensor per parameter (on the host). ``factored=False`` keeps whole second moments,
    ``moments=2`` AdamW's two, ``vector_bytes`` replaces the factors' element size.
    """
    total = 4 * len(shapes) if steps else 0
    for shape in shapes:
        n = math.prod(shape)
        if moments == 2:
            total += 2 * param_bytes * n
        elif factored and len(shape) >= 2:
            vb = param_bytes if vector_bytes is None else vector_bytes
            total += vb * math.prod(shape[:-2]) * (shape[-2] + shape[-1])
        else:
            total += param_bytes * n
    return total


def adafactor_slips() -> list[tuple[Callable, str]]:
    """Typical wrong adafactor_state_bytes functions, each with its hint (chapter: 8)."""
    return [
        (lambda shapes, param_bytes: adafactor_bytes_by_terms(shapes, param_bytes, steps=False),
         "PyTorch's Adafactor also keeps a step tensor per parameter, fp32"),
        (lambda shapes, param_bytes: adafactor_bytes_by_terms(shapes, param_bytes,
                                                              factored=False),
         "a 2-D weight keeps only a row and a column of its second moment (rows + columns "
         "values), not a whole matrix"),
        (lambda shapes, param_bytes: adafactor_bytes_by_terms(shapes, param_bytes, moments=2),
         "that is AdamW's two moments: Adafactor keeps no first moment (beta1 = 0), and "
         "factors the second"),
        (lambda shapes, param_bytes: adafactor_bytes_by_terms(shapes, param_bytes,
                                                              vector_bytes=4),
         "the row and column factors are kept in the parameters' dtype, not fp32"),
        (lambda shapes, param_bytes: adafactor_bytes_by_terms(shapes, param_bytes, steps=False)
         + 4, "one step tensor per parameter, not one for the whole optimizer"),
    ]


def check_adafactor_bytes(answer):
    """Check an adafactor_state_bytes(shapes, param_bytes) function against torch's state (chapter: 8)."""
    return _check_cases(answer, "adafactor_state_bytes", tuple(ADAFACTOR_CASES),
                        adafactor_case_args, measured_adafactor_bytes, adafactor_slips,
                        pair=False, counted=tuple(ADAFACTOR_CASES), counted_word="measured")


# ------------------------------------------------------------- 8.5 the ring's traffic


def ring_case_args(case: str) -> dict:
    """Exercise 8.5's arguments of a case (chapter: 8).

    batch, kv_heads, tokens_per_rank, head_dim, world, value_bytes.
    """
    if case == RING_FORMULA_NAME:
        c = RING_FORMULA_CASE
        cfg = get_config(c["model"])
        return dict(batch=1, kv_heads=cfg.kv_heads, tokens_per_rank=c["seq_len"] // c["world"],
                    head_dim=cfg.head_dim, world=c["world"], value_bytes=PARAM_BYTES[c["dtype"]])
    check_choice("case", case, (*RING_CASES, RING_FORMULA_NAME))
    c = RING_CASES[case]
    return dict(batch=c["batch"], kv_heads=c["kv_heads"], tokens_per_rank=c["tokens_per_rank"],
                head_dim=c["head_dim"], world=RING_WORLDS[case],
                value_bytes=PARAM_BYTES[c["dtype"]])


@functools.cache
def counted_ring_bytes(case: str) -> tuple[int, int]:
    """(forward, backward) bytes rank 0 sends, counted by ring attention over a fake group (chapter: 8)."""
    check_choice("case", case, RING_CASES)
    with fake_ring(RING_WORLDS[case]):
        sent = ring_rank_bytes(**RING_CASES[case])["bytes_sent"]
    return sent["forward"], sent["backward"]


def expected_ring_bytes(case: str) -> tuple[int, int]:
    """What exercise 8.5 expects: the counted bytes, or the formula for the large case (chapter: 8)."""
    if case in RING_CASES:
        return counted_ring_bytes(case)
    a = ring_case_args(case)
    sent = kv_bytes_sent_per_step(a["batch"], a["kv_heads"], a["tokens_per_rank"] * a["world"],
                                  a["head_dim"], a["world"], a["value_bytes"])
    return sent["forward"], sent["backward"]


def ring_bytes_by_terms(batch: int, kv_heads: int, tokens_per_rank: int, head_dim: int,
                        world: int, value_bytes: int, *, hops: int = -1, home: bool = True,
                        grad_bytes: int | None = None, tensors: int = 2) -> tuple[int, int]:
    """(forward, backward) bytes one rank sends, with switches: the right count and slips (chapter: 8).

    ``hops`` is added to N for the hops a block travels; ``home`` sends the gradients home;
    ``grad_bytes`` replaces the accumulators' (fp32 at least); ``tensors`` K and V, or one.
    """
    block = batch * kv_heads * tokens_per_rank * head_dim
    gb = max(value_bytes, 4) if grad_bytes is None else grad_bytes
    n = world + hops
    if world == 1:
        return 0, 0
    fwd = n * tensors * block * value_bytes
    bwd = n * tensors * block * (value_bytes + gb) + (tensors * block * gb if home else 0)
    return fwd, bwd


def ring_slips() -> list[tuple[Callable, str]]:
    """Typical wrong ring_bytes_sent functions, each with its hint (chapter: 8)."""
    def slip(**kw):
        return lambda batch, kv_heads, tokens_per_rank, head_dim, world, value_bytes: (
            ring_bytes_by_terms(batch, kv_heads, tokens_per_rank, head_dim, world, value_bytes,
                                **kw))

    return [
        (slip(hops=0), "a block makes N - 1 hops: after them every rank has seen every block, "
                       "its own included"),
        (slip(home=False), "after the last hop the gradients of K and V are one rank short of "
                           "home: one more hop sends them to their owner"),
        (slip(grad_bytes=2), "the gradient accumulators that travel with K and V are fp32, "
                             "whatever the values' dtype"),
        (slip(tensors=1), "both K and V travel, and both of their gradients"),
    ]


def check_ring_bytes(answer):
    """Check a ring_bytes_sent(...) function against the bytes ring attention sent (chapter: 8)."""
    return _check_cases(answer, "ring_bytes_sent", (*RING_CASES, RING_FORMULA_NAME),
                        ring_case_args, expected_ring_bytes, ring_slips, pair=True,
                        counted=tuple(RING_CASES), counted_word="counted")


lab = define_lab("lab08", "Long context and large vocabularies")

lab.exercise(
    "8.1",
    "a head_bytes(cfg, batch_size, seq_len, precision) function giving the bytes the LM head "
    "and the loss hold at their forward and backward highest points",
    check=check_head_bytes,
)
lab.exercise(
    "8.2",
    "the smallest number of loss chunks whose traced forward peak fits the budget, predicted "
    "from the unchunked step",
    check=check_loss_chunks_answer,
    dimensionless=True,
)
lab.exercise(
    "8.3",
    "an offloaded_bytes(cfg, batch_size, seq_len, precision) function giving the host bytes of "
    "a checkpointed step with activation offloading, held to measured steps",
    check=check_offloaded_bytes,
)
lab.exercise(
    "8.4",
    "an adafactor_state_bytes(shapes, param_bytes) function giving torch.optim.Adafactor's "
    "state bytes after one step",
    check=check_adafactor_bytes,
)
lab.exercise(
    "8.5",
    "a ring_bytes_sent(batch, kv_heads, tokens_per_rank, head_dim, world, value_bytes) function "
    "giving the bytes one rank sends in one attention layer's forward and backward passes",
    check=check_ring_bytes,
)
