"""FLOPs of a training step, from the config (chapter 7).

This is the count PyTorch's counter makes, term by term.

``torch.utils.flop_counter.FlopCounterMode`` counts matrix multiplies and attention, nothing
elementwise. :func:`step_flops` writes that count down from the shapes, so it can be set beside
the counter (:func:`memlab.measure.step.trace_step` reports ``flops``) and beside the two
formulas the literature uses:

* ``6ND`` (Kaplan et al. 2020): 2 FLOPs per parameter per token forward, 4 backward, where N
  counts the parameters a token multiplies (:func:`matmul_parameters`) and D the tokens;
* the fuller count with attention, ``(6N + 12 L C T) D`` (PaLM, Chowdhery et al. 2022, appendix
  B; C = heads x head size): the scores and the weighted values, 4 B T^2 C FLOPs per layer in
  the forward pass, counted for the full T x T square as the counter and the papers do.

Recomputation under activation checkpointing (:mod:`memlab.model.checkpoint`) adds forward work
inside the backward pass. PyTorch's non-reentrant checkpoint stops a recomputation early by
default: once every tensor the backward needs is back, it stops, so the last operation of a
checkpointed unit whose saved tensors are all its inputs (the block's closing ``down_proj``, or
eager attention's ``att @ v``) is never run again. ``early_stop=False`` counts the whole
forward again, the textbook "one extra forward".
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, replace

from memlab.errors import MemlabError, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import ModelConfig, get_config
from memlab.model.moe import Routing
from memlab.model.step import StepSpec

# Backward FLOPs over forward FLOPs of one attention core, as torch's formulas count them: a
# matmul's backward is two matmuls; the SDPA kernels' backward also recomputes the scores
# (torch.utils.flop_counter.sdpa_backward_flop_count: 5 matmuls of the forward's 2).
ATTENTION_BACKWARD = {"sdpa": 2.5, "eager": 2.0}


@dataclass(frozen=True)
class QuotedMFU:
    """A model FLOPs utilisation a paper reports for end-to-end training, quoted (chapter: 7)."""

    who: str
    mfu: float
    gpus: int | None  # how many GPUs the figure is for (None: per GPU, count not given)
    gpu: str
    model: str
    source: str

    @property
    def label(self) -> str:
        """The figure in words, labelled quoted, e.g. '54.2% MFU ... (quoted: <source>)' (chapter: 7)."""
        on = f"{self.gpus:,} {self.gpu}s" if self.gpus else f"{self.gpu}s"
        return f"{self.who}: {self.mfu:.1%} MFU training {self.model} on {on} (quoted: {self.source})"


QUOTED_MFU = (
    # Dao, "FlashAttention-2", arXiv 2307.08691, abstract: "up to 225 TFLOPs/s per A100 GPU (72%
    # model FLOPs utilization)" training GPT-style models end to end.
    QuotedMFU("Dao 2023 (FlashAttention-2)", 0.72, None, "A100", "GPT-style models",
              "https://arxiv.org/abs/2307.08691"),
    # Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
    # arXiv 2205.05198, abstract: a 530B GPT-3 style model on 2240 A100 GPUs at 54.2% MFU.
    QuotedMFU("Korthikanti et al. 2022", 0.542, 2240, "A100", "a 530B-parameter GPT-3 style model",
              "https://arxiv.org/abs/2205.05198"),
)


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one training step by phase and by term, as FlopCounterMode counts them (chapter: 7)."""

    forward: int  # the forward pass of every micro-batch
    backward: int  # gradients, plus any forward recomputed by checkpointing
    recompute: int  # the part of ``backward`` that is forward work done again
    linear_forward: int  # the blocks' and the head's matrix multiplies, forward
    attention_forward: int  # scores and weighted values, forward
    tokens: int  # tokens per step (micro-batches included)
    setup: dict

    @property
    def total(self) -> int:
        """Forward plus backward FLOPs; the optimizer's elementwise work is not counted (chapter: 7)."""
        return self.forward + self.backward

    @property
    def recompute_share(self) -> float:
        """Recomputed FLOPs over the step's FLOPs without them (chapter: 7)."""
        return self.recompute / (self.total - self.recompute)

    def as_dict(self) -> dict:
        """The fields and the total as a plain dict (chapter: 7)."""
        return asdict(self) | {"total": self.total}


def matmul_parameters(cfg: ModelConfig | str) -> int:
    """Parameters a token multiplies: every Linear weight of the blocks and the head (chapter: 7).

    Leaves out the embedding lookups (no multiply), the norms and the biases, which
    FlopCounterMode does not count; a tied head counts once, as a multiply. An MoE block counts
    what a token multiplies: the router, its k experts, the shared expert and its gate.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    C, hs, F = cfg.d_model, cfg.head_dim, cfg.ffn_dim
    attn = C * cfg.n_head * hs + 2 * C * cfg.kv_heads * hs + cfg.n_head * hs * C
    if cfg.moe is not None:
        mlp = cfg.moe.active_block_parameters(C)
    else:
        mlp = (2 if cfg.style == "gpt2" else 3) * C * F
    return cfg.n_layer * (attn + mlp) + C * cfg.vocab_size


def moe_rows(cfg: ModelConfig, tokens: int, routing: Routing | None = None) -> list[int]:
    """Rows each expert computes for ``tokens`` tokens: the routing's split, capped (chapter: 9).

    ``routing`` (default balanced, as a trace routes) splits the N·k (token, slot) rows; a
    capacity factor caps each expert at ceil(c · N · k / E) rows (GShard; Switch Transformer).
    """
    m = cfg.moe
    if m is None:
        raise MemlabError(f"moe_rows needs an MoE config, got {cfg.name!r} (dense)")
    routing = Routing.balanced(m.experts) if routing is None else routing
    if not isinstance(routing, Routing) or len(routing.shares) != m.experts:
        raise MemlabError(f"routing must be a Routing with {m.experts} shares (one per expert), "
                          f"got {routing!r}")
    cap = m.capacity(tokens)
    return [c if cap is None else min(c, cap) for c in routing.counts(tokens * m.top_k)]


def moe_mlp_flops(cfg: ModelConfig, tokens: int, routing: Routing | None = None) -> int:
    """Forward FLOPs of one block's MoE MLP: router, the rows each expert runs, shared (chapter: 9).

    2 N C E for the router's logits, 6 C F per row an expert computes (its three SwiGLU
    matmuls), 6 N C F_s for the shared expert and 2 N C for its gate (Shazeer et al. 2017;
    Mixtral, Jiang et al. 2024; DeepSeekMoE, Dai et al. 2024). Dropped rows cost nothing.
    """
    m, C, N = cfg.moe, cfg.d_model, tokens
    rows = sum(moe_rows(cfg, tokens, routing))
    return (2 * N * C * m.experts + 6 * rows * C * m.d_ff + 6 * N * C * m.shared_d_ff
            + (2 * N * C if m.shared_gate else 0))


def _check_attention(cfg: ModelConfig) -> None:
    if cfg.attention not in ATTENTION_BACKWARD:
        raise MemlabError(f"step_flops counts attention {', '.join(ATTENTION_BACKWARD)}; got "
                          f"{cfg.attention!r} (the book's FlashAttention skips masked tiles: "
                          "count it with the counter, trace_step(...).flops)")


def step_flops(config_or_spec: StepSpec | ModelConfig | str, *, early_stop: bool = True,
               routing: Routing | None = None, **switches) -> StepFlops:
    """FLOPs of a training step as PyTorch's counter counts them, from the shapes (chapter: 7).

    Takes what :func:`memlab.measure.step.trace_step` takes (a StepSpec, or a config and
    ``batch_size``, ``seq_len``, ``checkpointing``, ``grad_accum_steps``, ``attention`` ...).
    An MoE model's blocks count the rows each expert runs under ``routing`` (default balanced,
    as a trace routes; :func:`moe_mlp_flops`), chapter 9.
    """
    spec = StepSpec.of(config_or_spec, **switches)
    cfg = spec.config
    _check_attention(cfg)
    if not isinstance(early_stop, bool):
        raise MemlabError(f"early_stop must be True or False, got {early_stop!r}")
    plan = parse_checkpointing(spec.checkpointing)
    B, T, L, C, F = spec.batch_size, spec.seq_len, cfg.n_layer, cfg.d_model, cfg.ffn_dim
    BT = B * T
    head = 2 * BT * C * cfg.vocab_size
    if cfg.moe is None:
        block_linear = 2 * BT * (matmul_parameters(cfg) - C * cfg.vocab_size) // L
    else:
        attn = 2 * BT * (matmul_parameters(cfg) - C * cfg.vocab_size) // L \
            - 2 * BT * cfg.moe.active_block_parameters(C)
        block_linear = attn + moe_mlp_flops(cfg, BT, routing)
    scores = 2 * B * cfg.n_head * T * T * cfg.head_dim  # q @ k^T; att @ v is the same
    attention = 2 * scores
    forward = L * (block_linear + attention) + head
    backward = L * (2 * block_linear + ATTENTION_BACKWARD[cfg.attention] * attention) + 2 * head
    # Forward work done again in the backward pass.
    last_linear = 2 * BT * F * C  # down_proj: never run again when the recomputation stops early
    if cfg.moe is not None:  # an MoE block ends with its combine (saves its input) or shared expert
        m = cfg.moe
        last_linear = 2 * BT * m.shared_d_ff * C if m.shared_d_ff and not m.shared_gate else 0
    recompute = 0
    if plan.recomputes_blocks:
        units = [u for u in plan.units(L) if u[2]]
        recompute = sum((e - s) * (block_linear + attention) for s, e, _ in units)
        if early_stop:
            recompute -= len(units) * last_linear
    elif plan.kind == "selective":
        # SDPA saves its outputs, so it runs again; eager's att @ v saves only its inputs.
        recompute = L * (scores if cfg.attention == "eager" and early_stop else attention)
    if spec.loss_chunks > 1:  # the chunked loss computes each chunk's logits again (chapter 8)
        recompute += head
    k = spec.grad_accum_steps
    return StepFlops(forward=int(k * forward), backward=int(k * (backward + recompute)),
                     recompute=int(k * recompute), linear_forward=int(k * (L * block_linear + head)),
                     attention_forward=int(k * L * attention), tokens=k * BT,
                     setup=spec.as_dict() | {"early_stop": early_stop})


def six_nd(parameters: int, tokens: int) -> int:
    """Training FLOPs by the 6ND rule: 6 x parameters x tokens (chapter: 7)."""
    check_positive_int("parameters", parameters)
    check_positive_int("tokens", tokens)
    return 6 * parameters * tokens


def rule_flops(parameters: int, tokens: int, *, recompute: bool = False) -> int:
    """6ND, or 8ND with one extra forward for full recomputation: the rules of thumb (chapter: 7)."""
    if not isinstance(recompute, bool):
        raise MemlabError(f"recompute must be True or False, got {recompute!r}")
    return six_nd(parameters, tokens) // 6 * (8 if recompute else 6)


def palm_flops(cfg: ModelConfig | str, tokens: int, seq_len: int) -> int:
    """Training FLOPs with attention, (6N + 12 L C T) D, PaLM's appendix B (chapter: 7).

    N is :func:`matmul_parameters`, C = heads x head size, T the sequence length, D the tokens.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    check_positive_int("tokens", tokens)
    check_positive_int("seq_len", seq_len)
    per_token = 6 * matmul_parameters(cfg) + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
    return per_token * tokens


def attention_share(cfg: ModelConfig | str, seq_len: int) -> float:
    """The attention term's share of PaLM's count, 12LCT / (6N + 12LCT): what 6ND leaves out (chapter: 7)."""
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    att = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
    return att / (6 * matmul_parameters(cfg) + att)


def counted_flops(config_or_spec: StepSpec | ModelConfig | str, *, early_stop: bool = True,
                  **switches) -> dict[str, int]:
    """FLOPs of a traced step by phase, from FlopCounterMode on fake tensors (chapter: 7).

    ``early_stop=False`` turns off the early stop of PyTorch's checkpoint for the step
    (``torch.utils.checkpoint.set_checkpoint_early_stop``).
    """
    from torch.utils.checkpoint import set_checkpoint_early_stop

    from memlab.measure.step import trace_step

    if not isinstance(early_stop, bool):
        raise MemlabError(f"early_stop must be True or False, got {early_stop!r}")
    spec = StepSpec.of(config_or_spec, **switches)
    with set_checkpoint_early_stop(early_stop) if not early_stop else contextlib.nullcontext():
        traced = trace_step(spec, count_flops=True)
    return dict(traced.flops_by_phase) | {"total": traced.flops}


@dataclass(frozen=True)
class ActiveFlops:
    """An MoE model's memory of all parameters beside the compute of the active ones (chapter: 9)."""

    parameters: int  # every parameter: what the weights, gradients and optimizer states hold
    active_parameters: int  # the parameters one token passes through
    per_token: int  # training FLOPs per token, balanced routing (step_flops)
    all_experts_per_token: int  # the same step with every token sent to every expert
    six_n_active: int  # 6 x the matmul parameters a token multiplies (Kaplan et al. 2020)

    @property
    def compute_share(self) -> float:
        """FLOPs per token over those of the all-experts step: what sparsity saves (chapter: 9)."""
        return self.per_token / self.all_experts_per_token

    def as_dict(self) -> dict:
        """The fields and the share as a plain dict (chapter: 9)."""
        return asdict(self) | {"compute_share": self.compute_share}


def active_flops(cfg: ModelConfig | str, seq_len: int) -> ActiveFlops:
    """Parameters held against FLOPs run per token, for an MoE model's training step (chapter: 9).

    Memory follows every parameter, compute the active ones (Shazeer et al. 2017; Mixtral,
    Jiang et al. 2024): the step's FLOPs per token of one ``seq_len`` sequence beside those
    of the same model with each token sent to all its experts, a dense model of its full size.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if cfg.moe is None:
        raise MemlabError(f"active_flops needs an MoE config, got {cfg.name!r} (dense)")
    check_positive_int("seq_len", seq_len)
    every = replace(cfg, moe=replace(cfg.moe, top_k=cfg.moe.experts, capacity_factor=None))
    per_token = step_flops(cfg, batch_size=1, seq_len=seq_len).total // seq_len
    return ActiveFlops(parameters=cfg.num_parameters(), active_parameters=cfg.active_parameters(),
                       per_token=per_token,
                       all_experts_per_token=step_flops(every, batch_size=1,
                                                        seq_len=seq_len).total // seq_len,
                       six_n_active=6 * matmul_parameters(cfg))
