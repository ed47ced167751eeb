"""LoRA from scratch against peft: the same trainable counts, outputs and gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memlab.errors import MemlabError
from memlab.finetune import (
    LoraConfig,
    adapters_disabled,
    block_linear_shapes,
    count_trainable,
    freeze_all_but_last,
    inject_lora,
    lora_forward,
    lora_layers,
    merge_lora,
    trainable_parameters,
    unmerge_lora,
)
from memlab.model import PRESETS, build_model, get_config

peft = pytest.importorskip("peft")

TINY = get_config("tiny")
BLOCK_NAMES = list(block_linear_shapes(TINY))


def _x(cfg=TINY, B=2, T=16):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))


def _ours(cfg, lora):
    model = build_model(cfg, seed=0)
    layers = inject_lora(model, lora)
    g = torch.Generator().manual_seed(2)
    for m in layers.values():  # a nonzero B, so the update shows
        m.lora_B.weight.data = torch.randn(m.lora_B.weight.shape, generator=g) * 0.1
    return model


def _peft_like(cfg, lora, ours):
    """The same base and the same adapter weights, wrapped by peft."""
    base = build_model(cfg, seed=0)
    targets = BLOCK_NAMES if lora.target_modules == "all-linear" else list(lora.target_modules)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha,
                                                   lora_dropout=0.0, target_modules=targets))
    for name, m in lora_layers(ours).items():
        layer = pm.base_model.model.get_submodule(name)
        layer.lora_A["default"].weight.data.copy_(m.lora_A.weight)
        layer.lora_B["default"].weight.data.copy_(m.lora_B.weight)
    return pm


@pytest.mark.parametrize("cfg_name", ["tiny", "tiny-gpt2"])
@pytest.mark.parametrize("lora", [LoraConfig(r=4, alpha=8), LoraConfig(r=2, alpha=16,
                                                                        target_modules="all-linear")])
def test_counts_outputs_and_gradients_match_peft(cfg_name, lora):
    cfg = get_config(cfg_name)
    ours = _ours(cfg, lora)
    pm = _peft_like(cfg, lora, ours)
    n, _ = pm.get_nb_trainable_parameters()
    assert count_trainable(ours) == n == trainable_parameters(cfg, lora=lora)
    x = _x(cfg)
    a, b = ours(x), pm(x)
    torch.testing.assert_close(a, b)
    a.pow(2).mean().backward()
    b.pow(2).mean().backward()
    for name, m in lora_layers(ours).items():
        layer = pm.base_model.model.get_submodule(name)
        torch.testing.assert_close(m.lora_A.weight.grad, layer.lora_A["default"].weight.grad)
        torch.testing.assert_close(m.lora_B.weight.grad, layer.lora_B["default"].weight.grad)


def test_adapters_off_and_merge_match_peft_and_the_base():
    lora = LoraConfig(r=4, alpha=8)
    ours = _ours(TINY, lora)
    pm = _peft_like(TINY, lora, ours)
    base = build_model(TINY, seed=0)
    x = _x()
    with torch.no_grad():
        ref = base(x)
        with adapters_disabled(ours):
            off = ours(x)
        with pm.disable_adapter():
            peft_off = pm(x)
        on = ours(x)
        merge_lora(ours)
        merged = ours(x)
        unmerge_lora(ours)
        back = ours(x)
        peft_merged = pm.merge_and_unload()(x)
    assert torch.equal(off, ref) and torch.equal(peft_off, ref)  # exactly the base model
    torch.testing.assert_close(merged, on, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(peft_merged, merged, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(back, on, rtol=1e-5, atol=1e-5)


def test_peft_all_linear_on_a_plain_module_takes_the_head_too():
    """peft drops the output layer only for a transformers model: on the book's module it adapts lm_head."""
    pm = peft.get_peft_model(build_model(TINY, seed=0),
                             peft.LoraConfig(r=4, target_modules="all-linear"))
    n, _ = pm.get_nb_trainable_parameters()
    ours = trainable_parameters(TINY, lora=LoraConfig(r=4, target_modules="all-linear"))
    assert n - ours == 4 * (TINY.d_model + TINY.vocab_size)


def test_lora_forward_is_the_merged_weight():
    g = torch.Generator().manual_seed(0)
    x, W, b = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5)
    A, B = torch.randn(2, 8, generator=g), torch.randn(5, 2, generator=g)
    y = lora_forward(x, W, b, A, B, 0.5)
    torch.testing.assert_close(y, x @ (W + 0.5 * B @ A).T + b)


def test_b_starts_at_zero_so_the_model_starts_as_the_base():
    model = build_model(TINY, seed=0)
    inject_lora(model, LoraConfig(r=4))
    x = _x()
    with torch.no_grad():
        assert torch.equal(model(x), build_model(TINY, seed=0)(x))


@pytest.mark.parametrize("name", ["llama2-7b", "llama3-8b", "mistral-7b", "gpt2", "tiny"])
def test_counts_from_the_config_match_a_meta_model(name):
    cfg = PRESETS[name]
    for lora in (LoraConfig(r=8), LoraConfig(r=16, target_modules="all-linear")):
        model = build_model(cfg, device="meta")
        inject_lora(model, lora)
        assert count_trainable(model) == trainable_parameters(cfg, lora=lora)
    model = build_model(cfg, device="meta")
    assert freeze_all_but_last(model, 2) == trainable_parameters(cfg, train_last=2)


def test_the_issues_llama2_7b_counts():
    assert trainable_parameters("llama2-7b", lora=LoraConfig(r=8)) == 4_194_304
    assert trainable_parameters("llama2-7b",
                                lora=LoraConfig(r=16, target_modules="all-linear")) == 39_976_960


@pytest.mark.parametrize("call, match", [
    (lambda: LoraConfig(r=0), "rank r"),
    (lambda: LoraConfig(alpha=-1), "alpha"),
    (lambda: LoraConfig(dropout=1.0), "dropout"),
    (lambda: LoraConfig(target_modules=()), "target_modules"),
    (lambda: inject_lora(build_model(TINY), LoraConfig(target_modules=("qkv",))), "'qkv'"),
    (lambda: trainable_parameters(TINY, lora=LoraConfig(target_modules="c_attn")), "c_attn"),
    (lambda: trainable_parameters(TINY, train_last=3), "exceeds"),
    (lambda: freeze_all_but_last(build_model(TINY), 0), "k"),
])
def test_bad_input_is_one_line(call, match):
    with pytest.raises(MemlabError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_comma_separated_targets_as_the_cli_spells_them():
    assert LoraConfig(target_modules="q_proj, v_proj").target_modules == ("q_proj", "v_proj")
    assert dataclasses.replace(LoraConfig(), r=2).scaling == 8.0


def test_adapters_stay_fp32_on_a_bf16_base_as_peft_keeps_them():
    lora = LoraConfig(r=4, alpha=8)
    ours = build_model(TINY, seed=0).to(torch.bfloat16)
    layers = inject_lora(ours, lora)
    g = torch.Generator().manual_seed(2)
    for m in layers.values():
        m.lora_B.weight.data = torch.randn(m.lora_B.weight.shape, generator=g) * 0.1
    pm = peft.get_peft_model(build_model(TINY, seed=0).to(torch.bfloat16),
                             peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, m in layers.items():
        layer = pm.base_model.model.get_submodule(name)
        assert layer.lora_A["default"].weight.dtype == m.lora_A.weight.dtype == torch.float32
        layer.lora_A["default"].weight.data.copy_(m.lora_A.weight)
        layer.lora_B["default"].weight.data.copy_(m.lora_B.weight)
    x = _x()
    a, b = ours(x), pm(x)
    assert a.dtype == torch.bfloat16
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("call, match", [
    (lambda: LoraConfig(alpha=float("inf")), "alpha"),
    (lambda: LoraConfig(target_modules=5), "target_modules"),
    (lambda: trainable_parameters(TINY, lora="q_proj"), "LoraConfig"),
    (lambda: inject_lora(_ours(TINY, LoraConfig(r=2)), LoraConfig(r=2)), "adapters already"),
])
def test_more_bad_input_is_one_line(call, match):
    with pytest.raises(MemlabError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def test_all_linear_with_spaces_and_freeze_prefixes():
    from memlab.finetune import freeze_all_but

    assert LoraConfig(target_modules=" all-linear ").target_modules == "all-linear"
    model = build_model(TINY, seed=0)
    assert freeze_all_but(model, "lm_head") == TINY.vocab_size * TINY.d_model
    with pytest.raises(MemlabError, match="at least one module"):
        freeze_all_but(model, [])
