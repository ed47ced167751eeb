"""Tensor and pipeline parallelism on two processes, held to one process (chapter 6).

Data parallelism splits the batch; the other two split the model:

* **tensor parallelism** splits the tensors within a layer. One block of the book's model is
  sharded over the ranks with ``torch.distributed.tensor.parallel.parallelize_module``
  (Megatron-LM's scheme): the attention's q, k, v projections and the MLP's gate and up
  projections column-wise (each rank computes its own heads and its own slice of the hidden
  layer), the o and down projections row-wise (each rank's partial sum is all-reduced). The
  norms are replicated. Each rank keeps ``n_head / N`` query heads and ``n_kv_head / N``
  key/value heads, so its attention is told its local head counts.
* **pipeline parallelism** splits the layers. The model's blocks go to N stages (the first
  also holds the embedding, the last the final norm, the head and the loss), run with
  ``torch.distributed.pipelining``'s GPipe schedule over m micro-batches: all forwards, then
  all backwards. A stage idles while the pipeline fills and drains; GPipe's bubble is
  (p - 1) / (m + p - 1) of the step for p stages. Two measurements are set beside it:

  - *the schedule*: each stage's forward (with the loss, on the last) and backward of one
    micro-batch, timed one stage at a time while the others wait at a barrier, so no two
    processes compute at once; and the seconds to hand one micro-batch's activations to the
    next stage. :func:`memlab.distributed.schedule.gpipe_timeline` places every forward and
    backward by GPipe's rules from those times: the bubble of the schedule itself.
  - *the wall clock*: each stage times its own compute inside the real schedule (forward,
    loss and backward of every micro-batch); its bubble is 1 - busy / step. With the ranks
    sharing a machine's cores and memory, this bubble also holds what they do to each other
    (a stage's compute is slower inside the schedule than alone: ``contention``), and every
    transfer's and the scheduler's own time.

:func:`parallelism` launches both once (``torchrun``, two ranks) and sets each beside one
process running the same weights on the same batch.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from memlab.distributed.comm import CommCounter
from memlab.distributed.schedule import GPipeTimeline, gpipe_bubble, gpipe_timeline
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.config import ModelConfig
from memlab.model.transformer import Block, build_model, lm_loss, rope_cache

WORLD = 2  # ranks: the tensor-parallel degree and the number of pipeline stages
TP_ATOL = 1e-5  # fp32: the ranks sum the same products in another order
PP_RTOL = 1e-5  # the pipeline's loss against one process, relative
PP_GRAD_ATOL = 1e-6  # the pipeline's gradients against one process, absolute

# "ci": a couple of seconds of compute on two CPU cores, each micro-batch a few ms per stage;
# "full": a wider model (two GPUs under NCCL, or two CPU processes, slower)
SIZES = {
    "ci": dict(
        tp=dict(model=ModelConfig(name="tp-ci", vocab_size=512, n_layer=1, n_head=4,
                                  n_kv_head=2, d_model=128, d_ff=352, max_seq_len=64),
                batch_size=2, seq_len=32),
        pp=dict(model=ModelConfig(name="pp-ci", vocab_size=512, n_layer=4, n_head=4,
                                  d_model=256, d_ff=688, max_seq_len=128),
                batch_size=8, seq_len=128, microbatches=(4, 8), repeats=5, alone_repeats=15),
    ),
    "full": dict(
        tp=dict(model=ModelConfig(name="tp-full", vocab_size=32000, n_layer=1, n_head=16,
                                  n_kv_head=8, d_model=1024, d_ff=2816, max_seq_len=512),
                batch_size=4, seq_len=256),
        pp=dict(model=ModelConfig(name="pp-full", vocab_size=32000, n_layer=8, n_head=16,
                                  d_model=1024, d_ff=2816, max_seq_len=512),
                batch_size=16, seq_len=256, microbatches=(2, 4, 8, 16), repeats=5,
                alone_repeats=10),
    ),
}


# Tensor parallelism ----------------------------------------------------------------------
def tp_plan(block: Block) -> dict:
    """The block's tensor-parallel plan (chapter: 6).

    q, k, v, gate and up are split column-wise, o and down row-wise; the attention's and the MLP's
    input are replicated.

    The attention and the MLP take their input as one replicated DTensor (Megatron-LM's *f*:
    identity forward, all-reduce backward), so the backward all-reduces the input's gradient
    once per sublayer rather than once per linear.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    def replicated(n_args: int) -> PrepareModuleInput:  # the first argument; the others as they are
        layouts = (Replicate(),) + (None,) * (n_args - 1)
        return PrepareModuleInput(input_layouts=layouts, desired_input_layouts=layouts,
                                  use_local_output=False)

    plan = {"attn": replicated(4), "mlp": replicated(1),  # attn(x, rope, cache, layer), mlp(x)
            "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(),
            "attn.v_proj": ColwiseParallel(), "attn.o_proj": RowwiseParallel(),
            "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    if hasattr(block.mlp, "gate_proj"):  # Llama style: SwiGLU
        plan["mlp.gate_proj"] = ColwiseParallel()
    return plan


def local_config(cfg: ModelConfig, tp: int) -> ModelConfig:
    """The attention's config on one of ``tp`` ranks (chapter: 6).

    It has n_head / tp query heads and n_kv_head / tp key/value heads, with the same head size.
    """
    check_positive_int("tensor-parallel degree", tp)
    if cfg.kv_heads % tp:
        raise MemlabError(f"n_kv_head ({cfg.kv_heads}) must be divisible by the tensor-parallel "
                          f"degree ({tp}); accepted: a degree dividing {cfg.kv_heads}")
    if cfg.ffn_dim % tp:
        raise MemlabError(f"the MLP width ({cfg.ffn_dim}) must be divisible by the "
                          f"tensor-parallel degree ({tp}); accepted: a degree dividing "
                          f"{cfg.ffn_dim}")
    return replace(cfg, n_head=cfg.n_head // tp, n_kv_head=cfg.kv_heads // tp,
                   d_model=cfg.d_model // tp)


def shard_block(block: Block, mesh) -> Block:
    """Shard ``block`` in place over the 1-D ``mesh`` (Megatron-LM's split); the block (chapter: 6).

    As torchtitan does (``attention.n_heads = n_heads // tp``), the attention is given its
    local head counts: its q, k, v outputs are local tensors of n_head / N heads each.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(block, mesh, tp_plan(block))
    block.attn.cfg = local_config(block.attn.cfg, mesh.size())
    return block


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _tp_rank(spec: dict, device: torch.device) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    cfg = ModelConfig(**spec["model"])
    B, T = spec["batch_size"], spec["seq_len"]
    torch.manual_seed(0)
    ref = Block(cfg).to(device)  # the same weights on every rank
    block = copy.deepcopy(ref)
    x = torch.randn(B, T, cfg.d_model, device=device)  # (B, T, C)
    dout = torch.randn(B, T, cfg.d_model, device=device)  # the output's gradient
    rope = rope_cache(T, cfg.head_dim, cfg.rope_theta, device=device)

    x_ref = x.clone().requires_grad_(True)
    out_ref = ref(x_ref, rope)  # (B, T, C)
    out_ref.backward(dout)

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    shard_block(block, mesh)
    x_tp = x.clone().requires_grad_(True)
    with CommCounter() as fwd:
        out = block(x_tp, rope)  # (B, T, C), replicated: the row-wise linears all-reduce
    with CommCounter() as bwd:
        out.backward(dout)
    out = _full(out)

    full = dict(ref.named_parameters())
    linears, sharded_local, sharded_full, replicated = {}, 0, 0, 0
    grad_err = 0.0
    for name, p in block.named_parameters():
        local = _local(p.data).numel() * p.element_size()
        whole = full[name].numel() * full[name].element_size()
        if isinstance(p, DTensor):
            linears[name] = (local, whole)
            sharded_local, sharded_full = sharded_local + local, sharded_full + whole
        else:
            replicated += local
        grad_err = max(grad_err, float((_full(p.grad) - full[name].grad).abs().max()))
    return dict(
        output_error=float((out - out_ref).abs().max()),
        input_grad_error=float((x_tp.grad - x_ref.grad).abs().max()),
        weight_grad_error=grad_err,
        linear_bytes=linears,
        local_weight_bytes=sharded_local + replicated,
        full_weight_bytes=sharded_full + replicated,
        sharded_local_bytes=sharded_local, sharded_full_bytes=sharded_full,
        replicated_bytes=replicated,
        forward_comm=fwd.summary(), backward_comm=bwd.summary(),
        local_heads=block.attn.cfg.n_head, local_kv_heads=block.attn.cfg.kv_heads,
    )


# Pipeline parallelism --------------------------------------------------------------------
class PipelineStageModule(nn.Module):
    """Blocks ``lo:hi`` of a :class:`~memlab.model.transformer.Transformer`.

    The first stage adds the embedding, the last the final norm and head.
    """

    def __init__(self, model: nn.Module, lo: int, hi: int, *, first: bool, last: bool):
        super().__init__()
        self.cfg = model.cfg
        self.tok_emb = model.tok_emb if first else None
        self.pos_emb = model.pos_emb if first else None
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        self.norm_f = model.norm_f if last else None
        self.lm_head = model.lm_head if last else None

    def forward(self, x):  # first stage: token ids (B, T); later stages: (B, T, C)
        cfg = self.cfg
        T = x.size(1)
        if self.tok_emb is not None:
            idx = x
            x = self.tok_emb(idx)  # (B, T, C)
            if self.pos_emb is not None:
                x = x + self.pos_emb(torch.arange(T, device=idx.device))
        rope = None if cfg.style == "gpt2" else rope_cache(T, cfg.head_dim, cfg.rope_theta,
                                                           device=x.device)
        for block in self.blocks:
            x = block(x, rope)  # (B, T, C)
        if self.lm_head is not None:
            x = self.lm_head(self.norm_f(x))  # (B, T, V)
        return x


def split_stages(model: nn.Module, stages: int) -> list[PipelineStageModule]:
    """The model's blocks cut into ``stages`` consecutive, near-equal runs, one module each (chapter: 6)."""
    check_positive_int("stages", stages)
    L = len(model.blocks)
    if stages > L:
        raise MemlabError(f"{stages} pipeline stages for {L} blocks; accepted: 1 to {L}")
    if model.cfg.tied:
        raise MemlabError("a tied embedding and head would sit on two stages; accepted: a "
                          "model with tie_embeddings=False")
    cuts = [round(i * L / stages) for i in range(stages + 1)]
    return [PipelineStageModule(model, cuts[i], cuts[i + 1], first=i == 0, last=i == stages - 1)
            for i in range(stages)]


class _StageClock:
    """Seconds a stage computes inside the schedule: forwards, losses and backwards, each kind."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = dict.fromkeys(("forward", "loss", "backward"), 0.0)

    @property
    def busy_s(self) -> float:
        return sum(self.seconds.values())

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wrap(self, fn, kind: str):
        def timed(*args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            self.seconds[kind] += time.perf_counter() - t0
            return out

        return timed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stage_alone(module: nn.Module, x: torch.Tensor, tgt: torch.Tensor, *, first: bool,
                 last: bool, repeats: int, device: torch.device) -> tuple[float, float]:
    """Median seconds of the stage's forward (with the loss, on the last) and backward of one micro-batch."""
    g = torch.Generator().manual_seed(2)
    grad = None if last else torch.randn(x.shape[0], x.shape[1], module.cfg.d_model,
                                         generator=g).to(device)  # (mb, T, C)
    fwd, bwd = [], []
    for rep in range(repeats + 1):  # the first warms up: not timed
        inp = x if first else x.detach().requires_grad_(True)  # a later stage sends back dx
        _sync(device)
        t0 = time.perf_counter()
        out = module(inp)
        if last:
            out = lm_loss(out, tgt)
        _sync(device)
        t1 = time.perf_counter()
        out.backward(grad)
        _sync(device)
        t2 = time.perf_counter()
        module.zero_grad(set_to_none=True)
        if rep:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return statistics.median(fwd), statistics.median(bwd)


def _transfer_alone(shape: tuple, *, rank: int, world: int, repeats: int,
                    device: torch.device) -> list[float]:
    """Seconds to hand one micro-batch's activations to the next stage, each hop in turn.

    Half a round trip, median; only the sending rank of each hop returns its time.
    """
    import torch.distributed as dist

    buf = torch.zeros(shape, device=device)  # (mb, T, C)
    hops = []
    for s in range(world - 1):
        dist.barrier()  # one hop at a time, the other ranks waiting
        times = []
        for rep in range(repeats + 1):
            if rank == s:
                t0 = time.perf_counter()
                dist.send(buf, s + 1)
                dist.recv(buf, s + 1)
                _sync(device)
                if rep:
                    times.append((time.perf_counter() - t0) / 2)
            elif rank == s + 1:
                dist.recv(buf, s)
                dist.send(buf, s)
        if times:
            hops.append(statistics.median(times))
    dist.barrier()
    return hops


def _pp_rank(spec: dict, device: torch.device) -> dict:
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    cfg = ModelConfig(**spec["model"])
    B, T = spec["batch_size"], spec["seq_len"]
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    data = torch.randint(cfg.vocab_size, (B, T + 1), generator=g).to(device)
    idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()  # (B, T) each

    ref = build_model(cfg, device=device, seed=0)  # one process, the whole batch
    ref_loss = lm_loss(ref(idx), tgt)
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}

    model = build_model(cfg, device=device, seed=0)
    module = split_stages(model, world)[rank]
    first, last = rank == 0, rank == world - 1
    repeats = spec["repeats"]
    out = {}
    for m in spec["microbatches"]:
        clock = _StageClock(device)
        stage = PipelineStage(module, rank, world, device)
        stage.forward_one_chunk = clock.wrap(stage.forward_one_chunk, "forward")
        stage.backward_one_chunk = clock.wrap(stage.backward_one_chunk, "backward")
        # every stage is given the loss (it marks the schedule as training); the last computes it
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=clock.wrap(lm_loss, "loss"))
        bubbles, busy, totals, losses, grad_err = [], [], [], [], 0.0
        fwd_in, bwd_in = [], []
        for rep in range(repeats + 1):  # the first sets the stages up: not timed
            model.zero_grad(set_to_none=True)
            mb_losses: list[torch.Tensor] = []
            clock.reset()
            dist.barrier()  # both stages start together: a stage's wait for the other is idle
            t0 = time.perf_counter()
            if first:
                schedule.step(idx)
            elif last:
                schedule.step(target=tgt, losses=mb_losses)
            else:
                schedule.step()
            _sync(device)
            dist.barrier()  # the step ends when the last stage ends: a stage done early idles
            total = time.perf_counter() - t0
            if rep == 0:
                continue
            bubbles.append(1 - clock.busy_s / total)
            busy.append(clock.busy_s)
            totals.append(total)
            fwd_in.append((clock.seconds["forward"] + clock.seconds["loss"]) / m)
            bwd_in.append(clock.seconds["backward"] / m)
            if last:
                losses.append(float(torch.stack(mb_losses).mean()))
        mine = {id(p) for p in module.parameters()}
        for n, p in model.named_parameters():
            if id(p) in mine:  # a parameter of this stage without a gradient is an error
                err = float("inf") if p.grad is None else float((p.grad - ref_grads[n]).abs().max())
                grad_err = max(grad_err, err)
        mb = B // m  # one micro-batch: token ids on the first stage, activations on the others
        x = idx[:mb] if first else torch.randn(mb, T, cfg.d_model, generator=g).to(device)
        alone = (0.0, 0.0)
        for r in range(world):  # one stage at a time: no two processes compute at once
            dist.barrier()
            if r == rank:
                alone = _stage_alone(module, x, tgt[:mb], first=first, last=last,
                                     repeats=spec["alone_repeats"], device=device)
        hops = _transfer_alone((mb, T, cfg.d_model), rank=rank, world=world,
                               repeats=spec["alone_repeats"], device=device)
        out[str(m)] = dict(bubble=statistics.median(bubbles), bubbles=bubbles,
                           busy_s=statistics.median(busy), step_s=statistics.median(totals),
                           losses=losses, grad_error=grad_err,
                           forward_in_schedule_s=statistics.median(fwd_in),
                           backward_in_schedule_s=statistics.median(bwd_in),
                           forward_alone_s=alone[0], backward_alone_s=alone[1],
                           transfer_s=hops)
    return dict(reference_loss=float(ref_loss), runs=out,
                blocks=len(module.blocks), stage_parameters=sum(p.numel()
                                                                for p in module.parameters()))


def parallel_ranks(spec: dict, device: torch.device) -> dict:
    """One rank's tensor-parallel block and pipeline stage, each against one process (chapter: 6)."""
    return dict(tp=_tp_rank(spec["tp"], device), pp=_pp_rank(spec["pp"], device))


# The parent's view -----------------------------------------------------------------------
@dataclass(frozen=True)
class TensorParallelRank:
    """One rank's shard of the block: bytes, collectives, and the error against one process."""

    rank: int
    local_weight_bytes: int  # this rank's parameters of the block: shards + replicated norms
    full_weight_bytes: int  # the whole block's
    sharded_local_bytes: int  # this rank's shards of the seven split linears
    sharded_full_bytes: int  # those linears whole
    replicated_bytes: int  # the norms, on every rank
    linear_bytes: dict  # each split linear's weight: name -> (local bytes, full bytes)
    forward_comm: dict  # collective -> {"calls", "bytes" (payload), "sent_bytes" (ring)}
    backward_comm: dict
    output_error: float  # max abs, against one process
    input_grad_error: float
    weight_grad_error: float

    @property
    def shard_share(self) -> float:
        """The split linears' bytes on this rank over their whole bytes (1/N) (chapter: 6)."""
        return self.sharded_local_bytes / self.sharded_full_bytes


CONTENDED = 1.1  # a stage's compute this many times slower in the schedule than alone: contention


@dataclass(frozen=True)
class PipelineRun:
    """GPipe over m micro-batches: the schedule's bubble and the wall clock's, beside the formula.

    Seconds throughout; a tuple holds one value per stage.
    """

    microbatches: int
    stages: int
    bubble: tuple[float, ...]  # wall clock, per stage: 1 - busy / step, median over the repeats
    busy_s: tuple[float, ...]  # per stage: forward + loss + backward of all micro-batches
    step_s: tuple[float, ...]  # per stage: the whole schedule, wall clock
    formula: float  # (p - 1) / (m + p - 1)
    loss: float  # mean of the micro-batches' losses, last repeat
    reference_loss: float  # one process, the whole batch
    grad_error: float  # max abs over every stage's parameters, against one process
    forward_s: tuple[float, ...]  # one micro-batch's forward (and loss), the stage alone
    backward_s: tuple[float, ...]  # one micro-batch's backward, the stage alone
    transfer_s: float  # one micro-batch's activations to the next stage, alone
    forward_in_schedule_s: tuple[float, ...]  # the same forward inside the schedule, mean
    backward_in_schedule_s: tuple[float, ...]

    @property
    def ratio(self) -> tuple[float, ...]:
        """Wall-clock bubble over the formula, per stage (chapter: 6)."""
        return tuple(b / self.formula for b in self.bubble)

    @property
    def mean_bubble(self) -> float:
        """The wall clock's idle share: the stages' bubbles averaged (chapter: 6).

        Unequal stages shift idle time from the slower stage to the faster one; the mean
        keeps the total.
        """
        return sum(self.bubble) / len(self.bubble)

    def schedule(self, transfers: bool = False) -> GPipeTimeline:
        """GPipe's step built from the stages' times measured alone (chapter: 6).

        With ``transfers`` each hand-over takes the measured transfer time; without, none
        (the formula's assumption).
        """
        return gpipe_timeline(self.forward_s, self.backward_s, self.microbatches,
                              transfer_s=self.transfer_s if transfers else 0.0)

    @property
    def schedule_bubble(self) -> float:
        """The schedule's idle share from the stage times alone, no transfer time (chapter: 6)."""
        return self.schedule().mean_bubble

    @property
    def contention(self) -> tuple[float, ...]:
        """Each stage's compute per micro-batch inside the schedule over alone (chapter: 6).

        1 where nothing competes with it.
        """
        return tuple((fi + bi) / (fa + ba) for fi, bi, fa, ba in zip(
            self.forward_in_schedule_s, self.backward_in_schedule_s, self.forward_s,
            self.backward_s, strict=True))

    @property
    def loss_diff(self) -> float:
        """Relative difference of the pipeline's loss from one process's (chapter: 6)."""
        return abs(self.loss - self.reference_loss) / abs(self.reference_loss)

    @property
    def matches_one_process(self) -> bool:
        """Loss within PP_RTOL and gradients within PP_GRAD_ATOL of one process (chapter: 6)."""
        return self.loss_diff <= PP_RTOL and self.grad_error <= PP_GRAD_ATOL


@dataclass(frozen=True)
class ParallelismResult:
    """Tensor parallelism of one block and pipeline parallelism of a model on two ranks (chapter: 6)."""

    scale: str
    world_size: int
    backend: str
    device: str
    tp_config: dict  # the block's ModelConfig as a dict
    tp_batch: tuple[int, int]  # (B, T)
    tp_ranks: tuple[TensorParallelRank, ...]
    pp_config: dict
    pp_batch: tuple[int, int]
    pp_runs: tuple[PipelineRun, ...]
    launch_seconds: float  # the whole launch, process start-up included

    @property
    def tp_max_error(self) -> float:
        """Largest output error of the sharded block against one process, any rank (chapter: 6)."""
        return max(r.output_error for r in self.tp_ranks)

    def pp_run(self, microbatches: int) -> PipelineRun:
        """The run over ``microbatches`` micro-batches (chapter: 6)."""
        for r in self.pp_runs:
            if r.microbatches == microbatches:
                return r
        raise MemlabError(f"no pipeline run with {microbatches!r} micro-batches; accepted: "
                          + ", ".join(str(r.microbatches) for r in self.pp_runs))

    def table(self) -> str:
        """Tensor parallelism per rank, then the pipeline's bubble per m beside GPipe's formula (chapter: 6)."""
        lines = [f"tensor parallelism of one block ({self.tp_config['name']}, "
                 f"{self.tp_batch[0]} x {self.tp_batch[1]} tokens) on {self.world_size} ranks "
                 f"({self.backend}, {self.device})",
                 f"{'rank':<6}{'local bytes':>12}{'full bytes':>12}{'split share':>12}"
                 f"{'output err':>12}{'input grad err':>16}  forward collectives"]
        for r in self.tp_ranks:
            comm = ", ".join(f"{c} x{v['calls']} ({v['bytes']:,} B)"
                             for c, v in r.forward_comm.items()) or "none"
            lines.append(f"{r.rank:<6}{r.local_weight_bytes:>12,}{r.full_weight_bytes:>12,}"
                         f"{r.shard_share:>12.3f}{r.output_error:>12.2e}"
                         f"{r.input_grad_error:>16.2e}  {comm}")
        lines.append(f"pipeline parallelism (GPipe) of {self.pp_config['name']} "
                     f"({self.pp_config['n_layer']} blocks, {self.pp_batch[0]} x "
                     f"{self.pp_batch[1]} tokens) in {self.world_size} stages")
        lines.append(f"{'m':<4}{'formula':>9}{'schedule':>10}{'/formula':>10}{'wall clock':>12}"
                     f"{'/formula':>10}{'contention':>12}{'step ms':>9}{'loss diff':>11}"
                     "  same as 1 process")
        for r in self.pp_runs:
            lines.append(f"{r.microbatches:<4}{r.formula:>9.3f}{r.schedule_bubble:>10.3f}"
                         f"{r.schedule_bubble / r.formula:>10.2f}{r.mean_bubble:>12.3f}"
                         f"{r.mean_bubble / r.formula:>10.2f}{max(r.contention):>12.2f}"
                         f"{max(r.step_s) * 1e3:>9.1f}{r.loss_diff:>11.1e}  "
                         + ("yes" if r.matches_one_process else "NO"))
        return "\n".join(lines)

    def bubble_rows(self) -> list[dict]:
        """Per m: the formula, the schedule's bubble, the wall clock's, and their ratios (chapter: 6).

        The schedule's bubble is built from the stage times measured alone, without and with
        the measured transfers; the wall clock's is the stages' mean. ``contention`` is the
        slowest stage's compute inside the schedule over alone.
        """
        return [dict(m=r.microbatches, formula=r.formula, schedule=r.schedule_bubble,
                     schedule_over_formula=r.schedule_bubble / r.formula,
                     schedule_with_transfers=r.schedule(transfers=True).mean_bubble,
                     wall_clock=r.mean_bubble, wall_clock_over_formula=r.mean_bubble / r.formula,
                     contention=max(r.contention), step_ms=max(r.step_s) * 1e3,
                     loss_vs_one_process=r.loss_diff, same_as_one_process=r.matches_one_process)
                for r in self.pp_runs]

    def bubble_findings(self) -> str:
        """What the schedule's and the wall clock's bubbles show, in words from the numbers (chapter: 6)."""
        runs = sorted(self.pp_runs, key=lambda r: r.microbatches)
        lo, hi = runs[0], runs[-1]

        def each(f) -> str:
            return " and ".join(f(r) for r in runs)

        def per_mb(r) -> list[float]:  # each stage's forward + backward of one micro-batch
            return [f + b for f, b in zip(r.forward_s, r.backward_s, strict=True)]

        slowest = {max(range(r.stages), key=per_mb(r).__getitem__) for r in runs}
        holds = {0: "the embedding", lo.stages - 1: "the final norm, the head and the loss"}
        out = [f"Built from the stage times measured one stage at a time, GPipe's schedule "
               f"idles {each(lambda r: f'{r.schedule_bubble:.3f}')} of the step at m = "
               f"{each(lambda r: str(r.microbatches))}: "
               f"{each(lambda r: f'{r.schedule_bubble / r.formula:.2f}')} times the formula's "
               f"{each(lambda r: f'{r.formula:.3f}')}."]
        uneven = each(lambda r: f"{max(per_mb(r)) / min(per_mb(r)):.2f}")
        if max(r.schedule_bubble / r.formula for r in runs) > 1.02:
            who = "the slower stage"
            if len(slowest) == 1:
                (s,) = slowest
                who = f"stage {s}" + (f" (which also computes {holds[s]})" if s in holds else "")
            out.append(f"It lies above the formula because the stages are not equal: {who} "
                       f"takes {uneven} times as long per micro-batch as the faster one, which "
                       "waits for it.")
        else:
            out.append(f"The stages are nearly equal ({uneven} times), so the schedule follows "
                       "the formula.")
        share = lo.transfer_s / (sum(per_mb(lo)) / lo.stages)
        out.append(f"Handing one micro-batch's activations to the next stage took "
                   f"{lo.transfer_s * 1e3:.2f} ms at m = {lo.microbatches} ({share:.1%} of a "
                   f"stage's compute per micro-batch); with the transfers, the schedule idles "
                   f"{each(lambda r: f'{r.schedule(transfers=True).mean_bubble:.3f}')}.")
        out.append(f"The wall clock of the real schedule gives "
                   f"{each(lambda r: f'{r.mean_bubble:.3f}')} "
                   f"({each(lambda r: f'{r.mean_bubble / r.formula:.2f}')} times the formula). "
                   f"From m = {lo.microbatches} to m = {hi.microbatches} the formula "
                   f"{_change(lo.formula, hi.formula)}, the schedule's bubble "
                   f"{_change(lo.schedule_bubble, hi.schedule_bubble)}, the wall clock's "
                   f"{_change(lo.mean_bubble, hi.mean_bubble)}.")
        worst = max(max(r.contention) for r in runs)
        if worst > CONTENDED:
            out.append(f"Inside the schedule a stage's compute took up to {worst:.2f} times as "
                       f"long as alone: the {self.world_size} processes compete for the "
                       f"machine they share ({self.device}), so the wall clock measures that "
                       "contention, and the transfers' and the scheduler's own time, on top of "
                       "the schedule.")
        else:
            out.append(f"Inside the schedule a stage's compute took at most {worst:.2f} times "
                       "as long as alone, so little competes with it: what the wall clock adds "
                       "to the schedule is the transfers' and the scheduler's own time.")
        return " ".join(out)


def _change(before: float, after: float) -> str:
    """'falls by 44%', 'rises by 11%' or 'stays the same' (to the percent)."""
    rel = after / before - 1
    if round(rel * 100) == 0:
        return "stays the same"
    return f"{'rises' if rel > 0 else 'falls'} by {abs(rel):.0%}"


def _spec(scale: str) -> dict:
    size = SIZES[scale]
    return {part: dict(size[part], model=size[part]["model"].to_dict()) for part in size}


def parallelism(scale: str = "ci") -> ParallelismResult:
    """Tensor and pipeline parallelism on two ranks, one launch, each against one process (chapter: 6)."""
    from memlab.distributed.launch import launch

    check_choice("scale", scale, tuple(SIZES))
    spec = _spec(scale)
    run = launch("memlab.distributed.parallel:parallel_ranks", spec, nproc=WORLD,
                 timeout_s=600.0 if scale == "full" else 120.0)
    ranks = run.ranks
    tp = tuple(TensorParallelRank(
        rank=a["rank"], local_weight_bytes=a["tp"]["local_weight_bytes"],
        full_weight_bytes=a["tp"]["full_weight_bytes"],
        sharded_local_bytes=a["tp"]["sharded_local_bytes"],
        sharded_full_bytes=a["tp"]["sharded_full_bytes"],
        replicated_bytes=a["tp"]["replicated_bytes"],
        linear_bytes={k: tuple(v) for k, v in a["tp"]["linear_bytes"].items()},
        forward_comm=a["tp"]["forward_comm"],
        backward_comm=a["tp"]["backward_comm"], output_error=a["tp"]["output_error"],
        input_grad_error=a["tp"]["input_grad_error"],
        weight_grad_error=a["tp"]["weight_grad_error"]) for a in ranks)
    last = ranks[-1]["pp"]
    pp = []
    for m in spec["pp"]["microbatches"]:
        per = [a["pp"]["runs"][str(m)] for a in ranks]
        hops = [t for r in per for t in r["transfer_s"]]
        pp.append(PipelineRun(
            microbatches=m, stages=len(ranks), bubble=tuple(r["bubble"] for r in per),
            busy_s=tuple(r["busy_s"] for r in per), step_s=tuple(r["step_s"] for r in per),
            formula=gpipe_bubble(len(ranks), m), loss=per[-1]["losses"][-1],
            reference_loss=last["reference_loss"], grad_error=max(r["grad_error"] for r in per),
            forward_s=tuple(r["forward_alone_s"] for r in per),
            backward_s=tuple(r["backward_alone_s"] for r in per),
            transfer_s=statistics.mean(hops) if hops else 0.0,
            forward_in_schedule_s=tuple(r["forward_in_schedule_s"] for r in per),
            backward_in_schedule_s=tuple(r["backward_in_schedule_s"] for r in per)))
    tp_spec, pp_spec = spec["tp"], spec["pp"]
    return ParallelismResult(
        scale=scale, world_size=len(ranks), backend=ranks[0]["backend"], device=ranks[0]["device"],
        tp_config=tp_spec["model"], tp_batch=(tp_spec["batch_size"], tp_spec["seq_len"]),
        tp_ranks=tp, pp_config=pp_spec["model"],
        pp_batch=(pp_spec["batch_size"], pp_spec["seq_len"]), pp_runs=tuple(pp),
        launch_seconds=run.wall_s)
