"""memlab.model.train: the optimizer vocabulary and factory, TrainConfig and the one training loop."""

from __future__ import annotations

import math

import pytest
import torch

from memlab.errors import MemlabError
from memlab.model.config import OPTIMIZERS, get_config
from memlab.model.train import TrainConfig, make_optimizer, train_loop
from memlab.model.transformer import build_model


def _params():
    return [torch.nn.Parameter(torch.ones(4))]


@pytest.mark.parametrize("name, cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam),
                                       ("sgd", torch.optim.SGD), ("sgd-momentum", torch.optim.SGD)])
def test_every_torch_optimizer_by_its_book_name(name, cls):
    opt = make_optimizer(name, _params(), lr=0.1)
    assert type(opt) is cls
    if name.startswith("sgd"):
        assert opt.defaults["momentum"] == (0.9 if name == "sgd-momentum" else 0.0)


def test_eight_bit_adamw_is_bitsandbytes():
    bnb = pytest.importorskip("bitsandbytes")
    assert isinstance(make_optimizer("adamw-8bit", _params(), lr=0.1), bnb.optim.AdamW8bit)
    with pytest.raises(MemlabError, match="'adamw-8bit' has its own kernels"):
        make_optimizer("adamw-8bit", _params(), lr=0.1, impl="fused")


def test_bad_optimizer_input_is_one_line():
    with pytest.raises(MemlabError, match="unknown optimizer 'lion'; accepted: " + ", ".join(OPTIMIZERS)):
        make_optimizer("lion", _params(), lr=0.1)
    with pytest.raises(MemlabError, match="unknown optimizer_impl 'apex'"):
        make_optimizer("adamw", _params(), lr=0.1, impl="apex")
    with pytest.raises(MemlabError, match="lr must be a positive number, got 0"):
        make_optimizer("adamw", _params(), lr=0)


def test_cosine_schedule_warms_up_then_decays_to_zero():
    c = TrainConfig(steps=100, lr=1.0, schedule="cosine", warmup=10)
    assert c.lr_at(0) == pytest.approx(0.1 * 0.5 * (1 + math.cos(0)))
    assert c.lr_at(9) == pytest.approx(0.5 * (1 + math.cos(math.pi * 9 / 100)))
    assert c.lr_at(99) < 1e-3 and TrainConfig(steps=5, lr=0.3).lr_at(4) == 0.3


@pytest.mark.parametrize("kw, needle", [
    (dict(steps=0), "steps must be a positive integer"),
    (dict(lr=-1.0), "lr must be a positive number"),
    (dict(schedule="linear"), "unknown schedule 'linear'; accepted: constant, cosine"),
    (dict(autocast="fp8"), "unknown autocast 'fp8'; accepted: fp16, bf16"),
    (dict(grad_scaler=0), "grad_scaler must be a positive initial scale"),
    (dict(warmup=-1), "warmup must be a non-negative integer"),
])
def test_train_config_refuses_bad_values(kw, needle):
    with pytest.raises(MemlabError, match=needle):
        TrainConfig(**{"steps": 3, "lr": 0.1, **kw})


def _tiny():
    cfg = get_config("tiny", vocab_size=64, n_layer=1, d_model=32, n_head=2, n_kv_head=2, d_ff=64,
                     max_seq_len=16)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 64, (6, 2, 2, 8), generator=g)
    return build_model(cfg, seed=0), (lambda step: (data[step, 0], data[step, 1]))


def test_the_loop_lowers_the_loss_and_calls_its_hooks_in_order():
    model, batch = _tiny()
    calls = []
    log = train_loop(model, batch, TrainConfig(steps=6, lr=1e-2), device=torch.device("cpu"),
                     after_backward=lambda s, loss: calls.append(("backward", s, all(
                         p.grad is not None for p in model.parameters()))),
                     after_step=lambda s, loss: calls.append(("step", s, True)))
    assert calls == [(k, s, True) for s in range(6) for k in ("backward", "step")]
    assert len(log.losses) == 6 and log.losses[-1] < log.losses[0]
    assert log.scales is None and log.skipped_steps == [] and not model.training


def test_a_huge_loss_scale_skips_steps_and_backs_off():
    model, batch = _tiny()
    before = [p.detach().clone() for p in model.parameters()]
    log = train_loop(model, batch, TrainConfig(steps=3, lr=1e-2, autocast="fp16",
                                               grad_scaler=2.0**40),
                     device=torch.device("cpu"))
    assert log.skipped_steps[:1] == [0]  # fp16 gradients overflow at 2**40: the update is skipped
    for a, b, step in zip(log.scales, log.scales[1:], range(3), strict=False):
        assert b == (a / 2 if step in log.skipped_steps else a)  # halved after each skip
    if log.skipped_steps == [0, 1, 2]:
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
