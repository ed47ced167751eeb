"""The bytes of an MoE model's training step, by phase, for a given routing (chapter: 9).

The dense parts are the dense estimator's (:mod:`memlab.memory.estimator`); the MoE block's
saved tensors are :mod:`memlab.moe.saved`'s. Three levers: full activation checkpointing
(each block keeps its input and is recomputed in the backward pass), gradient accumulation,
and expert parallelism over N ranks: one rank of N holds E/N experts per block and the
replicated rest, and its experts run the rows every rank routes to them (GShard, Lepikhin et
al. 2020; DeepSpeed-MoE, Rajbhandari et al. 2022; Megatron-LM).
"""

from __future__ import annotations

import math
from dataclasses import replace

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.memory.activations import (
    PARAM_BYTES,
    BackwardGrads,
    SavedTensor,
    activation_bytes,
    activation_peaks,
    saved_tensors,
)
from memlab.memory.estimator import (
    DEVICES,
    MemoryEstimate,
    param_shape_groups,
    state_bytes,
    step_estimate,
    step_scratch_bytes,
)
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import ModelConfig, get_config, mlp_shapes
from memlab.model.moe import Routing
from memlab.moe.expert_parallel import check_expert_parallel
from memlab.moe.saved import moe_mlp_tensors, moe_saved_tensors, moe_weight_numel

CHECKPOINTING = ("False (none)", "True or 'full'")


def rank_shape_groups(cfg: ModelConfig, ranks: int = 1) -> tuple[list, list, list]:
    """Shapes of one rank's parameters: (embeddings, one block, head), E/N experts (chapter: 9).

    Under expert parallelism over N ranks each block keeps E/N of its experts (three
    (F, C)-sized matrices each); the embeddings, attention, norms, router, shared expert and
    head are replicated.
    """
    m = cfg.moe
    local = check_expert_parallel(m.experts, ranks)
    embed, block, head = param_shape_groups(cfg)
    expert = [(m.d_ff, cfg.d_model), (m.d_ff, cfg.d_model), (cfg.d_model, m.d_ff)]
    at = len(block) - len(mlp_shapes(cfg)) + 1  # the experts follow the router
    return embed, block[:at] + expert * local + block[at + 3 * m.experts:], head


def rank_shapes(cfg: ModelConfig, ranks: int = 1) -> list[tuple[tuple[int, ...], int]]:
    """(shape, how many) of one rank's parameters in ``parameters()`` order (chapter: 9)."""
    embed, block, head = rank_shape_groups(cfg, ranks)
    return [(t, 1) for t in embed] + [(t, cfg.n_layer) for t in block] + [(t, 1) for t in head]


def _moe_grads(cfg: ModelConfig, precision: str, ranks: int) -> BackwardGrads:
    C, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    _, shapes, head = rank_shape_groups(cfg, ranks)
    block = [math.prod(t) for t in shapes]
    pb = PARAM_BYTES[precision]
    total = sum(block)
    qkv_w = C * C + 2 * C * kv
    mlp = total - 2 * C - qkv_w - C * C
    gone = 3 * C * cfg.moe.d_ff * (cfg.moe.experts - cfg.moe.experts // ranks)
    cast = 2 if precision.endswith("-mixed") else 0
    in_block = {"attention norm": (pb * (total - C), cast * qkv_w),
                "attention": (pb * (C * C + C + mlp), cast * qkv_w),
                "MLP norm": (pb * mlp, cast * (qkv_w + C * C)),
                "MLP": (pb * mlp // 3, cast * (moe_weight_numel(cfg) - gone - mlp // 3))}
    return BackwardGrads(pb * total, pb * sum(math.prod(t) for t in head), pb * max(block),
                         in_block)


def rank_rows(cfg: ModelConfig, tokens: int, ranks: int,
                  routing: Routing | None = None) -> list[int]:
    """Rows each of rank 0's E/N experts runs per block when every rank routes alike (chapter: 9).

    Each of the N ranks sends its rows for expert e (``routing``'s count of its N·k rows) to
    the expert's owner: N times that.
    """
    m = cfg.moe
    local = check_expert_parallel(m.experts, ranks)
    counts = (routing or Routing.balanced(m.experts)).counts(tokens * m.top_k)
    return [ranks * c for c in counts[:local]]


def ep_mlp_tensors(cfg: ModelConfig, B: int, T: int, precision: str, ranks: int,
                   routing: Routing | None = None) -> list[SavedTensor]:
    """What one block's MoE MLP saves on rank 0 of N ranks of expert parallelism (chapter: 9).

    Read against :class:`memlab.moe.expert_parallel.ExpertParallelMoE`: the router's and the
    combine's tensors are one process's over this rank's N·k rows; the experts' inputs and
    SwiGLU tensors are over the R rows they receive; two (R,) int64 indices regroup the
    received rows by expert and back.
    """
    if routing is not None and len(routing.shares) != cfg.moe.experts:
        raise MemlabError(f"routing needs one share per expert ({cfg.moe.experts}), got "
                          f"{len(routing.shares)}")
    R = sum(rank_rows(cfg, B * T, ranks, routing))
    nk = B * T * cfg.moe.top_k
    out = []
    for t in moe_mlp_tensors(cfg, B, T, precision, None):  # dropless: R = N·k rows here
        if "experts:" in t.name or "dispatch" in t.name:
            t = replace(t, bytes=t.bytes // nk * R)
        out.append(t)
        if "experts: silu(gate) * up" in t.name:
            out.append(SavedTensor("MLP (experts) received rows regrouped by expert, and back",
                                   "layer", "2 x (R,)", "int64", 2 * 8 * R))
    return out


def moe_forward_high(cfg: ModelConfig, B: int, T: int, precision: str, ranks: int = 1,
                     routing: Routing | None = None, saving: bool = True) -> int:
    """Bytes an MoE MLP's forward holds at its highest point beyond what it saves (chapter: 9).

    Read against :class:`memlab.model.moe.MoE` and its expert-parallel rank: the block's
    residual stream and the MLP norm's output, the dispatch buffer (and, on a rank of N,
    the received rows and their regrouped copy), the experts' outputs, and either the largest
    expert's SwiGLU working set or the concatenated outputs with their weighted copy.
    ``saving``: False inside a checkpointed block, whose forward saves nothing.
    """
    from memlab.compute.flops import moe_rows
    from memlab.memory.activations import COMPUTE_BYTES

    m, C, N = cfg.moe, cfg.d_model, B * T
    nk = N * m.top_k
    cb, sb = COMPUTE_BYTES[precision], PARAM_BYTES[precision]
    mixed = precision.endswith("-mixed")
    hb = 4 if mixed else cb
    rows = rank_rows(cfg, N, ranks, routing) if ranks > 1 else moe_rows(cfg, N, routing)
    R = sum(rows)
    dispatch = (nk + (2 * R if ranks > 1 else 0)) * C * hb
    work = 3 * max(rows) * m.d_ff * cb + (2 * max(rows) * C * 2 if mixed else 0)
    wb = 2 if precision == "bf16" else 4  # the rows' weights and the weighted rows
    Fs = m.shared_d_ff  # the shared expert's working set, after the combine
    shared = (max(3 * N * Fs * cb, N * Fs * cb + N * C * cb) + (N * C * 2 if mixed else 0)
              if Fs else 0)
    y = N * C * hb  # the combine's sum
    if ranks > 1:  # the regrouped outputs and the rows sent back; the weighted rows, a moment
        combine = R * C * cb + nk * C * cb + max(nk * C * wb, shared) + y
    else:  # the concatenated outputs a moment, then the weighted rows, kept
        combine = R * C * wb + max(R * C * cb, y + shared)
    router = N * m.experts * 4 + N * m.top_k * 12 + 2 * nk * 8
    if not saving:
        return N * C * (sb + hb) + router + dispatch + R * C * cb + max(work, combine)
    # saved already: the dispatch buffer (or its casts), the experts' outputs and weighted rows
    return (dispatch - (nk * C * hb if not mixed else 0) + R * C * cb
            if ranks > 1 else 0)


def _recomputed_high(cfg, block, grads, high: int, model_level: int, B: int, T: int,
                     precision: str, accumulating: bool) -> int:
    """The backward's high point while a checkpointed MoE block is recomputed.

    The inputs kept below it, its attention's saved tensors, what its checkpointed forward
    holds (``high``) and the experts' SwiGLU tensors, saved this time, beside the gradients
    done so far and that of the block's output.
    """
    L, C = cfg.n_layer, cfg.d_model
    x_in = B * T * C * PARAM_BYTES[precision]
    # saved this time, beside the forward's locals: all but the rows dispatched and returned
    swiglu = sum(t.bytes for t in block if t.name.startswith("MLP (experts)")
                 and "dispatch buffer" not in t.name and "outputs, concatenated" not in t.name
                 and "weighted rows" not in t.name)
    kept = sum(t.bytes for t in block if not t.name.startswith(("Linear weights cast", "MLP")))
    out = 0
    for layer in {0, L - 1}:
        done = grads.largest if accumulating else grads.head + (L - 1 - layer) * grads.block
        out = max(out, model_level + (layer + 1) * x_in + kept + grads.in_block["MLP"][1]
                  + high + swiglu + done + x_in)
    return out


def _check(cfg, checkpointing, grad_accum_steps, expert_parallel, device):
    if cfg.moe is None:
        raise MemlabError(f"estimate_moe needs a model with experts, got {cfg.name!r} (dense): "
                          f"use memlab.memory.estimate")
    check_choice("device", device, DEVICES)
    plan = parse_checkpointing(checkpointing)
    if plan.kind not in ("none", "full"):
        raise MemlabError(f"checkpointing of an MoE model is modelled for "
                          f"{' and '.join(CHECKPOINTING)}, got {checkpointing!r}")
    check_positive_int("grad_accum_steps", grad_accum_steps)
    check_expert_parallel(cfg.moe.experts, expert_parallel)
    if expert_parallel > 1 and cfg.moe.capacity_factor is not None:
        raise MemlabError(f"expert parallelism here is dropless: capacity_factor must be null, "
                          f"got {cfg.moe.capacity_factor!r}")
    return plan


def estimate_moe(cfg: ModelConfig | str, *, batch_size: int, seq_len: int,
                 precision: str = "fp32", optimizer: str = "adamw",
                 optimizer_impl: str = "foreach", device: str = "cuda",
                 routing: Routing | None = None, checkpointing: bool | str = False,
                 grad_accum_steps: int = 1, expert_parallel: int = 1) -> MemoryEstimate:
    """Estimate an MoE training step's bytes by category and phase, on one rank (chapter: 9).

    ``checkpointing``: False or full (True, 'full'); ``grad_accum_steps`` micro-batches of
    ``batch_size`` per optimizer step; ``expert_parallel`` N: rank 0 of N ranks, each with its
    own micro-batch, E/N experts per block and the rest replicated (data-parallel), every rank
    routing as ``routing`` says (balanced by default).
    """
    from memlab.model.step import StepSpec

    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    plan = _check(cfg, checkpointing, grad_accum_steps, expert_parallel, device)
    StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
             optimizer=optimizer, optimizer_impl=optimizer_impl)  # the switches, checked once
    B, T, W = batch_size, seq_len, expert_parallel
    shapes = rank_shapes(cfg, W)
    n = sum(math.prod(t) * k for t, k in shapes)
    pb = PARAM_BYTES[precision]
    P = G = pb * n
    S = state_bytes(shapes, pb, optimizer, optimizer_impl, device)
    full = moe_saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision, device=device,
                             routing=routing)
    block = [t for t in full if t.scope == "layer"]
    if W > 1:
        at = [i for i, t in enumerate(block) if t.name.startswith("MLP (experts)")]
        block = (block[:at[0]] + ep_mlp_tensors(cfg, B, T, precision, W, routing)
                 + block[at[-1] + 1:])
        block = [replace(t, bytes=2 * moe_weight_numel(cfg) - 6 * cfg.d_model * cfg.moe.d_ff
                         * (cfg.moe.experts - cfg.moe.experts // W))
                 if t.name.startswith("Linear weights cast") else t for t in block]
    if plan.kind == "full":
        saved = saved_tensors(replace(cfg, moe=None), batch_size=B, seq_len=T,
                              precision=precision, checkpointing=True, device=device)
    else:
        saved = [t for t in full if t.scope != "layer"] + block
    casts = sum(t.bytes for t in block if t.name.startswith("Linear weights cast"))
    accumulating = grad_accum_steps > 1
    A = activation_bytes(saved, cfg.n_layer)
    fwd, bwd = activation_peaks(cfg, saved, B, T, precision, plan, device, accumulating,
                                block=block, grads=_moe_grads(cfg, precision, W),
                                checkpoint_casts=cfg.n_layer * casts)
    high = moe_forward_high(cfg, B, T, precision, W, routing, saving=plan.kind != "full")
    if plan.kind == "full":
        model_level = sum(t.bytes for t in saved if t.scope == "model")
        bwd = max(bwd, _recomputed_high(cfg, block, _moe_grads(cfg, precision, W), high,
                                        model_level, B, T, precision, accumulating))
        below = model_level + cfg.n_layer * sum(t.bytes for t in saved if t.scope == "layer")
        fwd = max(fwd, below + (cfg.n_layer * casts if precision.endswith("-mixed") else 0)
                  + high)
    else:
        fwd = max(fwd, A + high)
    tokens = 2 * B * T * 8
    VC = cfg.vocab_size * cfg.d_model * pb
    if accumulating:
        end = P + S + G + (3 * VC if cfg.tied else VC) + tokens
    else:
        end = P + S + G + (2 * VC if cfg.tied else 0) + tokens
    setup = dict(model=cfg.name, parameters=n, batch_size=B, seq_len=T, precision=precision,
                 optimizer=optimizer, optimizer_impl=optimizer_impl, attention=cfg.attention,
                 checkpointing=plan.label, grad_accum_steps=grad_accum_steps, mode="train",
                 new_tokens=0, device=device, total_parameters=cfg.num_parameters(),
                 active_parameters=cfg.active_parameters(), expert_parallel=W,
                 experts_per_rank=cfg.moe.experts // W)
    return step_estimate(
        parameters=n, P=P, G=G, S=S, A=A, tokens=tokens, fwd=fwd, bwd=bwd, end=end,
        scratch=step_scratch_bytes(shapes, pb, optimizer, optimizer_impl),
        accumulating=accumulating, saved=saved, setup=setup)
