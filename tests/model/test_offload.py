"""Activation offloading's hooks (memlab.model.offload, chapter 8), held to PyTorch's save_on_cpu."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.model.config import ModelConfig
from memlab.model.loss import lm_loss
from memlab.model.offload import ActivationOffload
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model

CFG = ModelConfig(name="offload", n_layer=2, n_head=4, n_kv_head=2, d_model=64, vocab_size=300,
                  max_seq_len=64)


def _grads(checkpointing, offload: str):
    model = build_model(CFG, seed=0, checkpointing=checkpointing,
                        offload_activations=offload == "memlab")
    gen = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, CFG.vocab_size, (2, 2, 48), generator=gen)
    if offload == "save_on_cpu":
        with torch.autograd.graph.save_on_cpu(device_type="cpu"):
            loss = lm_loss(model(idx), targets)
    else:
        loss = lm_loss(model(idx), targets)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, model


@pytest.mark.parametrize("checkpointing", [False, True, "selective"])
def test_offloaded_step_has_the_same_loss_and_gradients(checkpointing):
    loss, grads, _ = _grads(checkpointing, "none")
    for other in ("memlab", "save_on_cpu"):
        loss2, grads2, _ = _grads(checkpointing, other)
        assert loss2 == loss
        for name, g in grads.items():
            assert torch.equal(grads2[name], g), (other, name)


def test_parameters_and_their_views_stay_and_shared_storages_are_copied_once():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    hooks = ActivationOffload()
    with hooks:
        h = torch.tanh(x @ w.t())  # saves x, w.t() (a view of w) and tanh's output
        a, b = h.split(2)  # views of one storage
        y = (a * b).sum()  # saves a and b
    y.backward()
    # x (the input is a leaf that needs a gradient: kept), h once for tanh, a and b share h
    assert hooks.stats.tensors == 1
    assert hooks.stats.host_bytes == 4 * 8 * 4
    assert x.grad is not None and w.grad is not None


def test_offload_switch_is_checked_in_one_line():
    with pytest.raises(MemlabError, match="offload_activations must be True or False, got 'yes'"):
        StepSpec("tiny", batch_size=1, seq_len=8, offload_activations="yes")
