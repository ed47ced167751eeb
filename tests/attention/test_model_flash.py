"""The book's model with attention="flash": same numbers as sdpa, and the estimator held to it."""

import dataclasses
import itertools
import subprocess
import sys

import pytest
import torch

import memlab.model.flash as flash_mod
from memlab.measure.step import measure_step, trace_step
from memlab.memory.estimator import estimate
from memlab.model import KVCache, ModelConfig, build_model, get_config

GQA = ModelConfig(name="gqa", vocab_size=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                  max_seq_len=512)


def _logits_and_grads(cfg, x):
    model = build_model(cfg, seed=0)
    out = model(x)
    out.float().pow(2).mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_flash_model_matches_sdpa(n_kv_head):
    cfg = dataclasses.replace(GQA, n_kv_head=n_kv_head)
    x = torch.randint(0, cfg.vocab_size, (2, 100))  # not a multiple of the block
    ref, ref_g = _logits_and_grads(cfg, x)
    got, got_g = _logits_and_grads(dataclasses.replace(cfg, attention="flash"), x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_g, ref_g, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_flash_model_decodes_with_a_kv_cache_like_sdpa():
    """A prompt, then one token at a time: the queries are the last T of the S cached positions."""
    outs = {}
    x = torch.randint(0, GQA.vocab_size, (1, 12))
    for att in ("sdpa", "flash"):
        cfg = dataclasses.replace(GQA, attention=att)
        model = build_model(cfg, seed=0).eval()
        cache = KVCache(cfg, 1, 16)
        with torch.no_grad():
            steps = [model(x[:, :8], cache)[:, -1]]
            for t in range(8, 12):
                steps.append(model(x[:, t:t + 1], cache)[:, -1])
        outs[att] = torch.stack(steps)
    torch.testing.assert_close(outs["flash"], outs["sdpa"], rtol=1e-5, atol=1e-5)


def test_flash_is_one_of_the_models_attentions_and_bad_ones_are_refused():
    from memlab.errors import MemlabError
    assert get_config("tiny", attention="flash").attention == "flash"
    with pytest.raises(MemlabError, match="flash"):
        get_config("tiny", attention="flashy")


def test_a_trace_visits_one_tile_and_counts_the_same_bytes(monkeypatch):
    """Traces run one representative tile; every tile allocates and frees the same sizes."""
    cfg = dataclasses.replace(GQA, attention="flash")
    for precision in ("fp32", "bf16-mixed"):
        kw = dict(batch_size=2, seq_len=200, precision=precision)
        short = trace_step(cfg, **kw)
        monkeypatch.setattr(flash_mod, "_tiles", lambda starts, like, last=False: starts)
        full = trace_step(cfg, **kw)
        monkeypatch.undo()
        assert short.peak_bytes == full.peak_bytes
        assert short.saved_activations_bytes == full.saved_activations_bytes


# With checkpointing, fp32 at these tiny widths leaves sdpa's estimate as far off as flash's
# (3.5%, the recomputed block's backward); one 64 x 64 tile is then a tenth of the step.
GRID = (list(itertools.product((4, 1), ("fp32", "bf16-mixed", "bf16", "fp16-mixed"), (False,),
                               (64, 256)))
        + list(itertools.product((4, 1), ("bf16-mixed", "bf16", "fp16-mixed"), (True,), (256,))))


@pytest.mark.parametrize("n_kv_head, precision, ckpt, T", GRID)
def test_estimate_agrees_with_trace_for_flash(n_kv_head, precision, ckpt, T):
    """Activations exact and peak within 3% of the trace, GQA and MHA, every precision."""
    cfg = ModelConfig(name="f", vocab_size=512, n_layer=2, n_head=4, n_kv_head=n_kv_head,
                      d_model=64, max_seq_len=256, attention="flash")
    kw = dict(batch_size=2, seq_len=T, precision=precision, checkpointing=ckpt)
    traced = trace_step(cfg, **kw)
    est = estimate(cfg, device="cpu", **kw)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_estimate_agrees_with_a_real_cpu_step_for_flash(precision):
    kw = dict(batch_size=2, seq_len=128, precision=precision, attention="flash")
    measured = measure_step("tiny", device="cpu", **kw)
    est = estimate("tiny", device="cpu", **kw)
    assert est.saved_activations_bytes == pytest.approx(measured.saved_activations_bytes, rel=0.03)
    assert est.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.03)


def test_flash_saves_less_than_sdpa_only_by_the_unrepeated_keys_and_values():
    """With GQA the model repeats K and V for SDPA; FlashAttention reads them per KV head."""
    kw = dict(batch_size=2, seq_len=128)
    sdpa = estimate(GQA, device="cpu", **kw)
    flash = estimate(dataclasses.replace(GQA, attention="flash"), device="cpu", **kw)
    B, T, L, hs = 2, 128, GQA.n_layer, GQA.head_dim
    repeated = 2 * B * (GQA.n_head - GQA.kv_heads) * T * hs * 4  # k and v, fp32
    assert sdpa.saved_activations_bytes - flash.saved_activations_bytes == L * repeated


@pytest.mark.slow
@pytest.mark.parametrize("T", [2048, 32768])
def test_estimate_agrees_with_trace_for_llama2_7b_flash(T):
    cfg = dataclasses.replace(get_config("llama2-7b"), max_seq_len=T, attention="flash")
    kw = dict(batch_size=1, seq_len=T, precision="bf16-mixed")
    traced = trace_step(cfg, **kw)
    est = estimate(cfg, device="cpu", **kw)
    assert est.saved_activations_bytes == pytest.approx(traced.saved_activations_bytes, rel=0.03)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)


def test_cli_estimate_and_trace_take_flash():
    import json
    args = ["--model", "tiny", "--attention", "flash", "--batch-size", "2", "--seq-len", "64",
            "--json"]
    out = {}
    for cmd, extra in (("estimate", ["--device", "cpu"]), ("trace", [])):
        proc = subprocess.run([sys.executable, "-m", "memlab", cmd, *args, *extra],
                              capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out[cmd] = json.loads(proc.stdout)
    assert out["estimate"]["saved_activations_bytes"] == pytest.approx(out["trace"]["saved_activations_bytes"], rel=0.03)
    assert out["estimate"]["peak_bytes"] == pytest.approx(out["trace"]["peak_bytes"], rel=0.03)
    bad = subprocess.run([sys.executable, "-m", "memlab", "estimate", "--model", "tiny",
                          "--attention", "flashy", "--batch-size", "1", "--seq-len", "8"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert "flashy" in bad.stderr and "flash" in bad.stderr


def test_flash_model_under_bf16_autocast_matches_sdpa_within_bf16():
    """Autocast is off inside the kernel: tiles in fp32, output rounded once to bf16."""
    x = torch.randint(0, GQA.vocab_size, (2, 64))
    outs = {}
    for att in ("sdpa", "flash"):
        model = build_model(dataclasses.replace(GQA, attention=att), seed=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs[att] = model(x).float()
    scale = outs["sdpa"].abs().max()
    assert float((outs["flash"] - outs["sdpa"]).abs().max() / scale) < 2e-2  # a few bf16 ulps
