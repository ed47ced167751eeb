"""The fine-tuning estimator against the trace (full, frozen, LoRA) and a measured QLoRA step."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.finetune import SETUPS, LoraConfig, Setup, trainable_parameters
from memlab.finetune.estimate import (
    base_weight_bytes,
    estimate_finetune,
    quantized_weight_bytes,
)
from memlab.measure.step import measure_step, trace_step
from memlab.memory import estimate
from memlab.model.step import StepSpec

TOL = 0.03  # the bound; most set-ups land within a few bytes

SET_UPS = [
    Setup("last block", train_last=1),
    Setup("last 2", train_last=2),
    Setup("LoRA q,v", lora=LoraConfig(r=8)),
    Setup("LoRA all", lora=LoraConfig(r=4, target_modules="all-linear")),
    Setup("LoRA o,up,down, dropout", lora=LoraConfig(r=4, dropout=0.1,
                                                      target_modules="o_proj,up_proj,down_proj")),
    Setup("LoRA MLP only", lora=LoraConfig(r=2, target_modules=("down_proj",))),
]


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt2"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
@pytest.mark.parametrize("setup", SET_UPS, ids=lambda s: s.name)
def test_estimate_is_held_to_the_trace(model, precision, setup):
    spec = StepSpec(model, batch_size=2, seq_len=48, precision=precision, prepare=setup)
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=TOL)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=TOL)
    steady = traced.phase_breakdown["optimizer"]
    assert est.parameters_bytes == steady["parameters"]
    assert est.gradients_bytes == steady["gradients"]
    assert est.optimizer_states_bytes == steady["optimizer_states"]


@pytest.mark.parametrize("setup", SET_UPS[::2], ids=lambda s: s.name)
@pytest.mark.parametrize("switches", [dict(checkpointing=True), dict(attention="eager"),
                                      dict(attention="flash"), dict(optimizer="sgd")],
                         ids=["checkpointing", "eager", "flash", "sgd"])
def test_estimate_follows_the_other_switches(setup, switches):
    spec = StepSpec("tiny", batch_size=2, seq_len=32, precision="bf16-mixed", prepare=setup,
                    **switches)
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=TOL)


def test_a_7b_lora_step_matches_its_trace():
    spec = StepSpec("llama2-7b", batch_size=1, seq_len=256, precision="bf16-mixed",
                    prepare=Setup("LoRA q,v", lora=LoraConfig(r=8)))
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.01)
    assert est.setup["trainable_parameters"] == 4_194_304


def test_qlora_is_held_to_a_measured_step_of_the_books_model():
    from memlab.model.lm import config_for

    cfg = config_for("ci", None)
    setup = next(s for s in SETUPS if s.quantize_base)
    spec = StepSpec(cfg.model_config(), batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                    prepare=setup)
    measured = measure_step(spec, device="cpu")
    est = estimate_finetune(spec, device="cpu")
    assert est.peak_bytes == pytest.approx(measured.peak_bytes, rel=TOL)
    # the 4-bit codes with their scales, counted from bitsandbytes' own tensors
    assert est.parameters_bytes == measured.phase_breakdown["optimizer"]["parameters"]


def test_no_set_up_is_the_chapter_1_estimate():
    kw = dict(batch_size=2, seq_len=32, precision="bf16-mixed")
    assert estimate_finetune("tiny", **kw).peak_bytes == estimate("tiny", **kw).peak_bytes


def test_lora_leaves_the_activations_and_freezing_removes_them():
    kw = dict(batch_size=1, seq_len=4096, precision="bf16-mixed")
    full = estimate_finetune("llama2-7b", **kw)
    lora = estimate_finetune("llama2-7b", lora=LoraConfig(r=8), **kw)
    last = estimate_finetune("llama2-7b", train_last=2, **kw)
    assert lora.saved_activations_bytes > 0.7 * full.saved_activations_bytes
    assert last.saved_activations_bytes < 0.1 * full.saved_activations_bytes
    assert lora.optimizer_states_bytes < 0.01 * full.optimizer_states_bytes


@pytest.mark.parametrize("scheme", ["nf4", "nf4-dq", "fp4", "int8"])
def test_quantized_weight_bytes_count_what_bitsandbytes_stores(scheme):
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    from memlab.quant.compare import bnb_linear, layer_bytes

    lin = torch.nn.Linear(192, 80, bias=False)
    q = bnb_linear(lin, scheme, torch.device("cpu"))
    assert quantized_weight_bytes(192, 80, scheme) == layer_bytes(q, 192 * 80).weight_bytes


def test_a_4_bit_base_is_about_a_quarter_of_16_bits():
    b16 = base_weight_bytes("llama2-7b", "bf16")
    nf4 = base_weight_bytes("llama2-7b", "bf16", "nf4-dq")
    assert 0.25 < nf4 / b16 < 0.32  # embeddings, head and norms stay 16-bit


@pytest.mark.parametrize("kwargs, message", [
    (dict(quantize_base="nf4"), "a quantized base needs LoRA adapters"),
    (dict(lora=LoraConfig(r=4), quantize_base="int2"), "unknown base quantization 'int2'"),
    (dict(lora=LoraConfig(r=4, target_modules="c_attn")), "unknown LoRA target module 'c_attn'"),
    (dict(train_last=9), "exceeds the model's 2 blocks"),
    (dict(train_last=1, lora=LoraConfig(r=4)), "not both"),
    (dict(lora="r=4"), "lora must be a LoraConfig"),
])
def test_bad_set_ups_are_one_line(kwargs, message):
    with pytest.raises(MemlabError, match=message):
        estimate_finetune("tiny", batch_size=2, seq_len=32, **kwargs)


def test_trainable_parameters_are_in_the_setup():
    est = estimate_finetune("llama2-7b", batch_size=1, seq_len=512, precision="bf16-mixed",
                            lora=LoraConfig(r=16, target_modules="all-linear"))
    assert est.setup["trainable_parameters"] == 39_976_960 == trainable_parameters(
        "llama2-7b", lora=LoraConfig(r=16, target_modules="all-linear"))


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("setup", SET_UPS[:3:2], ids=lambda s: s.name)
def test_estimate_follows_gradient_accumulation(setup, precision):
    spec = StepSpec("tiny", batch_size=2, seq_len=32, precision=precision, grad_accum_steps=2,
                    prepare=setup)
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=TOL)
    assert est.phase_breakdown["forward"]["gradients"] == est.gradients_bytes  # kept across


# The chunked loss with a frozen head (memlab.model.loss): random small models, every phase.
CHUNKED_SET_UPS = [SET_UPS[2], SET_UPS[3], SET_UPS[0], SET_UPS[4]]


def _held_to_trace(spec):
    traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
    for phase in ("forward", "backward", "optimizer"):
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=TOL), (phase, spec)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=TOL)
    return traced, est


@pytest.mark.parametrize("seed", range(16))
def test_a_chunked_loss_is_held_to_the_trace(seed, random_step):
    cfg, step = random_step(seed, checkpointing=[False, True],
                            loss_chunks=lambda n, rng: rng.randrange(2, min(n, 16) + 1))
    _held_to_trace(StepSpec(cfg, prepare=CHUNKED_SET_UPS[seed % 4], **step))


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt2"])  # untied and tied
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("setup", CHUNKED_SET_UPS[:3], ids=lambda s: s.name)
def test_a_small_vocabulary_and_chunks_that_do_not_divide_the_tokens(model, precision,
                                                                     checkpointing, setup,
                                                                     request):
    # V = 8 C: with 7 chunks the blocks, not the head, make the peaks
    if (precision == "bf16" and model == "tiny-gpt2" and setup.lora
            and setup.lora.selects("down_proj")):
        request.applymarker(pytest.mark.xfail(
            reason="pure bf16 GPT-2, an adapter on down_proj: the backward walk counts a gradient "
            "as large as each saved copy, where the adapter's backward frees them first"))
    if (checkpointing and setup.train_last and model == "tiny-gpt2"
            and not precision.endswith("-mixed")):
        request.applymarker(pytest.mark.xfail(
            reason="a recomputed GPT-2 block trained whole: the backward walk counts about "
            "3% over the trace"))
    spec = StepSpec(model, batch_size=2, seq_len=48, precision=precision, loss_chunks=7,
                    checkpointing=checkpointing, prepare=setup)  # 96 tokens: 6 chunks of 14, one of 12
    traced, est = _held_to_trace(spec)
    assert est.setup["loss_chunks"] == 7


def test_a_frozen_head_keeps_the_norm_output_for_the_chunked_loss():
    spec = StepSpec("tiny", batch_size=2, seq_len=48, precision="fp32", loss_chunks=4,
                    prepare=SET_UPS[2])
    names = [t.name for t in estimate_finetune(spec).saved if t.scope == "head"]
    assert names == ["final norm: input (residual stream)", "final norm: 1/rms",
                     "final norm: output", "log-sum-exp of each token's logits (chunked loss)"]


def test_an_8b_lora_step_with_a_chunked_loss_matches_its_trace():
    for loss_chunks, checkpointing in ((8, False), (32, True)):
        spec = StepSpec("llama3.1-8b", batch_size=1, seq_len=8192, precision="bf16-mixed",
                        loss_chunks=loss_chunks, checkpointing=checkpointing,
                        prepare=Setup("LoRA q,v r=16", lora=LoraConfig(r=16)))
        traced, est = trace_step(spec), estimate_finetune(spec, device="cpu")
        for phase in ("forward", "backward", "optimizer"):
            assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                                rel=0.01)


# Every optimizer with every set-up: Adafactor's state follows the adapters' and blocks' shapes.
@pytest.mark.parametrize("optimizer", ["adafactor", "adamw-bf16-moments"])
@pytest.mark.parametrize("optimizer_impl", ["foreach", "for-loop"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16"])
@pytest.mark.parametrize("setup", SET_UPS[:4], ids=lambda s: s.name)
def test_adafactor_and_bf16_moments_are_held_to_the_trace(optimizer, optimizer_impl, precision,
                                                          setup):
    spec = StepSpec("tiny-gpt2" if setup.lora and setup.lora.r == 4 else "tiny", batch_size=2,
                    seq_len=48, precision=precision, optimizer=optimizer,
                    optimizer_impl=optimizer_impl, prepare=setup)
    traced, est = _held_to_trace(spec)
    assert est.optimizer_states_bytes == traced.phase_breakdown["optimizer"]["optimizer_states"]


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "sgd-momentum", "adamw-8bit",
                                       "adamw-bf16-moments", "adafactor"])
@pytest.mark.parametrize("setup", SET_UPS[:3], ids=lambda s: s.name)
def test_every_optimizer_estimates_every_set_up(optimizer, setup):
    est = estimate_finetune("llama2-7b", batch_size=1, seq_len=512, precision="bf16-mixed",
                            optimizer=optimizer, prepare=setup)
    assert est.optimizer_states_bytes >= 0 and est.peak_bytes > est.parameters_bytes


def test_8_bit_adamw_keeps_32_bit_state_for_small_adapters():
    # tiny's q, v adapters at r=8: A is 8 x 64 = 512 elements, under bitsandbytes' 4096
    small = estimate_finetune("tiny", batch_size=2, seq_len=32, optimizer="adamw-8bit",
                              lora=LoraConfig(r=8))
    assert small.optimizer_states_bytes == 8 * small.setup["trainable_parameters"]
    # llama2-7b's at r=8: 8 x 4096 elements each, uint8 states with one absmax per 256
    big = estimate_finetune("llama2-7b", batch_size=1, seq_len=64, optimizer="adamw-8bit",
                            lora=LoraConfig(r=8))
    n = big.setup["trainable_parameters"]
    assert big.optimizer_states_bytes == 2 * n + 8 * (n // 256) + 2 * 256 * 4
