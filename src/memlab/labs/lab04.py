"""Lab 4, "Attention": the online softmax by hand, the bytes naive attention saves for backward,
the KV cache per token and per context, and the number of KV heads that fits a budget.

Every expected value is computed at check time, never typed in: the online softmax against
``torch.softmax`` on the whole row and :func:`memlab.model.flash.online_softmax_update`; the saved
bytes measured with :func:`memlab.attention.memory.saved_bytes`; KV-cache bytes with
:func:`memlab.attention.kv.kv_bytes_per_token` and the GPU catalogue. Nothing is trained: the
quality side of exercise 4.4 is measured in milliseconds on a stand-in attention layer whose key
and value heads are mean-pooled into groups, as the GQA paper converts a checkpoint. Each hint
names one mistake and fires only on the answer that mistake gives, computed from the same numbers
the check compares with; a wrong answer no slip explains is told how far off it is, never the
recipe. The notebook imports none of the functions a check compares with.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from memlab.attention.gqa import check_kv_heads, kv_head_choices
from memlab.attention.kv import kv_bytes_per_token
from memlab.attention.memory import saved_bytes
from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.gpus import get_gpu
from memlab.labs.grader import (
    answer_number,
    answer_tensor,
    check_each_key,
    define_lab,
    merged_slips,
    named_slip,
    number_problem,
    off_by,
    one_line,
)
from memlab.memory.estimator import DTYPE_BYTES
from memlab.model.config import ModelConfig, get_config
from memlab.model.flash import online_softmax_update

# Exercise 4.1: attention scores of a few query rows (one row per query, one column per key),
# with spikes placed so that a row's max rises in a later block (row 0, a score whose exp()
# overflows in fp32), stays in the first block (row 1), or comes in the last, partial block
# (row 2). The online softmax runs over blocks of BLOCK keys.
SCORES = dict(rows=4, cols=40, std=3.0, seed=0)
SPIKES = ((0, 20, 100.0), (1, 2, 12.0), (2, 37, 14.0))  # (row, column, score)
BLOCK = 16
SOFTMAX_RTOL = 1e-5

# Exercise 4.2: the shape whose saved bytes naive attention is measured at (grouped-query heads,
# so that k and v's repetition to every head is a slip of its own size), and the lengths of
# the table that follows it.
SAVED_SHAPE = dict(batch_size=2, n_head=4, n_kv_head=2, T=256, head_size=32, dtype="bf16")
SAVED_TS = (256, 512, 1024)

# Exercise 4.3: KV-cache bytes per token of a few presets, and the longest context one batch of
# generation gets when the cache takes what the weights leave of a GPU's usable memory.
KV_CASES = {
    "llama2-7b, bf16": dict(model="llama2-7b", kv_precision="bf16"),
    "llama2-70b, bf16": dict(model="llama2-70b", kv_precision="bf16"),
    "gpt2, fp32": dict(model="gpt2", kv_precision="fp32"),
}
CONTEXT = dict(model="mistral-7b", gpu="L4", batch_size=8, precision="bf16")
CONTEXT_BATCHES = (1, 4, 8, 16, 32)
CONTEXT_SLIP_RTOL = 1e-3  # a slip's answer, rounded another way, still names it

# Exercise 4.4: a multi-head model converted to grouped-query attention, served with a batch of
# sequences of a given context; the cache gets what the weights leave of the GPU's usable memory.
# The quality of each n_kv_head is the output error of a stand-in attention layer of the model's
# head shape whose key and value heads are mean-pooled into n_kv_head groups.
GQA = dict(model="llama2-7b", gpu="A100-40GB", batch_size=32, context=4096, precision="bf16")
GQA_BATCHES = (4, 8, 16, 32, 64, 128)
STAND_IN = dict(T=64, similarity=0.9, query_scale=2.0, seed=0)


def _config(model: ModelConfig | str) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else get_config(model)


# --------------------------------------------------------------- 4.1 online softmax


def scores(rows: int = SCORES["rows"], cols: int = SCORES["cols"], std: float = SCORES["std"],
           seed: int = SCORES["seed"], spikes: Iterable[tuple[int, int, float]] = SPIKES) -> torch.Tensor:
    """(rows, cols) fp32 attention scores: N(0, std^2), with the scores of ``spikes`` set (chapter: 4)."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * std
    for row, col, value in spikes:
        x[row, col] = value
    return x


def blocks(x: torch.Tensor, block: int = BLOCK) -> list[torch.Tensor]:
    """The key blocks of ``x``: its columns in runs of ``block`` (chapter: 4).

    The last one may be shorter.
    """
    check_positive_int("block", block)
    return [x[..., c0:c0 + block] for c0 in range(0, x.size(-1), block)]


def run_online(update: Callable, x: torch.Tensor, block: int = BLOCK) -> list[tuple]:
    """``update(m, l, x_block)`` applied block by block from m = -inf, l = 0 (chapter: 4).

    It returns its output per block.
    """
    m = torch.full(x.shape[:-1], float("-inf"))
    l = torch.zeros(x.shape[:-1])  # noqa: E741 (the papers' l)
    steps = []
    for x_block in blocks(x, block):
        out = update(m.clone(), l.clone(), x_block.clone())
        steps.append(out)
        if not isinstance(out, (tuple, list)) or len(out) != 3 or out[0] is None or out[1] is None:
            break  # the check says what is wrong with this output
        m, l = out[0], out[1]  # noqa: E741
    return steps


# Typical wrong updates, each giving the answer its mistake gives on the same scores.
def _alpha_inverted(m, l, x):  # noqa: E741
    m_new = torch.maximum(m, x.amax(dim=-1))
    alpha = torch.exp(m_new - m)
    return m_new, alpha * l + torch.exp(x - m_new[..., None]).sum(dim=-1), alpha


def _no_rescale(m, l, x):  # noqa: E741
    m_new = torch.maximum(m, x.amax(dim=-1))
    return m_new, l + torch.exp(x - m_new[..., None]).sum(dim=-1), torch.exp(m - m_new)


def _block_max(m, l, x):  # noqa: E741
    m_new = x.amax(dim=-1)
    alpha = torch.exp(m - m_new)
    return m_new, alpha * l + torch.exp(x - m_new[..., None]).sum(dim=-1), alpha


def _old_max(m, l, x):  # noqa: E741
    m_new = torch.maximum(m, x.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    return m_new, alpha * l + torch.exp(x - m[..., None]).sum(dim=-1), alpha


ONLINE_SLIPS = (
    (_alpha_inverted, "alpha = exp(m - m_new), the old max minus the new one: it is at most 1 "
                      "and shrinks the sum of the blocks seen so far to the new, larger max"),
    (_no_rescale, "rescale the old sum when the max rises: l_new = alpha * l + the new block's "
                  "sum, because the old terms were exp(x - m), not exp(x - m_new)"),
    (_block_max, "m is the running max over every block seen so far, torch.maximum(m, the "
                 "block's max), not the block's own max: a later block with smaller scores "
                 "must not lower it"),
    (_old_max, "the new block's terms are exp(x_block - m_new), with the new max: with the old "
               "one, the first block's -inf makes exp() overflow"),
)


def _same(a: torch.Tensor, b: torch.Tensor, rtol: float = SOFTMAX_RTOL) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a.double(), b.double(), rtol=rtol,
                                                      atol=1e-30, equal_nan=True))


def _same_steps(got: list[tuple], ref: list[tuple]) -> bool:
    return len(got) == len(ref) and all(
        _same(g, r) for gs, rs in zip(got, ref, strict=True) for g, r in zip(gs, rs, strict=True))


def _step_outputs(out, rows: int):
    """One block's (m_new, l_new, alpha) as tensors; None for a stub; else the hint (a str)."""
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        return "return three values: (m_new, l_new, alpha)"
    if all(v is None for v in out):
        return None
    tensors = []
    for name, value in zip(("m_new", "l_new", "alpha"), out, strict=True):
        t = answer_tensor(value)
        if t is None or t.is_complex() or t.dtype == torch.bool:
            return f"{name} must be a real tensor, one value per row"
        if tuple(t.shape) == (rows, 1):
            return (f"{name} has shape {tuple(t.shape)}: one value per row, shape ({rows},); "
                    "reduce with keepdim=False")
        if tuple(t.shape) != (rows,):
            return (f"{name} has shape {tuple(t.shape)}, not ({rows},): reduce over the last "
                    "dimension (the keys of a row), one value per row")
        tensors.append(t)
    return tuple(tensors)


def check_online_softmax(answer, rtol: float = SOFTMAX_RTOL):
    """Check an online_softmax_update(m, l, x_block) -> (m_new, l_new, alpha) function against
    softmax on the whole rows and memlab's own update, block by block (chapter: 4)."""
    if not callable(answer):
        return False, f"answer the function online_softmax_update itself, got {type(answer).__name__}"
    x = scores()
    rows = x.shape[0]
    m = torch.full((rows,), float("-inf"))
    l = torch.zeros(rows)  # noqa: E741 (the papers' l)
    steps = []
    for x_block in blocks(x):
        try:
            out = answer(m.clone(), l.clone(), x_block.clone())
        except Exception as exc:
            return False, (f"online_softmax_update(m, l, x_block) raised {type(exc).__name__}: "
                           f"{one_line(exc)}")
        got = _step_outputs(out, rows)
        if got is None:
            return None
        if isinstance(got, str):
            return False, got
        steps.append(got)
        m, l = got[0], got[1]  # noqa: E741
    ref = run_online(online_softmax_update, x)
    if _same_steps(steps, ref):
        m, l = steps[-1][0].double(), steps[-1][1].double()  # noqa: E741
        p = torch.exp(x.double() - m[:, None]) / l[:, None]
        if torch.allclose(p, torch.softmax(x.double(), dim=-1), rtol=rtol, atol=1e-12):
            return True
        return False, "exp(x - m) / l after the last block must be softmax(x) on each whole row"
    for slip, hint in ONLINE_SLIPS:
        if _same_steps(steps, run_online(slip, x)):
            return False, hint
    # The first block where the answer differs got the same m and l as the reference did.
    i = next(i for i, (g, r) in enumerate(zip(steps, ref, strict=True))
             if not all(_same(a, b) for a, b in zip(g, r, strict=True)))
    (m_got, l_got, alpha_got), (m_ref, l_ref, alpha_ref) = steps[i], ref[i]
    if _same(m_got, l_ref) and _same(l_got, m_ref) and _same(alpha_got, alpha_ref):
        return False, "return (m_new, l_new, alpha) in that order"
    if not all(torch.isfinite(step[1]).all() for step in steps):
        return False, ("l is not finite: exp() of a large score overflows fp32; subtract the "
                       "running max first, exp(x_block - m_new)")
    wrong = [name for name, g, r in zip(("m_new", "l_new", "alpha"), steps[i], ref[i], strict=True)
             if not _same(g, r)]
    verb = "differs" if len(wrong) == 1 else "differ"
    return False, (f"after block {i + 1} of {len(ref)}, {' and '.join(wrong)} {verb} from "
                   "memlab.model.flash.online_softmax_update's")


# ------------------------------------------------------ 4.2 bytes saved for backward


@dataclass(frozen=True)
class SavedTensor:
    """One tensor autograd keeps for backward: its shape, its dtype and the bytes of its storage."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int


def attention_inputs(batch_size: int = SAVED_SHAPE["batch_size"], n_head: int = SAVED_SHAPE["n_head"],
                     n_kv_head: int = SAVED_SHAPE["n_kv_head"], T: int = SAVED_SHAPE["T"],
                     head_size: int = SAVED_SHAPE["head_size"], dtype: str = SAVED_SHAPE["dtype"]):
    """Seeded q (B, nh, T, hs) and k, v (B, nkv, T, hs) on the CPU, requiring gradients (chapter: 4)."""
    for name, n in (("batch_size", batch_size), ("n_head", n_head), ("n_kv_head", n_kv_head),
                    ("T", T), ("head_size", head_size)):
        check_positive_int(name, n)
    if n_head % n_kv_head:
        raise MemlabError(f"n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head})")
    dt = to_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch_size, n_head, T, head_size, generator=g).to(dt).requires_grad_()
    k = torch.randn(batch_size, n_kv_head, T, head_size, generator=g).to(dt).requires_grad_()
    v = torch.randn(batch_size, n_kv_head, T, head_size, generator=g).to(dt).requires_grad_()
    return q, k, v


def measured_saved_bytes(impl: str = "naive", **shape) -> int:
    """Bytes ``impl`` saves for backward at :data:`SAVED_SHAPE` (or ``shape``), measured (chapter: 4)."""
    return saved_bytes(impl, *attention_inputs(**{**SAVED_SHAPE, **shape}))


def saved_tensors(fn: Callable, *args) -> list[SavedTensor]:
    """The tensors autograd keeps while ``fn(*args)`` runs (chapter: 4).

    Each storage once, in the order saved.
    """
    seen: dict[int, SavedTensor] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = SavedTensor(tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                                   storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return list(seen.values())


def saved_parts(batch_size: int, n_head: int, n_kv_head: int, T: int, head_size: int,
                dtype: str) -> dict[str, int]:
    """Bytes of each tensor naive causal attention keeps, counted from the shape (chapter: 4).

    q, and k and v repeated to all n_head heads (the matmuls' inputs); the (T, T) boolean mask;
    the softmax's fp32 output; its copy cast back to the inputs' dtype, which att @ v keeps.
    """
    e = to_dtype(dtype).itemsize
    heads = batch_size * n_head * T * head_size * e
    P = batch_size * n_head * T * T  # probabilities
    parts = {"q": heads, "k repeated": heads, "v repeated": heads, "causal mask": T * T,
             "probabilities, fp32": 4 * P}
    if e != 4:  # the softmax's output is cast back to the inputs' dtype: a second copy
        parts[f"probabilities, {dtype}"] = e * P
    return parts


def saved_bytes_slips(expected: int, batch_size: int, n_head: int, n_kv_head: int, T: int,
                      head_size: int, dtype: str) -> list[tuple[float, str]]:
    """Typical wrong predictions of naive attention's saved bytes, each with its hint (chapter: 4)."""
    e = to_dtype(dtype).itemsize
    P = batch_size * n_head * T * T
    heads = batch_size * n_head * T * head_size * e
    kept_by_softmax = ("the softmax runs in fp32 (.float()) and keeps its fp32 output for its "
                       f"backward, besides the {dtype} copy that att @ v keeps: two copies of "
                       "the (B, nh, T, T) probabilities")
    scores = ("the scores before the softmax are not kept: the softmax's backward needs only "
              "its output, the probabilities")
    return [
        (expected - 4 * P, kept_by_softmax),
        (expected - e * P, kept_by_softmax),
        (expected - T * T, "masked_fill keeps its boolean (T, T) mask for backward: one byte "
                           "per entry"),
        (expected + (batch_size * n_head - 1) * T * T,
         "the mask is (T, T), broadcast over the batch and the heads: it is stored once"),
        (expected - 2 * batch_size * (n_head - n_kv_head) * T * head_size * e,
         "naive attention repeats k and v to all n_head heads (repeat_interleave) before the "
         "matmuls, and the matmuls keep the repeated copies: count k and v at n_head heads"),
        (expected - 3 * heads, "each matmul keeps its inputs: q and k for q @ k^T, v for att @ v"),
        (expected + e * P, scores),
        (expected + 4 * P, scores),
        (expected * 8, "bits and bytes are different units: answer bytes"),
    ] + ([(expected + 3 * heads, f"q, k and v are {dtype}: {e} bytes per value; only the "
                                 "softmax runs in fp32")] if e == 2 else [])


def check_saved_bytes(answer):
    """Check the predicted bytes naive attention saves for backward at :data:`SAVED_SHAPE` (chapter: 4)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of bytes, got {type(answer).__name__}"
    expected = measured_saved_bytes("naive")
    if got == expected:
        return True
    hint = named_slip(got, saved_bytes_slips(expected, **SAVED_SHAPE), 1e-9)
    return False, hint or off_by(got, expected)


# ------------------------------------------------------------------ 4.3 the KV cache


def kv_budget_bytes(model: ModelConfig | str, gpu: str, precision: str = "bf16") -> int:
    """Bytes the KV cache can take: a GPU's usable memory minus the weights in ``precision`` (chapter: 4)."""
    check_choice("precision", precision, DTYPE_BYTES)
    return get_gpu(gpu).usable_bytes - _config(model).num_parameters() * DTYPE_BYTES[precision]


def longest_kv_context(model: ModelConfig | str = CONTEXT["model"], gpu: str = CONTEXT["gpu"],
                       batch_size: int = CONTEXT["batch_size"],
                       precision: str = CONTEXT["precision"]) -> int:
    """Longest context whose KV cache for the batch fits :func:`kv_budget_bytes` (chapter: 4).

    The context is in tokens per sequence.

    Only the weights and the cache are counted: no activations, no cap at the model's maximum
    context (:func:`memlab.attention.kv.longest_context` counts both).
    """
    check_positive_int("batch_size", batch_size)
    return max(0, kv_budget_bytes(model, gpu, precision)
               // (batch_size * kv_bytes_per_token(_config(model), precision)))


def kv_per_token_slips(key: str, expected: float) -> list[tuple[float, str]]:
    """Typical wrong KV bytes per token of one case of :data:`KV_CASES`, each with its hint (chapter: 4)."""
    case = KV_CASES[key]
    cfg = _config(case["model"])
    e = DTYPE_BYTES[case["kv_precision"]]
    slips = []
    if cfg.kv_heads != cfg.n_head:
        slips.append((expected * cfg.n_head / cfg.kv_heads,
                      f"{cfg.name} has {cfg.kv_heads} KV heads for {cfg.n_head} query heads "
                      "(grouped-query attention): the cache holds n_kv_head heads"))
    slips += [
        (expected / 2, "K and V are both cached: 2 tensors per layer"),
        (expected / cfg.n_layer, "every layer caches its own K and V"),
        (expected * 8, "bits and bytes are different units: answer bytes"),
        (expected / e, f"that counts values: multiply by the bytes of a {case['kv_precision']} "
                       "value"),
        (expected * (4 if e == 2 else 2) / e, f"the cache is {case['kv_precision']} here: {e} "
                                              "bytes per value"),
    ]
    return merged_slips(slips)


def check_kv_per_token(answer):
    """Check predicted KV-cache bytes per token for every case of :data:`KV_CASES` (chapter: 4)."""
    def problem(key: str, value) -> str:
        case = KV_CASES[key]
        expected = kv_bytes_per_token(case["model"], case["kv_precision"])
        return number_problem(value, expected, slips=lambda: kv_per_token_slips(key, expected),
                              slip_rtol=1e-9, ask="a number of bytes")

    return check_each_key(answer, KV_CASES, "KV_CASES", problem)


def context_slips(expected: int) -> list[tuple[float, str]]:
    """Typical wrong longest contexts for :data:`CONTEXT`, each with its hint (chapter: 4)."""
    cfg, gpu = _config(CONTEXT["model"]), get_gpu(CONTEXT["gpu"])
    B, e = CONTEXT["batch_size"], DTYPE_BYTES[CONTEXT["precision"]]
    weights = cfg.num_parameters() * e
    budget = gpu.usable_bytes - weights
    per = kv_bytes_per_token(cfg, CONTEXT["precision"])
    usable = "the usable memory (the nvidia-smi total minus memlab.gpus.RESERVED_BYTES)"
    return merged_slips([
        (gpu.usable_bytes // (B * per), "subtract the weights first: they take their bytes "
                                        "before the cache gets any"),
        ((gpu.total_bytes - weights) // (B * per), f"start from {usable}, not the total"),
        ((gpu.memory_bytes - weights) // (B * per), f"start from {usable}, not the label"),
        ((gpu.usable_bytes - 4 * cfg.num_parameters()) // (B * per),
         f"the weights are {CONTEXT['precision']}: {e} bytes per parameter"),
        (budget // per, "every sequence of the batch has its own cache: divide by the batch "
                        "size too"),
        (budget // (B * per * cfg.n_head // cfg.kv_heads),
         f"{cfg.name} has {cfg.kv_heads} KV heads for {cfg.n_head} query heads: the cache "
         "holds n_kv_head heads"),
        (budget // (B * per // 2), "K and V are both cached: 2 tensors per layer"),
        (budget // (B * per // cfg.n_layer), "every layer caches its own K and V"),
    ])


def check_context(answer):
    """Check the longest context of :data:`CONTEXT` whose cache fits what the weights leave (chapter: 4)."""
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of tokens, got {type(answer).__name__}"
    expected = longest_kv_context()
    if got == expected:
        return True
    if not math.isfinite(got):
        return False, f"answer a finite number of tokens, got {got}"
    if got != math.floor(got) and math.floor(got) == expected:
        return False, "round down to a whole number of tokens: a token's K and V fit or not"
    if got == expected + 1:
        return False, "round down: with one token more per sequence the cache no longer fits"
    return False, named_slip(got, context_slips(expected), CONTEXT_SLIP_RTOL) or off_by(got,
                                                                                      expected)


# -------------------------------------------------- 4.4 grouped-query attention


@dataclass(frozen=True)
class GQARow:
    """One choice of n_kv_head: the cache it takes and the output error pooling to it causes."""

    n_kv_head: int
    group_size: int  # query heads per KV head
    kv_bytes_per_token: int
    cache_bytes: int  # for the batch and context of GQA
    relative_error: float  # of the stand-in layer's output, pooled against multi-head


def pooled_attention_error(n_kv_head: int, model: ModelConfig | str = GQA["model"],
                           T: int = STAND_IN["T"], similarity: float = STAND_IN["similarity"],
                           query_scale: float = STAND_IN["query_scale"],
                           seed: int = STAND_IN["seed"]) -> float:
    """Relative output error of a stand-in causal attention layer when its key and value heads are
    mean-pooled into ``n_kv_head`` groups, as the GQA paper converts a checkpoint (chapter: 4).

    The stand-in has the model's heads (n_head of head_dim); its keys and values per head are
    sqrt(similarity) x a part all heads share + sqrt(1 - similarity) x a part of their own, so
    that ``similarity`` is the share of variance heads have in common. It is not a trained model.
    """
    cfg = _config(model)
    nh, hs = cfg.n_head, cfg.head_dim
    check_kv_heads(n_kv_head, nh)
    if not 0 <= similarity <= 1:
        raise MemlabError(f"similarity must be between 0 and 1, got {similarity!r}")
    g = torch.Generator().manual_seed(seed)

    def heads():  # (1, nh, T, hs)
        shared = torch.randn(1, 1, T, hs, generator=g)
        own = torch.randn(1, nh, T, hs, generator=g)
        return math.sqrt(similarity) * shared + math.sqrt(1 - similarity) * own

    q = torch.randn(1, nh, T, hs, generator=g) * query_scale
    k, v = heads(), heads()
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (1, nh, T, hs)
    group = nh // n_kv_head

    def pooled(t):  # mean over each group of heads, then shared by the group's query heads
        return t.view(1, n_kv_head, group, T, hs).mean(dim=2).repeat_interleave(group, dim=1)

    y_pooled = F.scaled_dot_product_attention(q, pooled(k), pooled(v), is_causal=True)
    return ((y_pooled - y).norm() / y.norm()).item()


def gqa_cache_bytes(n_kv_head: int, model: ModelConfig | str = GQA["model"],
                    batch_size: int = GQA["batch_size"], context: int = GQA["context"],
                    precision: str = GQA["precision"]) -> int:
    """KV-cache bytes of ``model`` with ``n_kv_head`` KV heads, for a batch at a context (chapter: 4)."""
    converted = replace(_config(model), n_kv_head=n_kv_head)
    return kv_bytes_per_token(converted, precision) * batch_size * context


def gqa_budget_bytes() -> int:
    """The KV budget of exercise 4.4 (chapter: 4).

    What :data:`GQA`'s weights leave of its GPU's usable memory.
    """
    return kv_budget_bytes(GQA["model"], GQA["gpu"], GQA["precision"])


def gqa_table(batch_size: int = GQA["batch_size"], context: int = GQA["context"]) -> list[GQARow]:
    """Every valid n_kv_head of :data:`GQA`'s model (chapter: 4).

    With the cache it takes and the stand-in's error.
    """
    cfg = _config(GQA["model"])
    rows = []
    for n in sorted(kv_head_choices(cfg.n_head)):
        per = gqa_cache_bytes(n, batch_size=1, context=1)
        rows.append(GQARow(n, cfg.n_head // n, per, per * batch_size * context,
                           pooled_attention_error(n)))
    return rows


def best_n_kv_head(table: Iterable[GQARow], budget: int) -> int:
    """The n_kv_head whose cache fits ``budget`` bytes with the smallest error (chapter: 4)."""
    table = list(table)
    fitting = [row for row in table if row.cache_bytes <= budget]
    if not fitting:
        smallest = min(table, key=lambda row: row.cache_bytes)
        raise MemlabError(f"no n_kv_head fits in {budget:,} bytes; the smallest cache, at "
                          f"n_kv_head={smallest.n_kv_head}, takes {smallest.cache_bytes:,}")
    return min(fitting, key=lambda row: row.relative_error).n_kv_head


def n_kv_head_slips(table: list[GQARow], budget: int) -> dict[int, str]:
    """The wrong n_kv_head each miscount of the cache leads to, with its hint (chapter: 4).

    The table gives each choice's bytes per token; a miscount of the batch or the context
    divides every cache by a factor, and the answer it gives is the best choice against the
    budget times that factor.
    """
    factors = (
        (GQA["batch_size"], "every sequence of the batch has its own cache: bytes per token x "
                            "batch size x context"),
        (GQA["context"], "the cache holds every position of the context: bytes per token x "
                         "batch size x context"),
    )
    out: dict[int, str] = {}
    for factor, hint in factors:
        n = best_n_kv_head(table, budget * factor)
        if hint not in out.get(n, ""):
            out[n] = f"{out[n]}; or {hint}" if n in out else hint
    return out


def check_n_kv_head(answer):
    """Check the n_kv_head whose cache fits :func:`gqa_budget_bytes` with the smallest error (chapter: 4)."""
    choices = sorted(kv_head_choices(_config(GQA["model"]).n_head))
    if (isinstance(answer, bool) or not isinstance(answer, numbers.Real)
            or not math.isfinite(answer) or answer != int(answer)):
        return False, f"answer a number of KV heads, an int, got {type(answer).__name__} {answer!r}"
    n = int(answer)
    if n not in choices:
        return False, (f"n_kv_head must divide n_head ({choices[-1]}), got {n}; accepted: "
                       + ", ".join(map(str, choices)))
    table, budget = gqa_table(), gqa_budget_bytes()
    best = best_n_kv_head(table, budget)
    if n == best:
        return True
    row = next(r for r in table if r.n_kv_head == n)
    if row.cache_bytes <= budget:
        return False, (f"n_kv_head={n} fits, but a choice with a smaller error fits too: the "
                       "more KV heads, the less pooling loses")
    slip = n_kv_head_slips(table, budget).get(n, "")
    over = f"n_kv_head={n} needs {row.cache_bytes:,} bytes of cache, more than the budget of {budget:,}"
    if n == choices[-1] and not slip:
        return False, f"{over}: multi-head attention has the smallest error, but it does not fit"
    return False, f"{over}" + (f": {slip}" if slip else "")


lab = define_lab("lab04", "Attention")

lab.exercise(
    "4.1",
    "an online_softmax_update(m, l, x_block) -> (m_new, l_new, alpha) function that gives "
    "softmax on the whole row and memlab's update, block by block",
    check=check_online_softmax,
    rtol=SOFTMAX_RTOL,
)
lab.exercise(
    "4.2",
    "bytes naive attention saves for backward at SAVED_SHAPE, measured with saved_bytes",
    check=check_saved_bytes,
)
lab.exercise(
    "4.3a",
    "KV-cache bytes per token of each case of KV_CASES",
    check=check_kv_per_token,
)
lab.exercise(
    "4.3b",
    "the longest context whose KV cache fits what the weights leave of the GPU's usable memory",
    check=check_context,
    dimensionless=True,
)
lab.exercise(
    "4.4",
    "the n_kv_head whose KV cache fits the budget with the smallest output error",
    check=check_n_kv_head,
    dimensionless=True,
)
