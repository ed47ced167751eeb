"""How many GPUs each stage needs, the ZeRO paper's numbers, and the communication-time model."""

from __future__ import annotations

import json

import pytest

from memlab.distributed import commtime, plan
from memlab.distributed.estimate import estimate_sharded
from memlab.errors import MemlabError
from memlab.gpus import get_gpu


def test_the_zero_papers_four_numbers():
    got = plan.zero_paper_model_states()
    assert got == {0: 120.0, 1: 31.40625, 2: 16.640625, 3: 1.875}
    for stage, quoted in plan.ZERO_PAPER_QUOTED_GB.items():
        assert round(got[stage], 3 if stage == 3 else 1) == quoted


def test_the_sweep_has_a_value_per_model_stage_and_gpu_count():
    sweep = plan.per_gpu_sweep(("tiny", "llama2-7b"), (1, 2, 8), seq_len=64)
    assert sweep.models == ("tiny", "llama2-7b") and sweep.gpus == (1, 2, 8)
    for m in sweep.models:
        for s in sweep.stages:
            states, peaks = sweep.model_state_bytes[m][s], sweep.peak_bytes[m][s]
            assert len(states) == len(peaks) == 3
            assert all(p > st for p, st in zip(peaks, states, strict=True))
            if s == 0:
                assert len(set(states)) == 1 and len(set(peaks)) == 1
            else:
                assert states[0] > states[1] > states[2]
        one = estimate_sharded(m, zero_stage=3, gpus=8, precision="bf16-mixed", batch_size=1,
                               seq_len=64, checkpointing=True)
        assert sweep.peak_bytes[m][3][2] == one.per_gpu_peak_bytes
    assert "stage 3" in sweep.table("llama2-7b")
    json.dumps(sweep.as_dict())
    with pytest.raises(MemlabError, match="unknown model 'gpt2'"):
        sweep.table("gpt2")


def test_the_default_sweep_covers_three_models_up_to_1024_gpus():
    sweep = plan.per_gpu_sweep()
    assert sweep.models == ("llama2-7b", "llama2-70b", "llama3-405b")
    assert sweep.gpus[0] == 1 and sweep.gpus[-1] == 1024 and len(sweep.gpus) == 11
    assert sweep.setup["precision"] == "bf16-mixed" and sweep.setup["checkpointing"]


def test_smallest_gpus_fits_and_one_fewer_does_not():
    kw = dict(precision="bf16-mixed", batch_size=1, seq_len=4096, checkpointing=True)
    usable = get_gpu("A100-80GB").usable_bytes
    n = plan.smallest_gpus("llama2-70b", 3)
    assert n is not None and n > 1
    assert estimate_sharded("llama2-70b", zero_stage=3, gpus=n, **kw).per_gpu_peak_bytes <= usable
    assert estimate_sharded("llama2-70b", zero_stage=3, gpus=n - 1,
                            **kw).per_gpu_peak_bytes > usable
    assert plan.smallest_gpus("llama2-70b", 0) is None  # DDP never shards
    assert plan.smallest_gpus("tiny", 0, seq_len=64) == 1
    assert plan.smallest_gpus("llama2-70b", 3, max_gpus=n - 1) is None


def test_fit_counts_table():
    counts = plan.fit_counts()
    assert counts.gpu == "A100-80GB" and counts.usable_bytes == get_gpu("A100-80GB").usable_bytes
    for m in counts.models:
        assert counts.counts[m][0] is None  # none of them trains with DDP on 80 GB
        n3 = counts.counts[m][3]
        assert n3 is not None
        for s in (1, 2):
            assert counts.counts[m][s] is None or counts.counts[m][s] >= n3
    assert counts.counts["llama2-7b"][3] < counts.counts["llama2-70b"][3] \
        < counts.counts["llama3-405b"][3]
    text = counts.table()
    assert "llama3-405b" in text and "-" in text
    json.dumps(counts.as_dict())
    with pytest.raises(MemlabError, match="unknown GPU 'V100'"):
        plan.fit_counts(gpu="V100")


# The communication-time model --------------------------------------------------------------
PSI = 11_000_000_000


def test_ring_volumes_and_bandwidth():
    from memlab.distributed.comm import ring_sent_bytes

    assert ring_sent_bytes("all-reduce", 100, 4) == 150
    assert ring_sent_bytes("all-gather", 100, 4) == 75
    assert ring_sent_bytes("broadcast", 100, 4) == 25  # the root sends it once, of 4 ranks
    assert all(ring_sent_bytes(c, 100, 1) == 0 for c in ("all-reduce", "all-gather", "broadcast"))
    nvlink = commtime.LINKS["a100-nvlink3"].bytes_per_s
    assert nvlink == 300e9  # 600 GB/s both directions, quoted
    assert commtime.per_gpu_bandwidth(8) == nvlink
    assert commtime.per_gpu_bandwidth(16) == 2e12 / 8 / 8  # the node's RoCE over 8 GPUs
    for link in commtime.LINKS.values():
        assert link.source.startswith("https://") and link.quoted


def test_comm_seconds_follow_the_stage_and_the_link():
    assert commtime.comm_seconds(PSI, 3, 1) == 0.0
    within = commtime.comm_seconds(PSI, 3, 8)
    assert within == pytest.approx(3 * 7 / 8 * PSI * 2 / 300e9)
    assert commtime.comm_seconds(PSI, 0, 8) == pytest.approx(within * 2 / 3)
    assert commtime.comm_seconds(PSI, 3, 16) > 8 * within  # across nodes: 31.25 GB/s a GPU
    lat = commtime.comm_seconds(PSI, 3, 16, hop_latency_s=1e-5)
    assert lat == pytest.approx(commtime.comm_seconds(PSI, 3, 16) + 3 * 15 * 1e-5)
    with pytest.raises(MemlabError, match="unknown link 'ib'"):
        commtime.comm_seconds(PSI, 3, 16, inter="ib")


def test_throughput_falls_only_once_communication_is_exposed():
    gpus = [8, 16, 64, 512]
    hidden = commtime.throughput_model(PSI, 65536, gpus, mfu=0.4)
    assert [r.relative for r in hidden] == [1.0] * 4  # compute hides communication
    exposed = commtime.throughput_model(PSI, 65536, gpus, mfu=0.4, overlap=False)
    rel = [r.relative for r in exposed]
    assert rel[0] == 1.0 and rel == sorted(rel, reverse=True) and rel[-1] < 1
    row = exposed[-1]
    assert row.step_s == pytest.approx(row.compute_s + row.comm_s)
    assert row.compute_s == pytest.approx(6 * PSI * 65536 / (312e12 * 0.4))
    assert row.tokens_per_s_per_gpu == pytest.approx(65536 / row.step_s)
    json.dumps(row.as_dict())


@pytest.mark.parametrize("kwargs, message", [
    (dict(mfu=1.5), "between 0 and 1"),
    (dict(mfu=0.0), "mfu must be a positive number"),
    (dict(mfu=0.4, peak_flops=-1), "peak_flops must be a positive number"),
    (dict(mfu=0.4, stage=5), "ZeRO stage must be one of"),
])
def test_throughput_model_bad_input(kwargs, message):
    with pytest.raises(MemlabError, match=message):
        commtime.throughput_model(PSI, 4096, [8, 16], **kwargs)
