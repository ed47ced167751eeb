"""One small, readable decoder-only transformer, in two styles.

* Llama style: RMSNorm, rotary positions (RoPE), grouped-query attention through
  ``F.scaled_dot_product_attention``, SwiGLU MLP, untied head, no biases.
* GPT-2 style: LayerNorm, GELU MLP, learned positions, biases, head tied to the embedding.

For generation, :class:`KVCache` keeps every layer's keys and values; ``model(idx, kv_cache)``
runs a prompt (prefill) or one new token (decode) at the absolute positions the cache is at.

Presets reproduce the published models' parameter counts exactly (tests pin them).
Names follow the papers and nanoGPT: B batch, T sequence, C model width (d_model),
nh query heads, nkv key/value heads, hs head size.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memlab.errors import MemlabError
from memlab.model.checkpoint import Checkpointing, parse_checkpointing
from memlab.model.config import ModelConfig, get_config
from memlab.model.flash import flash_attention
from memlab.model.loss import chunked_lm_loss, lm_loss  # noqa: F401 - lm_loss's old home
from memlab.model.moe import MoE, recompute_contexts
from memlab.model.offload import ActivationOffload


# Modules ---------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in fp32 as Llama does."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):  # (B, T, C)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cache(T: int, hs: int, theta: float, device=None, start: int = 0):
    """cos and sin tables for rotary embeddings (Su et al. 2021) (chapter: 1).

    At positions start..start+T-1, each (T, hs/2), fp32.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, device=device, dtype=torch.float32) / hs))
    t = torch.arange(start, start + T, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)  # (T, hs/2)
    return freqs.cos(), freqs.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (first half, second half) of each head of x, shaped (B, nh, T, hs) (chapter: 1)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class KVCache:
    """Keys and values of every layer, preallocated for ``max_len`` positions (chapter: 1).

    ``k[i]`` and ``v[i]`` are layer i's tensors, (B, nkv, max_len, hs) each, in the model's
    dtype; positions [0, pos) are filled. Its bytes are fixed when it is made:
    2 x n_layer x B x nkv x max_len x hs x bytes per value.
    """

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, *, device=None,
                 dtype=None):
        if max_len > cfg.max_seq_len:
            raise MemlabError(f"KV cache length {max_len} exceeds max_seq_len {cfg.max_seq_len}")
        shape = (batch_size, cfg.kv_heads, max_len, cfg.head_dim)  # (B, nkv, max_len, hs)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.max_len = max_len
        self.pos = 0  # number of positions filled

    def nbytes(self) -> int:
        """Bytes of all the keys and values (chapter: 1)."""
        return sum(t.untyped_storage().nbytes() for t in self.k + self.v)


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads (Ainslie et al. 2023)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        C, hs = cfg.d_model, cfg.head_dim
        bias = cfg.style == "gpt2"
        qkv_bias = bias or cfg.qkv_bias
        self.q_proj = nn.Linear(C, cfg.n_head * hs, bias=qkv_bias)
        self.k_proj = nn.Linear(C, cfg.kv_heads * hs, bias=qkv_bias)
        self.v_proj = nn.Linear(C, cfg.kv_heads * hs, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.n_head * hs, C, bias=bias)
        self.recompute_core = False  # selective checkpointing (set by the model's plan)

    def forward(self, x, rope=None, cache=None, layer=0):
        cfg = self.cfg
        B, T, C = x.shape
        nh, nkv, hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
        q = self.q_proj(x).view(B, T, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(B, T, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        pos = 0
        if cache is not None:  # write the new positions, then attend over all filled ones
            pos = cache.pos
            cache.k[layer][:, :, pos : pos + T] = k
            cache.v[layer][:, :, pos : pos + T] = v
            k = cache.k[layer][:, :, : pos + T]  # (B, nkv, S, hs), S = pos + T; a view
            v = cache.v[layer][:, :, : pos + T]
        if self.recompute_core and cache is None and torch.is_grad_enabled():
            # Selective checkpointing: keep q, k and v, recompute the core in the backward pass.
            y = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            y = self.core(q, k, v, pos)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, nh * hs)  # (B, T, C)
        return self.o_proj(y)

    def core(self, q, k, v, pos: int = 0):
        """The attention core: scores, softmax and the weighted values, (B, nh, T, hs) (chapters: 1, 7).

        q is (B, nh, T, hs); k and v are (B, nkv, S, hs), the T queries being the last T of the
        S positions. What selective checkpointing recomputes (Korthikanti et al. 2022).
        """
        cfg = self.cfg
        nh, nkv, hs = cfg.n_head, cfg.kv_heads, cfg.head_dim
        T, S = q.size(2), k.size(2)  # keys: S = T without a cache
        if cfg.attention == "flash":
            return flash_attention(q, k, v, causal=True)  # (B, nh, T, hs); k, v not repeated
        if nkv != nh:  # GQA: each key/value head serves nh/nkv query heads
            k = k.repeat_interleave(nh // nkv, dim=1)  # (B, nh, S, hs)
            v = v.repeat_interleave(nh // nkv, dim=1)
        if cfg.attention == "sdpa" and pos == 0:  # no cache, or a prompt into an empty one
            return F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)  # (B, nh, T, hs)
        if cfg.attention == "sdpa":
            # Query i sits at position pos + i: it sees keys 0..pos+i. One new token sees all.
            mask = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device).tril(pos)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
        # eager: materialises the (T, S) scores and keeps the softmax for backward
        future = torch.ones(T, S, dtype=torch.bool, device=q.device).triu(pos + 1)  # (T, S)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
        att = att.masked_fill(future, float("-inf"))
        att = att.softmax(dim=-1)  # kept for backward: the s^2 term of eager attention
        return att @ v  # (B, nh, T, hs)


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020) for Llama style, GELU for GPT-2 style."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.style = cfg.style
        C, Fd = cfg.d_model, cfg.ffn_dim
        if cfg.style == "gpt2":
            self.up_proj = nn.Linear(C, Fd)
            self.down_proj = nn.Linear(Fd, C)
        else:
            self.gate_proj = nn.Linear(C, Fd, bias=False)
            self.up_proj = nn.Linear(C, Fd, bias=False)
            self.down_proj = nn.Linear(Fd, C, bias=False)

    def forward(self, x):  # (B, T, C)
        if self.style == "gpt2":
            return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        Norm = (lambda d: nn.LayerNorm(d, eps=cfg.norm_eps)) if cfg.style == "gpt2" else (
            lambda d: RMSNorm(d, eps=cfg.norm_eps)
        )
        self.norm1 = Norm(cfg.d_model)
        self.attn = Attention(cfg)
        self.norm2 = Norm(cfg.d_model)
        self.mlp = MLP(cfg) if cfg.moe is None else MoE(cfg.d_model, cfg.moe)

    def forward(self, x, rope=None, cache=None, layer=0):
        x = x + self.attn(self.norm1(x), rope, cache, layer)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """Decoder-only language model: tokens (B, T) in, logits (B, T, V) out."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.style == "gpt2" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm_f = (
            nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
            if cfg.style == "gpt2"
            else RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        )
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.lm_head.weight = self.tok_emb.weight
        # Activation checkpointing (memlab.model.checkpoint): which blocks keep only their input.
        self.checkpointing = Checkpointing("none")
        # Activation offloading (memlab.model.offload): None, or the hooks and their byte counts.
        self.offload: ActivationOffload | None = None

    def set_checkpointing(self, plan) -> Checkpointing:
        """Turn on a checkpointing plan: False/True, 'selective', 'every-K', 'segments-K' (chapters: 1, 7)."""
        self.checkpointing = parse_checkpointing(plan)
        for block in self.blocks:
            block.attn.recompute_core = self.checkpointing.kind == "selective"
        return self.checkpointing

    def _blocks(self, x, rope, start: int, end: int):
        for block in self.blocks[start:end]:
            x = block(x, rope)
        return x

    def forward(self, idx, kv_cache: KVCache | None = None, *, last_only: bool = False,
                hidden: bool = False, targets=None, loss_chunks: int = 1):
        """Logits (B, T, V) for token ids (B, T); with ``kv_cache``, at positions pos..pos+T-1.

        ``last_only=True`` computes the last position's logits only, (B, 1, V): all that
        generation needs, and it spares the (B, T, V) logits of a prompt. ``hidden=True``
        returns the final norm's output (B, T, C) instead. ``targets`` (B, T) returns the loss
        of the head applied over ``loss_chunks`` chunks of tokens
        (:func:`memlab.model.loss.chunked_lm_loss`), inside the forward, where a sharded model
        has its head gathered.
        """
        B, T = idx.shape
        pos = 0 if kv_cache is None else kv_cache.pos
        if self.cfg.max_seq_len < pos + T:
            raise MemlabError(f"sequence length {pos + T} exceeds max_seq_len {self.cfg.max_seq_len}")
        if kv_cache is not None and kv_cache.max_len < pos + T:
            raise MemlabError(f"sequence length {pos + T} exceeds the KV cache's {kv_cache.max_len}")
        x = self.tok_emb(idx)  # (B, T, C)
        rope = None
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(pos, pos + T, device=idx.device))  # (B, T, C)
        else:
            rope = rope_cache(T, self.cfg.head_dim, self.cfg.rope_theta, device=idx.device,
                              start=pos)
        training = torch.is_grad_enabled() and kv_cache is None
        offload = self.offload if training and self.offload is not None else contextlib.nullcontext()
        with offload:  # the blocks' saved tensors to the host (memlab.model.offload), if on
            # (the loops rebind x, so each block's input is freed once nothing else holds it)
            if self.checkpointing.recomputes_blocks and training:
                for start, end, kept in self.checkpointing.units(len(self.blocks)):
                    if kept:  # keep only the unit's input; its forward runs again in the backward
                        x = checkpoint(self._blocks, x, rope, start, end, use_reentrant=False,
                                       context_fn=recompute_contexts)
                    else:
                        x = self._blocks(x, rope, start, end)
            else:
                for i, block in enumerate(self.blocks):
                    x = block(x, rope, kv_cache, i)
        if kv_cache is not None:
            kv_cache.pos = pos + T
        if last_only:
            x = x[:, -1:]  # (B, 1, C)
        if targets is not None:
            return chunked_lm_loss(self.norm_f(x), self.lm_head.weight, targets, loss_chunks)
        if hidden:
            return self.norm_f(x)  # (B, T, C)
        return self.lm_head(self.norm_f(x))  # (B, T, V), or (B, 1, V)


def block_linears(model: nn.Module, kind: type[nn.Module] = nn.Linear) -> dict[str, nn.Module]:
    """The ``kind`` modules inside a :class:`Transformer`'s blocks, by qualified name (chapters: 3, 5).

    What quantization, QAT and LoRA replace: the attention projections and the MLP, never the
    embedding, the norms or the LM head.
    """
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise MemlabError(f"expected a memlab Transformer with .blocks, got {type(model).__name__}")
    return {f"blocks.{name}": m for name, m in blocks.named_modules() if isinstance(m, kind)}


def replace_module(model: nn.Module, name: str, module: nn.Module) -> nn.Module:
    """Put ``module`` at the qualified ``name`` inside ``model`` (chapters: 3, 5).

    It returns the module it replaced.
    """
    parent, _, child = name.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    old = getattr(owner, child)
    setattr(owner, child, module)
    return old


def build_model(
    cfg: ModelConfig | str,
    *,
    device=None,
    dtype=None,
    seed: int | None = 0,
    checkpointing: bool | str = False,
    offload_activations: bool = False,
) -> Transformer:
    """Build a :class:`Transformer` from a config or preset name (chapter: all).

    ``device="meta"`` builds it without allocating any weights; ``checkpointing=True``
    turns on full activation checkpointing (one saved input per block), and a plan name
    ('selective', 'every-K', 'segments-K', :mod:`memlab.model.checkpoint`) another plan.
    ``offload_activations=True`` keeps the blocks' saved tensors on the host between the passes
    (:mod:`memlab.model.offload`; the model's ``offload.stats`` counts the bytes).
    """
    plan = parse_checkpointing(checkpointing)
    if isinstance(cfg, str):
        cfg = get_config(cfg)
    if seed is not None and str(device) != "meta":
        torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = Transformer(cfg)
    if dtype is not None:
        if not isinstance(dtype, torch.dtype):
            raise MemlabError(f"dtype must be a torch.dtype such as torch.bfloat16, got {dtype!r}")
        model = model.to(dtype)
    model.set_checkpointing(plan)
    if offload_activations:
        model.offload = ActivationOffload()
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameters, a tied weight counted once (chapter: 0)."""
    return sum(p.numel() for p in model.parameters())


def model_loss(model: Transformer, idx, targets, loss_chunks: int = 1):
    """The training loss of ``model`` on ``idx``: the head and the loss whole, or in chunks (chapter: 8).

    ``loss_chunks=1`` is :func:`lm_loss` of the logits; more computes the head and the loss
    over that many chunks of tokens (:func:`memlab.model.loss.chunked_lm_loss`), so the
    (B, T, V) logits never exist whole.
    """
    if loss_chunks == 1:
        loss = lm_loss(model(idx), targets)  # the logits die inside lm_loss, as in training
    else:
        loss = model(idx, targets=targets, loss_chunks=loss_chunks)
    aux = moe_aux_loss(model)
    return loss if aux is None else loss + aux


def moe_aux_loss(model: Transformer):
    """The experts' load-balancing loss of the last forward, weighted, or None (chapter: 9).

    ``aux_loss_coef`` times the mean over the blocks of each block's Switch Transformer loss
    (:class:`memlab.model.moe.MoE`), as transformers adds Mixtral's to the language-model loss.
    """
    layers = [b.mlp for b in getattr(model, "blocks", ()) if isinstance(b.mlp, MoE)]
    if not layers or not layers[0].moe.aux_loss_coef or layers[0].aux_loss is None:
        return None
    return layers[0].moe.aux_loss_coef * torch.stack([m.aux_loss for m in layers]).mean()
