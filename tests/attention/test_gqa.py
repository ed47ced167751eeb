"""MHA vs GQA vs MQA on the book's small model: parameters, KV-cache bytes, saved activations, quality."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from memlab.attention.gqa import (
    GQA_STEPS,
    MEASURED_ATTENTIONS,
    _gqa_comparison,
    check_kv_heads,
    gqa_comparison,
    kind_of,
    kv_head_choices,
)
from memlab.errors import MemlabError
from memlab.model.lm import TINY_LM, lm_config
from memlab.model.transformer import KVCache

STEPS = 12  # enough to move every variant off its initial loss; the tests check bytes and shapes


@pytest.fixture(scope="module")
def result():
    return gqa_comparison(config=TINY_LM, steps=STEPS, device="cpu")


def test_lm_config_n_kv_head_defaults_to_multi_head():
    cfg = lm_config("ci")
    assert cfg.n_kv_head is None
    assert cfg.model_config().n_kv_head == cfg.n_head  # unchanged: plain multi-head attention
    assert lm_config("ci", n_kv_head=2).model_config().n_kv_head == 2
    with pytest.raises(MemlabError, match="n_kv_head"):
        lm_config("ci", n_kv_head=3).model_config()


def test_rows_are_ordered_from_mha_to_mqa(result):
    nh = TINY_LM.n_head
    assert [r.n_kv_head for r in result.rows] == list(kv_head_choices(nh)) == [4, 2, 1]
    assert [r.kind for r in result.rows] == ["MHA", "GQA", "MQA"]
    assert [r.group_size for r in result.rows] == [1, 2, 4]
    assert result.steps == STEPS and result.config.n_kv_head is None
    assert all(len(r.losses) == STEPS for r in result.rows)
    assert result.row(2).kind == "GQA"


def test_kv_bytes_divide_by_the_group_size(result):
    cfg = TINY_LM.model_config()
    mha = result.row(cfg.n_head)
    for r in result.rows:
        assert r.kv_ratio == r.n_kv_head / cfg.n_head  # exactly
        assert r.kv_bytes_per_token * r.group_size == mha.kv_bytes_per_token
        assert r.kv_bytes_per_token == 2 * cfg.n_layer * r.n_kv_head * cfg.head_dim * 4  # fp32
        cache = KVCache(replace(cfg, n_kv_head=r.n_kv_head), 1, cfg.max_seq_len)  # allocated
        assert cache.nbytes() == r.kv_bytes_per_token * cfg.max_seq_len


def test_parameters_shrink_by_the_k_and_v_projections(result):
    cfg = TINY_LM.model_config()
    C, L, nh, hs = cfg.d_model, cfg.n_layer, cfg.n_head, cfg.head_dim
    mha = result.row(nh).parameters
    assert mha == cfg.num_parameters()
    for r in result.rows:
        assert r.parameters == replace(cfg, n_kv_head=r.n_kv_head).num_parameters()
        assert mha - r.parameters == 2 * L * C * hs * (nh - r.n_kv_head)  # K and V, every block
    assert [r.parameters for r in result.rows] == sorted((r.parameters for r in result.rows),
                                                         reverse=True)


def test_saved_activations_barely_change(result):
    cfg = TINY_LM.model_config()
    B, T, L, nh, hs = TINY_LM.batch_size, TINY_LM.seq_len, cfg.n_layer, cfg.n_head, cfg.head_dim
    mha = result.row(nh)
    assert set(mha.saved_activations_bytes) == set(MEASURED_ATTENTIONS)
    for r in result.rows:
        kv_gap = 2 * L * B * T * (nh - r.n_kv_head) * hs * 4  # K and V outputs, fp32
        for att in MEASURED_ATTENTIONS:
            gap = mha.saved_activations_bytes[att] - r.saved_activations_bytes[att]
            assert 0 <= gap <= kv_gap, (att, r.n_kv_head)
        # the tiled kernel reads the shared heads without copies: only the smaller K and V remain
        assert mha.saved_activations_bytes["flash"] - r.saved_activations_bytes["flash"] == kv_gap
        assert kv_gap < 0.1 * mha.saved_activations_bytes["flash"]


def test_quality_is_paired_against_mha(result):
    mha = result.row(TINY_LM.n_head)
    assert mha.delta_loss == 0.0 and math.isnan(mha.delta_se)
    for r in result.rows[1:]:
        assert r.delta_se > 0 and math.isfinite(r.delta_se)
        assert r.delta_loss == pytest.approx(r.loss - mha.loss, abs=1e-6)  # fp32 loss vs fp64 mean
        assert r.quality.seq_loss.shape == (TINY_LM.eval_sequences,)
        assert r.loss < r.losses[0]  # trained
    assert "MQA" in result.table() and list(result.frame().index) == [4, 2, 1]


def test_best_within_a_kv_budget(result):
    by = {r.n_kv_head: r for r in result.rows}
    assert result.best_within(0) is None
    assert result.best_within(by[1].kv_bytes_per_token) is by[1]
    best = result.best_within(by[4].kv_bytes_per_token)
    assert best.loss == min(r.loss for r in result.rows)
    with pytest.raises(MemlabError, match="kv_bytes_per_token"):
        result.best_within(-1)


def test_computed_once_per_process(result):
    again = gqa_comparison(config=TINY_LM, steps=STEPS, device="cpu", kv_heads=[1, 2])
    assert again is result  # n_head is always added: the same variants, the same run


def test_kept_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path))
    kept = _gqa_comparison.__wrapped__  # without the per-process cache
    args = ("ci", TINY_LM, (4,), 2, "fp32", "cpu")
    first = kept(*args)
    assert len(list(tmp_path.glob("*.pt"))) == 1
    second = kept(*args)
    assert second.rows[0].loss == first.rows[0].loss
    assert torch.equal(second.rows[0].quality.seq_loss, first.rows[0].quality.seq_loss)


@pytest.mark.parametrize("bad", [3, 0, -2, 8, True, 2.0, "2", None])
def test_bad_n_kv_head_is_one_line(bad):
    with pytest.raises(MemlabError) as err:
        gqa_comparison(config=TINY_LM, kv_heads=[4, bad], device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and repr(bad) in msg and "accepted: 4, 2, 1" in msg


def test_other_bad_input_is_one_line():
    cases = [dict(kv_heads=2), dict(steps=0), dict(kv_precision="int3"),
             dict(config=replace(TINY_LM, n_kv_head=2)), dict(config="ci")]
    for kw in cases:
        with pytest.raises(MemlabError) as err:
            gqa_comparison(**{"config": TINY_LM, "device": "cpu", **kw})
        assert "\n" not in str(err.value)
    with pytest.raises(MemlabError, match="accepted: 4, 2, 1"):
        check_kv_heads(True, 4)


def test_kinds_and_steps_per_scale():
    assert [kind_of(h, 8) for h in kv_head_choices(8)] == ["MHA", "GQA", "GQA", "MQA"]
    assert kv_head_choices(1) == (1,) and kind_of(1, 1) == "MHA"
    assert GQA_STEPS["ci"] < lm_config("ci").steps  # fewer steps at 'ci', the same for every variant
