"""Activation offloading's cut, host bytes and batch that fits (memlab.longcontext.offload, chapter 8)."""

from __future__ import annotations

import pytest

from memlab.compute.offload import transfer_seconds
from memlab.errors import MemlabError
from memlab.finetune import LoraConfig, Setup
from memlab.longcontext.offload import largest_batch, offload_case, offload_study
from memlab.model.config import get_config

QLORA = Setup("QLoRA", lora=LoraConfig(r=8), quantize_base="nf4-dq")


def test_a_case_moves_the_units_inputs_there_and_back():
    cfg = get_config("llama3.1-8b")
    case = offload_case(cfg, QLORA, batch_size=2, seq_len=4096)
    assert case.host_bytes == cfg.n_layer * 2 * 4096 * cfg.d_model * 2
    assert case.moved_bytes == 2 * case.host_bytes
    assert case.transfer_s == transfer_seconds(case.moved_bytes, "pcie4-x16")
    assert 0 < case.cut < 1 and case.offloaded_peak_bytes < case.peak_bytes


def test_offloading_never_shrinks_the_batch_that_fits():
    study = offload_study("llama3.1-8b", setups=(QLORA,), batch_sizes=(1,), seq_lens=(2048, 8192),
                          gpu="A100-40GB")
    for fit in study.fits:
        assert fit.offloaded_batch >= fit.batch
        peak = largest_batch("llama3.1-8b", QLORA, fit.capacity_bytes, seq_len=fit.seq_len,
                             offload=True)
        assert peak == fit.offloaded_batch


def test_bad_input_is_one_line():
    with pytest.raises(MemlabError, match="setups must name"):
        offload_study("tiny", setups=())
    with pytest.raises(MemlabError, match="capacity_bytes"):
        largest_batch("tiny", QLORA, 0, seq_len=64)
