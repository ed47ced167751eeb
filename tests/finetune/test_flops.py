"""Freezing removes the weight-gradient matmuls, not the input-gradient ones below a trainable layer."""

from __future__ import annotations

import pytest
import torch

from memlab.finetune import LoraConfig, freeze_all_but_last, inject_lora, step_flops
from memlab.model import build_model, get_config

TINY = get_config("tiny")


@pytest.fixture(scope="module")
def x():
    return torch.randint(0, TINY.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))


def test_full_training_backward_is_twice_the_forward(x):
    eager = get_config("tiny", attention="eager")  # matmuls only: no fused kernel recomputing
    f = step_flops(build_model(eager, seed=0), x)
    assert f.backward == 2 * f.forward  # input and weight gradients of every matmul
    sdpa = step_flops(build_model(TINY, seed=0), x)  # SDPA counted, its backward recomputes
    assert sdpa.forward == f.forward and sdpa.backward > f.backward


def test_freezing_drops_weight_gradients_and_the_layers_below(x):
    full = step_flops(build_model(TINY, seed=0), x)
    m = build_model(TINY, seed=0)
    freeze_all_but_last(m, 1)
    last = step_flops(m, x)
    assert last.forward == full.forward and last.backward < full.backward
    head_only = build_model(TINY, seed=0)
    for p in head_only.parameters():
        p.requires_grad_(False)
    head_only.lm_head.weight.requires_grad_(True)
    assert step_flops(head_only, x).backward < last.backward


def test_weights_left_out_of_the_optimizer_save_no_flops():
    from memlab.errors import MemlabError
    from memlab.finetune.compare import SETUPS
    from memlab.finetune.flops import flops_table

    t = flops_table(setups=SETUPS[:2], frozen_by="optimizer")
    assert t.row("last block").flops == t.row("full").flops
    assert t.row("last block").trainable_parameters < t.row("full").trainable_parameters
    with pytest.raises(MemlabError, match="frozen_by"):
        flops_table(frozen_by="lr")


def test_lora_keeps_the_input_gradients_of_every_frozen_layer(x):
    full = step_flops(build_model(TINY, seed=0), x)
    m = build_model(TINY, seed=0)
    inject_lora(m, LoraConfig(r=8))
    lo = step_flops(m, x)
    # adapters in the first block: the input gradients run through the whole model
    assert 0.9 * full.forward < lo.backward < full.backward
