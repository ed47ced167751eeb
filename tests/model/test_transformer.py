import json

import pytest
import torch

from memlab.errors import MemlabError
from memlab.model.config import PRESETS, ModelConfig, config_from_hf, get_config
from memlab.model.transformer import build_model, count_parameters, lm_loss

# Published parameter counts (Hugging Face checkpoints; GPT-2 counts the tied head once).
PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-xl": 1_557_611_200,
    "llama-1b": 1_100_048_384,  # TinyLlama-1.1B
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3.1-8b": 8_030_261_248,  # Llama 3.1 8B: Llama 3 8B's shapes
    "llama3-405b": 405_853_388_800,  # Llama 3.1 405B
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,  # biases on q, k and v
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_are_exact(name):
    model = build_model(name, device="meta")  # no weights allocated
    assert count_parameters(model) == PUBLISHED[name]
    assert get_config(name).num_parameters() == PUBLISHED[name]


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_tiny_presets_run_forward_and_backward(name):
    cfg = get_config(name)
    model = build_model(cfg)
    assert count_parameters(model) == cfg.num_parameters()
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, cfg.vocab_size)  # (B, T, V)
    loss = lm_loss(logits, idx)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_gpt2_head_is_tied_and_llama_is_not():
    g = build_model("tiny-gpt2")
    assert g.lm_head.weight is g.tok_emb.weight
    m = build_model("tiny")
    assert m.lm_head.weight is not m.tok_emb.weight


def test_gqa_has_fewer_kv_parameters():
    mha = get_config("tiny", n_kv_head=None)
    gqa = get_config("tiny")
    assert gqa.kv_heads == 2 and mha.kv_heads == 4
    assert mha.num_parameters() - gqa.num_parameters() == gqa.n_layer * 2 * gqa.d_model * (
        (mha.kv_heads - gqa.kv_heads) * gqa.head_dim
    )


def test_eager_and_sdpa_attention_agree():
    idx = torch.randint(0, 512, (2, 24))
    a = build_model(get_config("tiny", attention="sdpa"), seed=1)(idx)
    b = build_model(get_config("tiny", attention="eager"), seed=1)(idx)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_checkpointing_gives_same_gradients():
    idx = torch.randint(0, 512, (2, 16))
    grads = []
    for ckpt in (False, True):
        model = build_model("tiny", seed=2, checkpointing=ckpt)
        lm_loss(model(idx), idx).backward()
        grads.append(model.tok_emb.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_causality():
    model = build_model("tiny", seed=0)
    idx = torch.randint(0, 512, (1, 10))
    idx2 = idx.clone()
    idx2[0, -1] = (idx2[0, -1] + 1) % 512
    torch.testing.assert_close(model(idx)[0, :-1], model(idx2)[0, :-1])


def test_hf_llama_config_loads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }))
    cfg = get_config(str(path))
    assert cfg.num_parameters() == PUBLISHED["llama2-7b"]


# Qwen2's config.json (Qwen2.5-7B's and Qwen2.5-0.5B's shapes, as published): biases on q, k, v
# come from the family, not the file; a sliding window is refused in one line.
QWEN2 = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
         "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
         "vocab_size": 152064, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
         "rope_theta": 1000000.0, "tie_word_embeddings": False, "use_sliding_window": False}
QWEN2_05B = dict(QWEN2, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                 num_hidden_layers=24, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True)


def test_hf_qwen2_configs_load_with_their_biases(tmp_path):
    from memlab.model.config import config_from_hf_dict

    cfg = config_from_hf_dict(QWEN2)
    assert cfg.qkv_bias and cfg.num_parameters() == PUBLISHED["qwen2.5-7b"]
    assert config_from_hf_dict(QWEN2_05B).num_parameters() == 494_032_768  # Qwen2.5-0.5B
    with pytest.raises(MemlabError, match="sets use_sliding_window to True.*accepted: false"):
        config_from_hf_dict(dict(QWEN2, use_sliding_window=True))
    # the page reads the families it has tables for: not Qwen2's biases (a dense model's),
    # named in its error; the mixtures of experts' tables have them
    from memlab.interactive.estimator import PAGE_STYLES

    assert set(PAGE_STYLES) == {"gpt2", "llama", "mistral", "mixtral", "qwen2_moe"}


def test_hf_gpt2_config_loads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024, "vocab_size": 50257, "n_inner": None,
    }))
    assert config_from_hf(path).num_parameters() == PUBLISHED["gpt2"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"model_type": "bert"}', "model_type 'bert'; accepted: gpt2, llama"),
        ('{"model_type": "llama"}', "lacks the key 'vocab_size'"),
        ('{"model_type": "llama", "vocab_size": -1, "num_hidden_layers": 2, '
         '"num_attention_heads": 2, "hidden_size": 8, "intermediate_size": 8}',
         "vocab_size must be a positive integer"),
    ],
)
def test_malformed_config_is_one_line_error(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(MemlabError, match=message) as exc:
        get_config(str(path))
    assert "\n" not in str(exc.value)


def test_unknown_preset_names_accepted_ones():
    with pytest.raises(MemlabError, match=r"unknown model 'llama9'; accepted: tiny, .*llama2-7b"):
        get_config("llama9")


def test_bad_overrides_and_shapes():
    with pytest.raises(MemlabError, match="unknown config field"):
        get_config("tiny", n_layers=3)
    with pytest.raises(MemlabError, match="divisible"):
        ModelConfig(d_model=10, n_head=3)
    with pytest.raises(MemlabError, match="n_kv_head"):
        ModelConfig(n_head=4, n_kv_head=3)
    with pytest.raises(MemlabError, match="unknown attention 'flash3'"):
        ModelConfig(attention="flash3")
    with pytest.raises(MemlabError, match="exceeds max_seq_len"):
        build_model("tiny")(torch.zeros(1, 129, dtype=torch.long))


def test_every_preset_is_tested():
    # the mixture-of-experts presets' published totals and active counts: tests/model/test_moe.py
    moe = {name for name, cfg in PRESETS.items() if cfg.moe is not None}
    assert moe == {"tiny-moe", "mixtral-8x7b", "qwen1.5-moe-a2.7b"}
    assert set(PRESETS) == set(PUBLISHED) | {"tiny", "tiny-gpt2"} | moe


def test_rope_preserves_norms_and_depends_on_relative_position():
    from memlab.model.transformer import apply_rope, rope_cache

    hs, T = 16, 12
    cos, sin = rope_cache(T, hs, 10000.0)
    q = torch.randn(1, 1, 1, hs).expand(1, 1, T, hs)  # the same vector at every position
    k = torch.randn(1, 1, 1, hs).expand(1, 1, T, hs)
    rq, rk = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # a rotation keeps lengths
    scores = (rq @ rk.transpose(-2, -1))[0, 0]  # (T, T)
    # <q at i, k at j> depends only on i - j: each diagonal is constant.
    for offset in range(-T + 1, T):
        diag = scores.diagonal(offset)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), rtol=1e-4, atol=1e-4)


def test_hf_configs_this_model_cannot_express_are_refused(tmp_path):
    path = tmp_path / "config.json"
    base = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}
    path.write_text(json.dumps(dict(base, head_dim=32)))
    with pytest.raises(MemlabError, match="head_dim 32"):
        get_config(str(path))
    path.write_text(json.dumps(dict(base, attention_bias=True)))
    with pytest.raises(MemlabError, match="biases"):
        get_config(str(path))
    path.write_text(json.dumps(dict(base, model_type="gemma2")))
    with pytest.raises(MemlabError, match="model_type 'gemma2'"):
        get_config(str(path))


def test_config_type_errors_are_one_line():
    with pytest.raises(MemlabError, match="n_kv_head"):
        get_config("tiny", n_kv_head="2")
    with pytest.raises(MemlabError, match="d_ff must be a positive integer"):
        get_config("tiny", d_ff=0)
    with pytest.raises(MemlabError, match="dtype must be a torch.dtype"):
        build_model("tiny", dtype="bf16")


def test_tiny_preset_is_pinned():
    assert get_config("tiny").num_parameters() == 158_016
    assert count_parameters(build_model("tiny-gpt2", device="meta")) == 141_056


def test_qkv_biases_count_exactly_and_are_refused_unless_a_flag():
    cfg = get_config("tiny", qkv_bias=True)
    plain = get_config("tiny")
    assert cfg.num_parameters() == count_parameters(build_model(cfg, device="meta"))
    assert cfg.num_parameters() - plain.num_parameters() == cfg.n_layer * (
        cfg.d_model + 2 * cfg.kv_heads * cfg.head_dim)
    from memlab.model.config import param_groups

    assert sum(param_groups(cfg)[1]) * cfg.n_layer + sum(param_groups(cfg)[0]) + sum(
        param_groups(cfg)[2]) == cfg.num_parameters()
    with pytest.raises(MemlabError, match="qkv_bias must be true or false, got 'yes'"):
        get_config("tiny", qkv_bias="yes")


def test_gpt2_style_with_grouped_query_attention_counts_exactly():
    cfg = get_config("tiny-gpt2", n_kv_head=2)
    assert cfg.num_parameters() == count_parameters(build_model(cfg, device="meta"))


def test_hf_config_is_named_by_its_own_name_else_by_its_path(tmp_path):
    folder = tmp_path / "gpt2-medium"
    folder.mkdir()
    path = folder / "config.json"
    raw = {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16,
           "n_positions": 1024, "vocab_size": 50257}
    path.write_text(json.dumps(raw))
    assert get_config(str(path)).name == str(path)  # not the folder's name alone
    path.write_text(json.dumps(dict(raw, _name_or_path="gpt2-medium")))
    assert get_config(str(path)).name == "gpt2-medium"
    path.write_text(json.dumps(dict(raw, _name_or_path="")))
    assert get_config(str(path)).name == str(path)
    from memlab.model.config import config_from_hf_dict

    assert config_from_hf_dict(raw).name == "gpt2 (24 layers, width 1024)"
    assert config_from_hf_dict(raw).num_parameters() == 354_823_168


@pytest.mark.parametrize("raw, message", [
    ({"model_type": ["llama"]}, "the config has model_type ['llama']; accepted: gpt2, llama, mistral, qwen2, "
                                   "mixtral, qwen2_moe"),
    ({"model_type": "gpt2", "vocab_size": 10, "n_layer": 1, "n_head": 1, "n_positions": 8},
     "the config lacks the key 'n_embd'; accepted keys: n_embd, hidden_size"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 2,
      "hidden_size": "8", "intermediate_size": 8, "head_dim": 4},
     "the config: hidden_size must be a positive integer, got '8'"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 2,
      "hidden_size": 8, "intermediate_size": 8, "rope_theta": "10k"},
     "the config: rope_theta must be a number, got '10k'"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 2,
      "hidden_size": 8, "intermediate_size": 8, "tie_word_embeddings": "yes"},
     "the config: tie_word_embeddings must be true, false or null, got 'yes'"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 3, "hidden_size": 8, "intermediate_size": 8},
     "the config: num_key_value_heads (3) must divide num_attention_heads (4)"),
    ({"model_type": "gpt2", "vocab_size": 10, "n_layer": 1, "n_head": 3, "n_embd": 8,
      "n_positions": 8}, "the config: n_embd (8) must be divisible by n_head (3)"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 2,
      "hidden_size": 8, "intermediate_size": 8, "head_dim": 8},
     "the config sets head_dim 8, not hidden_size / num_attention_heads = 4, which the book's "
     "model needs; accepted: 4 or absent"),
    ({"model_type": "llama", "vocab_size": 10, "num_hidden_layers": 1, "num_attention_heads": 2,
      "hidden_size": 8, "intermediate_size": 8, "mlp_bias": True},
     "the config sets mlp_bias to True: biases in attention or MLP"),
])
def test_hf_dict_errors_name_the_key_and_the_accepted_values(raw, message):
    from memlab.model.config import config_from_hf_dict

    with pytest.raises(MemlabError) as exc:
        config_from_hf_dict(raw)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_hf_counts_written_as_integral_floats_are_read():
    from memlab.model.config import config_from_hf_dict

    raw = {"model_type": "llama", "vocab_size": 32000.0, "num_hidden_layers": 2,
           "num_attention_heads": 4, "hidden_size": 64, "intermediate_size": 176.0,
           "num_key_value_heads": 2}
    cfg = config_from_hf_dict(raw)
    assert (cfg.vocab_size, cfg.d_ff) == (32000, 176) and isinstance(cfg.vocab_size, int)
    with pytest.raises(MemlabError, match="num_hidden_layers must be a positive integer, got 2.5"):
        config_from_hf_dict(dict(raw, num_hidden_layers=2.5))
