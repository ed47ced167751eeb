"""KV-cache bytes per token, the longest context that fits, and where the cache outgrows the weights."""

from __future__ import annotations

import pytest

from memlab.attention import kv_bytes_per_token, longest_context, tokens_where_cache_equals_weights
from memlab.errors import MemlabError
from memlab.gpus import get_gpu
from memlab.memory.estimator import estimate_inference
from memlab.model.config import get_config


def test_bytes_per_token_of_the_presets():
    assert kv_bytes_per_token("llama2-7b") == 512 * 1024  # 32 layers x 32 heads, no GQA
    assert kv_bytes_per_token("llama2-70b") == 320 * 1024  # 80 layers x 8 KV heads
    assert kv_bytes_per_token("llama2-7b", "fp32") == 1024 * 1024
    with pytest.raises(MemlabError, match="kv_precision"):
        kv_bytes_per_token("llama2-7b", "int3")


def test_gqa_divides_the_cache_by_the_group_size():
    mha = get_config("llama2-70b", n_kv_head=64)
    gqa = get_config("llama2-70b")
    assert kv_bytes_per_token(mha) == 8 * kv_bytes_per_token(gqa)


def test_longest_context_is_the_edge_of_what_fits():
    cfg = get_config("llama2-7b")
    n = longest_context(cfg, "A100-40GB", batch_size=16)
    usable = get_gpu("A100-40GB").usable_bytes
    assert 0 < n < cfg.max_seq_len
    assert estimate_inference(cfg, 16, n - 1, "bf16", 1).peak_bytes <= usable
    assert estimate_inference(cfg, 16, n, "bf16", 1).peak_bytes > usable
    assert longest_context("llama2-70b", "T4") == 0  # the weights alone do not fit
    assert longest_context("gpt2", "H100") == get_config("gpt2").max_seq_len  # capped


def test_where_the_cache_outgrows_the_weights():
    cfg = get_config("llama2-7b")
    tokens = tokens_where_cache_equals_weights(cfg)
    assert (tokens - 1) * kv_bytes_per_token(cfg) < 2 * cfg.num_parameters() <= (
        tokens * kv_bytes_per_token(cfg))
