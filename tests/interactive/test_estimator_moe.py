"""The kernel-free estimator on a mixture of experts: memlab.moe.estimate_moe's bytes, in Python
and in its script (under Node here; in Chromium in test_estimator_browser.py)."""

import dataclasses
import json
import random
import shutil
import subprocess

import pytest

from memlab.errors import MemlabError
from memlab.interactive import estimator as est
from memlab.interactive.estimator_moe import MOE_UNMODELLED
from memlab.model.config import PRESETS, MoEConfig
from memlab.model.step import PHASES
from memlab.moe.estimate import estimate_moe

MOE_PRESETS = ("mixtral-8x7b", "qwen1.5-moe-a2.7b")


def test_the_menu_offers_the_moe_presets_with_their_active_parameters():
    menu = dict(est._menu_models("llama2-7b")[0])
    for name in MOE_PRESETS:
        cfg = PRESETS[name]
        assert name in menu
        label = est._model_label(cfg)
        assert label == (f"{name} ({cfg.num_parameters() / 1e9:,.2f}B, "
                         f"{cfg.active_parameters() / 1e9:,.2f}B active)")
    assert est._model_label(PRESETS["llama2-7b"]) == "llama2-7b (6.74B)"  # dense: as before
    assert "qwen2-7b" not in menu  # a dense model with q, k, v biases is still left out


@pytest.mark.parametrize("name", MOE_PRESETS)
@pytest.mark.parametrize("precision, attention, device", [
    ("bf16-mixed", "sdpa", "cuda"), ("fp32", "eager", "cpu"), ("bf16", "flash", "cuda"),
    ("fp16-mixed", "eager", "cuda")])
def test_readout_of_an_moe_model_is_estimate_moe(name, precision, attention, device):
    cfg = PRESETS[name]
    r = est.estimate_readout(name, batch_size=2, seq_len=512, precision=precision,
                             attention=attention, device=device, optimizer="adamw-8bit")
    want = estimate_moe(dataclasses.replace(cfg, attention=attention), batch_size=2, seq_len=512,
                        precision=precision, optimizer="adamw-8bit", device=device)
    assert r["error"] is None
    assert r["peak_bytes"] == want.peak_bytes and r["peak_phase"] == want.peak_phase
    assert {p: r["phases"][p]["bytes"] for p in PHASES} == want.phase_peak_bytes
    assert r["parameters"] == cfg.num_parameters()
    assert r["active_parameters"] == cfg.active_parameters() < cfg.num_parameters()
    assert r["setup"].startswith(f"{name}: {cfg.num_parameters():,} parameters, "
                                 f"{cfg.active_parameters():,} active; batch 2")


def test_a_dense_readout_has_no_active_count():
    assert "active_parameters" not in est.estimate_readout("llama2-7b", seq_len=256)


@pytest.mark.parametrize("role, value", [("checkpointing", True), ("grad_accum_steps", 2),
                                         ("context_parallel", 2), ("loss_chunks", 4),
                                         ("offload_activations", True)])
def test_a_lever_the_moe_estimate_lacks_is_a_one_line_error(role, value):
    r = est.estimate_readout("mixtral-8x7b", seq_len=1024, **{role: value})
    words = MOE_UNMODELLED[role][1]
    assert r == {"error": f"memlab: error: {words} is not modelled for a mixture of experts yet "
                          f"(mixtral-8x7b): got {role} {value!r}; accepted: "
                          f"{MOE_UNMODELLED[role][0]!r}"}
    with pytest.raises(MemlabError, match="not modelled for a mixture of experts"):
        est.memory_estimator("mixtral-8x7b", **{role: value})


def test_the_page_of_an_moe_model_turns_off_the_levers_and_says_why():
    moe = est.memory_estimator("qwen1.5-moe-a2.7b", seq_len=1024).html()
    for role in MOE_UNMODELLED:
        assert f'data-role="{role}" disabled' in moe
    assert ("qwen1.5-moe-a2.7b is a mixture of experts: its estimate (memlab.moe.estimate_moe, "
            "balanced routing) does not model activation checkpointing") in moe
    dense = est.memory_estimator("llama2-7b").html()
    assert not any(f'data-role="{role}" disabled' in dense for role in MOE_UNMODELLED)
    assert 'data-role="levers-note" hidden' in dense


MOE_NODE_RUNNER = """
const est = require(process.argv[1]);
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(input.cases.map(([cfg, setting]) =>
  [est.readout(cfg, setting, input.K), est.modelLabel(cfg, input.K)])));
"""


def test_script_under_node_matches_python_on_moe_configs_levers_and_capacity():
    """Random experts (capacity factors too, which no config.json sets), and the levers the
    MoE estimate refuses: the script's readout is Python's."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser test checks the script in Chromium")
    rng = random.Random(5)
    cases = []
    for i in range(160):
        E = rng.choice([1, 2, 8, 60])
        shared = rng.choice([0, 64])
        cfg = dataclasses.replace(PRESETS["tiny-moe" if i % 2 else "mixtral-8x7b"],
                                  qkv_bias=rng.random() < 0.3, moe=MoEConfig(
            experts=E, top_k=rng.randint(1, min(E, 4)), d_ff=rng.choice([32, 1408]),
            shared_d_ff=shared, shared_gate=bool(shared) and rng.random() < 0.5,
            norm_topk_prob=rng.random() < 0.5, aux_loss_coef=rng.choice([0.0, 0.02]),
            capacity_factor=rng.choice([None, 0.3, 1.0, 1.25, 3.0])))
        setting = dict(batch_size=rng.choice([1, 2, 5]), seq_len=rng.choice([1, 33, 128]),
                       precision=rng.choice(["fp32", "bf16", "bf16-mixed", "fp16-mixed"]),
                       optimizer=rng.choice(["adamw", "adafactor", "adamw-8bit", "sgd"]),
                       optimizer_impl=rng.choice(["foreach", "for-loop"]),
                       attention=rng.choice(["sdpa", "eager", "flash"]),
                       device=rng.choice(["cpu", "cuda"]),
                       **{role: off for role, (off, _) in MOE_UNMODELLED.items()})
        if rng.random() < 0.15:
            role = rng.choice(list(MOE_UNMODELLED))
            setting[role] = {False: True, 1: 2}[MOE_UNMODELLED[role][0]]
        cases.append((cfg, setting))
    K = est.estimator_data()
    run = subprocess.run([node, "-e", MOE_NODE_RUNNER, str(est.__file__).replace(
        "estimator.py", "static/estimator.js")], capture_output=True, text=True, timeout=120,
        input=json.dumps({"K": K, "cases": [[est._script_model(c), s] for c, s in cases]}))
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout)
    refused = 0
    for (cfg, setting), (page, label) in zip(cases, got, strict=True):
        want = est.estimate_readout(cfg, **setting)
        assert page == want, (cfg, setting)
        assert label == est._model_label(cfg)
        refused += want["error"] is not None
    assert 0 < refused < len(cases) // 3


def test_pasted_moe_configs_and_the_families_the_page_refuses():
    raw = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
           "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
           "num_local_experts": 4, "num_experts_per_tok": 2}
    cfg = est.pasted_config(raw)
    assert cfg.moe.experts == 4 and est.estimate_readout(cfg, seq_len=64)["error"] is None
    for other in ("qwen3_moe", "deepseek_v3", "olmoe"):
        with pytest.raises(MemlabError) as e:
            est.pasted_config(dict(raw, model_type=other, num_experts=8))
        assert str(e.value) == (f"the pasted config has model_type {other!r}, a mixture of "
                                "experts this page does not read; accepted mixtures of experts: "
                                "mixtral, qwen2_moe")
    with pytest.raises(MemlabError, match="accepted: gpt2, llama, mistral, mixtral, qwen2_moe"):
        dense = {k: v for k, v in raw.items() if "experts" not in k}
        est.pasted_config(dict(dense, model_type="qwen2"))  # dense, q, k, v biases: not on the page
