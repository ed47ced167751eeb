"""A planner for a mixture of experts: every expert-parallel set-up that fits a GPU, cheapest
first (chapter 9).

Each set-up runs on G GPUs, each with its own micro-batch of sequences: the experts are split
over groups of N GPUs (expert parallelism, N dividing the experts and G; GShard, Lepikhin et
al. 2020; DeepSpeed-MoE, Rajbhandari et al. 2022; Megatron-LM), the G/N groups hold the same
experts and train them data-parallel, and the rest of the model (attention, norms, router,
shared expert, embeddings) is replicated on all G. It fits when one GPU's peak,
:func:`memlab.moe.estimate.estimate_moe` with ``expert_parallel=N`` (held to the trace within
3% in its tests), is at most the GPU's usable memory.

Cost is GPU-seconds per optimizer step, the GPUs times the step's seconds, where a step's
seconds add (no overlap is assumed, so each is an upper bound):

* compute: the step's FLOPs with the rows the experts run, top-k of E per token
  (:func:`memlab.compute.flops.step_flops`: active FLOPs, not those of all the experts) over
  the GPU's quoted dense peak times an assumed MFU;
* all-to-all: the rows one GPU sends to the others of its group, dispatch and combine, forward
  and backward (the forward again under checkpointing;
  :func:`memlab.moe.ep_run.all_to_all_step_bytes`) over one GPU's link in a group of N
  (:func:`memlab.distributed.commtime.per_gpu_bandwidth`, the GPU's NVLink as
  :mod:`memlab.compute.plan` has it);
* gradients: the replicated part's all-reduced over all G GPUs, each group's experts over the
  G/N GPUs that hold them, once per optimizer step, chapter 6's ring
  (:func:`memlab.distributed.commtime.comm_seconds`, as the dense planner counts DDP's).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from memlab.compute.flops import step_flops
from memlab.compute.plan import (
    GPU_COUNTS,
    NVLINK,
    PCIE,
    cheapest_words,
    check_mfu,
    cost_columns,
    largest_fitting,
    micro_batch_words,
    plan_dict,
    plan_inputs,
    plan_table,
)
from memlab.distributed.commtime import comm_seconds, per_gpu_bandwidth
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.gpus import GPU, get_gpu
from memlab.model.config import ModelConfig
from memlab.model.step import StepSpec
from memlab.moe.ep_run import all_to_all_step_bytes
from memlab.moe.estimate import estimate_moe, rank_shapes
from memlab.moe.expert_parallel import check_expert_parallel


@dataclass(frozen=True)
class MoEPlanRow:
    """One MoE set-up that fits: its layout, one GPU's peak and the step's cost (chapter: 9)."""

    precision: str
    optimizer: str
    gpus: int
    expert_parallel: int  # GPUs per expert-parallel group
    checkpointing: bool
    micro_batch: int  # sequences per GPU per pass
    grad_accum: int
    per_gpu_peak_bytes: int  # estimate_moe on one rank
    flops_per_step: int  # all GPUs, active FLOPs (the experts' rows)
    all_experts_flops_per_step: int  # the same step with every token sent to every expert
    compute_s: float
    all_to_all_s: float
    grad_sync_s: float
    all_to_all_bytes: int  # one GPU sends per optimizer step

    @property
    def step_s(self) -> float:
        """Seconds per optimizer step: every term added, no overlap (chapter: 9)."""
        return self.compute_s + self.all_to_all_s + self.grad_sync_s

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds per optimizer step, what the plan sorts by (chapter: 9)."""
        return self.gpus * self.step_s

    @property
    def label(self) -> str:
        """The set-up in words (chapter: 9)."""
        n, g = self.expert_parallel, self.gpus
        groups = f" ({g // n} data-parallel groups)" if g > n else ""
        parts = (f"expert parallel {n} on {g} GPU{'s' if g > 1 else ''}{groups}",
                 "" if self.optimizer == "adamw" else self.optimizer,
                 "checkpointing" if self.checkpointing else "",
                 micro_batch_words(self.micro_batch, self.grad_accum))
        return ", ".join(p for p in parts if p)

    def as_dict(self) -> dict:
        """The row with its seconds, cost and label (chapter: 9)."""
        return {**asdict(self), "step_s": self.step_s, "gpu_seconds": self.gpu_seconds,
                "label": self.label}


@dataclass(frozen=True)
class MoEPlan:
    """Every MoE set-up that fits, cheapest first, and what was assumed (chapter: 9)."""

    model: str
    parameters: int
    active_parameters: int
    experts: int
    gpu: str
    usable_bytes: int
    global_batch: int
    seq_len: int
    mfu: float
    rows: tuple[MoEPlanRow, ...]
    tried: int
    smallest_peak_bytes: int
    smallest_peak_label: str
    dropped: str = ""  # set-ups asked for that the plan does not model, and why

    def reading(self) -> str:
        """The plan read from the top, in sentences computed from its rows (chapter: 9)."""
        out = [cheapest_words(self)]
        if self.rows:
            best = self.rows[0]
            out.append(f"Its compute counts the active experts' FLOPs, "
                       f"{best.flops_per_step / best.all_experts_flops_per_step:.0%} of those of "
                       f"all the experts, and its all-to-all takes {best.all_to_all_s:.2f} s.")
            fewest = min(self.rows, key=lambda r: (r.gpus, r.gpu_seconds))
            if fewest is not best:
                out.append(f"The fewest GPUs that fit: {fewest.label}.")
        return " ".join(out)

    def as_dict(self) -> dict:
        """The plan as a plain dict (chapter: 9)."""
        return plan_dict(self)

    def table(self, limit: int | None = 15, unit: str = "GiB") -> str:
        """The cheapest set-ups as text, with each one's all-to-all seconds (chapter: 9)."""
        a2a = ("a2a s", 8, lambda r: f"{r.all_to_all_s:.2f}")
        return plan_table(self, cost_columns(unit, before_step=(a2a,)), limit=limit, unit=unit,
                          parameters=f"{self.parameters:,} parameters, "
                                     f"{self.active_parameters:,} active",
                          notes=[self.dropped] if self.dropped else [])


def expert_parallel_degrees(experts: int, gpus: int) -> list[int]:
    """The expert-parallel group sizes that divide both the experts and the GPUs (chapter: 9)."""
    check_positive_int("experts", experts)
    check_positive_int("gpus", gpus)
    return [n for n in range(1, min(experts, gpus) + 1) if experts % n == 0 and gpus % n == 0]


def moe_step_cost(cfg: ModelConfig, gpu: GPU | str, *, gpus: int, expert_parallel: int,
                  checkpointing: bool, micro_batch: int, grad_accum: int, seq_len: int,
                  mfu: float = 0.4) -> dict:
    """Seconds and FLOPs of one optimizer step of an MoE set-up, term by term (chapter: 9).

    The module's cost model for one row: ``gpus`` GPUs, each ``grad_accum`` micro-batches of
    ``micro_batch`` sequences, experts split over groups of ``expert_parallel``.
    """
    g = get_gpu(gpu)
    check_expert_parallel(cfg.moe.experts, expert_parallel)
    N = expert_parallel
    check_positive_int("gpus", gpus)
    if gpus % N:
        raise MemlabError(f"expert_parallel {N} must divide the GPUs, got {gpus}; accepted: "
                          f"{expert_parallel_degrees(cfg.moe.experts, gpus)}")
    precision = "bf16-mixed" if g.bf16_tensor_cores else "fp16-mixed"
    fmt = "bf16" if g.bf16_tensor_cores else "fp16"
    B = gpus * micro_batch * grad_accum

    def flops(c):
        return step_flops(StepSpec(c, batch_size=B, seq_len=seq_len, precision=precision,
                                   checkpointing=checkpointing)).total

    active = flops(cfg)
    every = flops(replace(cfg, moe=replace(cfg.moe, top_k=cfg.moe.experts,
                                           capacity_factor=None)))
    link = NVLINK.get(g.name, PCIE)
    sent = all_to_all_step_bytes(cfg, N, tokens=micro_batch * seq_len, precision=precision,
                                 checkpointing=checkpointing, grad_accum_steps=grad_accum)
    a2a = sent / per_gpu_bandwidth(N, intra=link) if N > 1 else 0.0
    shapes = rank_shapes(cfg, N)
    local = cfg.n_layer * (cfg.moe.experts // N) * 3 * cfg.d_model * cfg.moe.d_ff
    replicated = sum(math.prod(t) * k for t, k in shapes) - local
    sync = (comm_seconds(replicated, 0, gpus, intra=link)
            + comm_seconds(local, 0, gpus // N, intra=link))
    return dict(precision=precision, flops=active, all_experts_flops=every,
                compute_s=active / gpus / (g.peak_ops(fmt) * mfu), all_to_all_s=a2a,
                grad_sync_s=sync, all_to_all_bytes=sent)


def plan_moe(model: ModelConfig | str, gpu: GPU | str, *, global_batch: int, seq_len: int,
             gpu_counts=GPU_COUNTS, mfu: float = 0.4, device: str = "cuda",
             optimizers=("adamw",), dropped: str = "") -> MoEPlan:
    """Every expert-parallel set-up of an MoE training step that fits ``gpu`` (chapter: 9).

    For each expert-parallel degree N (dividing the experts), optimizer and checkpointing
    (none or full), the fewest of ``gpu_counts`` GPUs it fits on (N dividing them, and they
    the global batch), at its largest fitting power-of-two micro-batch; cheapest first in
    GPU-seconds (:func:`moe_step_cost`). ``dropped``: a line saying which set-ups asked for
    were left out, and why.
    """
    cfg, g = plan_inputs(model, gpu, global_batch, seq_len)
    if cfg.moe is None:
        raise MemlabError(f"plan_moe needs a model with experts, got {cfg.name!r} (dense): "
                          f"use memlab.compute.plan.plan_training")
    check_mfu(mfu)
    from memlab.distributed.estimate import SHARDED_OPTIMIZERS

    optimizers = (optimizers,) if isinstance(optimizers, str) else tuple(optimizers)
    for o in optimizers:
        check_choice("optimizer", o, SHARDED_OPTIMIZERS)
    if not any(global_batch % c == 0 for c in gpu_counts):
        raise MemlabError(f"no GPU count in {tuple(gpu_counts)} divides the global batch "
                          f"{global_batch}")
    precision = "bf16-mixed" if g.bf16_tensor_cores else "fp16-mixed"
    E = cfg.moe.experts
    rows, tried, smallest = [], 0, (None, "")
    for n in expert_parallel_degrees(E, E):
        for opt in optimizers:
            for ckpt in (False, True):
                for gpus in gpu_counts:
                    if gpus % n or global_batch % gpus:
                        continue
                    tried += 1
                    per_gpu = global_batch // gpus

                    def peak(m, n=n, opt=opt, ckpt=ckpt):
                        return estimate_moe(cfg, batch_size=m, seq_len=seq_len,
                                            precision=precision, optimizer=opt, device=device,
                                            checkpointing=ckpt, expert_parallel=n).peak_bytes

                    low = peak(1)
                    if smallest[0] is None or low < smallest[0]:
                        smallest = (low, _label(precision, opt, gpus, n, ckpt))
                    if low > g.usable_bytes:
                        continue
                    sizes = [1 << i for i in range(per_gpu.bit_length()) if per_gpu % (1 << i) == 0]
                    m = largest_fitting(sizes, peak, g.usable_bytes)
                    c = moe_step_cost(cfg, g, gpus=gpus, expert_parallel=n, checkpointing=ckpt,
                                      micro_batch=m, grad_accum=per_gpu // m, seq_len=seq_len,
                                      mfu=mfu)
                    rows.append(MoEPlanRow(precision, opt, gpus, n, ckpt, m, per_gpu // m,
                                           peak(m), c["flops"], c["all_experts_flops"],
                                           c["compute_s"], c["all_to_all_s"], c["grad_sync_s"],
                                           c["all_to_all_bytes"]))
                    break
    rows.sort(key=lambda r: (r.gpu_seconds, r.gpus, r.per_gpu_peak_bytes))
    return MoEPlan(model=cfg.name, parameters=cfg.num_parameters(),
                   active_parameters=cfg.active_parameters(), experts=E, gpu=g.name,
                   usable_bytes=g.usable_bytes, global_batch=global_batch, seq_len=seq_len,
                   mfu=float(mfu), rows=tuple(rows), tried=tried,
                   smallest_peak_bytes=int(smallest[0] or 0), smallest_peak_label=smallest[1],
                   dropped=dropped)


def _label(precision, opt, gpus, n, ckpt) -> str:
    return MoEPlanRow(precision, opt, gpus, n, ckpt, 1, 1, 0, 0, 1, 0.0, 0.0, 0.0, 0).label
