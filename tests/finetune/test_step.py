"""A fine-tuning step measured and traced: the model is prepared (frozen, adapters) before the step."""

from __future__ import annotations

import functools

import pytest

from memlab.errors import MemlabError
from memlab.finetune import LoraConfig, freeze_all_but_last, inject_lora, trainable_parameters
from memlab.measure.step import measure_step, trace_step
from memlab.memory.estimator import estimate
from memlab.model import get_config
from memlab.model.step import StepSpec

TINY = get_config("tiny")
LORA = LoraConfig(r=4)


def _lora(model):
    inject_lora(model, LORA)


@pytest.mark.parametrize("run", [trace_step, functools.partial(measure_step, device="cpu")])
def test_lora_step_keeps_gradients_and_states_of_the_adapters_only(run):
    spec = StepSpec(TINY, batch_size=2, seq_len=32, prepare=_lora)
    got = run(spec)
    n = trainable_parameters(TINY, lora=LORA)
    opt = got.phase_breakdown["optimizer"]
    assert opt["gradients"] == 4 * n  # fp32 adapters
    assert opt["optimizer_states"] >= 2 * 4 * n  # AdamW's two moments (and its step counters)
    assert opt["optimizer_states"] < 2 * 4 * n + 4 * 1024
    assert got.setup["prepare"] == "_lora"


def test_freezing_shrinks_the_saved_activations_and_the_states():
    full = trace_step(TINY, batch_size=2, seq_len=32)
    frozen = trace_step(StepSpec(TINY, batch_size=2, seq_len=32,
                                 prepare=lambda m: freeze_all_but_last(m, 1)))
    assert frozen.saved_activations_bytes < full.saved_activations_bytes
    assert frozen.phase_breakdown["optimizer"]["optimizer_states"] < \
        full.phase_breakdown["optimizer"]["optimizer_states"]


def test_the_estimator_refuses_a_prepared_step_in_one_line():
    with pytest.raises(MemlabError, match="prepare") as e:
        estimate(StepSpec(TINY, batch_size=2, seq_len=32, prepare=_lora))
    assert "\n" not in str(e.value)
    with pytest.raises(MemlabError, match="prepare must be a callable"):
        StepSpec(TINY, batch_size=2, seq_len=32, prepare="lora")


def test_a_qlora_step_is_measured_and_its_trace_refused_in_one_line():
    pytest.importorskip("bitsandbytes")
    from memlab.finetune import qlora

    def q(model):
        qlora(model, LORA)

    spec = StepSpec(TINY, batch_size=2, seq_len=32, prepare=q)
    got = measure_step(spec, device="cpu")
    n = trainable_parameters(TINY, lora=LORA)
    assert got.phase_breakdown["optimizer"]["gradients"] == 4 * n
    full = measure_step(TINY, device="cpu", batch_size=2, seq_len=32)
    assert got.phase_breakdown["optimizer"]["parameters"] < \
        full.phase_breakdown["optimizer"]["parameters"]  # the 4-bit base
    with pytest.raises(MemlabError, match="fake tensors") as e:
        trace_step(spec)
    assert "\n" not in str(e.value)
