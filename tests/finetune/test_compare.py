"""Fine-tuning set-ups compared on the book's model, from the same start on the same batches."""

from __future__ import annotations

import math

import pytest

from memlab.errors import MemlabError
from memlab.finetune import LoraConfig, finetune_comparison, trainable_parameters
from memlab.model.lm import TINY_LM
from memlab.results import writable_type

pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def comp():
    return finetune_comparison(config=TINY_LM, steps=6, device="cpu",
                               setups=("full", "last block", "LoRA q,v r=4", "QLoRA q,v r=8"))


def test_rows_trainable_counts_and_paired_differences(comp):
    cfg = TINY_LM.model_config()
    assert [r.name for r in comp.rows] == ["full", "last block", "LoRA q,v r=4", "QLoRA q,v r=8"]
    assert comp.row("full").trainable_parameters == cfg.num_parameters()
    assert comp.row("last block").trainable_parameters == trainable_parameters(cfg, train_last=1)
    assert comp.row("LoRA q,v r=4").trainable_parameters == trainable_parameters(
        cfg, lora=LoraConfig(r=4))
    assert comp.row("full").delta_loss == 0 and math.isnan(comp.row("full").delta_se)
    assert all(r.delta_se > 0 for r in comp.rows[1:])


def test_memory_falls_with_what_trains(comp):
    full, lora = comp.row("full"), comp.row("LoRA q,v r=4")
    assert lora.categories["optimizer_states"] < full.categories["optimizer_states"]
    assert lora.peak_bytes < full.peak_bytes
    qlora = comp.row("QLoRA q,v r=8")
    assert qlora.categories["parameters"] < lora.categories["parameters"]  # the 4-bit base


def test_each_row_is_at_its_own_factor_and_is_the_sweeps_run_at_that_factor(comp):
    from memlab.finetune.compare import SETUPS, lr_factor, lr_sweep

    assert comp.base_lr == TINY_LM.lr
    assert all(r.lr_factor == lr_factor(r.name) for r in comp.rows)
    lora = next(s for s in SETUPS if s.name == "LoRA q,v r=4")
    sweep = lr_sweep(config=TINY_LM, steps=6, factors=(lr_factor(lora.name),), setups=(lora,),
                     device="cpu")
    assert sweep.rows[0].loss == comp.row(lora.name).quality.loss  # adapters from a fixed seed


def test_the_result_is_storable_and_bad_names_are_refused(comp):
    writable_type(type(comp))
    with pytest.raises(MemlabError, match="unknown set-up 'lora'"):
        comp.row("lora")
    with pytest.raises(MemlabError, match="unknown set-up"):
        finetune_comparison(config=TINY_LM, steps=1, setups=("nope",))


def test_setups_name_themselves_in_the_step_and_refuse_bad_combinations():
    from memlab.finetune import SETUPS, Setup
    from memlab.model.step import StepSpec

    spec = StepSpec(TINY_LM.model_config(), batch_size=2, seq_len=8, prepare=SETUPS[2])
    assert spec.as_dict()["prepare"] == SETUPS[2].name
    with pytest.raises(MemlabError, match="needs LoRA"):
        Setup("x", quantize_base="nf4")
    with pytest.raises(MemlabError, match="not both"):
        Setup("x", lora=LoraConfig(), train_last=1)
    with pytest.raises(MemlabError, match="at least one set-up"):
        finetune_comparison(config=TINY_LM, steps=1, setups=())
