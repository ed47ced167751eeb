"""memlab.model.optim: AdamW with bf16 moments, and the two cheaper optimizers by name (chapter 8)."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.model.optim import AdamWBf16Moments
from memlab.model.train import make_optimizer


def _pair(seed: int = 0):
    """Two identical small parameter sets: a matrix and a vector."""
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(6, 5, generator=gen), torch.randn(5, generator=gen)]
    return ([torch.nn.Parameter(t.clone()) for t in base],
            [torch.nn.Parameter(t.clone()) for t in base])


def _steps(opt, params, n: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_with_fp32_moments_it_is_torchs_adamw_step_for_step(weight_decay):
    ours, theirs = _pair()
    kw = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=weight_decay)
    a = AdamWBf16Moments(ours, moments_dtype=torch.float32, **kw)
    b = torch.optim.AdamW(theirs, foreach=False, **kw)
    for _ in range(5):
        _steps(a, ours, 1, seed=7)
        _steps(b, theirs, 1, seed=7)
        for p, q in zip(ours, theirs, strict=True):
            assert torch.equal(p, q)
            assert torch.equal(a.state[p]["exp_avg_sq"], b.state[q]["exp_avg_sq"])


def test_its_moments_are_bf16_and_it_stays_near_fp32_adamw():
    ours, theirs = _pair()
    a = AdamWBf16Moments(ours, lr=1e-2)
    b = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=1e-2)
    _steps(a, ours, 20)
    _steps(b, theirs, 20)
    for p, q in zip(ours, theirs, strict=True):
        assert p.dtype == torch.float32
        assert {k: v.dtype for k, v in a.state[p].items() if torch.is_tensor(v)} == {
            "exp_avg": torch.bfloat16, "exp_avg_sq": torch.bfloat16}
        assert not torch.equal(p, q)  # the rounding of the moments shows
        assert torch.allclose(p, q, atol=2e-2)


def test_a_bf16_parameter_is_updated_in_fp32_and_stays_bf16():
    p = torch.nn.Parameter(torch.ones(4, 3, dtype=torch.bfloat16))
    opt = AdamWBf16Moments([p], lr=1e-2)
    p.grad = torch.ones_like(p)
    opt.step()
    assert p.dtype == torch.bfloat16 and torch.all(p < 1)


def test_the_two_by_name():
    p = [torch.nn.Parameter(torch.ones(4, 2))]
    assert isinstance(make_optimizer("adamw-bf16-moments", p, lr=0.1), AdamWBf16Moments)
    ada = make_optimizer("adafactor", p, lr=0.1, impl="foreach")
    assert type(ada) is torch.optim.Adafactor and ada.defaults["foreach"] is True
    p[0].grad = torch.ones_like(p[0])
    ada.step()
    assert {k: tuple(v.shape) for k, v in ada.state[p[0]].items()} == {
        "step": (), "row_var": (4, 1), "col_var": (1, 2)}


@pytest.mark.parametrize("name", ["adamw-bf16-moments", "adafactor"])
def test_no_fused_kernel_is_a_one_line_error(name):
    with pytest.raises(MemlabError, match=f"optimizer '{name}' .*; accepted optimizer_impl for "
                                          "it: foreach, for-loop"):
        make_optimizer(name, [torch.nn.Parameter(torch.ones(2))], lr=0.1, impl="fused")


def test_bad_moments_dtype_is_refused():
    with pytest.raises(MemlabError, match="moments_dtype must be torch.bfloat16 or torch.float32"):
        AdamWBf16Moments([torch.nn.Parameter(torch.ones(2))], moments_dtype=torch.float16)
