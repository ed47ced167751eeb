"""memlab estimate and memlab trace on a mixture of experts, with --expert-parallel N: the
table, the JSON, the config.json files of its families, and one-line errors."""

from __future__ import annotations

import json

import pytest

from memlab.cli import main
from memlab.model.config import get_config
from memlab.moe.command import NOT_MODELLED
from memlab.moe.ep_run import all_to_all_step_bytes
from memlab.moe.estimate import estimate_moe

TINY = ["--model", "tiny-moe", "--batch-size", "2", "--seq-len", "32"]
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000,
           "max_position_embeddings": 1024, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
           "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
           "tie_word_embeddings": False}
# a small Qwen2-MoE: 6 experts of width 64, top 2, a gated shared expert of width 256
QWEN_MOE = {k: v for k, v in MIXTRAL.items() if k not in ("num_local_experts",
                                                         "router_aux_loss_coef")} | {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 128,
    "num_key_value_heads": 4, "num_experts": 6, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 256, "norm_topk_prob": False}


def _json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _config_file(tmp_path, raw: dict, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_estimate_and_trace_agree_on_a_rank(capsys, ranks):
    argv = TINY + ["--precision", "bf16-mixed", "--checkpointing", "--expert-parallel", str(ranks)]
    est, traced = _json(capsys, ["estimate", *argv]), _json(capsys, ["trace", *argv])
    cfg = get_config("tiny-moe")
    for d in (est, traced):
        assert d["expert_parallel"] == ranks and d["experts_per_rank"] == 4 // ranks
        assert d["total_parameters"] == cfg.num_parameters()
        assert d["active_parameters"] == cfg.active_parameters()
        assert d["parameters"] * 4 == d["parameters_bytes"]  # the rank's, fp32 master weights
    assert est["parameters"] == traced["parameters"]
    assert est["peak_bytes"] == pytest.approx(traced["peak_bytes"], rel=0.03)
    assert est["flops"] == traced["flops"]  # the active rows' FLOPs, from shapes and counted
    ref = estimate_moe(cfg, batch_size=2, seq_len=32, precision="bf16-mixed",
                       checkpointing=True, expert_parallel=ranks)
    assert est["peak_bytes"] == ref.peak_bytes
    sent = all_to_all_step_bytes(cfg, ranks, tokens=64, precision="bf16-mixed",
                                 checkpointing=True)
    assert est["all_to_all_bytes_per_step"] == sent and (sent > 0) == (ranks > 1)


def test_the_table_names_the_parameters_and_the_ranks(capsys):
    assert main(["estimate", *TINY, "--expert-parallel", "2"]) == 0
    out = capsys.readouterr().out
    cfg = get_config("tiny-moe")
    assert f"{cfg.num_parameters():,} in all, {cfg.active_parameters():,} active" in out
    assert "expert parallelism over 2 ranks: 2 experts per block" in out
    assert "all-to-all per step" in out and "peak" in out


def test_mixtral_over_eight_ranks_at_full_size(capsys):
    argv = ["--model", "mixtral-8x7b", "--batch-size", "1", "--seq-len", "4096",
            "--precision", "bf16-mixed", "--expert-parallel", "8"]
    d = _json(capsys, ["estimate", *argv])
    ref = estimate_moe("mixtral-8x7b", batch_size=1, seq_len=4096, precision="bf16-mixed",
                       expert_parallel=8)
    assert d["peak_bytes"] == ref.peak_bytes and d["experts_per_rank"] == 1
    assert d["flops"] < 6 * d["total_parameters"] * 4096  # only the active experts compute


@pytest.mark.parametrize("raw,ranks", [(MIXTRAL, 4), (QWEN_MOE, 3)])
def test_a_config_json_of_either_family(capsys, tmp_path, raw, ranks):
    path = _config_file(tmp_path, raw)
    argv = ["--model", path, "--batch-size", "1", "--seq-len", "64", "--expert-parallel",
            str(ranks)]
    est, traced = _json(capsys, ["estimate", *argv]), _json(capsys, ["trace", *argv])
    assert est["parameters"] == traced["parameters"]
    for phase, peak in traced["phase_peak_bytes"].items():
        assert est["phase_peak_bytes"][phase] == pytest.approx(peak, rel=0.03), phase


def test_expert_parallelism_must_divide_the_experts(cli_error):
    cli_error(["estimate", *TINY, "--expert-parallel", "3"], "3", "4", "divide")
    cli_error(["trace", *TINY, "--expert-parallel", "0"], "expert_parallel")


def test_expert_parallelism_needs_experts(cli_error):
    cli_error(["estimate", "--model", "tiny", "--batch-size", "1", "--seq-len", "16",
               "--expert-parallel", "2"], "--expert-parallel", "'tiny' is dense", "mixtral")


def test_top_k_larger_than_the_experts_is_caught_where_the_config_is_read(cli_error, tmp_path):
    path = _config_file(tmp_path, MIXTRAL | {"num_experts_per_tok": 9})
    cli_error(["estimate", "--model", path, "--batch-size", "1", "--seq-len", "16"],
              "top_k (9)", "experts (8)", path)


@pytest.mark.parametrize("family,keys", [
    ("deepseek_v3", {"n_routed_experts": 256, "num_experts_per_tok": 8}),
    ("olmoe", {"num_experts": 64, "num_experts_per_tok": 8}),
    ("gpt_oss", {"num_local_experts": 32, "num_experts_per_tok": 4})])
def test_an_unsupported_family_names_the_supported_ones(cli_error, tmp_path, family, keys):
    path = _config_file(tmp_path, {"model_type": family, "hidden_size": 64} | keys)
    cli_error(["estimate", "--model", path, "--batch-size", "1", "--seq-len", "16"],
              repr(family), "mixture of experts", "mixtral, qwen2_moe")


@pytest.mark.parametrize("flag", sorted(NOT_MODELLED))
def test_levers_not_modelled_with_experts_are_refused(cli_error, flag):
    value = {"--inference": [], "--offload-activations": [], "--lora-targets": ["q_proj"],
             "--offload": ["optimizer"], "--layout": ["mixed"], "--quantize-base": ["nf4"],
             "--kv-precision": ["bf16"], "--lora-alpha": ["8"]}.get(flag, ["2"])
    cli_error(["estimate", *TINY, flag, *value], flag, "not modelled", "--expert-parallel")


def test_a_checkpointing_plan_other_than_full_is_refused(cli_error):
    cli_error(["trace", *TINY, "--checkpointing", "selective"], "'selective'", "full")


@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_other_attentions_on_cpu_conventions(capsys, attention):
    argv = [*TINY, "--precision", "bf16-mixed", "--attention", attention, "--expert-parallel", "2"]
    est = _json(capsys, ["estimate", *argv, "--device", "cpu"])
    traced = _json(capsys, ["trace", *argv])
    for phase, peak in traced["phase_peak_bytes"].items():
        assert est["phase_peak_bytes"][phase] == pytest.approx(peak, rel=0.03), phase
    assert ("flops" in est) == (attention == "eager")  # the book's FlashAttention: traced only
