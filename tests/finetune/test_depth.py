"""The last k blocks of a deep model trained: estimated, traced, and the FLOPs of the step."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.finetune.depth import depth_table
from memlab.model.config import get_config


def test_fewer_trained_blocks_save_activations_and_backward_and_the_traces_agree():
    n = get_config("llama-1b").n_layer
    t = depth_table("llama-1b", blocks=(1, 2, 4, n), traced=(1, 4, n), batch_size=1, seq_len=128)
    assert (t.n_layer, t.parameters) == (n, get_config("llama-1b").num_parameters())
    acts = [r.saved_activations_bytes for r in t.rows]
    trained = [r.trainable_parameters for r in t.rows]
    assert acts == sorted(acts) and trained == sorted(trained) and trained[-1] == t.parameters
    for r in t.rows:
        if r.traced_peak_bytes is not None:
            assert r.peak_bytes == pytest.approx(r.traced_peak_bytes, rel=0.03)
    assert t.row(2).traced_peak_bytes is None and t.row(2).forward_flops is None
    full, last = t.row(n), t.row(1)
    assert full.forward_flops == last.forward_flops
    assert full.backward_flops > 1.9 * full.forward_flops
    assert last.backward_flops < 0.2 * last.forward_flops  # the gradient stops in the last block


def test_depth_table_refuses_in_one_line():
    with pytest.raises(MemlabError, match="blocks 40 exceeds llama2-7b's 32 blocks"):
        depth_table("llama2-7b", blocks=(40,))
    with pytest.raises(MemlabError, match="traced names 3 blocks"):
        depth_table("llama2-7b", blocks=(1,), traced=(3,))
    with pytest.raises(MemlabError, match="no row trains the last 3 blocks; accepted: 1"):
        depth_table("tiny", blocks=(1,), seq_len=32).row(3)
