"""memlab.memory.compare: other estimators, each by its own conventions, and their ratio to a traced step."""

from __future__ import annotations

import math
import sys
from argparse import Namespace
from functools import cache

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.step import trace_step
from memlab.memory.compare import (
    OtherEstimate,
    _accelerate_from_model,
    accelerate_estimate,
    all_estimates,
    bytes_per_param_estimate,
    comparison_table,
    eleutherai_activation_bytes,
    eleutherai_estimate,
    eleutherai_parameter_count,
    rule_of_thumb_loading,
)
from memlab.model.config import get_config
from memlab.model.transformer import build_model
from memlab.units import to_unit

LLAMA = get_config("llama2-7b")
N = LLAMA.num_parameters()  # 6,738,415,616
GPT2 = get_config("gpt2")


# Rules of thumb ------------------------------------------------------------------------------
@pytest.mark.parametrize("bpp", [16, 18, 20, 24])
def test_bytes_per_param_rule_is_that_many_bytes_per_parameter(bpp):
    est = bytes_per_param_estimate(LLAMA, bpp)
    assert isinstance(est, OtherEstimate)
    assert est.total_bytes == bpp * N
    assert est.saved_activations_bytes is None
    assert est.name == f"{bpp} bytes/param"


def test_documented_splits_add_up_and_others_have_none():
    for bpp, split in ((16, (2, 2, 12)), (18, (2, 4, 12))):
        est = bytes_per_param_estimate(LLAMA, bpp)
        assert (est.parameters_bytes, est.gradients_bytes, est.optimizer_states_bytes) == tuple(
            b * N for b in split)
        assert est.parameters_bytes + est.gradients_bytes + est.optimizer_states_bytes == est.total_bytes
    est = bytes_per_param_estimate(LLAMA, 20)
    assert (est.parameters_bytes, est.gradients_bytes, est.optimizer_states_bytes) == (None, None, None)


def test_four_gb_per_billion_parameters_is_fp32_weights_in_decimal_gb():
    est = rule_of_thumb_loading("llama2-7b")
    assert est.total_bytes == est.parameters_bytes == 4 * N
    assert math.isclose(to_unit(est.total_bytes, "GB"), 4 * N / 1e9)
    assert est.gradients_bytes is est.optimizer_states_bytes is est.saved_activations_bytes is None


# EleutherAI ------------------------------------------------------------------------------------
def test_eleutherai_activations_are_the_closed_form_on_llama2_7b():
    s, b, h, L, a = 2048, 1, LLAMA.d_model, LLAMA.n_layer, LLAMA.n_head
    acts = eleutherai_activation_bytes(LLAMA, batch_size=b, seq_len=s)
    assert acts == s * b * h * L * (34 + 5 * a * s / h)  # 5as/h = 80 here: exact in floats
    assert acts == 34 * s * b * h * L + 5 * a * s * s * b * L
    assert to_unit(acts, "GiB") == 28.5  # the script's 'Total Activation Memory: 28.50 GiB'


def test_eleutherai_checkpointing_keeps_34_sbhL():
    s, b, h, L = 2048, 2, LLAMA.d_model, LLAMA.n_layer
    est = eleutherai_estimate(LLAMA, batch_size=b, seq_len=s, checkpointing=True)
    assert est.saved_activations_bytes == 34 * s * b * h * L
    assert "2sbhL" in est.notes  # what full checkpointing really stores is documented


def test_eleutherai_is_18_bytes_per_param_plus_activations_summed():
    est = eleutherai_estimate(LLAMA, batch_size=1, seq_len=2048)
    assert (est.parameters_bytes, est.gradients_bytes, est.optimizer_states_bytes) == (2 * N, 4 * N, 12 * N)
    assert est.total_bytes == 18 * N + est.saved_activations_bytes
    assert est.details["communication_bytes"] == 0


def test_eleutherai_with_its_own_parameter_count_reproduces_the_script():
    h, L, V, f = LLAMA.d_model, LLAMA.n_layer, LLAMA.vocab_size, LLAMA.ffn_dim
    theirs = eleutherai_parameter_count(LLAMA, seq_len=2048)
    assert theirs == 2 * V * h + h * 2048 + 8 * h * L + 2 * h + 4 * L * h * h + 3 * L * f * h
    assert theirs > N  # learned positions and LayerNorm biases the model does not have
    acts = eleutherai_activation_bytes(LLAMA, batch_size=1, seq_len=2048)
    # The script's printed total for `-l 32 -hs 4096 -a 32 -v 32000 -ff 2.6875 -nl 3 -z 0`.
    assert round(to_unit(18 * theirs + acts, "GiB"), 2) == 141.62


def test_eleutherai_fp32_changes_only_the_weights():
    mixed = eleutherai_estimate(LLAMA, batch_size=1, seq_len=512)
    fp32 = eleutherai_estimate(LLAMA, batch_size=1, seq_len=512, precision="fp32")
    assert fp32.parameters_bytes == 4 * N
    assert fp32.total_bytes - mixed.total_bytes == 2 * N
    assert fp32.saved_activations_bytes == mixed.saved_activations_bytes


def test_eleutherai_zero_stages_shard_as_the_script_does():
    g = 4
    z = {k: eleutherai_estimate(LLAMA, batch_size=1, seq_len=512, zero_stage=k, num_gpus=g)
         for k in range(4)}
    assert z[0].total_bytes == 18 * N + z[0].saved_activations_bytes  # no buffers without ZeRO
    assert z[1].optimizer_states_bytes == 12 * N // g and z[1].gradients_bytes == 4 * N
    assert z[2].gradients_bytes == 4 * N // g and z[2].parameters_bytes == 2 * N
    assert z[3].parameters_bytes == 2 * N // g
    assert z[1].details["communication_bytes"] == 500_000_000 * 2
    assert z[3].details["communication_bytes"] == (500_000_000 + 1_000_000_000) * 2
    assert z[0].total_bytes > z[1].total_bytes > z[2].total_bytes > z[3].total_bytes


# accelerate -----------------------------------------------------------------------------------
def test_accelerate_fp32_training_is_16_bytes_per_param():
    est = accelerate_estimate(LLAMA, "fp32")
    F = 4 * N  # the fp32 model size accelerate starts from
    assert est.total_bytes == 4 * F == 16 * N  # the 'step' stage, the largest
    assert est.details["stage_bytes"] == {"model": F, "gradients": F, "optimizer": 2 * F,
                                          "step": 4 * F}
    assert est.details["buffer_bytes"] == 0  # the book's model registers no buffers
    assert round(to_unit(est.total_bytes, "GiB"), 2) == 100.41  # printed by the CLI as 'GB'


@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16-mixed", "bf16"])
def test_accelerate_16_bit_training_is_8_bytes_per_param(precision):
    est = accelerate_estimate(LLAMA, precision)
    assert est.total_bytes == 8 * N
    assert est.gradients_bytes == 6 * N  # 1.5 F: counted, but below the max
    assert est.details["load_bytes"] == 2 * N  # the 'Total Size' column of the 16-bit row
    assert est.total_bytes < est.parameters_bytes + est.gradients_bytes + est.optimizer_states_bytes


def test_accelerate_counts_buffers_too():
    model = build_model("tiny", device="meta", dtype=torch.float32)
    assert list(model.buffers()) == []
    plain = _accelerate_from_model(model, "fp32")
    model.register_buffer("extra", torch.empty(1000, device="meta"))  # 4000 bytes
    with_buffer = _accelerate_from_model(model, "fp32")
    assert with_buffer.details["buffer_bytes"] == 4000
    assert with_buffer.total_bytes - plain.total_bytes == 4 * 4000


def test_drop_lm_head_removes_V_times_C_for_untied_models_only():
    V, C = LLAMA.vocab_size, LLAMA.d_model
    full = accelerate_estimate(LLAMA)
    auto = accelerate_estimate(LLAMA, drop_lm_head=True)
    assert full.details["parameters"] - auto.details["parameters"] == V * C
    assert full.total_bytes - auto.total_bytes == 16 * V * C
    assert round(to_unit(auto.total_bytes, "GiB"), 2) == 98.46
    tied = accelerate_estimate(GPT2, drop_lm_head=True)  # the head shares the embedding
    assert tied.total_bytes == accelerate_estimate(GPT2).total_bytes == 16 * GPT2.num_parameters()


def test_accelerate_estimate_matches_the_cli_pipeline(monkeypatch):
    """gather_data() and estimate_command()'s max, with the Hub model swapped for ours."""
    import accelerate.commands.estimate as cli

    monkeypatch.setattr(cli, "create_empty_model",
                        lambda *a, **k: build_model(LLAMA, device="meta", dtype=torch.float32))
    args = Namespace(model_name="llama2-7b", library_name="transformers",
                     trust_remote_code=False, dtypes=["float32", "float16"])
    rows = {r[0]: r for r in cli.gather_data(args)}
    for dtype, precision in (("float32", "fp32"), ("float16", "fp16-mixed")):
        _, _, total, training = rows[dtype]
        est = accelerate_estimate(LLAMA, precision)
        assert est.total_bytes == max(training.values())
        assert est.details["load_bytes"] == total


def test_missing_accelerate_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate -> ImportError
    with pytest.raises(MemlabError, match=r"memlab\[compare\]") as err:
        accelerate_estimate("tiny")
    assert "\n" not in str(err.value)


# Bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, words", [
    (lambda: accelerate_estimate("tiny", "fp8"), ["fp8", "bf16-mixed"]),
    (lambda: accelerate_estimate("nope"), ["nope", "llama2-7b"]),
    (lambda: accelerate_estimate("tiny", drop_lm_head="yes"), ["drop_lm_head"]),
    (lambda: eleutherai_estimate("tiny", batch_size=0, seq_len=8), ["batch_size", "0"]),
    (lambda: eleutherai_estimate("tiny", batch_size=1, seq_len=8, zero_stage=4), ["4", "0, 1, 2, 3"]),
    (lambda: eleutherai_estimate("tiny", batch_size=1, seq_len=8, num_gpus=0), ["num_gpus"]),
    (lambda: eleutherai_estimate("tiny", batch_size=1, seq_len=8, precision="fp64"), ["fp64", "fp32"]),
    (lambda: bytes_per_param_estimate("tiny", -16), ["bytes_per_param", "-16"]),
    (lambda: bytes_per_param_estimate(42), ["ModelConfig"]),
    (lambda: all_estimates("tiny", batch_size=1, seq_len=8, precision="int8"), ["int8"]),
    (lambda: rule_of_thumb_loading("tiny").ratio_to(0), ["measured_bytes"]),
    (lambda: comparison_table(["x"], 1), ["OtherEstimate"]),
    (lambda: comparison_table([], 1, unit="gigs"), ["gigs", "GiB"]),
])
def test_bad_input_raises_one_line(call, words):
    with pytest.raises(MemlabError) as err:
        call()
    msg = str(err.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


# Against a traced step -------------------------------------------------------------------------
@cache
def _traced_tiny():
    """An fp32 step of the tiny model whose activations dwarf its 158k parameters."""
    return trace_step("tiny", batch_size=8, seq_len=128, precision="fp32")


def test_each_method_has_a_ratio_to_a_traced_step():
    step = _traced_tiny()
    estimates = all_estimates("tiny", batch_size=8, seq_len=128, precision="fp32")
    names = [e.name for e in estimates]
    assert len(set(names)) == len(names) == 5  # the tiny model is untied: both accelerate rows
    ratios = {e.name: e.ratio_to(step.peak_bytes) for e in estimates}
    assert all(r > 0 and math.isfinite(r) for r in ratios.values())

    rule = ratios["16 bytes/param"]
    assert rule < 1  # no activations: it misses most of this step
    assert step.saved_activations_bytes > 16 * get_config("tiny").num_parameters()
    # accelerate's fp32 figure is the same 16 bytes/param (no buffers); without the head, less.
    assert ratios["accelerate estimate-memory"] == rule
    assert ratios["accelerate estimate-memory (AutoModel: no LM head)"] < rule
    # EleutherAI adds activations, so it gets closer than any parameter-only rule.
    assert ratios["EleutherAI calc_transformer_mem"] > rule
    assert ratios["4 GB per billion parameters"] < rule


def test_loading_rule_equals_the_traced_fp32_parameters():
    step = _traced_tiny()
    assert rule_of_thumb_loading("tiny").parameters_bytes == step.parameters_bytes


def test_comparison_table_divides_by_the_measured_peak():
    step = _traced_tiny()
    estimates = all_estimates("tiny", batch_size=8, seq_len=128)
    table = comparison_table(estimates, step.peak_bytes, unit="MiB")
    assert list(table.index) == [e.name for e in estimates]
    for e in estimates:
        assert table.loc[e.name, "ratio to measured"] == e.total_bytes / step.peak_bytes
        assert table.loc[e.name, "total (MiB)"] == e.total_bytes / 2**20
    assert math.isnan(table.loc["16 bytes/param", "activations (MiB)"])


def test_all_estimates_has_one_accelerate_row_for_tied_models():
    names = [e.name for e in all_estimates("tiny-gpt2", batch_size=1, seq_len=16,
                                           precision="bf16-mixed")]
    assert sum(n.startswith("accelerate") for n in names) == 1
