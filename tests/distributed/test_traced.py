"""A sharded (FSDP2) training step traced on fake tensors over a fake process group."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from memlab.distributed import traced
from memlab.distributed.traced import ShardedTrace, trace_sharded
from memlab.errors import MemlabError
from memlab.model.config import get_config
from memlab.model.transformer import build_model

TINY = get_config("tiny")
UNEVEN = get_config("tiny", d_ff=170)  # 170 rows: padded to 172 over 4 ranks, 176 over 8
SMALL = dict(batch_size=2, seq_len=64)


def _padded_shard_bytes(cfg, gpus: int) -> int:
    """One rank's fp32 shard of every parameter: dim 0 padded to a multiple of ``gpus``."""
    model = build_model(cfg, device="meta")
    return sum(4 * math.ceil(p.shape[0] / gpus) * math.prod(p.shape[1:])
               for p in model.parameters())


@pytest.mark.parametrize("gpus", [4, 8])
@pytest.mark.parametrize("cfg", [TINY, UNEVEN], ids=["tiny", "uneven"])
def test_each_rank_holds_the_padded_shards(cfg, gpus):
    got = trace_sharded(cfg, gpus, **SMALL)
    shard = _padded_shard_bytes(cfg, gpus)
    assert got.peak_by_category["sharded_param"] == shard
    n_tensors = len(list(build_model(cfg, device="meta").parameters()))
    # params + grads (fp32 shards) + AdamW's two moments, plus its 4-byte step counters
    assert got.model_state_bytes == 4 * shard + 4 * n_tensors
    assert not dist.is_initialized()  # the fake process group is gone


def test_the_result_names_every_category_and_adds_up():
    got = trace_sharded(TINY, 4, **SMALL)
    assert isinstance(got, ShardedTrace)
    assert {"sharded_param", "unsharded_param", "sharded_grad", "unsharded_grad", "act",
            "temp", "opt", "inp"} <= set(got.peak_by_category)
    assert all(k == k.lower() for k in got.peak_by_category)
    assert sum(got.peak_by_category.values()) == got.peak_bytes
    assert got.parameters == TINY.num_parameters() and got.gpus == 4
    text = got.table()
    assert "ZeRO-3" in text and "sharded_param" in text and "peak" in text


def test_zero2_keeps_more_gathered_parameters_than_zero3():
    zero3 = trace_sharded(TINY, 4, reshard_after_forward=True, **SMALL)
    zero2 = trace_sharded(TINY, 4, reshard_after_forward=False, **SMALL)
    assert zero2.peak_by_category["unsharded_param"] > zero3.peak_by_category["unsharded_param"]
    assert zero2.peak_bytes > zero3.peak_bytes
    assert zero2.model_state_bytes == zero3.model_state_bytes


def test_more_ranks_hold_smaller_shards():
    w4, w8 = trace_sharded(TINY, 4, **SMALL), trace_sharded(TINY, 8, **SMALL)
    assert w8.model_state_bytes < w4.model_state_bytes
    assert w8.peak_bytes < w4.peak_bytes


def test_checkpointing_and_bf16_shrink_the_peak_not_the_model_states():
    base = trace_sharded(TINY, 4, batch_size=2, seq_len=128)
    ckpt = trace_sharded(TINY, 4, batch_size=2, seq_len=128, checkpointing=True)
    bf16 = trace_sharded(TINY, 4, batch_size=2, seq_len=128, precision="bf16-mixed")
    assert ckpt.peak_by_category["act"] < base.peak_by_category["act"]
    assert bf16.peak_bytes < base.peak_bytes
    # the shards, their gradients and the optimizer states stay fp32
    assert ckpt.model_state_bytes == bf16.model_state_bytes == base.model_state_bytes


@pytest.mark.parametrize("kwargs, needle", [
    (dict(gpus=1), "trace_step"),
    (dict(gpus=0), "gpus"),
    (dict(gpus=2.0), "gpus"),
    (dict(gpus=True), "gpus"),
    (dict(precision="fp16-mixed"), "accepted: fp32, bf16-mixed"),
    (dict(batch_size=0), "batch_size"),
    (dict(seq_len=TINY.max_seq_len + 1), "max_seq_len"),
    (dict(reshard_after_forward="yes"), "reshard_after_forward"),
    (dict(checkpointing=1), "checkpointing"),
    (dict(model=3), "model"),
    (dict(model="no-such-model"), "unknown model"),
])
def test_bad_input_gets_a_one_line_error(kwargs, needle):
    args = dict(model=TINY, gpus=4, **SMALL) | kwargs
    with pytest.raises(MemlabError, match=needle) as err:
        trace_sharded(args.pop("model"), args.pop("gpus"), **args)
    assert "\n" not in str(err.value)
    assert not dist.is_initialized()


def test_a_process_group_already_there_is_refused():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with pytest.raises(MemlabError, match="already initialised") as err:
            trace_sharded(TINY, 4, **SMALL)
        assert "\n" not in str(err.value)
        assert dist.is_initialized()  # the caller's group is left alone
    finally:
        dist.destroy_process_group()


def test_the_process_group_is_destroyed_when_the_trace_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("broken model")

    monkeypatch.setattr(traced, "build_model", broken)
    with pytest.raises(RuntimeError, match="broken model"):
        trace_sharded(TINY, 4, **SMALL)
    assert not dist.is_initialized()
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.slow
def test_llama2_7b_over_8_ranks_holds_16_bytes_per_parameter_over_8():
    got = trace_sharded("llama2-7b", 8)  # the whole model, traced: about 10 s
    expected = 16 * got.parameters / 8  # fp32 params + grads + AdamW's m and v, sharded
    assert got.model_state_bytes == pytest.approx(expected, rel=0.02)
    assert got.peak_by_category["sharded_param"] == pytest.approx(4 * got.parameters / 8,
                                                                  rel=1e-6)
    assert got.peak_bytes > got.model_state_bytes
