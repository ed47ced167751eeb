"""One rank's estimate under context parallelism (memlab.memory.context), without torch: what it
shares with the plain step, what the ring adds, and the one-line refusals. The trace that holds
it within 3% is in tests/longcontext/test_context_parallel.py."""

import pytest

from memlab.errors import MemlabError
from memlab.memory.context import (
    check_context_parallel,
    ring_block,
    ring_buffer_bytes,
    ring_core_tensors,
    ring_transient_bytes,
)
from memlab.memory.estimator import estimate
from memlab.model.config import get_config


def test_one_rank_is_the_plain_step():
    plain = estimate("llama3.1-8b", batch_size=1, seq_len=8192, precision="bf16-mixed")
    one = estimate("llama3.1-8b", batch_size=1, seq_len=8192, precision="bf16-mixed",
                   context_parallel=1)
    assert one.as_dict() == plain.as_dict()


def test_model_states_are_replicated_and_activations_follow_the_rank_s_tokens():
    kw = dict(batch_size=1, precision="bf16-mixed", checkpointing=True)
    whole = estimate("llama3.1-8b", seq_len=131072, context_parallel=8, **kw)
    share = estimate("llama3.1-8b", seq_len=16384, **kw)
    for key in ("parameters_bytes", "gradients_bytes", "optimizer_states_bytes"):
        assert getattr(whole, key) == getattr(share, key)
    # full checkpointing saves block inputs and the head: the same at 16,384 tokens per rank
    assert whole.saved_activations_bytes == share.saved_activations_bytes
    assert whole.setup["seq_len"] == 131072 and whole.setup["tokens_per_rank"] == 16384
    assert "one of 8 context-parallel ranks (16384 tokens each" in whole.table()


def test_the_ring_saves_k_and_v_per_kv_head_and_its_own_statistics():
    cfg = get_config("llama3.1-8b")
    core = ring_core_tensors(cfg, 1, 2048, "bf16-mixed")
    by = {t.name.split(": ", 1)[1]: t.bytes for t in core}
    assert by["k"] == by["v"] == 2048 * cfg.kv_heads * cfg.head_dim * 2
    assert by["q"] == by["output"] == 2048 * cfg.n_head * cfg.head_dim * 2
    assert by["log-sum-exp"] == 2048 * cfg.n_head * 4
    assert by["the rank's token positions"] == 2048 * 8
    block = ring_block(cfg, 1, 2048, "bf16-mixed")
    assert [t for t in block if t.name.startswith("ring attention")] == core
    assert any(t.name.startswith("RoPE") for t in block)


def test_the_ring_s_buffers_and_scores():
    cfg = get_config("llama3.1-8b")
    n, kv = 4096, 4096 * cfg.kv_heads * cfg.head_dim
    assert ring_buffer_bytes(cfg, 1, n, 1, "bf16-mixed") == {"forward": 0, "backward": 0}
    assert ring_buffer_bytes(cfg, 1, n, 8, "bf16-mixed") == {"forward": 2 * kv * 2,
                                                            "backward": 2 * kv * 2 + 2 * kv * 4}
    t = ring_transient_bytes(cfg, 1, n, 8, "bf16-mixed")
    scores = cfg.n_head * n * n * 4
    assert 3 * scores < t["forward"] < t["backward"] < 4 * scores


@pytest.mark.parametrize("ranks, seq_len, words", [
    (8, 1000, "cuts the sequence into 16 equal chunks: seq_len must be a multiple of 16, got 1000"),
    (0, 64, "context_parallel must be a positive whole number of ranks, got 0"),
    (True, 64, "context_parallel must be a positive whole number of ranks, got True"),
])
def test_bad_context_parallelism_is_one_line(ranks, seq_len, words):
    with pytest.raises(MemlabError) as exc:
        check_context_parallel(ranks, seq_len)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_only_no_or_full_checkpointing_is_estimated_under_the_ring():
    with pytest.raises(MemlabError, match="checkpointing False or True, got 'every-2'"):
        estimate("tiny", batch_size=1, seq_len=64, context_parallel=2, checkpointing="every-2")
