"""Lab 4's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import math

import pytest
import torch

from memlab.attention.gqa import kv_head_choices
from memlab.attention.kv import kv_bytes_per_token, longest_context
from memlab.attention.memory import saved_bytes
from memlab.errors import MemlabError
from memlab.gpus import get_gpu
from memlab.labs.grader import get_lab
from memlab.labs.lab04 import (
    BLOCK,
    CONTEXT,
    CONTEXT_BATCHES,
    GQA,
    GQA_BATCHES,
    KV_CASES,
    SAVED_SHAPE,
    SPIKES,
    attention_inputs,
    best_n_kv_head,
    blocks,
    gqa_budget_bytes,
    gqa_cache_bytes,
    gqa_table,
    kv_budget_bytes,
    longest_kv_context,
    measured_saved_bytes,
    pooled_attention_error,
    saved_parts,
    saved_tensors,
    scores,
)
from memlab.model.config import get_config
from memlab.model.flash import naive_attention


@pytest.fixture(scope="module")
def table():
    return gqa_table()


def test_the_lab_has_its_exercises():
    assert get_lab("lab04").ids == ("4.1", "4.2", "4.3a", "4.3b", "4.4")


# ------------------------------------------------------------ 4.1 online softmax


def online_softmax_update(m, l, x_block):  # noqa: E741 - the lab's reference solution
    m_new = torch.maximum(m, x_block.amax(dim=-1))
    alpha = torch.exp(m - m_new)
    return m_new, alpha * l + torch.exp(x_block - m_new[:, None]).sum(dim=-1), alpha


def test_scores_are_built_for_the_slips():
    """Row 0's max rises in a later block and overflows exp() in fp32; row 1's max is in its first
    block and a later block's max is lower; row 2's max is in the last, partial block."""
    x = scores()
    assert torch.equal(x, scores()) and x.dtype == torch.float32
    sizes = [b.shape[-1] for b in blocks(x, BLOCK)]
    assert len(sizes) >= 3 and sizes[-1] < BLOCK
    block_max = torch.stack([b.amax(dim=-1) for b in blocks(x, BLOCK)], dim=1)  # (rows, blocks)
    first = block_max.argmax(dim=1).tolist()
    assert first[0] > 0 and first[1] == 0 and first[2] == len(sizes) - 1
    assert block_max[1, 1] < block_max[1, 0]
    assert torch.isinf(torch.exp(x[0]).sum()) and torch.isfinite(torch.exp(x[1:]).sum())
    assert [(r, c) for r, c, _ in SPIKES] == [(0, 20), (1, 2), (2, 37)]


def test_online_correct(lab, capsys, printed):
    assert lab.check("4.1", online_softmax_update).ok
    assert printed() == "✅ 4.1 correct"

    def in_fp64(m, l, x_block):  # noqa: E741
        m, l, x_block = m.double(), l.double(), x_block.double()  # noqa: E741
        m_new = torch.max(torch.stack([m, x_block.max(dim=-1).values]), dim=0).values
        alpha = (m - m_new).exp()
        return m_new, l * alpha + (x_block - m_new.unsqueeze(-1)).exp().sum(-1), alpha

    assert lab.check("4.1", in_fp64).ok
    capsys.readouterr()


def test_online_stub_is_not_attempted(lab, capsys):
    def stub(m, l, x_block):  # noqa: E741
        pass

    assert lab.check("4.1", stub).status == "not attempted"
    assert lab.check("4.1", None).status == "not attempted"
    assert lab.check("4.1", lambda m, s, x: (None, None, None)).status == "not attempted"
    capsys.readouterr()


def _online_variant(kind):
    def f(m, l, x):  # noqa: E741
        block_max = x.amax(dim=-1)
        m_new = block_max if kind == "block-max" else torch.maximum(m, block_max)
        alpha = torch.exp(m_new - m) if kind == "inverted" else torch.exp(m - m_new)
        shift = m if kind == "old-max" else m_new
        terms = torch.exp(x - shift[:, None]).sum(dim=-1)
        l_new = {"no-rescale": l + terms, "no-max": l + torch.exp(x).sum(dim=-1)}.get(
            kind, alpha * l + terms)
        if kind == "keepdim":
            return m_new[:, None], l_new[:, None], alpha[:, None]
        if kind == "order":
            return l_new, m_new, alpha
        if kind == "alpha-off":
            return m_new, l_new, alpha * 0.5
        return m_new, l_new, alpha

    return f


@pytest.mark.parametrize(("kind", "words"), [
    ("inverted", "alpha = exp(m - m_new), the old max minus the new one"),
    ("no-rescale", "rescale the old sum when the max rises"),
    ("block-max", "m is the running max over every block seen so far"),
    ("old-max", "the new block's terms are exp(x_block - m_new)"),
    ("no-max", "l is not finite: exp() of a large score overflows fp32"),
    ("keepdim", "one value per row, shape (4,); reduce with keepdim=False"),
    ("order", "return (m_new, l_new, alpha) in that order"),
    ("alpha-off", "after block 2 of 3, alpha differs"),
])
def test_online_mistakes_get_their_hint(lab, printed, kind, words):
    assert lab.check("4.1", _online_variant(kind)).status == "not yet"
    assert words in printed()


def test_online_bad_answers(lab, printed):
    def broken(m, l, x):  # noqa: E741
        raise IndexError("oops")

    assert lab.check("4.1", broken).status == "not yet"
    assert "online_softmax_update(m, l, x_block) raised IndexError: oops" in printed()
    assert lab.check("4.1", 3.0).status == "not yet"
    assert "answer the function online_softmax_update itself" in printed()
    assert lab.check("4.1", lambda m, s, x: (m, s)).status == "not yet"
    assert "return three values" in printed()
    assert lab.check("4.1", lambda m, s, x: (x.amax(0), x.sum(0), x.sum(0))).status == "not yet"
    assert "reduce over the last dimension" in printed()
    assert lab.check("4.1", lambda m, s, x: ("a", "b", "c")).status == "not yet"
    assert "must be a real tensor" in printed()


# ---------------------------------------------------------- 4.2 saved bytes


def test_saved_bytes_are_the_parts_and_each_storage_once():
    """The measurement the check uses is the sum of the parts counted from the shape, and
    memlab.attention.saved_bytes counts each saved storage once at this shape."""
    expected = measured_saved_bytes("naive")
    parts = saved_parts(**SAVED_SHAPE)
    assert expected == sum(parts.values())
    kept = saved_tensors(naive_attention, *attention_inputs())
    assert sum(t.bytes for t in kept) == expected == saved_bytes("naive", *attention_inputs())
    assert len(kept) == len(parts)


def test_flash_saves_linearly_and_naive_quadratically():
    naive = [measured_saved_bytes("naive", T=T) for T in (128, 256)]
    flash = [measured_saved_bytes("flash", T=T) for T in (128, 256)]
    assert flash[1] == 2 * flash[0] and naive[1] > 3.5 * naive[0]


def _saved_variant(kind) -> int:
    s = SAVED_SHAPE
    B, nh, nkv, T, hs = s["batch_size"], s["n_head"], s["n_kv_head"], s["T"], s["head_size"]
    e = torch.empty(0, dtype=torch.bfloat16).element_size()
    q = B * nh * T * hs * e
    P = B * nh * T * T
    kv = 2 * B * (nkv if kind == "kv-at-nkv" else nh) * T * hs * e
    mask = {"no-mask": 0, "mask-per-head": B * nh * T * T}.get(kind, T * T)
    probs = {"one-copy-fp32": 4 * P, "one-copy-bf16": e * P, "scores-too": 4 * P + 2 * e * P,
             "no-probs": 0}.get(kind, (4 + e) * P)
    inputs = {"no-inputs": 0, "fp32-inputs": 2 * (q + kv)}.get(kind, q + kv)
    total = inputs + mask + probs
    return total * 8 if kind == "bits" else total


def test_saved_bytes_correct(lab, capsys):
    assert _saved_variant("right") == measured_saved_bytes("naive")
    assert lab.check("4.2", _saved_variant("right")).ok
    assert lab.check("4.2", float(_saved_variant("right"))).ok
    assert lab.check("4.2", torch.tensor(_saved_variant("right"))).ok
    capsys.readouterr()


@pytest.mark.parametrize(("kind", "words"), [
    ("one-copy-fp32", "two copies of the (B, nh, T, T) probabilities"),
    ("one-copy-bf16", "two copies of the (B, nh, T, T) probabilities"),
    ("no-mask", "masked_fill keeps its boolean (T, T) mask"),
    ("mask-per-head", "it is stored once"),
    ("kv-at-nkv", "count k and v at n_head heads"),
    ("no-inputs", "each matmul keeps its inputs"),
    ("scores-too", "the scores before the softmax are not kept"),
    ("fp32-inputs", "q, k and v are bf16: 2 bytes per value"),
    ("bits", "bits and bytes"),
    ("no-probs", "too small"),  # no slip explains it: how far off, never the recipe
])
def test_saved_bytes_mistakes_get_their_hint(lab, printed, kind, words):
    assert lab.check("4.2", _saved_variant(kind)).status == "not yet"
    assert words in printed()


def test_saved_bytes_stub_and_bad_answers(lab, capsys, printed):
    assert lab.check("4.2", None).status == "not attempted"
    capsys.readouterr()
    assert lab.check("4.2", "3 MB").status == "not yet"
    assert "answer a number of bytes, got str" in printed()


# --------------------------------------------------------------- 4.3 KV cache


def _per_token(key, *, heads=None, kv=2, layers=None, value_bytes=None) -> int:
    case = KV_CASES[key]
    cfg = get_config(case["model"])
    e = {"bf16": 2, "fp32": 4}[case["kv_precision"]] if value_bytes is None else value_bytes
    return (kv * (cfg.n_layer if layers is None else layers)
            * (cfg.kv_heads if heads is None else heads) * cfg.head_dim * e)


def test_kv_per_token_correct(lab, capsys):
    answer = {key: _per_token(key) for key in KV_CASES}
    assert answer["llama2-7b, bf16"] == 512 * 2**10 and answer["llama2-70b, bf16"] == 320 * 2**10
    assert answer == {k: kv_bytes_per_token(c["model"], c["kv_precision"]) for k, c in KV_CASES.items()}
    assert lab.check("4.3a", answer).ok
    capsys.readouterr()


@pytest.mark.parametrize(("key", "kw", "words"), [
    ("llama2-70b, bf16", dict(heads=64), "8 KV heads for 64 query heads"),
    ("llama2-7b, bf16", dict(kv=1), "K and V are both cached"),
    ("gpt2, fp32", dict(kv=1), "K and V are both cached"),
    ("llama2-70b, bf16", dict(layers=1), "every layer caches its own K and V"),
    ("llama2-7b, bf16", dict(value_bytes=4), "the cache is bf16 here: 2 bytes per value"),
    ("gpt2, fp32", dict(value_bytes=2), "the cache is fp32 here: 4 bytes per value"),
    ("gpt2, fp32", dict(value_bytes=1), "that counts values"),
    ("llama2-7b, bf16", dict(value_bytes=16), "bits and bytes"),
    ("gpt2, fp32", dict(value_bytes=3), "'gpt2, fp32': 25% too small"),  # no slip: how far off
])
def test_kv_per_token_mistakes_get_their_hint(lab, printed, key, kw, words):
    answer = {k: _per_token(k) for k in KV_CASES}
    answer[key] = _per_token(key, **kw)
    assert lab.check("4.3a", answer).status == "not yet"
    line = printed()
    assert f"1 of {len(KV_CASES)} not right: {key!r}" in line and words in line


def test_kv_per_token_stub_and_bad_keys(lab, capsys):
    assert lab.check("4.3a", None).status == "not attempted"
    assert lab.check("4.3a", dict.fromkeys(KV_CASES)).status == "not attempted"
    assert lab.check("4.3a", [1, 2, 3]).status == "not yet"
    assert lab.check("4.3a", {"llama2-7b, bf16": 1}).status == "not yet"
    lines = capsys.readouterr().out.splitlines()
    assert "answer a dict" in lines[2] and "missing keys" in lines[3]


def _context(*, memory=None, weight_bytes=2, batch=None, per_token_factor=1.0) -> float:
    cfg, gpu = get_config(CONTEXT["model"]), get_gpu(CONTEXT["gpu"])
    memory = gpu.usable_bytes if memory is None else memory
    per = 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * 2 * per_token_factor
    return (memory - weight_bytes * cfg.num_parameters()) // (
        (CONTEXT["batch_size"] if batch is None else batch) * per)


def test_context_correct(lab, capsys):
    expected = _context()
    assert expected == longest_kv_context() > 0
    assert lab.check("4.3b", expected).ok and lab.check("4.3b", float(expected)).ok
    capsys.readouterr()


@pytest.mark.parametrize(("kw", "words"), [
    (dict(weight_bytes=0), "subtract the weights first"),
    (dict(memory=get_gpu(CONTEXT["gpu"]).total_bytes), "not the total"),
    (dict(memory=get_gpu(CONTEXT["gpu"]).memory_bytes), "not the label"),
    (dict(weight_bytes=4), "the weights are bf16: 2 bytes per parameter"),
    (dict(batch=1), "divide by the batch size too"),
    (dict(per_token_factor=4), "8 KV heads for 32 query heads"),
    (dict(per_token_factor=0.5), "K and V are both cached"),
    (dict(per_token_factor=1 / 32), "every layer caches its own K and V"),
])
def test_context_mistakes_get_their_hint(lab, printed, kw, words):
    assert lab.check("4.3b", _context(**kw)).status == "not yet"
    assert words in printed()


def test_context_rounding_and_bad_answers(lab, capsys, printed):
    expected = longest_kv_context()
    assert lab.check("4.3b", expected + 0.4).status == "not yet"
    assert "round down to a whole number of tokens" in printed()
    assert lab.check("4.3b", expected + 1).status == "not yet"
    assert "with one token more" in printed()
    assert lab.check("4.3b", float("inf")).status == "not yet"
    assert "finite" in printed()
    assert lab.check("4.3b", expected * 0.9).status == "not yet"
    line = printed()  # no slip explains it: how far off, never the recipe
    assert line.endswith("10% too small") and "usable" not in line
    assert lab.check("4.3b", "8k").status == "not yet"
    assert "answer a number of tokens" in printed()
    assert lab.check("4.3b", None).status == "not attempted"
    capsys.readouterr()


def test_the_estimate_is_shorter_than_weights_and_cache_alone():
    """The mark scheme's claim: above batch 1 the estimate's context is shorter; at batch 1 it
    stops at the model's maximum context."""
    cfg = get_config(CONTEXT["model"])
    assert CONTEXT["batch_size"] in CONTEXT_BATCHES
    for B in CONTEXT_BATCHES:
        estimated = longest_context(CONTEXT["model"], CONTEXT["gpu"], batch_size=B)
        assert estimated < longest_kv_context(batch_size=B)
        assert (estimated == cfg.max_seq_len) == (B == 1)


def test_kv_budget_bytes():
    cfg = get_config(CONTEXT["model"])
    assert kv_budget_bytes(cfg, CONTEXT["gpu"]) == (get_gpu(CONTEXT["gpu"]).usable_bytes
                                                   - 2 * cfg.num_parameters())
    with pytest.raises(MemlabError, match="unknown precision 'int3'"):
        kv_budget_bytes(cfg, CONTEXT["gpu"], "int3")


# ------------------------------------------------- 4.4 grouped-query attention


def test_the_table_is_built_for_the_lesson(table):
    """Errors fall as n_kv_head grows (0 for multi-head); the answer is the largest n_kv_head that
    fits, below multi-head, above multi-query; each choice's cache is its bytes per token times
    the batch and the context."""
    cfg = get_config(GQA["model"])
    assert [row.n_kv_head for row in table] == sorted(kv_head_choices(cfg.n_head))
    errors = [row.relative_error for row in table]
    assert errors == sorted(errors, reverse=True) and errors[-1] == 0.0
    assert all(a > b + 1e-3 for a, b in zip(errors, errors[1:], strict=False))  # robust order
    tokens = GQA["batch_size"] * GQA["context"]
    assert all(row.cache_bytes == row.kv_bytes_per_token * tokens
               == gqa_cache_bytes(row.n_kv_head) for row in table)
    budget = gqa_budget_bytes()
    best = best_n_kv_head(table, budget)
    fitting = [row.n_kv_head for row in table if row.cache_bytes <= budget]
    assert best == max(fitting) and 1 < best < cfg.n_head
    for B in GQA_BATCHES:
        rows = gqa_table(batch_size=B)
        assert best_n_kv_head(rows, budget) == max(r.n_kv_head for r in rows
                                                   if r.cache_bytes <= budget)


def test_n_kv_head_correct(lab, capsys, table):
    budget = gqa_budget_bytes()
    tokens = GQA["batch_size"] * GQA["context"]
    answer = min((row.relative_error, row.n_kv_head) for row in table
                 if row.kv_bytes_per_token * tokens <= budget)[1]
    assert lab.check("4.4", answer).ok and lab.check("4.4", float(answer)).ok
    assert lab.check("4.4", torch.tensor(answer).item()).ok
    capsys.readouterr()


def test_n_kv_head_every_wrong_choice_gets_its_hint(lab, printed, table):
    budget = gqa_budget_bytes()
    best = best_n_kv_head(table, budget)
    for row in table:
        if row.n_kv_head == best:
            continue
        assert lab.check("4.4", row.n_kv_head).status == "not yet"
        line = printed()
        if row.cache_bytes <= budget:
            assert "fits, but a choice with a smaller error fits too" in line
            assert str(best) not in line.split("fits,")[1]  # the answer is not given away
        else:
            assert f"n_kv_head={row.n_kv_head} needs {row.cache_bytes:,} bytes" in line


@pytest.mark.parametrize(("factor", "words"), [
    ("batch_size", "every sequence of the batch has its own cache"),
    ("context", "the cache holds every position of the context"),
])
def test_n_kv_head_miscounts_are_named(lab, printed, table, factor, words):
    """A cache counted without the batch (or the context) picks the choice the hint names."""
    budget = gqa_budget_bytes()
    tokens = GQA["batch_size"] * GQA["context"] // GQA[factor]
    slipped = min((row.relative_error, row.n_kv_head) for row in table
                  if row.kv_bytes_per_token * tokens <= budget)[1]
    assert slipped != best_n_kv_head(table, budget)
    assert lab.check("4.4", slipped).status == "not yet"
    assert words in printed()


def test_n_kv_head_bad_answers(lab, capsys, printed):
    assert lab.check("4.4", 3).status == "not yet"
    assert "must divide n_head (32), got 3; accepted: 1, 2, 4, 8, 16, 32" in printed()
    for bad in ("8", True, 7.5, float("nan")):
        assert lab.check("4.4", bad).status == "not yet"
        assert "answer a number of KV heads, an int" in printed()
    assert lab.check("4.4", None).status == "not attempted"
    capsys.readouterr()


def test_pooling_helpers_and_bad_input(table):
    assert pooled_attention_error(get_config(GQA["model"]).n_head) == 0.0
    assert math.isclose(pooled_attention_error(1), table[0].relative_error)
    with pytest.raises(MemlabError, match=r"n_kv_head 3 must divide n_head 32"):
        pooled_attention_error(3)
    with pytest.raises(MemlabError, match="similarity must be between 0 and 1"):
        pooled_attention_error(8, similarity=1.5)
    with pytest.raises(MemlabError, match=r"no n_kv_head fits in 1,000 bytes; the smallest cache, at n_kv_head=1"):
        best_n_kv_head(table, 1000)
    with pytest.raises(MemlabError, match=r"n_head \(4\) must be a multiple of n_kv_head \(3\)"):
        attention_inputs(n_kv_head=3)
