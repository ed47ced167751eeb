"""Generating text with a KV cache, and the memory it takes: measured, traced and estimated.

Generation runs in two phases:

* prefill: the whole prompt (B, T) goes through the model at once. Each layer writes its
  keys and values into the :class:`~memlab.model.transformer.KVCache`; the transients are those of one
  layer's forward pass at length T (the MLP's (B, T, F) intermediates are the largest).
  Only the last position's logits are computed, (B, 1, V): generation needs no others, and
  a prompt's full (B, T, V) logits would often outweigh everything else.
* decode: one token at a time, attending over every cached position. The transients are
  small; the weights and the cache are the memory.

:func:`measure_inference` runs both phases for real; :func:`trace_inference` runs them on
fake tensors, so a 70B model's inference is counted on a laptop; :func:`estimate_inference`
computes the same bytes from a formula, stage by stage of the forward pass. Weights and the
cache are allocated before the phases and reported on their own.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

from memlab.device import pick_device
from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import default_dtype, measure_peak
from memlab.model.transformer import KVCache, ModelConfig, Transformer, build_model, get_config
from memlab.units import to_unit

DTYPES = ("bf16", "fp16", "fp32")  # the formats a model is run in here
INFERENCE_PHASES = ("prefill", "decode")
# Bytes per value of the weights and the cache for a precision name. Inference keeps no fp32
# master copy: a '*-mixed' training recipe serves its weights in 16 bits.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "bf16-mixed": 2, "fp16-mixed": 2}


# Generation ---------------------------------------------------------------------------------
def _pick(logits, greedy: bool, generator=None):
    """Next token ids (B, 1) from logits (B, 1, V): the most likely, or a sample."""
    last = logits[:, -1]  # (B, V)
    if greedy:
        return last.argmax(dim=-1, keepdim=True)  # (B, 1)
    probs = last.float().softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)  # (B, 1)


def _prefill(model: Transformer, idx, cache: KVCache, greedy: bool = True, generator=None):
    """Run the prompt (B, T) into an empty cache; return the first new token (B, 1)."""
    return _pick(model(idx, cache, last_only=True), greedy, generator)


def _decode(model: Transformer, tok, cache: KVCache, steps: int, greedy: bool = True,
            generator=None):
    """Feed ``tok`` (B, 1) and ``steps`` more tokens one at a time; return all (B, steps + 1)."""
    out = [tok]
    for _ in range(steps):
        tok = _pick(model(tok, cache, last_only=True), greedy, generator)  # logits die here
        out.append(tok)
    return torch.cat(out, dim=1)  # (B, steps + 1)


def _model_dtype(model: Transformer) -> torch.dtype:
    return next(model.parameters()).dtype


@torch.no_grad()
def generate(model: Transformer, idx, new_tokens: int, *, greedy: bool = True,
             generator: torch.Generator | None = None):
    """Token ids (B, T + new_tokens): the prompt idx (B, T), then new tokens decoded with a KV cache (chapter: 1).

    ``greedy=False`` samples from the softmax instead of taking the most likely token.
    """
    check_positive_int("new_tokens", new_tokens)
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
        raise MemlabError(f"idx must be a (B, T) tensor of token ids, got {idx!r}")
    B, T = idx.shape
    if T + new_tokens > model.cfg.max_seq_len:
        raise MemlabError(f"prompt length {T} + new_tokens {new_tokens} exceeds max_seq_len "
                          f"{model.cfg.max_seq_len} of model {model.cfg.name!r}")
    cache = KVCache(model.cfg, B, T + new_tokens, device=idx.device, dtype=_model_dtype(model))
    tok = _prefill(model, idx, cache, greedy, generator)
    new = _decode(model, tok, cache, new_tokens - 1, greedy, generator)
    return torch.cat([idx, new], dim=1)  # (B, T + new_tokens)


# Measured and traced ------------------------------------------------------------------------
@dataclass(frozen=True)
class InferenceMemory:
    """Bytes of generating new_tokens tokens after a prompt: weights, KV cache, and each phase's peak.

    A phase's peak counts everything live: the weights, the cache, the prompt's token ids and
    the phase's transients. The cache is preallocated for prompt_len + new_tokens positions.
    """

    weights_bytes: int  # the parameters, in the inference dtype (a tied weight once)
    kv_cache_bytes: int
    peak_bytes: int  # the larger of the two phase peaks
    prefill_peak_bytes: int
    decode_peak_bytes: int
    setup: dict  # model, parameters, batch_size, prompt_len, new_tokens, dtype
    mode: str  # 'measured' (real tensors) or 'traced' (FakeTensorMode)
    device: str  # where the tensors live ('cpu' when traced: fake CPU tensors)
    method: str = "dispatch"  # how the phases were counted: see memlab.measure.step.measure_peak

    @property
    def peak_phase(self) -> str:
        """'prefill' or 'decode': the phase holding the peak (chapter: 1)."""
        return "prefill" if self.prefill_peak_bytes >= self.decode_peak_bytes else "decode"

    @property
    def phase_peak_bytes(self) -> dict[str, int]:
        """Peak bytes of each phase, keyed 'prefill' and 'decode' (chapter: 1)."""
        return {"prefill": self.prefill_peak_bytes, "decode": self.decode_peak_bytes}

    def as_dict(self) -> dict:
        """The fields as a plain dict, bytes as ints (chapter: 1)."""
        return asdict(self)

    def table(self, unit: str | None = None) -> str:
        """Weights, KV cache and the phase peaks as a text table in MiB or GiB (chapter: 1)."""
        unit = unit or ("GiB" if self.peak_bytes >= 2**30 else "MiB")
        s = self.setup
        rows = [("weights", self.weights_bytes), ("KV cache", self.kv_cache_bytes),
                ("prefill peak", self.prefill_peak_bytes), ("decode peak", self.decode_peak_bytes)]
        lines = [f"{self.mode} inference on {self.device}: {s['model']} ({s['parameters']:,} "
                 f"parameters), batch {s['batch_size']}, prompt {s['prompt_len']} + "
                 f"{s['new_tokens']} new tokens, {s['dtype']}",
                 f"{'':<14}{unit:>12}"]
        lines += [f"{label:<14}{to_unit(b, unit):>12.3f}" for label, b in rows]
        lines.append(f"peak is in the {self.peak_phase} phase")
        return "\n".join(lines)


def _setup(config_or_name, batch_size, prompt_len, new_tokens, dtype) -> ModelConfig:
    if isinstance(config_or_name, str):
        cfg = get_config(config_or_name)
    elif isinstance(config_or_name, ModelConfig):
        cfg = config_or_name
    else:
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {config_or_name!r}")
    check_positive_int("batch_size", batch_size)
    check_positive_int("prompt_len", prompt_len)
    check_positive_int("new_tokens", new_tokens)
    check_choice("dtype", dtype, DTYPES)
    if prompt_len + new_tokens > cfg.max_seq_len:
        raise MemlabError(f"prompt_len {prompt_len} + new_tokens {new_tokens} exceeds max_seq_len "
                          f"{cfg.max_seq_len} of model {cfg.name!r}")
    return cfg


def _run_inference(cfg: ModelConfig, B: int, T: int, N: int, dtype: str, *,
                   device: torch.device, traced: bool, seed: int) -> InferenceMemory:
    """Build the model and the cache, then measure the prefill and the decode phases apart.

    The single implementation behind :func:`measure_inference` (real tensors) and
    :func:`trace_inference` (fake CPU tensors: the model is built inside the fake mode, in
    its final dtype, since ``module.to`` fails on fake tensors).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    method = "dispatch" if traced else "auto"
    with FakeTensorMode() if traced else contextlib.nullcontext(), torch.no_grad():
        with default_dtype(to_dtype(dtype)):
            model = build_model(cfg, device=device, seed=None if traced else seed)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, cfg.vocab_size, (B, T), generator=gen).to(device)  # (B, T)
        cache = KVCache(cfg, B, T + N, device=device, dtype=to_dtype(dtype))
        base = weights + cache.nbytes() + idx.numel() * idx.element_size()
        tok, pre = measure_peak(_prefill, model, idx, cache, device=device, method=method)
        _, dec = measure_peak(_decode, model, tok, cache, N - 1, device=device, method=method)
    prefill = base + pre.peak_allocated_bytes
    decode = base + pre.end_allocated_bytes + dec.peak_allocated_bytes
    return InferenceMemory(
        weights_bytes=weights,
        kv_cache_bytes=cache.nbytes(),
        peak_bytes=max(prefill, decode),
        prefill_peak_bytes=prefill,
        decode_peak_bytes=decode,
        setup={"model": cfg.name, "parameters": cfg.num_parameters(), "batch_size": B,
               "prompt_len": T, "new_tokens": N, "dtype": dtype},
        mode="traced" if traced else "measured",
        device=device.type,
        method=pre.method,
    )


def measure_inference(config_or_name: ModelConfig | str, *, batch_size: int, prompt_len: int,
                      new_tokens: int, dtype: str = "bf16", device=None,
                      seed: int = 0) -> InferenceMemory:
    """Bytes of a real generation on the device: weights, KV cache, prefill and decode peaks (chapter: 1)."""
    cfg = _setup(config_or_name, batch_size, prompt_len, new_tokens, dtype)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MemlabError(f"seed must be a non-negative integer, got {seed!r}")
    return _run_inference(cfg, batch_size, prompt_len, new_tokens, dtype,
                          device=pick_device(device), traced=False, seed=seed)


def trace_inference(config_or_name: ModelConfig | str, *, batch_size: int, prompt_len: int,
                    new_tokens: int, dtype: str = "bf16") -> InferenceMemory:
    """Bytes of a generation counted on fake tensors, without allocating it (chapter: 1)."""
    cfg = _setup(config_or_name, batch_size, prompt_len, new_tokens, dtype)
    return _run_inference(cfg, batch_size, prompt_len, new_tokens, dtype,
                          device=torch.device("cpu"), traced=True, seed=0)


# Estimated ----------------------------------------------------------------------------------
def forward_stage_bytes(cfg: ModelConfig | str, *, batch_size: int, new_positions: int,
                        positions: int, bytes_per_value: int = 2) -> dict[str, int]:
    """Bytes live above weights, cache and prompt ids at each stage of one cached forward pass (chapter: 1).

    The pass feeds ``new_positions`` tokens (T: the prompt at prefill, 1 at decode) that
    attend over ``positions`` cached ones (S), in a model whose weights and cache hold
    ``bytes_per_value`` bytes per value, with no autograd. It follows
    :class:`memlab.model.transformer.Transformer` op by op, as the traced pass runs it: each temporary
    is freed as soon as nothing refers to it, and the input of a block stays alive in the
    caller until the block returns. Only the last position's logits are computed.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    for what, value in (("batch_size", batch_size), ("new_positions", new_positions),
                        ("positions", positions)):
        check_positive_int(what, value)
    if bytes_per_value not in (2, 4):
        raise MemlabError(f"bytes_per_value must be 2 or 4, got {bytes_per_value!r}")
    if positions < new_positions:
        raise MemlabError(f"positions ({positions}) must be at least new_positions "
                          f"({new_positions}): the new ones are cached too")
    B, T, S, cb = batch_size, new_positions, positions, bytes_per_value
    C, F, V = cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    nh, hs = cfg.n_head, cfg.head_dim
    llama = cfg.style == "llama"
    BT = B * T
    X = BT * C * cb  # one (B, T, C) tensor: the residual stream, a norm's output, q, o
    K = BT * cfg.kv_heads * hs * cb  # the new keys (or values), (B, nkv, T, hs)
    KS = B * nh * S * hs * cb if cfg.kv_heads != nh else 0  # cached keys repeated to nh heads
    Fb = BT * F * cb  # one (B, T, F) MLP intermediate
    R = T * hs * 4 if llama else 0  # RoPE cos and sin, (T, hs/2) fp32 each, alive all pass
    Rc = T * hs * cb if (llama and cb != 4) else 0  # cos and sin cast to the model dtype

    def norm(rows: int) -> int:
        """Bytes a norm of (rows, C) adds above its input, at its highest point."""
        if not llama:  # LayerNorm: output, mean and 1/std (in the input dtype on CPU)
            return rows * C * cb + 2 * rows * cb
        up = rows * C * 4 if cb != 4 else 0  # x.float() copies a 16-bit input
        down = rows * C * cb if cb != 4 else 0  # .to(dtype) copies back
        # x.float() and x^2 (with its mean), or x * rsqrt, its cast and weight * it.
        return max(up + rows * C * 4 + rows * 4, rows * C * 4 + down + rows * C * cb)

    if cfg.attention == "sdpa":  # the output, then o_proj's output (or the heads-merging copy)
        core = 2 * X
    else:  # eager: the (B, nh, T, S) scores twice (scaled, masked, softmax), the causal mask
        W = B * nh * T * S * cb
        core = T * S + max(2 * W, W + 2 * X)
    stages = {
        # x0 (the block's input, kept by the caller), h (norm1's output), q, k, v, ...
        "attention norm": X + norm(BT),
        "attention": 2 * X + X + KS + KS + core,  # x0, h, q (rotated), k and v repeated (GQA)
        "MLP norm": 2 * X + norm(BT),  # x0 and x1 = x0 + attention
        "MLP": 3 * X + (3 if llama else 2) * Fb,  # x0, x1, h2; silu(gate), up, their product
        "block output": 4 * X,  # x0, x1, the MLP's output, x1 + it
        "final norm": X + norm(B),  # the last block's output, the last position normalized
        "head": X + B * C * cb + B * V * cb,  # ... and the logits of the last position
    }
    if llama:
        # q, k, v, and inside apply_rope on q (two halves' products at a time), then on k.
        stages["rotary q"] = 2 * X + X + 2 * K + Rc + 2 * X
        stages["rotary k"] = 2 * X + 2 * X + 2 * K + Rc + 2 * K
        # While the tables are made: the embedding, inv_freq, positions, their outer product.
        stages = {k: v + R for k, v in stages.items()}
        stages["rotary tables"] = X + 2 * hs + 4 * T + R // 2 + R
    else:
        stages["embedding"] = X + T * C * cb + X  # token and position embeddings, their sum
        stages["q, k, v"] = 2 * X + X + 2 * K
    stages["next token"] = B * V * cb + 8 * B  # the logits and the argmax, after the pass
    return stages


def estimate_inference(cfg: ModelConfig | str, batch_size: int, seq_len: int,
                       precision: str = "bf16", new_tokens: int = 1, *,
                       kv_precision: str | None = None):
    """Estimated bytes of generating new_tokens tokens after a prompt of seq_len, by phase (chapter: 1).

    Weights and the KV cache are held in one dtype: 4 bytes for ``fp32``, 2 for ``bf16`` and
    ``fp16``. A ``*-mixed`` precision (a training recipe) is served in its 16-bit type, with
    no fp32 master copy. ``kv_precision`` stores the cache in another of those dtypes (the
    weights' by default). The cache is preallocated for seq_len + new_tokens positions. The
    prefill peak is weights + cache + prompt ids + the largest stage of a forward pass at
    T = seq_len (:func:`forward_stage_bytes`; the MLP's intermediates for the presets);
    the decode peak is the same at T = 1 over the full cache, plus the tokens generated so
    far (counted as temporaries). Returns a :class:`memlab.memory.training.MemoryEstimate` with mode
    'inference' and phases 'prefill' and 'decode'.
    """
    from memlab.memory.training import MemoryEstimate, kv_cache_bytes

    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {cfg!r}")
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_positive_int("new_tokens", new_tokens)
    check_choice("precision", precision, DTYPE_BYTES)
    kv_precision = precision if kv_precision is None else kv_precision
    check_choice("kv_precision", kv_precision, DTYPE_BYTES)
    if seq_len + new_tokens > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} + new_tokens {new_tokens} exceeds max_seq_len "
                          f"{cfg.max_seq_len} of model {cfg.name!r}")
    B, T, N, cb = batch_size, seq_len, new_tokens, DTYPE_BYTES[precision]
    n = cfg.num_parameters()
    weights = n * cb
    cache = kv_cache_bytes(cfg, batch_size=B, tokens=T + N,
                           bytes_per_value=DTYPE_BYTES[kv_precision])
    ids = B * T * 8  # the prompt's token ids, int64
    prefill = max(forward_stage_bytes(cfg, batch_size=B, new_positions=T, positions=T,
                                      bytes_per_value=cb).values())
    # Decode: the last step is the largest (the longest cache); before it, N - 1 tokens are
    # kept. At the end all N are concatenated into a new (B, N) tensor.
    decode = 2 * N * 8 * B
    if N > 1:
        step = forward_stage_bytes(cfg, batch_size=B, new_positions=1, positions=T + N - 1,
                                   bytes_per_value=cb)
        decode = max(decode, (N - 1) * 8 * B + max(step.values()))
    base = weights + cache + ids
    phases = {"prefill": base + prefill, "decode": base + decode}
    peak_phase = max(INFERENCE_PHASES, key=lambda p: phases[p])  # prefill on a tie
    breakdown = {
        p: dict(parameters=weights, gradients=0, optimizer_states=0, activations=0,
                kv_cache=cache, temporaries=phases[p] - base, other=ids)
        for p in INFERENCE_PHASES
    }
    dtype = {4: "fp32"}.get(cb, "fp16" if precision.startswith("fp16") else "bf16")
    return MemoryEstimate(
        parameters=n,
        weights_bytes=weights,
        gradients_bytes=0,
        optimizer_bytes=0,
        activations_bytes=0,  # nothing is kept for a backward pass
        temporaries_bytes=phases[peak_phase] - base,
        kv_cache_bytes=cache,
        other_bytes=ids,
        peak_bytes=phases[peak_phase],
        peak_phase=peak_phase,
        phase_peak_bytes=phases,
        setup=dict(model=cfg.name, parameters=n, batch_size=B, seq_len=T, precision=precision,
                   dtype=dtype, attention=cfg.attention, mode="inference", new_tokens=N,
                   kv_precision=kv_precision),
        phase_breakdown=breakdown,
    )
