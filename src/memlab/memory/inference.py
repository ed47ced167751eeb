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
from memlab.measure.peak import measure_peak
from memlab.measure.step import default_dtype
from memlab.memory.estimator import DTYPES
from memlab.model.config import ModelConfig, get_config
from memlab.model.transformer import KVCache, Transformer, build_model
from memlab.units import to_unit


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
    """Token ids (B, T + new_tokens) (chapter: 1).

    The prompt idx (B, T), then new tokens decoded with a KV cache.

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

    parameters_bytes: int  # the parameters, in the inference dtype (a tied weight once)
    kv_cache_bytes: int
    peak_bytes: int  # the larger of the two phase peaks
    prefill_peak_bytes: int
    decode_peak_bytes: int
    setup: dict  # model, parameters, batch_size, prompt_len, new_tokens, dtype
    mode: str  # 'measured' (real tensors) or 'traced' (FakeTensorMode)
    device: str  # where the tensors live ('cpu' when traced: fake CPU tensors)
    method: str = "dispatch"  # how the phases were counted: see memlab.measure.peak.measure_peak

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
        rows = [("weights", self.parameters_bytes), ("KV cache", self.kv_cache_bytes),
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
        parameters_bytes=weights,
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
