"""Every strategy on 4 ranks: per-rank bytes against the ZeRO formulas, bytes sent against 2Ψ/3Ψ,
losses and weights against one process, activations the same everywhere (one launch)."""

import pytest

from memlab.distributed import zero
from memlab.distributed.experiments import MEMORY_SIZES
from memlab.distributed.sharding import DIST_CI, distributed_memory
from memlab.errors import MemlabError

pytestmark = pytest.mark.slow  # one torchrun launch of 4 ranks: about 20 s on 2 cores


@pytest.fixture(scope="module")
def result():
    size = dict(MEMORY_SIZES["ci"])
    size.pop("model")
    return distributed_memory(DIST_CI, **size)


def test_every_rank_of_every_strategy_matches_its_formula_within_5_percent(result):
    assert result.world_size == 4 and result.backend == "gloo"
    for run in result.runs:
        for rank in run.ranks:
            assert rank.model_states / run.built_bytes == pytest.approx(1, abs=0.05), run.strategy
            if run.strategy != "zero2":
                assert run.built_bytes == run.formula_bytes
    # FSDP2 kept after forward holds its shard beside the gathered parameters: 4Ψ/N above ZeRO-2
    z2 = result.run("zero2")
    assert z2.built_bytes - z2.formula_bytes == 4 * result.parameters // 4


def test_the_measured_shards_are_exact_where_nothing_is_split_unevenly(result):
    n = result.parameters
    P = 4 * n  # fp32
    for s, gpus in (("zero2", 4), ("zero3", 4), ("offload", 4), ("hsdp", 2)):
        for rank in result.run(s).ranks:
            assert rank.gradients == P // gpus  # the model's sizes divide evenly by 4
            assert rank.optimizer_states == 2 * P // gpus + 4 * len(list(_tensors(result)))
    ddp = result.run("ddp").ranks[0]
    assert (ddp.parameters, ddp.gradients) == (P, P)
    # ZeRO-1 gives each tensor's states wholly to one rank: uneven, but they add up to AdamW's
    zero1 = result.run("zero1").ranks
    assert sum(r.optimizer_states for r in zero1) == ddp.optimizer_states
    assert len({r.optimizer_states for r in zero1}) > 1


def _tensors(result):
    """The model's parameter tensors (each has a 4-byte step counter in AdamW's state)."""
    from memlab.model.transformer import build_model

    return build_model(DIST_CI, device="meta").parameters()


def test_zero2_keeps_all_parameters_gathered_until_backward_zero3_one_block(result):
    P = 4 * result.parameters
    assert result.run("zero2").ranks[0].parameters_after_forward == P + P // 4  # and the shard
    assert result.run("zero3").ranks[0].parameters_after_forward == P // 4
    block = max(b for _, b in result.run("zero3").gather_timeline)
    from memlab.model.transformer import build_model

    one_block = sum(p.numel() for p in build_model(DIST_CI, device="meta").blocks[0].parameters())
    assert 4 * one_block <= block <= 2 * 4 * one_block  # a block, and the next one prefetched
    assert max(b for _, b in result.run("zero2").gather_timeline) == P  # every unit at once


def test_communication_is_2_psi_for_ddp_and_zero2_3_psi_for_zero3(result):
    assert result.run("ddp").comm_ratio == pytest.approx(1.0, rel=1e-3)
    assert result.run("zero2").comm_ratio == pytest.approx(1.0, rel=1e-3)
    assert result.run("zero3").comm_ratio == pytest.approx(1.0, rel=1e-3)
    # PyTorch's ZeRO-1 all-reduces the whole gradient, then broadcasts the updated shards: 3Ψ
    assert result.run("zero1").comm_ratio == pytest.approx(1.5, rel=1e-3)
    assert set(result.run("zero1").ranks[0].comm) == {"all-reduce", "broadcast"}
    # hybrid: ZeRO-3 inside each pair, plus an all-reduce of the shards across the pairs
    assert set(result.run("hsdp").ranks[0].comm) == {"all-gather", "reduce-scatter", "all-reduce"}


def test_activations_are_the_same_on_every_strategy(result):
    acts = {r.strategy: r.ranks[0].activations for r in result.runs}
    assert len(set(acts.values())) == 1, acts


def test_a_run_on_several_ranks_shows_what_a_one_rank_record_cannot(result):
    assert result.cannot_show() == ()
    from memlab.results import recorded

    rec = recorded("distributed-memory", device="cuda")
    if rec is None or rec.value().world_size != 1:
        pytest.skip("no one-rank GPU record of distributed-memory is stored")
    lacks = rec.value().cannot_show()
    assert any(x.startswith("sharding:") for x in lacks)
    assert any(x.startswith("FSDP's gathering:") for x in lacks)
    assert any(x.startswith("bytes on a link:") for x in lacks)


def test_every_strategy_trains_like_one_process(result):
    for run in result.runs:
        assert run.matches_one_process, (run.strategy, run.against_one_process)
        assert run.against_one_process.max_loss_diff < 1e-5
    assert result.reference_noise is None  # the CPU repeats itself exactly


def test_a_run_that_would_not_fit_is_refused_before_it_starts():
    from memlab.model.config import get_config

    with pytest.raises(MemlabError, match=r"4 ranks of llama2-70b need about .* GiB \(estimated\)"):
        distributed_memory(get_config("llama2-70b"), nproc=4)


def test_formula_strings_are_the_papers():
    assert [zero.formula(s) for s in zero.STAGES] == ["16Ψ", "4Ψ + 12Ψ/N", "2Ψ + 14Ψ/N", "16Ψ/N"]
    assert [zero.formula(s, layout="fp32") for s in zero.STAGES] == [
        "16Ψ", "8Ψ + 8Ψ/N", "4Ψ + 12Ψ/N", "16Ψ/N"]
