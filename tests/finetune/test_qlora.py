"""QLoRA on the CPU through bitsandbytes: a 4-bit frozen base, fp32 adapters, the same as peft."""

from __future__ import annotations

import pytest
import torch

from memlab.errors import MemlabError
from memlab.finetune import LoraConfig, count_trainable, lora_layers, trainable_parameters
from memlab.finetune.qlora import qlora, quantize_base
from memlab.model import build_model, get_config

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")
TINY = get_config("tiny")


@pytest.mark.parametrize("scheme", ["nf4-dq", "nf4"])
def test_qlora_trains_only_fp32_adapters_on_a_4bit_base(scheme):
    model = build_model(TINY, seed=0)
    layers = qlora(model, LoraConfig(r=4, alpha=8), scheme)
    assert all(isinstance(m.base, bnb.nn.Linear4bit) for m in layers.values())
    assert all(m.base.weight.dtype == torch.uint8 for m in layers.values())  # stored packed
    assert all(m.lora_A.weight.dtype == torch.float32 for m in layers.values())
    assert count_trainable(model) == trainable_parameters(TINY, lora=LoraConfig(r=4))
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    model(x).pow(2).mean().backward()
    assert all(m.lora_B.weight.grad is not None for m in layers.values())
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_qlora_matches_peft_on_the_same_4bit_base():
    lora = LoraConfig(r=4, alpha=8)
    ours = build_model(TINY, seed=0)
    layers = qlora(ours, lora)
    g = torch.Generator().manual_seed(3)
    for m in layers.values():
        m.lora_B.weight.data = torch.randn(m.lora_B.weight.shape, generator=g) * 0.1
    base = quantize_base(build_model(TINY, seed=0), "nf4-dq")
    pm = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8,
                                                   target_modules=["q_proj", "v_proj"]))
    for name, m in lora_layers(ours).items():
        layer = pm.base_model.model.get_submodule(name)
        layer.lora_A["default"].weight.data.copy_(m.lora_A.weight)
        layer.lora_B["default"].weight.data.copy_(m.lora_B.weight)
    assert pm.get_nb_trainable_parameters()[0] == count_trainable(ours)
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    a, b = ours(x), pm(x)
    torch.testing.assert_close(a, b)
    a.sum().backward()
    b.sum().backward()
    for name, m in lora_layers(ours).items():
        layer = pm.base_model.model.get_submodule(name)
        torch.testing.assert_close(m.lora_A.weight.grad, layer.lora_A["default"].weight.grad)


def test_a_base_quantization_the_layers_cannot_take_is_refused():
    with pytest.raises(MemlabError, match="unknown base quantization 'gptq-4'") as e:
        quantize_base(build_model(TINY), "gptq-4")
    assert "\n" not in str(e.value)


def test_merging_into_a_quantized_base_is_refused_in_one_line():
    from memlab.finetune import merge_lora

    model = build_model(TINY, seed=0)
    qlora(model, LoraConfig(r=4))
    with pytest.raises(MemlabError, match="cannot merge into a quantized base") as e:
        merge_lora(model)
    assert "\n" not in str(e.value)
