"""A memory planner: every set-up of a training step that fits a GPU, cheapest first (chapter 7).

Given a model, a GPU and a global batch of sequences, :func:`plan_training` tries each set-up
the book has measured: how the work is spread (ZeRO stage 0-3 over N GPUs, chapter 6), what is
kept in host memory (offload, chapters 6-7), what trains (everything, or LoRA or QLoRA adapters,
chapter 5), whether blocks are checkpointed (this chapter), and, for each, the largest
micro-batch that fits, with the accumulation steps that make up the global batch. The bytes
come from the estimators of chapters 1, 5 and 6, held to traces in their tests; a set-up fits
when its per-GPU peak is at most the GPU's usable memory (:attr:`memlab.gpus.GPU.usable_bytes`).

Cost is estimated GPU-seconds per optimizer step: the GPUs times the step's seconds, where a
step's seconds add (no overlap is assumed, so each is an upper bound)

* compute: its FLOPs (:func:`memlab.compute.flops.step_flops`, the count PyTorch's counter
  makes; adapters train no base weight, so their steps skip the base's weight gradients) over
  the GPU's quoted dense peak times an assumed MFU;
* communication: chapter 6's ring model (:func:`memlab.distributed.commtime.comm_seconds`) over
  the GPU's quoted NVLink, or PCIe where the catalogue lists none, counted per micro-batch
  where the strategy communicates per micro-batch (:func:`comm_seconds_per_step`): DDP and
  ZeRO-1 accumulate locally (DDP's ``no_sync``) and all-reduce once per optimizer step;
  FSDP2, which runs memlab's ZeRO-2 and ZeRO-3 (:mod:`memlab.distributed.strategies`), gathers
  the parameters again in every micro-batch (ZeRO-2 for the forward, kept until the backward;
  ZeRO-3 for the forward and again for the backward) and reduce-scatters every micro-batch's
  gradients into the sharded ones;
* offload: the host traffic (:func:`memlab.compute.offload.host_link_bytes`) over a quoted
  host link, and the CPU's optimizer step at a rate in seconds per parameter
  (:func:`memlab.compute.offload.default_cpu_step_rate`: chapter 6's GPU record);
* a 4-bit base (QLoRA): the dequantization of its block linears to 16 bits before every use
  (:func:`dequantization_bytes`), as memory traffic over the GPU's quoted bandwidth;
* context parallelism (chapter 8): the ring's K and V blocks each rank sends in every layer
  (:func:`memlab.memory.context.kv_bytes_sent_per_step`, the forward again when it is
  recomputed), over the same link as the data-parallel collectives.

Chapter 8's levers are tried where the estimators model them: the chunked loss
(:data:`PLAN_LOSS_CHUNKS` chunks; exact, at the cost of the head's forward once more) with
every set-up, and context parallelism (a ring of N GPUs per sequence, data parallel across
rings) at ZeRO stages 0 and 1, where one GPU's activation side holds.
Optimizers change what training does, not only its bytes, so the plan tries the ones named
(``optimizers``; AdamW by default); adapters always train with AdamW, whose states are small.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Real

from memlab.compute.cpu_step import CpuStepRate
from memlab.compute.flops import step_flops
from memlab.compute.offload import (
    DEFAULT_STAGES,
    as_cpu_step_rate,
    host_link,
    host_link_bytes,
)
from memlab.distributed.commtime import comm_seconds, per_gpu_bandwidth
from memlab.distributed.estimate import ADAM, LAYOUT_OF, SHARDED_OPTIMIZERS, estimate_sharded
from memlab.distributed.zero import check_gpus, check_stage
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.finetune.counts import block_linear_shapes, trainable_parameters
from memlab.finetune.estimate import estimate_finetune, quantized_weight_bytes
from memlab.finetune.lora import LoraConfig
from memlab.gpus import GPU, get_gpu
from memlab.memory.activations import PARAM_BYTES
from memlab.memory.context import check_context_parallel, kv_bytes_sent_per_step
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec
from memlab.units import to_unit

TRAINS = ("full", "lora", "qlora")
# What adapters' set-ups may keep on the host: nothing, or the checkpointed units' inputs
# (activation offloading, chapter 8; memlab.model.offload).
ADAPTER_OFFLOADS = ("none", "activations")  # what a set-up trains: every weight, adapters, adapters on a 4-bit base
OFFLOADS_AT = {0: ("none",), 1: ("none", "optimizer"), 2: ("none", "optimizer"),
               3: ("none", "optimizer", "params")}
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# The chunked loss's chunks the plan tries: torchtune's default (CEWithChunkedOutputLoss,
# num_output_chunks=8).
PLAN_LOSS_CHUNKS = 8
CONTEXT_PARALLEL = (2, 4, 8, 16, 32, 64)  # ring sizes tried, where 2N divides the sequence
RING_STAGES = (0, 1)  # where context parallelism is estimated (one GPU's activation side)
LORA_RANK = 16
QLORA_BASE = "nf4-dq"
# The NVLink each catalogued GPU's data-parallel ring runs over (memlab.distributed.commtime).
NVLINK = {"A100-40GB": "a100-nvlink3", "A100-80GB": "a100-nvlink3", "H100": "h100-nvlink4",
          "H200": "h100-nvlink4"}
PCIE = "pcie4-x16"  # GPUs the catalogue lists no NVLink for
# A 4-bit base is dequantized to 16 bits before each use: bitsandbytes' MatMul4Bit runs
# dequantize_4bit + F.linear in the forward at training shapes and dequantize_4bit again for
# the input's gradient in the backward (bitsandbytes/autograd/_functions.py and
# backends/cuda/ops.py, 0.50); the QLoRA paper: "we dequantize the storage data type to the
# computation data type to perform the forward and backward pass" (Dettmers et al. 2023,
# arXiv 2305.14314, section 3). A recomputed forward (checkpointing) dequantizes once more.
DEQUANT_SOURCE = "https://arxiv.org/abs/2305.14314"
DEQUANT_PASSES = 2  # per micro-batch: the forward and the backward
DEQUANT_BYTES_WRITTEN = 2  # the 16-bit copy written per weight (read by the matmul, as a bf16 base's)


def micro_batch_words(sequences: int, grad_accum: int) -> str:
    """A micro-batch and its accumulation in words: '2 sequences × 256 accumulation steps' (chapter: 7)."""
    check_positive_int("sequences", sequences)
    check_positive_int("grad_accum", grad_accum)
    return (f"{sequences} sequence{'s' if sequences > 1 else ''} × {grad_accum} accumulation "
            f"step{'s' if grad_accum > 1 else ''}")


def check_mfu(mfu) -> float:
    """``mfu`` if it is a number in (0, 1]; else one line (chapters: 7, 9)."""
    if isinstance(mfu, bool) or not isinstance(mfu, Real) or not 0 < mfu <= 1:
        raise MemlabError(f"mfu must be a number in (0, 1], got {mfu!r}")
    return float(mfu)


def largest_fitting(sizes: list[int], peak, usable_bytes: int) -> int:
    """The largest of ascending ``sizes`` whose ``peak(size)`` fits ``usable_bytes`` (chapters: 7, 9).

    The first must fit; the peak grows with the size, which the bisection relies on.
    """
    lo, hi = 0, len(sizes) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if peak(sizes[mid]) <= usable_bytes:
            lo = mid
        else:
            hi = mid - 1
    return sizes[lo]


def nothing_fits(smallest_bytes: int, label: str, unit: str = "GiB", *,
                 sentence: bool = False) -> str:
    """'nothing fits: the smallest per-GPU peak is 92.6 GiB (its set-up)' (chapters: 7, 9).

    ``sentence``: capitalized, with its full stop.
    """
    text = (f"nothing fits: the smallest per-GPU peak is {to_unit(smallest_bytes, unit):.1f} "
            f"{unit} ({label})")
    return f"N{text[1:]}." if sentence else text


def cost_columns(unit: str = "GiB", *, before_step=()) -> list[tuple]:
    """A plan table's columns after the label: peak, PFLOP, step s, GPU-s (chapters: 7, 9).

    ``before_step``: more (title, width, format of a row) columns before the step's seconds.
    """
    return [("peak " + unit, 10, lambda r: f"{to_unit(r.per_gpu_peak_bytes, unit):.1f}"),
            ("PFLOP", 9, lambda r: f"{r.flops_per_step / 1e15:.1f}"), *before_step,
            ("step s", 9, lambda r: f"{r.step_s:.2f}"),
            ("GPU-s", 9, lambda r: f"{r.gpu_seconds:.1f}")]


def plan_table(plan, columns, *, limit: int | None = 15, unit: str = "GiB",
               parameters: str | None = None, notes=()) -> str:
    """A plan's cheapest rows as text: a head, ``notes``, a line per row (chapters: 7, 9).

    ``columns``: (title, width, format of a row) after each row's label; ``parameters``: the
    words after the model's name (default its parameter count).
    """
    words = parameters or f"{plan.parameters:,} parameters"
    head = (f"{plan.model} ({words}) on {plan.gpu} "
            f"({to_unit(plan.usable_bytes, unit):.1f} {unit} usable), global batch "
            f"{plan.global_batch} x {plan.seq_len}: {len(plan.rows)} of {plan.tried} set-ups "
            f"fit (estimated; cost assumes MFU {plan.mfu:.0%}, no overlap)")
    shown = plan.rows[:limit] if limit else plan.rows
    w = max([len(r.label) for r in shown] + [6]) + 2
    lines = [head, *notes,
             f"{'#':>3}  {'set-up':<{w}}" + "".join(f"{t:>{n}}" for t, n, _ in columns)]
    for i, r in enumerate(shown, 1):
        lines.append(f"{i:>3}  {r.label:<{w}}" + "".join(f"{f(r):>{n}}" for _, n, f in columns))
    if not plan.rows:
        lines.append(nothing_fits(plan.smallest_peak_bytes, plan.smallest_peak_label, unit))
    return "\n".join(lines)


def plan_inputs(model, gpu, global_batch: int, seq_len: int) -> tuple[ModelConfig, GPU]:
    """A plan's model and GPU, its batch and length checked, each in one line (chapters: 7, 9)."""
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    g = get_gpu(gpu)
    check_positive_int("global_batch", global_batch)
    check_positive_int("seq_len", seq_len)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    return cfg, g

def cheapest_words(plan) -> str:
    """A plan's first sentence: its cheapest row and its cost, or that nothing fits (chapters: 7, 9)."""
    if not plan.rows:
        return nothing_fits(plan.smallest_peak_bytes, plan.smallest_peak_label, sentence=True)
    best = plan.rows[0]
    return (f"The cheapest set-up is {best.label}, {best.gpu_seconds:.0f} GPU-seconds per "
            f"optimizer step.")

def plan_dict(plan) -> dict:
    """A plan dataclass as a plain dict, each row by its own ``as_dict`` (chapters: 7, 9)."""
    d = {k: v for k, v in asdict(plan).items() if k != "rows"}
    return d | {"rows": [r.as_dict() for r in plan.rows]}


@dataclass(frozen=True)
class PlanRow:
    """One set-up that fits: how it runs, its per-GPU peak and its estimated cost (chapter: 7)."""

    trains: str  # 'full', 'lora' or 'qlora'
    precision: str
    zero_stage: int
    gpus: int
    offload: str
    checkpointing: bool
    micro_batch: int  # sequences per GPU per forward pass
    grad_accum: int  # micro-batches per optimizer step
    per_gpu_peak_bytes: int  # estimated
    flops_per_step: int  # all GPUs together, one optimizer step
    compute_s: float
    comm_s: float  # per optimizer step, every micro-batch's collectives counted
    offload_s: float  # host-link traffic
    cpu_step_s: float = 0.0  # the CPU's optimizer step of an offload
    dequant_s: float = 0.0  # a 4-bit base dequantized before every use
    optimizer: str = "adamw"
    loss_chunks: int = 1  # the chunked loss (chapter 8); 1: the logits whole
    context_parallel: int = 1  # GPUs per sequence (a ring, chapter 8); 1: none

    @property
    def step_s(self) -> float:
        """Estimated seconds per optimizer step: every term added, no overlap (chapter: 7)."""
        return self.compute_s + self.comm_s + self.offload_s + self.cpu_step_s + self.dequant_s

    @property
    def data_parallel(self) -> int:
        """Data-parallel ranks: the GPUs over the ring's size, each its own sequences (chapter: 8)."""
        return self.gpus // self.context_parallel

    @property
    def gpu_seconds(self) -> float:
        """Estimated GPU-seconds per optimizer step, the cost the plan sorts by (chapter: 7)."""
        return self.gpus * self.step_s

    @property
    def label(self) -> str:
        """The set-up in words: 'full, ZeRO-3 on 8 GPUs, 4 sequences × 16 accumulation steps' (chapter: 7)."""
        what = {"full": "full", "lora": f"LoRA r={LORA_RANK}",
                "qlora": f"QLoRA r={LORA_RANK} ({QLORA_BASE} base)"}[self.trains]
        if self.optimizer != "adamw":
            what += f" with {self.optimizer}"
        parts = [what, f"ZeRO-{self.zero_stage} on {self.gpus} GPU{'s' if self.gpus > 1 else ''}"]
        if self.context_parallel > 1:
            parts.append(f"rings of {self.context_parallel}")
        if self.loss_chunks > 1:
            parts.append(f"loss in {self.loss_chunks} chunks")
        if self.offload != "none":
            parts.append(f"offload {self.offload}")  # 'activations': the units' inputs
        if self.checkpointing:
            parts.append("checkpointing")
        parts.append(micro_batch_words(self.micro_batch, self.grad_accum))
        return ", ".join(parts)

    def as_dict(self) -> dict:
        """The row with its step seconds, cost and label (chapter: 7)."""
        return asdict(self) | dict(step_s=self.step_s, gpu_seconds=self.gpu_seconds,
                                   data_parallel=self.data_parallel, label=self.label)


@dataclass(frozen=True)
class MemoryPlan:
    """Every set-up that fits, cheapest first, and what was assumed (chapter: 7)."""

    model: str
    parameters: int
    gpu: str
    usable_bytes: int
    global_batch: int
    seq_len: int
    mfu: float  # assumed, for the compute time
    host_link: str
    cpu_step_s_per_parameter: float  # the CPU's optimizer step under offload
    cpu_step_label: str  # where that rate comes from
    rows: tuple[PlanRow, ...]  # the set-ups that fit, cheapest first
    tried: int  # set-ups tried (each at its largest fitting micro-batch, or refused)
    smallest_peak_bytes: int  # the smallest per-GPU peak of any set-up, fitting or not
    smallest_peak_label: str

    def best(self, trains: str | None = None) -> PlanRow:
        """The cheapest row, or the cheapest that trains ``trains`` (chapter: 7)."""
        rows = [r for r in self.rows if trains is None or r.trains == trains]
        if not rows:
            raise MemlabError(f"no set-up{'' if trains is None else ' training ' + trains} fits "
                              f"{self.gpu}; the smallest peak is {to_unit(self.smallest_peak_bytes, 'GiB'):.1f} "
                              f"GiB ({self.smallest_peak_label})")
        return rows[0]

    def reading(self) -> str:
        """The plan read from the top, in sentences computed from its rows (chapter: 7)."""
        if not self.rows:
            return cheapest_words(self)
        out = [cheapest_words(self)]
        by = {t: [r for r in self.rows if r.trains == t] for t in TRAINS}
        if by["full"] and (by["lora"] or by["qlora"]):
            a = min((r for r in self.rows if r.trains != "full"), key=lambda r: r.gpu_seconds)
            f = by["full"][0]
            out.append(f"Adapters skip the base weights' gradients: the cheapest adapter set-up "
                       f"costs {a.gpu_seconds:.0f} GPU-seconds, the cheapest full training "
                       f"{f.gpu_seconds:.0f}.")
        plain = {t: [r for r in by[t] if not r.checkpointing and r.loss_chunks == 1]
                 for t in ("lora", "qlora")}
        if plain["lora"] and plain["qlora"]:
            lo, q = plain["lora"][0], plain["qlora"][0]
            out.append(f"QLoRA fits {q.micro_batch} sequences per micro-batch where LoRA fits "
                       f"{lo.micro_batch}, and dequantizing its 4-bit base adds "
                       f"{q.dequant_s:.1f} s to each step: it costs "
                       f"{'more' if q.gpu_seconds > lo.gpu_seconds else 'less'} than LoRA "
                       f"({q.gpu_seconds:.1f} against {lo.gpu_seconds:.1f} GPU-seconds).")
        kept = [r for r in by["full"] if r.offload == "none" and r.loss_chunks == 1
                and r.context_parallel == 1 and r.optimizer == "adamw"]
        if kept:
            fewest = min(r.gpus for r in kept)
            f = min((r for r in kept if not r.checkpointing), default=kept[0],
                    key=lambda r: r.gpu_seconds)
            twin = [r for r in kept if r.checkpointing and (r.zero_stage, r.gpus)
                    == (f.zero_stage, f.gpus)]
            text = (f"Full training without offload needs at least {fewest} "
                    f"GPU{'s' if fewest > 1 else ''}")
            if twin and not f.checkpointing:
                c = twin[0]
                change = c.gpu_seconds / f.gpu_seconds - 1
                text += (f"; on {f.gpus} with ZeRO-{f.zero_stage}, checkpointing fits "
                         f"{c.micro_batch} sequences per micro-batch instead of {f.micro_batch} "
                         f"and costs {abs(change):.0%} {'more' if change > 0 else 'less'}: "
                         + ("its recomputation, against fewer micro-batches' collectives"
                            if f.zero_stage >= 2 else "its recomputation"))
            out.append(text + ".")
        ringed = [r for r in by["full"] if r.context_parallel > 1]
        if ringed:
            r = min(ringed, key=lambda r: r.gpu_seconds)
            out.append(f"Context parallelism's cheapest set-up is {r.label}: its ring sends "
                       f"each rank's keys and values in every layer, counted in its "
                       f"{r.comm_s:.1f} s of communication per step.")
        chunked = [r for r in self.rows if r.loss_chunks > 1]
        if chunked:
            r = min(chunked, key=lambda r: r.gpu_seconds)
            out.append(f"The chunked loss is listed where it fits more sequences or fewer "
                       f"GPUs than the whole logits; the cheapest such set-up is {r.label}.")
        offloaded = [r for r in by["full"] if r.offload != "none"]
        if offloaded:
            o = min(offloaded, key=lambda r: (r.gpus, r.gpu_seconds))
            out.append(f"Offload fits full training on {o.gpus} GPU{'s' if o.gpus > 1 else ''} "
                       f"({o.label}); of its {o.step_s:.0f} s per step, the host link takes "
                       f"{o.offload_s:.0f} s and the CPU's optimizer step {o.cpu_step_s:.0f} s.")
        return " ".join(out)

    def as_dict(self) -> dict:
        """The plan as a plain dict (chapter: 7)."""
        return plan_dict(self)

    def table(self, limit: int | None = 15, unit: str = "GiB") -> str:
        """The cheapest set-ups as text: label, per-GPU peak, FLOPs and estimated cost (chapter: 7)."""
        return plan_table(self, cost_columns(unit), limit=limit, unit=unit)


def _powers_of_two_dividing(n: int) -> list[int]:
    out, m = [], 1
    while n % m == 0:
        out.append(m)
        m *= 2
    return out


def _peak(cfg, trains, precision, stage, gpus, offload, ckpt, m, T, device, optimizer="adamw",
          chunks=1, cp=1) -> int:
    spec = StepSpec(cfg, batch_size=m, seq_len=T, precision=precision, checkpointing=ckpt,
                    offload_activations=offload == "activations", optimizer=optimizer,
                    loss_chunks=chunks)
    if trains == "full":
        return estimate_sharded(spec, zero_stage=stage, gpus=gpus, offload=offload,
                                device=device, context_parallel=cp).per_gpu_peak_bytes
    lora = LoraConfig(r=LORA_RANK, target_modules="all-linear")
    return estimate_finetune(spec, lora=lora, device=device,
                             quantize_base=QLORA_BASE if trains == "qlora" else None).peak_bytes


def _flops(cfg, trains, precision, ckpt, B, T, chunks=1) -> int:
    f = step_flops(StepSpec(cfg, batch_size=B, seq_len=T, precision=precision,
                            checkpointing=ckpt, loss_chunks=chunks))
    # Frozen base weights get no gradient: their weight-gradient matmuls (as many FLOPs as the
    # forward's matmuls) are skipped; the adapters' own FLOPs (rank 16) are left out.
    return f.total if trains == "full" else f.total - f.linear_forward


# Seconds of a set-up ------------------------------------------------------------------------
def comm_seconds_per_step(parameters: int, stage: int, gpus: int, grad_accum: int, *,
                          intra: str = "a100-nvlink3") -> float:
    """Seconds one GPU sends per optimizer step of ``grad_accum`` micro-batches, by stage (chapter: 7).

    Stages 0 and 1 (DDP, DDP + ZeroRedundancyOptimizer): gradients accumulate locally under
    ``no_sync`` and are all-reduced once per optimizer step, 2Ψ. Stages 2 and 3 (FSDP2, as
    memlab's ``zero2`` and ``zero3`` run): every micro-batch all-gathers the parameters (once
    at stage 2, kept from the forward to the backward; twice at stage 3) and reduce-scatters
    its gradients, 2Ψ and 3Ψ per micro-batch. Each at
    :func:`memlab.distributed.commtime.comm_seconds`' ring rate.
    """
    stage, gpus = check_stage(stage), check_gpus(gpus)
    grad_accum = check_positive_int("grad_accum", grad_accum)
    once = comm_seconds(parameters, stage, gpus, intra=intra)
    return once if stage <= 1 else grad_accum * once


def dequantization_bytes(model: ModelConfig | str, scheme: str = QLORA_BASE) -> int:
    """Bytes one dequantization of a quantized base moves: stored bytes read, 16 bits written (chapter: 7).

    Over every block linear (the layers a QLoRA base quantizes): the stored bytes
    (:func:`memlab.finetune.estimate.quantized_weight_bytes`) read and a 16-bit copy written,
    :data:`DEQUANT_BYTES_WRITTEN` bytes per weight. The matmul's read of that copy is not
    counted: a 16-bit base reads as many bytes.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    shapes = block_linear_shapes(cfg).values()
    stored = sum(quantized_weight_bytes(i, o, scheme) for i, o, _ in shapes)
    written = DEQUANT_BYTES_WRITTEN * sum(i * o for i, o, _ in shapes)
    return cfg.n_layer * (stored + written)


def dequantization_seconds(model: ModelConfig | str, gpu: GPU | str, grad_accum: int, *,
                           checkpointing: bool = False, scheme: str = QLORA_BASE) -> float:
    """Seconds a 4-bit base's dequantization adds per optimizer step, estimated (chapter: 7).

    :data:`DEQUANT_PASSES` dequantizations per micro-batch (one more under checkpointing, whose
    recomputed forward uses the weights again; the early stop's skipped ``down_proj`` is
    counted too, an upper bound) of :func:`dequantization_bytes` each, at the GPU's quoted
    memory bandwidth: a memory-bound kernel run at the datasheet's rate, a lower bound on its
    time.
    """
    g = get_gpu(gpu)
    grad_accum = check_positive_int("grad_accum", grad_accum)
    if not g.bandwidth_bytes_per_s:
        raise MemlabError(f"GPU {g.name!r} has no quoted memory bandwidth; accepted: a GPU of "
                          f"memlab.gpus with bandwidth_bytes_per_s")
    passes = DEQUANT_PASSES + (1 if checkpointing else 0)
    moved = grad_accum * passes * dequantization_bytes(model, scheme)
    return moved / g.bandwidth_bytes_per_s


@dataclass(frozen=True)
class StepCost:
    """Estimated seconds of one optimizer step of a set-up, term by term (chapter: 7)."""

    compute_s: float
    comm_s: float
    offload_s: float
    cpu_step_s: float
    dequant_s: float

    @property
    def step_s(self) -> float:
        """Every term added, no overlap (chapter: 7)."""
        return self.compute_s + self.comm_s + self.offload_s + self.cpu_step_s + self.dequant_s


def step_cost(model: ModelConfig | str, gpu: GPU | str, *, trains: str, zero_stage: int = 0,
              gpus: int = 1, offload: str = "none", checkpointing: bool = False,
              micro_batch: int, grad_accum: int, seq_len: int, mfu: float = 0.4,
              host_link_name: str = "pcie4-x16",
              cpu_step: CpuStepRate | float | None = None, loss_chunks: int = 1,
              context_parallel: int = 1) -> StepCost:
    """Estimated seconds of one optimizer step of a set-up, at a given shape (chapters: 7, 8).

    ``micro_batch`` sequences per data-parallel rank per pass, ``grad_accum`` passes per
    optimizer step, on ``gpus`` GPUs (``context_parallel`` of them per sequence): the planner's
    cost model (the module's docstring) for one row.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    g = get_gpu(gpu)
    check_choice("trains", trains, TRAINS)
    stage, gpus = check_stage(zero_stage), check_gpus(gpus)
    check_positive_int("micro_batch", micro_batch)
    check_positive_int("grad_accum", grad_accum)
    check_positive_int("seq_len", seq_len)
    check_mfu(mfu)
    if trains != "full" and (stage != 0 or offload not in ADAPTER_OFFLOADS):
        raise MemlabError(f"trains {trains!r} runs data parallel, offloading at most its "
                          f"checkpointed activations; got ZeRO-{stage}, offload {offload!r}; "
                          f"accepted: zero_stage 0, offload {' or '.join(map(repr, ADAPTER_OFFLOADS))}")
    if offload == "activations" and not checkpointing:
        raise MemlabError("offload 'activations' moves the checkpointed units' inputs: it needs "
                          "checkpointing=True")
    cp = check_context_parallel(context_parallel, seq_len)
    if cp > 1 and (trains != "full" or gpus % cp or offload != "none"):
        raise MemlabError(f"context_parallel {cp} runs full training in rings of {cp} GPUs, "
                          f"without offload; got trains {trains!r}, {gpus} GPUs, offload "
                          f"{offload!r}")
    link = host_link(host_link_name)
    rate = as_cpu_step_rate(cpu_step)
    precision = "bf16-mixed" if g.bf16_tensor_cores else "fp16-mixed"
    fmt = "bf16" if g.bf16_tensor_cores else "fp16"
    n = cfg.num_parameters()
    global_batch = gpus // cp * micro_batch * grad_accum
    flops = _flops(cfg, trains, precision, checkpointing, global_batch, seq_len, loss_chunks)
    compute_s = flops / gpus / (g.peak_ops(fmt) * mfu)
    if trains == "full":
        synced = n
    else:
        synced = trainable_parameters(cfg, lora=LoraConfig(r=LORA_RANK,
                                                            target_modules="all-linear"))
    comm_s = comm_seconds_per_step(synced, stage, gpus, grad_accum,
                                   intra=NVLINK.get(g.name, PCIE))
    if cp > 1:  # the ring's K and V blocks, every layer of every micro-batch
        sent = kv_bytes_sent_per_step(micro_batch, cfg.kv_heads, seq_len, cfg.head_dim, cp,
                                      PARAM_BYTES[precision])
        passes = sent["forward"] * (2 if checkpointing else 1) + sent["backward"]
        comm_s += (grad_accum * cfg.n_layer * passes
                   / per_gpu_bandwidth(cp, intra=NVLINK.get(g.name, PCIE)))
    if offload == "activations":  # the units' inputs there and back, every micro-batch
        inputs = cfg.n_layer * micro_batch * seq_len * cfg.d_model * PARAM_BYTES[precision]
        offload_s = 2 * inputs * grad_accum / link.bytes_per_s
    else:
        offload_s = _host_seconds(n, offload, stage, gpus, LAYOUT_OF[precision], checkpointing,
                                  grad_accum, link.bytes_per_s)
    cpu_s = 0.0 if offload in ("none", "activations") else rate.seconds(-(-n // gpus))
    dequant_s = (dequantization_seconds(cfg, g, grad_accum, checkpointing=checkpointing)
                 if trains == "qlora" else 0.0)
    return StepCost(compute_s, comm_s, offload_s, cpu_s, dequant_s)


def plan_training(model: ModelConfig | str, gpu: GPU | str, *, global_batch: int, seq_len: int,
                  trains=TRAINS, gpu_counts=GPU_COUNTS, mfu: float = 0.4,
                  host_link_name: str = "pcie4-x16", device: str = "cuda",
                  cpu_step: CpuStepRate | float | None = None,
                  optimizers=("adamw",)) -> MemoryPlan:
    """Every set-up of a training step that fits ``gpu`` (chapters: 7, 8).

    The cheapest in estimated GPU-seconds (:func:`step_cost`) comes first.

    ``global_batch`` sequences of ``seq_len`` tokens per optimizer step; the data-parallel
    ranks (GPU counts, or GPU counts over the ring's size) must divide it. Full training tries
    ZeRO stages 0-3 with their offloads, each optimizer of ``optimizers``, and at stages 0-1
    rings of :data:`CONTEXT_PARALLEL` GPUs; LoRA and QLoRA run data parallel (stage 0). Every
    set-up is tried with and without the chunked loss. Each set-up is listed once, on the
    fewest of ``gpu_counts`` GPUs it fits, at its largest fitting power-of-two micro-batch.
    ``cpu_step`` is the offloaded optimizer step's rate (None:
    :func:`memlab.compute.offload.default_cpu_step_rate`).
    """
    cfg, g = plan_inputs(model, gpu, global_batch, seq_len)
    if isinstance(trains, str):
        trains = (trains,)
    for t in trains:
        if t not in TRAINS:
            raise MemlabError(f"trains {t!r} is not a set-up; accepted: {', '.join(TRAINS)}")
    if isinstance(optimizers, str):
        optimizers = (optimizers,)
    for o in optimizers:
        check_choice("optimizer", o, SHARDED_OPTIMIZERS)
    check_mfu(mfu)
    link = host_link(host_link_name)
    rate = as_cpu_step_rate(cpu_step)
    precision = "bf16-mixed" if g.bf16_tensor_cores else "fp16-mixed"
    n = cfg.num_parameters()
    if not any(global_batch % c == 0 for c in gpu_counts):
        raise MemlabError(f"no GPU count in {tuple(gpu_counts)} divides the global batch "
                          f"{global_batch}")
    chunk_options = (1, PLAN_LOSS_CHUNKS) if seq_len >= PLAN_LOSS_CHUNKS else (1,)
    rings = (1, *(c for c in CONTEXT_PARALLEL if seq_len % (2 * c) == 0))
    rows, tried = [], 0
    smallest = (None, "")
    for setup in _setups(trains, optimizers, chunk_options, rings):
        t, opt, stage, offload, ckpt, chunks, cp = setup
        for gpus in gpu_counts:  # the fewest GPUs this set-up fits on
            if gpus % cp or global_batch % (gpus // cp):
                continue
            if gpus == cp and stage != DEFAULT_STAGES.get(offload, 0):
                continue  # over one data-parallel rank the stages differ only by what they offload
            tried += 1
            per_rank = global_batch // (gpus // cp)  # sequences per data-parallel rank
            sizes = _powers_of_two_dividing(per_rank)

            def peak(m, t=t, stage=stage, gpus=gpus, offload=offload, ckpt=ckpt, opt=opt,
                     chunks=chunks, cp=cp):
                return _peak(cfg, t, precision, stage, gpus, offload, ckpt, m, seq_len, device,
                             opt, chunks, cp)

            low = peak(1)
            if smallest[0] is None or low < smallest[0]:
                smallest = (low, _label(t, stage, gpus, offload, ckpt, opt, chunks, cp))
            if low > g.usable_bytes:
                continue
            m = largest_fitting(sizes, peak, g.usable_bytes)  # the largest micro-batch that fits
            cost = step_cost(cfg, g, trains=t, zero_stage=stage, gpus=gpus, offload=offload,
                             checkpointing=ckpt, micro_batch=m, grad_accum=per_rank // m,
                             seq_len=seq_len, mfu=mfu, host_link_name=link.name, cpu_step=rate,
                             loss_chunks=chunks, context_parallel=cp)
            flops = _flops(cfg, t, precision, ckpt, global_batch, seq_len, chunks)
            rows.append(PlanRow(t, precision, stage, gpus, offload, ckpt, m, per_rank // m,
                                peak(m), flops, cost.compute_s, cost.comm_s, cost.offload_s,
                                cost.cpu_step_s, cost.dequant_s, opt, chunks, cp))
            break
    rows = _undominated(rows)
    rows.sort(key=lambda r: (r.gpu_seconds, r.gpus, r.per_gpu_peak_bytes))
    return MemoryPlan(model=cfg.name, parameters=n, gpu=g.name, usable_bytes=g.usable_bytes,
                      global_batch=global_batch, seq_len=seq_len, mfu=float(mfu),
                      host_link=link.name, cpu_step_s_per_parameter=rate.seconds_per_parameter,
                      cpu_step_label=rate.label, rows=tuple(rows), tried=tried,
                      smallest_peak_bytes=int(smallest[0] or 0), smallest_peak_label=smallest[1])


def _undominated(rows: list[PlanRow]) -> list[PlanRow]:
    """Rows less a chunked loss that fits no fewer GPUs, nor more sequences, than its twin.

    The chunked loss computes the head's forward once more: where the logits whole fit as
    well, it only costs.
    """
    whole = {_twin(r): r for r in rows if r.loss_chunks == 1}
    return [r for r in rows if r.loss_chunks == 1 or _twin(r) not in whole
            or (whole[_twin(r)].gpus, -whole[_twin(r)].micro_batch) > (r.gpus, -r.micro_batch)]


def _twin(r: PlanRow) -> tuple:
    return (r.trains, r.optimizer, r.zero_stage, r.offload, r.checkpointing, r.context_parallel)


def _setups(trains, optimizers, chunk_options, rings):
    """(trains, optimizer, stage, offload, checkpointing, loss chunks, ring) of every set-up tried."""
    for t in trains:
        full = t == "full"
        for opt in optimizers if full else ("adamw",):
            for stage in (0, 1, 2, 3) if full else (0,):
                for offload in OFFLOADS_AT[stage] if full else ADAPTER_OFFLOADS:
                    if offload != "none" and opt not in ADAM:
                        continue  # ZeRO-Offload steps Adam on the CPU
                    for ckpt in (False, True):
                        if offload == "activations" and not ckpt:
                            continue  # it moves the checkpointed units' inputs
                        ringed = full and stage in RING_STAGES and offload == "none"
                        for chunks in chunk_options:
                            for cp in rings if ringed else (1,):
                                yield t, opt, stage, offload, ckpt, chunks, cp


def _host_seconds(n, offload, stage, gpus, layout, ckpt, accum, bytes_per_s) -> float:
    """Seconds of host traffic per optimizer step. Gradients leave the GPU in every micro-batch's
    backward pass (ZeRO-Offload accumulates them on the host); offloaded parameters are fetched
    for every micro-batch; updated parameters come back once a step."""
    if offload == "none":
        return 0.0
    t = host_link_bytes(n, offload=offload, zero_stage=stage, gpus=gpus, layout=layout,
                        checkpointing=ckpt)
    per_step = t.host_to_device_bytes + accum * t.device_to_host_bytes if offload == "optimizer" \
        else accum * t.total_bytes
    return per_step / bytes_per_s


def _label(t, stage, gpus, offload, ckpt, opt="adamw", chunks=1, cp=1) -> str:
    return PlanRow(t, "", stage, gpus, offload, ckpt, 1, 1, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, opt,
                   chunks, cp).label
