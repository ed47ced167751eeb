"""The mixture-of-experts MLP: equal to a token-by-token reference, its counts, its configs."""

from __future__ import annotations

import json
import random

import pytest
import torch

from memlab.errors import MemlabError
from memlab.model.config import ModelConfig, MoEConfig, config_from_hf_dict, get_config
from memlab.model.moe import MoE, Routing, SwiGLU, reference_moe
from memlab.model.transformer import (
    MLP,
    build_model,
    count_parameters,
    model_loss,
    moe_aux_loss,
)

# Published totals: Mixtral 8x7B "46.7B total parameters, 12.9B per token" (Mistral AI,
# 2023-12-11); Qwen1.5-MoE-A2.7B "14.3B parameters, 2.7B activated" (Qwen, 2024-03-28).
PUBLISHED = {"mixtral-8x7b": (46_702_792_704, 12.9), "qwen1.5-moe-a2.7b": (14.3, 2.7)}


def _random_moe(seed: int) -> tuple[ModelConfig, torch.Tensor]:
    rng = random.Random(seed)
    E = rng.randrange(1, 9)
    shared = rng.choice([0, 16, 40])
    moe = MoEConfig(experts=E, top_k=rng.randrange(1, E + 1), d_ff=rng.choice([8, 24, 32]),
                    shared_d_ff=shared, shared_gate=bool(shared) and rng.random() < 0.5,
                    norm_topk_prob=rng.random() < 0.5)
    cfg = ModelConfig(name=f"moe{seed}", n_layer=rng.randrange(1, 3), n_head=2, d_model=32,
                      vocab_size=rng.randrange(50, 200), moe=moe)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rng.randrange(1, 3), rng.randrange(1, 20), 32, generator=gen,
                    dtype=torch.float64)
    return cfg, x


@pytest.mark.parametrize("seed", range(8))
def test_dispatch_and_combine_equal_the_token_by_token_mixture(seed):
    cfg, x = _random_moe(seed)
    torch.manual_seed(seed)
    layer = MoE(cfg.d_model, cfg.moe).double()
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, ref = layer(x1), reference_moe(layer, x2)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    got = torch.autograd.grad(y, [x1, *layer.parameters()], g, allow_unused=True)
    want = torch.autograd.grad(ref, [x2, *layer.parameters()], g, allow_unused=True)
    for a, b in zip(got, want, strict=True):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any())
        else:
            torch.testing.assert_close(a, b)
    assert sum(layer.rows) == x.shape[0] * x.shape[1] * cfg.moe.top_k and layer.dropped == 0


def test_one_expert_chosen_by_every_token_is_the_dense_mlp():
    cfg = ModelConfig(d_model=32, n_head=2, d_ff=48, moe=MoEConfig(experts=1, top_k=1, d_ff=48))
    layer, dense = MoE(32, cfg.moe), MLP(ModelConfig(d_model=32, n_head=2, d_ff=48))
    dense.load_state_dict(layer.experts[0].state_dict())
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(layer(x), dense(x))


def test_a_capacity_drops_the_rows_past_it_in_token_order():
    torch.manual_seed(0)
    moe = MoEConfig(experts=4, top_k=2, d_ff=16, capacity_factor=0.5)
    layer = MoE(32, moe)
    with torch.no_grad():  # a router that sends every token to experts 0 and 1
        layer.router.weight.zero_()
        layer.router.weight[0, 0], layer.router.weight[1, 0] = 5.0, 4.0
    x = torch.randn(1, 12, 32)
    x[..., 0] = 1.0
    y = layer(x)
    cap = moe.capacity(12)  # ceil(0.5 · 12 · 2 / 4) = 3
    assert layer.rows == [12, 12, 0, 0] and layer.dropped == 2 * (12 - cap)
    ref = reference_moe(layer, x)
    torch.testing.assert_close(y[0, :cap], ref[0, :cap])  # the first tokens keep both experts
    assert not y[0, cap:].any()  # the rest are dropped: nothing added to their residual


def test_routing_fixes_the_counts_a_trace_uses():
    assert sorted(Routing.balanced(4).counts(10)) == [2, 2, 3, 3]
    assert sum(Routing([5, 1, 0, 2]).counts(17)) == 17 and Routing([5, 1, 0, 2]).counts(17)[2] == 0
    with pytest.raises(MemlabError, match="routing shares"):
        Routing([0, 0])


def test_the_balancing_loss_is_one_under_a_uniform_router_and_joins_the_training_loss():
    model = build_model("tiny-moe", seed=0)
    for block in model.blocks:
        torch.nn.init.zeros_(block.mlp.router.weight)
    idx = torch.randint(0, 512, (2, 16))
    loss = model_loss(model, idx, idx)
    for block in model.blocks:
        torch.testing.assert_close(block.mlp.aux_loss, torch.tensor(1.0))
    coef = get_config("tiny-moe").moe.aux_loss_coef
    torch.testing.assert_close(moe_aux_loss(model), torch.tensor(coef))
    loss.backward()  # the router gets a gradient through the balancing loss
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("seed", range(6))
def test_the_counts_by_formula_are_the_built_models(seed):
    cfg, _ = _random_moe(seed)
    model = build_model(cfg, device="meta")
    assert count_parameters(model) == cfg.num_parameters()
    m = cfg.moe
    per_expert = 3 * cfg.d_model * m.d_ff
    assert cfg.num_parameters() - cfg.active_parameters() == \
        cfg.n_layer * (m.experts - m.top_k) * per_expert
    assert isinstance(model.blocks[0].mlp.experts[0], SwiGLU)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_presets_have_their_published_totals_and_active_counts(name):
    cfg = get_config(name)
    total, active = PUBLISHED[name]
    n = cfg.num_parameters()
    assert n == total if isinstance(total, int) else round(n / 1e9, 1) == total
    assert round(cfg.active_parameters() / 1e9, 1) == active
    assert count_parameters(build_model(cfg, device="meta")) == n


MIXTRAL_JSON = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
                "num_local_experts": 8, "num_experts_per_tok": 2,
                "router_aux_loss_coef": 0.02, "tie_word_embeddings": False}
QWEN_MOE_JSON = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                 "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16,
                 "num_hidden_layers": 24, "num_key_value_heads": 16, "vocab_size": 151936,
                 "max_position_embeddings": 8192, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
                 "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                 "shared_expert_intermediate_size": 5632, "norm_topk_prob": False,
                 "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "router_aux_loss_coef": 0.001, "tie_word_embeddings": False}


@pytest.mark.parametrize("raw, preset", [(MIXTRAL_JSON, "mixtral-8x7b"),
                                         (QWEN_MOE_JSON, "qwen1.5-moe-a2.7b")])
def test_config_json_of_the_moe_families_loads_as_the_presets(raw, preset, tmp_path):
    cfg, want = config_from_hf_dict(raw), get_config(preset)
    assert cfg.moe == want.moe and cfg.qkv_bias == want.qkv_bias
    assert (cfg.num_parameters(), cfg.active_parameters()) == \
        (want.num_parameters(), want.active_parameters())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert get_config(str(path)).moe == want.moe


@pytest.mark.parametrize("raw, message", [
    (dict(MIXTRAL_JSON, num_experts_per_tok=9), "top_k (9) must be at most the experts (8)"),
    (dict(QWEN_MOE_JSON, decoder_sparse_step=2), "makes some blocks dense"),
    ({k: v for k, v in MIXTRAL_JSON.items() if k != "num_local_experts"},
     "lacks the key 'num_local_experts'"),
    (dict(MIXTRAL_JSON, model_type="deepseek_v3"), "accepted MoE families: mixtral, qwen2_moe "
                                                   "(dense: gpt2, llama, mistral, qwen2)"),
])
def test_bad_moe_configs_are_one_line_errors(raw, message):
    with pytest.raises(MemlabError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        config_from_hf_dict(raw)
    assert "\n" not in str(e.value)


def test_moe_fields_are_checked_in_one_line():
    for kw, message in [(dict(top_k=0), "top_k must be a positive integer"),
                        (dict(capacity_factor=0), "capacity_factor must be a positive number"),
                        (dict(shared_gate=True), "shared_gate needs a shared expert")]:
        with pytest.raises(MemlabError, match=message):
            MoEConfig(**(dict(experts=4, top_k=2, d_ff=8) | kw))
    with pytest.raises(MemlabError, match="moe needs style 'llama'"):
        ModelConfig(style="gpt2", moe=MoEConfig(experts=2, top_k=1, d_ff=8))


def test_the_dense_estimator_refuses_an_moe_model_and_the_command_line_runs_it(capsys):
    from memlab.cli import main
    from memlab.memory.estimator import estimate

    with pytest.raises(MemlabError, match="models dense MLPs; 'tiny-moe' is a mixture of experts"):
        estimate("tiny-moe", batch_size=1, seq_len=16)
    cfg = get_config("tiny-moe")
    for command in ("estimate", "trace"):  # the command line takes the MoE estimator's road
        assert main([command, "--model", "tiny-moe", "--batch-size", "2", "--seq-len", "16",
                     "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["parameters"], out["active_parameters"]) == \
            (cfg.num_parameters(), cfg.active_parameters())
