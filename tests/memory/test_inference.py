import pytest
import torch

from memlab.errors import MemlabError
from memlab.memory.estimator import estimate_inference, forward_stage_bytes
from memlab.memory.inference import generate, measure_inference, trace_inference
from memlab.model.config import get_config
from memlab.model.transformer import KVCache, build_model

CACHE_MODELS = [
    ("tiny", {}),  # Llama style, GQA (4 query heads, 2 key/value heads)
    ("tiny", {"n_kv_head": None}),  # plain multi-head attention
    ("tiny", {"attention": "eager"}),
    ("tiny-gpt2", {}),  # learned positions, tied head
]


@pytest.mark.parametrize(("name", "overrides"), CACHE_MODELS)
def test_cached_forward_matches_full_forward(name, overrides):
    cfg = get_config(name, **overrides)
    model = build_model(cfg, seed=3)
    idx = torch.randint(0, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)  # (B, T, V), no cache
        cache = KVCache(cfg, 2, 24)
        parts = [model(idx[:, :10], cache)]  # prefill into an empty cache (causal)
        parts.append(model(idx[:, 10:14], cache))  # a second chunk: explicit mask at pos 10
        parts += [model(idx[:, t : t + 1], cache) for t in range(14, 24)]  # decode
    assert cache.pos == 24
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-4, atol=1e-4)


def test_last_only_computes_the_last_position():
    cfg = get_config("tiny")
    model = build_model(cfg, seed=1)
    idx = torch.randint(0, cfg.vocab_size, (3, 12))
    with torch.no_grad():
        last = model(idx, KVCache(cfg, 3, 12), last_only=True)
        full = model(idx)
    assert last.shape == (3, 1, cfg.vocab_size)  # (B, 1, V): no (B, T, V) logits
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_greedy_generation_matches_a_loop_without_cache(name):
    cfg = get_config(name)
    model = build_model(cfg, seed=2)
    idx = torch.randint(0, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    out = generate(model, idx, 9)
    assert out.shape == (2, 16) and torch.equal(out[:, :7], idx)
    naive = idx
    with torch.no_grad():
        for _ in range(9):
            naive = torch.cat([naive, model(naive)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, naive)


def test_sampling_is_reproducible_with_a_generator():
    model = build_model("tiny", seed=0)
    idx = torch.zeros(2, 4, dtype=torch.long)
    a = generate(model, idx, 6, greedy=False, generator=torch.Generator().manual_seed(5))
    b = generate(model, idx, 6, greedy=False, generator=torch.Generator().manual_seed(5))
    assert a.shape == (2, 10) and torch.equal(a, b)


def test_kv_cache_is_preallocated_in_the_model_dtype():
    from memlab.model.config import kv_cache_bytes

    cfg = get_config("tiny")
    cache = KVCache(cfg, 3, 40, dtype=torch.bfloat16)
    assert cache.k[0].shape == (3, cfg.kv_heads, 40, cfg.head_dim)  # (B, nkv, max_len, hs)
    assert cache.nbytes() == kv_cache_bytes(cfg, batch_size=3, tokens=40, bytes_per_value=2)


def test_llama2_7b_kv_cache_is_half_a_mib_per_token_in_fp16():
    from memlab.model.config import kv_cache_bytes

    cfg = get_config("llama2-7b")
    per_token = 2 * cfg.n_layer * cfg.kv_heads * cfg.head_dim * 2  # K and V, fp16
    # The usual figure: 2 x 32 layers x 32 heads x 128 x 2 bytes = 524,288 bytes (0.5 MiB).
    assert per_token == 524_288
    assert kv_cache_bytes(cfg, batch_size=1, tokens=1, bytes_per_value=2) == per_token
    est = estimate_inference(cfg, 1, 4000, "bf16", 96)
    assert est.kv_cache_bytes == 4096 * per_token  # 2 GiB for a full 4096-token context


# Estimate vs trace: (model, batch, prompt, new tokens, dtype). Fake tensors make the 7B
# and 8B cases take about a second each; the decode phase costs one pass per new token.
GRID = [
    ("tiny", 1, 16, 1, "fp32"),
    ("tiny", 4, 64, 16, "bf16"),
    ("tiny", 3, 100, 28, "fp32"),
    ("tiny-gpt2", 2, 16, 64, "bf16"),
    ("gpt2", 1, 16, 8, "bf16"),
    ("gpt2", 4, 960, 2, "fp32"),
    ("llama2-7b", 1, 16, 2, "bf16"),
    ("llama2-7b", 4, 2048, 1, "fp32"),
    ("llama3-8b", 2, 512, 2, "bf16"),  # GQA: 8 key/value heads for 32 query heads
    ("llama3-8b", 4, 2048, 2, "fp32"),
]
SLOW_GRID = [
    ("tiny", 4, 64, 64, "bf16"),
    ("gpt2", 4, 960, 64, "fp32"),
    ("llama2-7b", 2, 1024, 16, "bf16"),
    ("llama3-8b", 1, 16, 24, "bf16"),
]


def _check_estimate_against_trace(name, B, T, N, dtype):
    traced = trace_inference(name, batch_size=B, prompt_len=T, new_tokens=N, dtype=dtype)
    est = estimate_inference(name, B, T, dtype, N)
    assert est.parameters_bytes == traced.parameters_bytes
    assert est.kv_cache_bytes == traced.kv_cache_bytes
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)
    for phase in ("prefill", "decode"):
        assert est.phase_peak_bytes[phase] == pytest.approx(traced.phase_peak_bytes[phase],
                                                            rel=0.03)
    assert est.peak_phase == traced.peak_phase
    # Only the last position's logits are computed: the prefill never holds (B, T, V) logits,
    # which would outweigh its largest other transient (x0, x1, h and 3 MLP intermediates)
    # where V > 3 (C + F): GPT-2 and Llama 3.
    cfg = get_config(name)
    if cfg.vocab_size > 3 * (cfg.d_model + cfg.ffn_dim):
        base = traced.parameters_bytes + traced.kv_cache_bytes + B * T * 8
        logits = B * T * cfg.vocab_size * (4 if dtype == "fp32" else 2)
        assert traced.prefill_peak_bytes - base < logits


@pytest.mark.parametrize(("name", "B", "T", "N", "dtype"), GRID)
def test_estimate_matches_trace(name, B, T, N, dtype):
    _check_estimate_against_trace(name, B, T, N, dtype)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "B", "T", "N", "dtype"), SLOW_GRID)
def test_estimate_matches_trace_long_generation(name, B, T, N, dtype):
    _check_estimate_against_trace(name, B, T, N, dtype)


@pytest.mark.parametrize("name", ["tiny", "tiny-gpt2"])
def test_measured_fp32_matches_estimate_on_cpu(name):
    m = measure_inference(name, batch_size=4, prompt_len=64, new_tokens=16, dtype="fp32",
                          device="cpu")
    est = estimate_inference(name, 4, 64, "fp32", 16)
    assert m.mode == "measured" and m.device == "cpu"
    assert m.parameters_bytes == est.parameters_bytes and m.kv_cache_bytes == est.kv_cache_bytes
    for phase in ("prefill", "decode"):
        assert m.phase_peak_bytes[phase] == pytest.approx(est.phase_peak_bytes[phase], rel=0.01)


def test_measured_bf16_on_cpu_adds_matmul_scratch():
    # CPU bf16 matmuls (oneDNN) allocate a private fp32-sized scratch for the weight that
    # tensors never show: the profiler sees it, the estimate and the trace do not.
    m = measure_inference("tiny-gpt2", batch_size=4, prompt_len=64, new_tokens=16,
                          dtype="bf16", device="cpu")
    est = estimate_inference("tiny-gpt2", 4, 64, "bf16", 16)
    for phase in ("prefill", "decode"):
        ratio = m.phase_peak_bytes[phase] / est.phase_peak_bytes[phase]
        assert 0.99 <= ratio <= 1.25


def test_prefill_peak_sits_in_the_mlp_for_llama():
    stages = forward_stage_bytes("llama2-7b", batch_size=1, new_positions=2048,
                                 positions=2048, bytes_per_value=2)
    assert max(stages, key=stages.get) == "MLP"
    cfg = get_config("llama2-7b")
    R = 2048 * cfg.head_dim * 4  # RoPE tables
    assert stages["MLP"] == 3 * 2048 * cfg.d_model * 2 + 3 * 2048 * cfg.ffn_dim * 2 + R


def test_inference_result_table_and_dict():
    r = trace_inference("tiny", batch_size=1, prompt_len=8, new_tokens=2, dtype="bf16")
    assert r.mode == "traced" and r.peak_bytes == max(r.phase_peak_bytes.values())
    assert "prefill peak" in r.table() and r.as_dict()["setup"]["prompt_len"] == 8


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"prompt_len": 1.5}, "prompt_len must be a positive integer"),
        ({"new_tokens": 0}, "new_tokens must be a positive integer"),
        ({"dtype": "int8"}, "unknown dtype 'int8'; accepted: bf16, fp16, fp32"),
        ({"prompt_len": 100, "new_tokens": 29}, "exceeds max_seq_len 128"),
    ],
)
def test_bad_input_raises_one_line_errors(kwargs, match):
    args = {"batch_size": 1, "prompt_len": 8, "new_tokens": 2, "dtype": "fp32", **kwargs}
    with pytest.raises(MemlabError, match=match) as info:
        trace_inference("tiny", **args)
    assert "\n" not in str(info.value)


def test_bad_input_elsewhere():
    with pytest.raises(MemlabError, match="unknown model"):
        measure_inference("nope", batch_size=1, prompt_len=4, new_tokens=1, device="cpu")
    with pytest.raises(MemlabError, match="unknown precision"):
        estimate_inference("tiny", 1, 8, "int4", 1)
    with pytest.raises(MemlabError, match="exceeds max_seq_len"):
        estimate_inference("tiny", 1, 120, "bf16", 9)
    model = build_model("tiny")
    with pytest.raises(MemlabError, match="new_tokens must be a positive integer"):
        generate(model, torch.zeros(1, 4, dtype=torch.long), 0)
    cache = KVCache(model.cfg, 1, 6)
    with torch.no_grad(), pytest.raises(MemlabError, match="exceeds the KV cache's 6"):
        model(torch.zeros(1, 7, dtype=torch.long), cache)


def test_inference_has_one_way_in():
    """A training step's estimate takes no inference switches; estimate_inference is the door."""
    import inspect

    from memlab.memory.estimator import estimate

    assert not {"mode", "new_tokens"} & set(inspect.signature(estimate).parameters)
    est = estimate_inference("tiny", 2, 16, "bf16-mixed", 4)
    same = estimate_inference("tiny", 2, 16, "bf16", 4)  # a mixed recipe is served in bf16
    assert est.peak_bytes == same.peak_bytes and est.parameters_bytes == 2 * est.parameters
    assert set(est.phase_peak_bytes) == {"prefill", "decode"}
    assert est.gradients_bytes == est.optimizer_states_bytes == est.saved_activations_bytes == 0
    assert sum(est.breakdown().values()) == est.peak_bytes
