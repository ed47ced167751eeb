"""Context parallelism's bytes: the estimate held to one rank's traced step, the ring's bytes
measured against their formulas, the per-rank table and the sequence-parallel split."""

import json
from dataclasses import replace

import pytest

from memlab.errors import MemlabError
from memlab.longcontext.context_parallel import (
    context_parallel_table,
    fake_ring,
    ring_rank_bytes,
    sequence_parallel_bytes,
    trace_context_parallel,
)
from memlab.memory.estimator import estimate
from memlab.model.config import get_config

# tiny's shape with room for long sequences: the ring's (T/N)^2 scores outweigh the weights
LONG_TINY = replace(get_config("tiny"), name="tiny-long", max_seq_len=1 << 16)


@pytest.mark.parametrize("seq_len, ranks, precision, checkpointing, loss_chunks", [
    (2048, 4, "fp32", False, 1),
    (2048, 4, "bf16-mixed", True, 1),
    (4096, 8, "bf16", True, 4),
    (1024, 2, "bf16-mixed", False, 4),
])
def test_the_estimate_is_held_to_one_ranks_traced_step(seq_len, ranks, precision, checkpointing,
                                                       loss_chunks):
    switches = dict(precision=precision, checkpointing=checkpointing, loss_chunks=loss_chunks)
    traced = trace_context_parallel(LONG_TINY, seq_len=seq_len, ranks=ranks, **switches)
    est = estimate(LONG_TINY, batch_size=1, seq_len=seq_len, device="cpu",
                   context_parallel=ranks, **switches)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)
    for phase, bytes_ in traced.phase_peak_bytes.items():
        assert est.phase_peak_bytes[phase] == pytest.approx(bytes_, rel=0.03), phase
    assert est.setup["tokens_per_rank"] == seq_len // ranks


@pytest.mark.slow
def test_llama31_8b_at_128k_over_8_ranks_is_held_to_its_trace():
    switches = dict(precision="bf16-mixed", checkpointing=True)
    traced = trace_context_parallel("llama3.1-8b", seq_len=131072, ranks=8, **switches)
    est = estimate("llama3.1-8b", batch_size=1, seq_len=131072, device="cpu", context_parallel=8,
                   **switches)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)
    for phase, bytes_ in traced.phase_peak_bytes.items():
        assert est.phase_peak_bytes[phase] == pytest.approx(bytes_, rel=0.03), phase


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_ranks_ring_bytes_measured_equal_the_formulas(ranks, dtype):
    with fake_ring(ranks):  # real tensors; the fake group's sends move nothing
        got = ring_rank_bytes(batch=2, heads=4, kv_heads=2, tokens_per_rank=64, head_dim=16,
                              dtype=dtype)
    assert got["saved_bytes"] == got["saved_formula"]
    assert got["forward_peak_bytes"] == got["forward_formula"]
    assert got["backward_peak_bytes"] == got["backward_formula"]
    assert got["bytes_sent"] == got["sent_formula"]


@pytest.mark.slow
def test_ring_bytes_on_two_gloo_ranks_equal_the_formulas():
    from memlab.distributed.launch import launch

    cases = [dict(batch=1, heads=4, kv_heads=2, tokens_per_rank=64, head_dim=16, dtype=d)
             for d in ("fp32", "bf16")]
    run = launch("memlab.longcontext.context_parallel:measure_ring", dict(cases=cases), nproc=2,
                 timeout_s=300)
    assert [a["rank"] for a in run.ranks] == [0, 1]
    for answer in run.ranks:
        for got in answer["results"]:
            assert got["saved_bytes"] == got["saved_formula"]
            assert got["forward_peak_bytes"] == got["forward_formula"]
            assert got["backward_peak_bytes"] == got["backward_formula"]
            assert got["bytes_sent"] == got["sent_formula"]


def test_at_constant_tokens_per_rank_a_ranks_bytes_stay_constant_and_only_traffic_grows():
    rows = context_parallel_table("llama3.1-8b", tokens_per_rank=2048, ranks=(2, 8, 64))
    first = rows[0].as_dict()
    for row in rows[1:]:
        d = row.as_dict()
        for key in ("model_states_bytes", "saved_activations_bytes", "ring_buffer_bytes",
                    "ring_scores_bytes", "peak_bytes"):
            assert d[key] == first[key], key
    # each rank's block goes N - 1 hops (and its gradients one more): the bytes sent grow
    # linearly with N
    sent = [r.kv_bytes_sent_per_step for r in rows]
    assert (sent[1] - sent[0]) * (64 - 8) == (sent[2] - sent[1]) * (8 - 2)
    assert sent[0] < sent[1] < sent[2]
    assert [r.seq_len for r in rows] == [4096, 16384, 131072]


def test_at_a_fixed_sequence_the_saved_activations_shrink_with_the_ranks():
    rows = context_parallel_table("llama3.1-8b", seq_len=131072, ranks=(8, 16, 32, 64))
    saved = [r.saved_activations_bytes for r in rows]
    assert saved == sorted(saved, reverse=True)
    assert len({r.model_states_bytes for r in rows}) == 1  # replicated, never sharded
    assert all(r.tokens_per_rank * r.ranks == 131072 for r in rows)


def test_the_table_takes_exactly_one_of_the_sequence_and_the_share():
    with pytest.raises(MemlabError, match="exactly one of seq_len and tokens_per_rank"):
        context_parallel_table("tiny", ranks=(2,))


def test_a_sequence_the_zigzag_cannot_split_is_refused_in_one_line():
    with pytest.raises(MemlabError, match="multiple of 16, got 1000") as exc:
        estimate(LONG_TINY, batch_size=1, seq_len=1000, context_parallel=8)
    assert "\n" not in str(exc.value)
    with pytest.raises(MemlabError, match="multiple of 8"):
        trace_context_parallel(LONG_TINY, seq_len=100, ranks=4)
    with pytest.raises(MemlabError, match="positive whole number of ranks"):
        estimate(LONG_TINY, batch_size=1, seq_len=64, context_parallel=0)
    with pytest.raises(MemlabError, match="checkpointing False or True"):
        estimate(LONG_TINY, batch_size=1, seq_len=64, context_parallel=2,
                 checkpointing="selective")


def test_sequence_parallelism_splits_what_tensor_parallelism_leaves_whole():
    cfg = replace(get_config("llama3.1-8b"), attention="eager")
    s, h, a, t = 4096, cfg.d_model, cfg.n_head, 8
    got = sequence_parallel_bytes(cfg, seq_len=s, tensor_parallel=t)
    # the paper's Table 2, in its own terms
    assert got["paper_no_parallelism"] == s * h * (34 + 5 * a * s // h)
    assert got["paper_tensor_parallel"] == s * h * 10 + s * h * (24 + 5 * a * s // h) // t
    assert got["paper_tensor_sequence_parallel"] == got["paper_no_parallelism"] // t
    for who in ("paper", "book"):
        assert (got[f"{who}_no_parallelism"] > got[f"{who}_tensor_parallel"]
                > got[f"{who}_tensor_sequence_parallel"])
    with pytest.raises(MemlabError, match="must divide 32 query and 8 key/value heads, got 3"):
        sequence_parallel_bytes(cfg, seq_len=s, tensor_parallel=3)


def test_the_command_line_estimates_and_traces_one_rank(capsys):
    from memlab.cli import main

    base = ["--model", "tiny", "--batch-size", "1", "--seq-len", "128", "--json"]
    assert main(["estimate", *base, "--context-parallel", "4"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert main(["trace", *base, "--context-parallel", "4"]) == 0
    traced = json.loads(capsys.readouterr().out)
    assert est["peak_bytes"] == pytest.approx(traced["peak_bytes"], rel=0.03)
    for extra, words in ((["--seq-len", "100"], "multiple of 8, got 100"),
                         (["--inference"], "drop --inference"),
                         (["--gpus", "2"], "replicates the model states"),
                         (["--checkpointing", "selective"], "no checkpointing or full")):
        assert main(["estimate", *base, "--context-parallel", "4", *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1
