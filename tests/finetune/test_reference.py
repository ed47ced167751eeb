"""Adapters off reproduce the base model's logits exactly, merged or not."""

from __future__ import annotations

import torch

from memlab.finetune import (
    LoraConfig,
    inject_lora,
    merge_lora,
    reference_check,
    trainable_parameters,
)
from memlab.model import build_model, get_config

TINY = get_config("tiny")


def _tuned():
    model = build_model(TINY, seed=0)
    layers = inject_lora(model, LoraConfig(r=4))
    for m in layers.values():
        torch.nn.init.normal_(m.lora_B.weight, std=0.1)
    return model


def test_adapters_off_give_the_base_logits_bit_for_bit():
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    r = reference_check(_tuned(), build_model(TINY, seed=0), x)
    assert r.identical and r.max_abs_diff == 0 and r.tuned_differs
    assert r.second_copy_bytes == 4 * TINY.num_parameters()
    assert r.adapter_bytes == 4 * trainable_parameters(TINY, lora=LoraConfig(r=4))  # fp32
    assert 0 < r.adapter_bytes < r.second_copy_bytes


def test_a_merged_model_is_unmerged_for_the_reference_and_merged_again():
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    tuned = _tuned()
    with torch.no_grad():
        on = tuned(x)
    merge_lora(tuned)
    r = reference_check(tuned, build_model(TINY, seed=0), x)
    assert r.max_abs_diff < 1e-5  # the merge and unmerge round in fp32
    with torch.no_grad():
        torch.testing.assert_close(tuned(x), on, rtol=1e-5, atol=1e-5)
