"""Context parallelism: one rank's share of a long-context step, traced and tabled (chapter: 8).

N ranks each hold T/N tokens of every sequence and the whole model (weights, gradients and
optimizer states replicated: context parallelism shards none of them). Attention is the one
layer that needs the other ranks' tokens; ring attention (:mod:`memlab.longcontext.ring`) passes
their keys and values around. Everything else in a block works token by token, so it runs on the
rank's T/N tokens as if the sequence were that short.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from functools import partial

import torch.distributed as dist

from memlab.errors import MemlabError, check_positive_int
from memlab.longcontext.ring import ring_attention
from memlab.memory.context import kv_bytes_sent_per_step


class RingCore:
    """A block's attention core replaced by ring attention over the default group (chapter: 8).

    Called as :meth:`memlab.model.transformer.Attention.core` is, with q (B, nh, Tl, hs) and k, v
    (B, nkv, Tl, hs) of this rank's tokens.
    """

    def __init__(self, layout: str = "zigzag", stats: dict | None = None):
        self.layout, self.stats = layout, stats

    def __call__(self, q, k, v, pos: int = 0):
        return ring_attention(q, k, v, causal=True, layout=self.layout, stats=self.stats)


def use_ring_attention(model, layout: str = "zigzag", stats: dict | None = None):
    """Make every block of a built model attend through the ring: a step's ``prepare`` hook (chapter: 8).

    The rotary tables stay those of positions 0..Tl-1: the same bytes as the rank's own
    positions, which a real run would pass instead.
    """
    core = RingCore(layout, stats)
    for block in model.blocks:
        block.attn.core = core
    return model


use_ring_attention.name = "ring attention"


@contextlib.contextmanager
def fake_ring(world: int):
    """A fake process group of ``world`` ranks in this process, as rank 0 (chapter: 8).

    Sends and receives return at once and move nothing: under FakeTensorMode one rank's step is
    traced, the ring's buffers included, without the other ranks.
    """
    from memlab.distributed.traced import fake_process_group

    check_positive_int("context_parallel", world)
    with fake_process_group(world, "trace context parallelism"):
        yield


def trace_context_parallel(model, *, seq_len: int, ranks: int, batch_size: int = 1,
                           layout: str = "zigzag", **switches):
    """One rank's training step at ``seq_len`` / ``ranks`` tokens, traced with the ring (chapter: 8).

    Rank 0 of a fake process group (:func:`fake_ring`) runs the step of
    :func:`memlab.measure.trace_step` on fake tensors, every block attending through
    :class:`memlab.longcontext.ring.RingAttention`. ``switches``: what :class:`StepSpec` takes
    (precision, optimizer, checkpointing, loss_chunks, ...). Returns its ``StepMemory``.
    """
    from memlab.measure.step import trace_step
    from memlab.memory.context import check_context_parallel
    from memlab.model.step import StepSpec

    check_context_parallel(ranks, seq_len)
    if ranks == 1:
        return trace_step(StepSpec(model, batch_size=batch_size, seq_len=seq_len, **switches))
    prepare = partial(use_ring_attention, layout=layout)
    prepare.name = "ring attention"
    with fake_ring(ranks):
        return trace_step(StepSpec(model, batch_size=batch_size, seq_len=seq_len // ranks,
                                   prepare=prepare, **switches))


@dataclass(frozen=True)
class ContextParallelRow:
    """One rank's bytes for a step spread over ``ranks`` ranks by context parallelism (chapter: 8).

    Model states (parameters, gradients, optimizer states) are replicated on every rank. The
    ring's bytes are one layer's, at their highest point (forward or backward).
    """

    ranks: int
    seq_len: int
    tokens_per_rank: int
    model_states_bytes: int  # parameters + gradients + optimizer states, whole on every rank
    saved_activations_bytes: int  # at the end of the forward pass, the head's included
    head_saved_bytes: int  # of which the final norm, the head and the loss keep
    ring_buffer_bytes: int  # the travelling key/value block (and its gradients), one layer
    ring_scores_bytes: int  # the block's scores, probabilities and their difference, fp32
    forward_peak_bytes: int
    backward_peak_bytes: int
    peak_bytes: int
    peak_phase: str
    kv_bytes_sent_per_step: int  # by this rank, all layers, forward (twice if recomputed) + backward

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 8)."""
        return asdict(self)


def context_parallel_table(model, *, seq_len: int | None = None,
                           tokens_per_rank: int | None = None,
                           ranks=(1, 2, 4, 8, 16, 32, 64), batch_size: int = 1,
                           precision: str = "bf16-mixed", checkpointing: bool = True,
                           **switches) -> list[ContextParallelRow]:
    """One rank's estimated bytes over context-parallel degrees, the sequence fixed or grown (chapter: 8).

    Exactly one of ``seq_len`` (the step's sequence, split N ways) and ``tokens_per_rank``
    (each rank's share, the sequence growing with N) is given. ``switches`` go to
    :func:`memlab.memory.estimate` (optimizer, optimizer_impl, loss_chunks, device, ...). The
    bytes sent are :func:`memlab.memory.context.kv_bytes_sent_per_step` times the layers, the
    forward counted twice when checkpointing recomputes it.
    """
    from memlab.memory.context import ring_buffer_bytes
    from memlab.memory.estimator import estimate
    from memlab.model.config import get_config
    from memlab.model.step import StepSpec

    if (seq_len is None) == (tokens_per_rank is None):
        raise MemlabError(f"give exactly one of seq_len and tokens_per_rank, got seq_len="
                          f"{seq_len!r} and tokens_per_rank={tokens_per_rank!r}")
    cfg = get_config(model) if isinstance(model, str) else model
    rows = []
    for n in ranks:
        T = seq_len if seq_len is not None else check_positive_int("tokens_per_rank",
                                                                   tokens_per_rank) * n
        spec = StepSpec(cfg, batch_size=batch_size, seq_len=T, precision=precision,
                        checkpointing=checkpointing, **{k: v for k, v in switches.items()
                                                        if k != "device"})
        est = estimate(spec, context_parallel=n,
                       **({"device": switches["device"]} if "device" in switches else {}))
        Tl = T // n
        cb = 4 if precision == "fp32" else 2
        buffers = ring_buffer_bytes(spec.config, batch_size, Tl, n, precision)
        sent = kv_bytes_sent_per_step(batch_size, cfg.kv_heads, T, cfg.head_dim, n, cb)
        recompute = 2 if checkpointing else 1
        rows.append(ContextParallelRow(
            ranks=n, seq_len=T, tokens_per_rank=Tl,
            model_states_bytes=est.parameters_bytes + est.gradients_bytes
            + est.optimizer_states_bytes,
            saved_activations_bytes=est.saved_activations_bytes,
            head_saved_bytes=sum(t.bytes for t in est.saved if t.scope == "head"),
            ring_buffer_bytes=max(buffers.values()),
            ring_scores_bytes=3 * batch_size * cfg.n_head * Tl * Tl * 4 if n > 1 else 0,
            forward_peak_bytes=est.phase_peak_bytes["forward"],
            backward_peak_bytes=est.phase_peak_bytes["backward"],
            peak_bytes=est.peak_bytes, peak_phase=est.peak_phase,
            kv_bytes_sent_per_step=cfg.n_layer * (recompute * sent["forward"] + sent["backward"])))
    return rows


def ring_rank_bytes(*, batch: int, heads: int, kv_heads: int, tokens_per_rank: int,
                    head_dim: int, dtype: str = "fp32", layout: str = "zigzag") -> dict:
    """This rank's ring-attention bytes, measured, beside the formulas (chapter: 8).

    In an initialized process group: runs ring attention forward and backward on random
    (B, H, Tl, D) tensors, counting the tensors autograd saves (unique storages, through
    ``torch.autograd.graph.saved_tensors_hooks``), the bytes each pass allocates at its
    highest point (``measure_peak``'s dispatch tracker) and the bytes sent; the formulas are
    :func:`memlab.memory.context.ring_core_tensors`, ``ring_transient_bytes`` and
    :func:`memlab.memory.context.kv_bytes_sent_per_step`.
    """
    import torch

    from memlab.measure.peak import measure_peak
    from memlab.memory.context import ring_core_tensors, ring_transient_bytes
    from memlab.model.config import ModelConfig

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    precision = "fp32" if dtype == "fp32" else "bf16"
    world = dist.get_world_size()
    cfg = ModelConfig(name="ring", n_head=heads, n_kv_head=kv_heads, d_model=heads * head_dim)
    B, H, Hkv, n, D = batch, heads, kv_heads, tokens_per_rank, head_dim
    gen = torch.Generator().manual_seed(dist.get_rank())
    q, k, v = (torch.randn(B, h, n, D, generator=gen).to(dt).requires_grad_()
               for h in (H, Hkv, Hkv))
    grad = torch.randn(B, H, n, D, generator=gen).to(dt)
    storages: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
        return t

    stats: dict = {}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out, fwd = measure_peak(ring_attention, q, k, v, layout=layout, stats=stats,
                                device="cpu", method="dispatch")
    _, bwd = measure_peak(out.backward, grad, device="cpu", method="dispatch")
    saved = [t.bytes for t in ring_core_tensors(cfg, B, n, precision)[:-1]]  # not o_proj's copy
    formula = ring_transient_bytes(cfg, B, n, world, precision)
    sent = kv_bytes_sent_per_step(B, Hkv, n * world, D, world, dt.itemsize)
    return dict(
        rank=dist.get_rank(), world=world,
        saved_bytes=sum(storages.values()), saved_formula=sum(saved),
        forward_peak_bytes=fwd.peak_allocated_bytes, forward_formula=formula["forward"],
        backward_peak_bytes=bwd.peak_allocated_bytes, backward_formula=formula["backward"],
        bytes_sent={k.removesuffix("_bytes_sent"): v for k, v in stats.items()},
        sent_formula=sent)


def measure_ring(spec: dict, device) -> dict:
    """:func:`ring_rank_bytes` for each case of ``spec['cases']`` on this rank (chapter: 8).

    The run of torchrun ``launch('memlab.longcontext.context_parallel:measure_ring', ...)``.
    """
    return dict(results=[ring_rank_bytes(**case) for case in spec["cases"]])


# Korthikanti et al. 2022, Table 2: activation bytes per layer in units of s*b*h, 16-bit values,
# eager attention with dropout: the attention block keeps 11 sbh + 5 a s^2 b, the MLP 19 sbh,
# the two LayerNorms 4 sbh (Section 4.1). Of the 34, tensor parallelism splits 24 (the tensors
# inside the attention and the MLP); the other 10 (the LayerNorms' inputs, the inputs of the
# first Linears and the two dropout masks) stay whole on every rank until sequence parallelism
# splits them along the sequence.
KORTHIKANTI_SBH = {"attention": 11, "mlp": 19, "norms": 4}
KORTHIKANTI_TP_SPLIT_SBH = 24
KORTHIKANTI_SCORES_AS2B = 5


def sequence_parallel_bytes(model, *, seq_len: int, batch_size: int = 1,
                            tensor_parallel: int = 8, precision: str = "bf16-mixed",
                            device: str = "cuda") -> dict[str, int]:
    """A layer's activations per rank: tensor parallelism t, then sequence parallelism too (chapter: 8).

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (arXiv 2205.05198), Table 2: sbh(34 + 5as/h) with no parallelism; sbh(10 + 24/t + 5as/(ht))
    with tensor parallelism, whose column and row splits cut the attention heads and the MLP's
    hidden width t ways but leave the LayerNorms, the dropouts and the inputs of the first
    Linears whole on every rank; and sbh/t (34 + 5as/h) with sequence parallelism, which runs
    those token-by-token layers on s/t tokens each (the all-reduce after a block becomes a
    reduce-scatter, and an all-gather brings the whole sequence back before the next Linears:
    the same bytes communicated). The ``book_*`` entries apply the same splits to the book's own
    saved tensors for one block (:func:`memlab.memory.activations.block_tensors`, the model's
    attention, no dropout): the norms' tensors whole under tensor parallelism alone, everything
    else, the autocast weight copies included, split t ways; with sequence parallelism all of
    it.
    """
    from memlab.memory.activations import block_tensors, stage_of
    from memlab.model.config import get_config

    cfg = get_config(model) if isinstance(model, str) else model
    t = check_positive_int("tensor_parallel", tensor_parallel)
    s, b, h, a = check_positive_int("seq_len", seq_len), batch_size, cfg.d_model, cfg.n_head
    if a % t or cfg.kv_heads % t:
        raise MemlabError(f"tensor parallelism splits the heads: tensor_parallel must divide "
                          f"{a} query and {cfg.kv_heads} key/value heads, got {t}")
    sbh = s * b * h
    whole = sum(KORTHIKANTI_SBH.values())
    scores = KORTHIKANTI_SCORES_AS2B * a * s * s * b
    block = block_tensors(cfg, b, s, precision, device)
    norms = sum(x.bytes for x in block if stage_of(x) in ("attention norm", "MLP norm"))
    total = sum(x.bytes for x in block)
    return {
        "paper_no_parallelism": whole * sbh + scores,
        "paper_tensor_parallel": (whole - KORTHIKANTI_TP_SPLIT_SBH) * sbh
        + (KORTHIKANTI_TP_SPLIT_SBH * sbh + scores) // t,
        "paper_tensor_sequence_parallel": (whole * sbh + scores) // t,
        "book_no_parallelism": total,
        "book_tensor_parallel": norms + (total - norms) // t,
        "book_tensor_sequence_parallel": total // t,
    }


# The chapter's ring run: equality with SDPA and the bytes, in one launch --------------------------
RING_SIZES = {
    "ci": dict(world=2, tokens_per_rank=64, head_dim=16),
    "full": dict(world=4, tokens_per_rank=1024, head_dim=64),
}


@dataclass(frozen=True)
class RingRun:
    """Ring attention over ``world`` ranks: against SDPA, and one rank's bytes (chapter: 8)."""

    scale: str
    world: int
    backend: str
    comparisons: tuple[dict, ...]  # per case: the largest errors and their tolerance
    rank_bytes: tuple[dict, ...]  # per rank: measured beside the formulas

    def as_dict(self) -> dict:
        """The run as a plain dict (chapter: 8)."""
        return asdict(self)


def ring_cases(world: int, tokens_per_rank: int, head_dim: int) -> list[dict]:
    """The chapter's cases: causal zig-zag with GQA, and full attention on a contiguous split."""
    T = world * tokens_per_rank
    return [dict(batch=1, heads=4, kv_heads=2, seq_len=T, head_dim=head_dim, causal=True,
                 layout="zigzag", dtype="fp32", seed=1),
            dict(batch=2, heads=2, kv_heads=2, seq_len=T, head_dim=head_dim, causal=False,
                 layout="contiguous", dtype="fp32", seed=2)]


def ring_checks(spec: dict, device) -> dict:
    """Both checks on this rank: the torchrun target of :func:`ring_run` (chapter: 8)."""
    from memlab.longcontext.ring import compare_with_sdpa

    compared = compare_with_sdpa(dict(cases=spec["cases"]), device)
    measured = measure_ring(dict(cases=[spec["bytes_case"]]), device)
    return dict(results=compared["results"], bytes=measured["results"][0])


def ring_run(scale: str = "ci") -> RingRun:
    """Ring attention launched over gloo (NCCL with a GPU per rank), checked and measured (chapter: 8)."""
    from memlab.distributed.launch import launch, launch_device

    size = RING_SIZES[scale]
    world = size["world"]
    cases = ring_cases(world, size["tokens_per_rank"], size["head_dim"])
    bytes_case = dict(batch=1, heads=4, kv_heads=2, tokens_per_rank=size["tokens_per_rank"],
                      head_dim=size["head_dim"])
    run = launch("memlab.longcontext.context_parallel:ring_checks",
                 dict(cases=cases, bytes_case=bytes_case), nproc=world, timeout_s=300)
    comparisons = tuple(  # each case's largest error over every rank, against its tolerance
        dict(case=res["case"], tolerance=res["tolerance"],
             worst=max(max(r["results"][i]["errors"].values()) for r in run.ranks),
             errors={k: max(r["results"][i]["errors"][k] for r in run.ranks)
                     for k in res["errors"]})
        for i, res in enumerate(run.ranks[0]["results"]))
    backend = "nccl" if launch_device(world) == "cuda" else "gloo"
    return RingRun(scale, world, backend, comparisons, tuple(r["bytes"] for r in run.ranks))
