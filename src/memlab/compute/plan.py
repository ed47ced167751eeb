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
  the GPU's quoted NVLink, or PCIe where the catalogue lists none;
* offload: the host traffic (:func:`memlab.compute.offload.host_link_bytes`) over a quoted
  host link.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Real

from memlab.compute.flops import step_flops
from memlab.compute.offload import DEFAULT_STAGES, host_link, host_link_bytes
from memlab.distributed.commtime import comm_seconds
from memlab.distributed.estimate import LAYOUT_OF, estimate_sharded
from memlab.errors import MemlabError, check_positive_int
from memlab.finetune.counts import trainable_parameters
from memlab.finetune.estimate import estimate_finetune
from memlab.finetune.lora import LoraConfig
from memlab.gpus import GPU, get_gpu
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec
from memlab.units import to_unit

TRAINS = ("full", "lora", "qlora")  # what a set-up trains: every weight, adapters, adapters on a 4-bit base
OFFLOADS_AT = {0: ("none",), 1: ("none", "optimizer"), 2: ("none", "optimizer"),
               3: ("none", "optimizer", "params")}
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LORA_RANK = 16
QLORA_BASE = "nf4-dq"
# The NVLink each catalogued GPU's data-parallel ring runs over (memlab.distributed.commtime).
NVLINK = {"A100-40GB": "a100-nvlink3", "A100-80GB": "a100-nvlink3", "H100": "h100-nvlink4",
          "H200": "h100-nvlink4"}
PCIE = "pcie4-x16"  # GPUs the catalogue lists no NVLink for


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
    comm_s: float
    offload_s: float

    @property
    def step_s(self) -> float:
        """Estimated seconds per optimizer step: compute, communication and host traffic added (chapter: 7)."""
        return self.compute_s + self.comm_s + self.offload_s

    @property
    def gpu_seconds(self) -> float:
        """Estimated GPU-seconds per optimizer step, the cost the plan sorts by (chapter: 7)."""
        return self.gpus * self.step_s

    @property
    def label(self) -> str:
        """The set-up in words, e.g. 'full, ZeRO-3 on 8 GPUs, checkpointing, micro-batch 4 x 16' (chapter: 7)."""
        what = {"full": "full", "lora": f"LoRA r={LORA_RANK}",
                "qlora": f"QLoRA r={LORA_RANK} ({QLORA_BASE} base)"}[self.trains]
        parts = [what, f"ZeRO-{self.zero_stage} on {self.gpus} GPU{'s' if self.gpus > 1 else ''}"]
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        if self.checkpointing:
            parts.append("checkpointing")
        parts.append(f"micro-batch {self.micro_batch} x {self.grad_accum}")
        return ", ".join(parts)

    def as_dict(self) -> dict:
        """The row with its step seconds, cost and label (chapter: 7)."""
        return asdict(self) | dict(step_s=self.step_s, gpu_seconds=self.gpu_seconds,
                                   label=self.label)


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

    def as_dict(self) -> dict:
        """The plan as a plain dict (chapter: 7)."""
        d = {k: v for k, v in asdict(self).items() if k != "rows"}
        return d | {"rows": [r.as_dict() for r in self.rows]}

    def table(self, limit: int | None = 15, unit: str = "GiB") -> str:
        """The cheapest set-ups as text: label, per-GPU peak, FLOPs and estimated cost (chapter: 7)."""
        head = (f"{self.model} ({self.parameters:,} parameters) on {self.gpu} "
                f"({to_unit(self.usable_bytes, unit):.1f} {unit} usable), global batch "
                f"{self.global_batch} x {self.seq_len}: {len(self.rows)} of {self.tried} set-ups "
                f"fit (estimated; cost assumes MFU {self.mfu:.0%}, no overlap)")
        shown = self.rows[:limit] if limit else self.rows
        w = max([len(r.label) for r in shown] + [6]) + 2
        lines = [head, f"{'#':>3}  {'set-up':<{w}}{'peak ' + unit:>10}{'PFLOP':>9}{'step s':>9}"
                       f"{'GPU-s':>9}"]
        for i, r in enumerate(shown, 1):
            lines.append(f"{i:>3}  {r.label:<{w}}{to_unit(r.per_gpu_peak_bytes, unit):>10.1f}"
                         f"{r.flops_per_step / 1e15:>9.1f}{r.step_s:>9.2f}{r.gpu_seconds:>9.1f}")
        if not self.rows:
            lines.append(f"nothing fits: the smallest per-GPU peak is "
                         f"{to_unit(self.smallest_peak_bytes, unit):.1f} {unit} "
                         f"({self.smallest_peak_label})")
        return "\n".join(lines)


def _powers_of_two_dividing(n: int) -> list[int]:
    out, m = [], 1
    while n % m == 0:
        out.append(m)
        m *= 2
    return out


def _peak(cfg, trains, precision, stage, gpus, offload, ckpt, m, T, device) -> int:
    spec = StepSpec(cfg, batch_size=m, seq_len=T, precision=precision, checkpointing=ckpt)
    if trains == "full":
        return estimate_sharded(spec, zero_stage=stage, gpus=gpus, offload=offload,
                                device=device).per_gpu_peak_bytes
    lora = LoraConfig(r=LORA_RANK, target_modules="all-linear")
    return estimate_finetune(spec, lora=lora, device=device,
                             quantize_base=QLORA_BASE if trains == "qlora" else None).peak_bytes


def _flops(cfg, trains, precision, ckpt, B, T) -> int:
    f = step_flops(StepSpec(cfg, batch_size=B, seq_len=T, precision=precision,
                            checkpointing=ckpt))
    # Frozen base weights get no gradient: their weight-gradient matmuls (as many FLOPs as the
    # forward's matmuls) are skipped; the adapters' own FLOPs (rank 16) are left out.
    return f.total if trains == "full" else f.total - f.linear_forward


def plan_training(model: ModelConfig | str, gpu: GPU | str, *, global_batch: int, seq_len: int,
                  trains=TRAINS, gpu_counts=GPU_COUNTS, mfu: float = 0.4,
                  host_link_name: str = "pcie4-x16", device: str = "cuda") -> MemoryPlan:
    """Every set-up of a training step that fits ``gpu`` (chapter: 7).

    The cheapest in estimated GPU-seconds comes first.

    ``global_batch`` sequences of ``seq_len`` tokens per optimizer step; GPU counts must divide
    it. Full training tries ZeRO stages 0-3 with their offloads; LoRA and QLoRA run data
    parallel (stage 0). Each set-up is listed once, on the fewest of ``gpu_counts`` GPUs it
    fits, at its largest fitting power-of-two micro-batch.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    g = get_gpu(gpu)
    check_positive_int("global_batch", global_batch)
    check_positive_int("seq_len", seq_len)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    if isinstance(trains, str):
        trains = (trains,)
    for t in trains:
        if t not in TRAINS:
            raise MemlabError(f"trains {t!r} is not a set-up; accepted: {', '.join(TRAINS)}")
    if isinstance(mfu, bool) or not isinstance(mfu, Real) or not 0 < mfu <= 1:
        raise MemlabError(f"mfu must be a number in (0, 1], got {mfu!r}")
    link = host_link(host_link_name)
    precision = "bf16-mixed" if g.bf16_tensor_cores else "fp16-mixed"
    fmt = "bf16" if g.bf16_tensor_cores else "fp16"
    peak_flops = g.peak_ops(fmt) * mfu
    intra = NVLINK.get(g.name, PCIE)
    n = cfg.num_parameters()
    counts = [c for c in gpu_counts if global_batch % c == 0]
    if not counts:
        raise MemlabError(f"no GPU count in {tuple(gpu_counts)} divides the global batch "
                          f"{global_batch}")
    layout = LAYOUT_OF[precision]
    lora = LoraConfig(r=LORA_RANK, target_modules="all-linear")
    adapters = {t: trainable_parameters(cfg, lora=lora) for t in ("lora", "qlora")}
    rows, tried = [], 0
    smallest = (None, "")
    for t in trains:
        stages = (0, 1, 2, 3) if t == "full" else (0,)
        for stage in stages:
            for offload in OFFLOADS_AT[stage] if t == "full" else ("none",):
                for ckpt in (False, True):
                    for gpus in counts:  # the fewest GPUs this set-up fits on
                        if gpus == 1 and stage != DEFAULT_STAGES[offload]:
                            continue  # over one GPU the stages differ only by what they offload
                        tried += 1
                        per_gpu = global_batch // gpus
                        sizes = _powers_of_two_dividing(per_gpu)

                        def peak(m, t=t, stage=stage, gpus=gpus, offload=offload, ckpt=ckpt):
                            return _peak(cfg, t, precision, stage, gpus, offload, ckpt, m,
                                         seq_len, device)

                        low = peak(1)
                        if smallest[0] is None or low < smallest[0]:
                            smallest = (low, _label(t, stage, gpus, offload, ckpt))
                        if low > g.usable_bytes:
                            continue
                        lo, hi = 0, len(sizes) - 1  # the largest micro-batch that fits
                        while lo < hi:
                            mid = (lo + hi + 1) // 2
                            if peak(sizes[mid]) <= g.usable_bytes:
                                lo = mid
                            else:
                                hi = mid - 1
                        m = sizes[lo]
                        flops = _flops(cfg, t, precision, ckpt, global_batch, seq_len)
                        compute_s = flops / gpus / peak_flops
                        comm_s = comm_seconds(n if t == "full" else adapters[t], stage, gpus,
                                              intra=intra)
                        offload_s = _host_seconds(n, offload, stage, gpus, layout, ckpt,
                                                  per_gpu // m, link.bytes_per_s)
                        rows.append(PlanRow(t, precision, stage, gpus, offload, ckpt, m,
                                            per_gpu // m, peak(m), flops, compute_s, comm_s,
                                            offload_s))
                        break
    rows.sort(key=lambda r: (r.gpu_seconds, r.gpus, r.per_gpu_peak_bytes))
    return MemoryPlan(model=cfg.name, parameters=n, gpu=g.name, usable_bytes=g.usable_bytes,
                      global_batch=global_batch, seq_len=seq_len, mfu=float(mfu),
                      host_link=link.name, rows=tuple(rows), tried=tried,
                      smallest_peak_bytes=int(smallest[0] or 0), smallest_peak_label=smallest[1])


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


def _label(t, stage, gpus, offload, ckpt) -> str:
    return PlanRow(t, "", stage, gpus, offload, ckpt, 1, 1, 0, 0, 0.0, 0.0, 0.0).label
