"""Offloading: model states in the host's memory, moved over the host link every step (chapter 7).

Three pieces:

* :func:`offload_table` -- estimated. For no offload, optimizer offload (ZeRO-Offload) and
  parameter offload (ZeRO-Infinity's CPU offload), the per-GPU peak of
  :func:`memlab.distributed.estimate.estimate_sharded`, the GPU bytes saved, the bytes moved over
  the host link per step, the seconds they take at a quoted link bandwidth (:data:`HOST_LINKS`)
  and the step's compute seconds at a quoted GPU peak and a given MFU: where the transfer is
  small beside the compute, offload is nearly free (it overlaps); where it is larger, it sets the
  step time.
* :class:`OffloadedAdamW` -- a from-scratch teaching version: fp32 master weights and AdamW's
  moments on the host, gradients copied device to host, the update on the host, the parameters
  copied back; it counts every byte it moves. :func:`measure_offload` measures the GPU peak with
  and without it on CUDA.
* :func:`paged_optimizer_status` -- bitsandbytes' paged optimizers, measured on CUDA.

Bytes over the host link per step and per GPU, Ψ parameters, N GPUs, (p, g) the bytes of a
working parameter and of a gradient in the layout (:data:`memlab.distributed.zero.LAYOUTS`;
2 and 2 under mixed precision):

* optimizer offload (Ren et al., "ZeRO-Offload: Democratizing Billion-Scale Model Training",
  USENIX ATC 2021, arXiv 2101.06840, section 4.1): the gradients go to the host (gΨ/N, the GPU's
  partition) and the updated 16-bit parameters come back (pΨ/N): 4Ψ bytes for one GPU in mixed
  precision, which the paper argues is the least an offload strategy can move while the forward
  and backward passes stay on the GPU.
* parameter offload (Rajbhandari et al., "ZeRO-Infinity: Breaking the GPU Memory Wall for Extreme
  Scale Deep Learning", SC 2021, arXiv 2104.07857, sections 4 and 6): the parameters live on the
  host, each GPU fetches its partition for every pass that uses them, and the gradients go to
  the host once (gΨ/N). The book counts two fetches, before the forward and before the backward
  (pΨ/N each), and a third under activation checkpointing, whose recomputation is a second
  forward. The updated parameters stay on the host, where the next step's forward fetches
  them, so they are not counted a second time. The all-gather that assembles a unit from the
  N partitions runs over the GPUs' own links (chapter 6), not the host link.

The two directions are counted one after the other at the link's one-way bandwidth; a
full-duplex link that moved both at once would take as little as the larger direction.

The CPU's own optimizer step is counted too, once per optimizer step over the GPU's Ψ/N
parameters, at a rate in seconds per parameter (:class:`memlab.compute.cpu_step.CpuStepRate`):
by default :func:`recorded_cpu_step_rate`, read from chapter 6's GPU record of ZeRO-3 with and
without PyTorch's ``CPUOffloadPolicy``; a rate measured on this CPU
(:func:`memlab.compute.cpu_step.measure_cpu_step_rate`) may be passed instead. Nothing is
assumed to overlap: ZeRO-Offload's one-step delayed update, which hides the CPU step behind
the next step's forward and backward passes, is not modelled.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from numbers import Real

import torch

from memlab.compute.cpu_step import CpuStepRate, measure_cpu_step_rate
from memlab.compute.flops import rule_flops
from memlab.device import device_name, pick_device
from memlab.distributed.commtime import HOST_LINK_NAMES, LINKS, Link
from memlab.distributed.estimate import LAYOUT_OF, estimate_sharded
from memlab.distributed.zero import LAYOUTS, OFFLOADS, check_gpus, check_offload, check_stage
from memlab.errors import (
    MemlabError,
    check_choice,
    check_positive_int,
    check_positive_number,
    require,
)
from memlab.gpus import get_gpu
from memlab.measure.step import default_dtype
from memlab.measure.timing import not_measurable
from memlab.model.config import ModelConfig, get_config
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, lm_loss
from memlab.results import recorded
from memlab.units import to_unit

# Host links, one-way bytes/s (quoted, in memlab.distributed.commtime.LINKS with their sources).
HOST_LINKS: dict[str, Link] = {name: LINKS[name] for name in HOST_LINK_NAMES}
ZERO_OFFLOAD_SOURCE = "https://arxiv.org/abs/2101.06840"  # Ren et al. 2021, section 4.1
ZERO_INFINITY_SOURCE = "https://arxiv.org/abs/2104.07857"  # Rajbhandari et al. 2021, sections 4, 6
# The ZeRO stage each offload runs at by default. ZeRO-Offload on one GPU is stage 2 with N = 1
# (the paper builds on ZeRO-2); parameters can only be offloaded once they are sharded (stage 3).
DEFAULT_STAGES = {"none": 0, "optimizer": 2, "params": 3}
# The table's precisions, and the tensor-core format their matmuls run in (memlab.gpus peaks).
COMPUTE_FORMAT = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "bf16"}
VERDICTS = ("nothing moved", "nearly free", "comparable", "dominates")
CPU_STEP_RECORD = "distributed-memory"  # chapter 6's experiment: ZeRO-3 with and without offload
# The host link of the GPU that recorded it: the H100 SXM datasheet's PCIe Gen5 x16
# (memlab.distributed.commtime.LINKS, quoted with its source).
CPU_STEP_RECORD_LINK = "pcie5-x16"


def _config(model) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return get_config(model)
    raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")


def host_link(name: str) -> Link:
    """A quoted host link of :data:`HOST_LINKS` by name (chapter: 7)."""
    check_choice("link", name, tuple(HOST_LINKS))
    return HOST_LINKS[name]


# Bytes and seconds -------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostTraffic:
    """Bytes one GPU moves over its host link in one training step, computed (chapter: 7)."""

    host_to_device_bytes: int
    device_to_host_bytes: int
    parameter_fetches: int  # times the parameters cross to the GPU per step

    @property
    def total_bytes(self) -> int:
        """Both directions together, bytes (chapter: 7)."""
        return self.host_to_device_bytes + self.device_to_host_bytes


def host_link_bytes(parameters: int, *, offload: str, zero_stage: int, gpus: int = 1,
                    layout: str = "mixed", checkpointing: bool = False) -> HostTraffic:
    """Bytes one of ``gpus`` GPUs moves over its host link per step for an offload (chapter: 7).

    They are counted by the papers' accounting.

    ``none``: 0. ``optimizer``: gradients to the host gΨ/N, updated parameters back pΨ/N.
    ``params``: the parameters fetched before the forward and the backward (and the recomputation
    under ``checkpointing``), pΨ/N each time, and the gradients to the host gΨ/N. Partitions are
    rounded up to whole bytes per GPU. See the module's docstring for the sources.
    """
    if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 0:
        raise MemlabError(f"parameters must be a non-negative integer, got {parameters!r}")
    stage, gpus = check_stage(zero_stage), check_gpus(gpus)
    check_offload(offload, stage)
    check_choice("layout", layout, tuple(LAYOUTS))
    if not isinstance(checkpointing, bool):
        raise MemlabError(f"checkpointing must be True or False, got {checkpointing!r}")
    p, g, _ = LAYOUTS[layout]

    def part(bytes_per_parameter: int) -> int:  # one GPU's partition, rounded up
        return -(-bytes_per_parameter * parameters // gpus)

    if offload == "none":
        return HostTraffic(0, 0, 0)
    if offload == "optimizer":
        return HostTraffic(part(p), part(g), 1)
    fetches = 3 if checkpointing else 2
    return HostTraffic(fetches * part(p), part(g), fetches)


def transfer_seconds(n_bytes: int, link: str) -> float:
    """Seconds to move ``n_bytes`` over a quoted host link at its one-way bandwidth (chapter: 7)."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, int) or n_bytes < 0:
        raise MemlabError(f"n_bytes must be a non-negative integer, got {n_bytes!r}")
    return n_bytes / host_link(link).bytes_per_s


def recorded_cpu_step_rate(results=None, link: str = CPU_STEP_RECORD_LINK) -> CpuStepRate | None:
    """The CPU optimizer step's seconds per parameter, from chapter 6's GPU record (chapter: 7).

    (offloaded step - ZeRO-3 step - its host-link seconds at ``link``) / parameters, from the
    newest CUDA record of ``distributed-memory``; ``None`` when none is stored.
    """
    check_choice("link", link, HOST_LINK_NAMES)
    rec = recorded(CPU_STEP_RECORD, device="cuda", results=results)
    if rec is None:
        return None
    res = rec.result
    runs = {r["strategy"]: r for r in res["runs"]}
    if not {"zero3", "offload"} <= set(runs):
        raise MemlabError(f"the record {CPU_STEP_RECORD} ({rec.label}) has no zero3 and offload "
                          f"runs; it has: {', '.join(runs)}")
    n, world, layout = int(res["parameters"]), int(res["world_size"]), res["layout"]
    check_choice("layout", layout, tuple(LAYOUTS))
    off, z3 = float(runs["offload"]["step_seconds"]), float(runs["zero3"]["step_seconds"])
    moved = host_link_bytes(n, offload="params", zero_stage=3, gpus=world,
                            layout=layout).total_bytes
    link_s = moved / LINKS[link].bytes_per_s
    share = -(-n // world)  # the parameters one rank steps
    rate = (off - z3 - link_s) / share
    if rate <= 0:
        raise MemlabError(f"the record {CPU_STEP_RECORD} ({rec.label}) leaves no time for the "
                          f"CPU step: offloaded {off:.3f} s, ZeRO-3 {z3:.3f} s, link {link_s:.3f} s")
    label = (f"{rec.label}: {res['config']['name']} ({n:,} parameters, {world} rank"
             f"{'s' if world > 1 else ''}, layout {layout}), ZeRO-3 + CPU offload {off:.2f} s per step - ZeRO-3 {z3:.2f} s - "
             f"{moved / 1e9:.1f} GB over {link} ({link_s:.2f} s) = {off - z3 - link_s:.2f} s "
             f"for the CPU's AdamW step over {share:,} parameters")
    return CpuStepRate(seconds_per_parameter=rate, kind="recorded", label=label,
                       parameters=share)


def default_cpu_step_rate() -> CpuStepRate:
    """The CPU step's rate the cost models use: the GPU record's host, else this CPU (chapter: 7)."""
    return recorded_cpu_step_rate() or measure_cpu_step_rate()


def as_cpu_step_rate(rate) -> CpuStepRate:
    """A CpuStepRate from itself, seconds per parameter, or None: the default (chapter: 7)."""
    if rate is None:
        return default_cpu_step_rate()
    if isinstance(rate, CpuStepRate):
        return rate
    if isinstance(rate, bool) or not isinstance(rate, Real) or rate < 0:
        raise MemlabError(f"cpu_step must be a CpuStepRate, a non-negative number of seconds per "
                          f"parameter or None (the recorded rate), got {rate!r}")
    return CpuStepRate(float(rate), "given", f"{float(rate):.3g} s per parameter, given", 0)


def compute_seconds(parameters: int, tokens: int, *, gpu: str = "H100", compute_format: str = "bf16",
                    mfu: float = 0.4, checkpointing: bool = False) -> float:
    """Seconds of a step's compute: rule_flops / (quoted tensor-core peak x mfu) (chapter: 7)."""
    mfu = check_positive_number("mfu", mfu)
    if mfu > 1:
        raise MemlabError(f"mfu must be in (0, 1], got {mfu!r}")
    peak = get_gpu(gpu).peak_ops(compute_format)
    return rule_flops(parameters, tokens, recompute=checkpointing) / (peak * mfu)


def offload_verdict(added_s: float, compute_s: float, *, free_below: float = 0.1) -> str:
    """The verdict of the seconds an offload adds against the step's compute seconds (chapter: 7).

    ``added_s`` is the transfer over the host link and the CPU's optimizer step together. One of
    'nothing moved', 'nearly free' (added <= free_below x compute), 'dominates' (added >
    compute) or 'comparable'.
    """
    if isinstance(added_s, bool) or not isinstance(added_s, Real) or added_s < 0:
        raise MemlabError(f"added_s must be a non-negative number, got {added_s!r}")
    compute_s = check_positive_number("compute_s", compute_s)
    free_below = check_positive_number("free_below", free_below)
    if free_below >= 1:
        raise MemlabError(f"free_below must be below 1 (a fraction of the compute time), "
                          f"got {free_below!r}")
    if added_s == 0:
        return "nothing moved"
    if added_s <= free_below * compute_s:
        return "nearly free"
    return "dominates" if added_s > compute_s else "comparable"


# The table ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffloadRow:
    """One offload choice, estimated (chapter: 7).

    It holds per-GPU peak bytes, bytes saved, host-link bytes, and seconds beside compute.
    """

    offload: str  # 'none', 'optimizer' or 'params'
    zero_stage: int
    per_gpu_peak_bytes: int  # estimate_sharded
    gpu_bytes_saved: int  # the table's first row's peak minus this one's
    cpu_offloaded_bytes: int  # model states held in the host's memory, per GPU
    host_to_device_bytes: int
    device_to_host_bytes: int
    link_bytes: int  # both directions
    transfer_s: float  # link_bytes / the link's one-way bandwidth
    cpu_step_s: float  # the CPU's optimizer step over this GPU's parameters (0 without offload)
    compute_s: float  # step FLOPs / (quoted peak x mfu)
    transfer_over_compute: float
    verdict: str  # offload_verdict of transfer_s + cpu_step_s

    @property
    def added_s(self) -> float:
        """Seconds the offload adds to a step: the transfer and the CPU's step (chapter: 7)."""
        return self.transfer_s + self.cpu_step_s

    @property
    def added_over_compute(self) -> float:
        """The added seconds over the step's compute seconds (chapter: 7)."""
        return self.added_s / self.compute_s

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class OffloadTable:
    """Estimated bytes offloading saves on each GPU and moves over the host link (chapter: 7).

    Both are per step, with seconds.
    """

    model: str
    parameters: int
    gpus: int
    batch_size: int  # per GPU
    seq_len: int
    tokens_per_step: int  # per GPU
    precision: str
    layout: str  # memlab.distributed.zero.LAYOUTS key
    checkpointing: bool
    link: str
    link_bytes_per_s: float  # quoted, one way
    link_quoted: str
    link_source: str
    gpu: str
    peak_flops: float  # quoted dense tensor-core peak of compute_format
    compute_format: str
    gpu_source: str
    mfu: float  # an input: the fraction of the peak the step sustains
    free_below: float  # added / compute at or below which offload counts as nearly free
    cpu_step_s_per_parameter: float  # the CPU's optimizer step, seconds per parameter
    cpu_step_kind: str  # 'recorded', 'measured' or 'given'
    cpu_step_label: str  # where the rate comes from
    rows: tuple[OffloadRow, ...]

    def as_dict(self) -> dict:
        """The table as a plain dict, rows as dicts (chapter: 7)."""
        return asdict(self)

    def row(self, offload: str) -> OffloadRow:
        """The row of one offload choice (chapter: 7)."""
        check_choice("offload", offload, tuple(r.offload for r in self.rows))
        return next(r for r in self.rows if r.offload == offload)

    def table(self, unit: str = "GiB") -> str:
        """The rows as a text table, labelled estimated (chapter: 7)."""
        head = (f"estimated offload on one of {self.gpus} {self.gpu} GPU(s) over {self.link} "
                f"({self.link_bytes_per_s / 1e9:.0f} GB/s one way, quoted): {self.model} "
                f"({self.parameters:,} parameters), batch {self.batch_size} x seq {self.seq_len} "
                f"per GPU, {self.precision}"
                + (", checkpointing" if self.checkpointing else "")
                + f", compute at {self.mfu:.0%} of {self.peak_flops / 1e12:.1f} TFLOP/s; the "
                  f"CPU's optimizer step at {self.cpu_step_s_per_parameter * 1e9:.2f} s per "
                  f"billion parameters ({self.cpu_step_kind})")
        lines = [head, f"{'offload':<10}{'stage':>6}{'peak ' + unit:>12}{'saved ' + unit:>12}"
                       f"{'link GB':>10}{'transfer s':>12}{'CPU step s':>12}{'compute s':>12}"
                       "  verdict"]
        for r in self.rows:
            lines.append(f"{r.offload:<10}{r.zero_stage:>6}{to_unit(r.per_gpu_peak_bytes, unit):>12.3f}"
                         f"{to_unit(r.gpu_bytes_saved, unit):>12.3f}{r.link_bytes / 1e9:>10.3f}"
                         f"{r.transfer_s:>12.4f}{r.cpu_step_s:>12.4f}{r.compute_s:>12.4f}"
                         f"  {r.verdict}")
        return "\n".join(lines)

    def tokens_for(self, offload: str, verdict: str = "nearly free") -> int:
        """Tokens per optimizer step per GPU at which an offload's added seconds reach a verdict (chapter: 7).

        The compute grows with the tokens, the added seconds do not: for 'nearly free' the
        added seconds are ``free_below`` x the compute, for 'comparable' they equal it.
        """
        check_choice("verdict", verdict, ("nearly free", "comparable"))
        r = self.row(offload)
        if r.added_s == 0:
            raise MemlabError(f"offload {offload!r} adds nothing; a verdict needs an offload that "
                              f"moves bytes")
        share = self.free_below if verdict == "nearly free" else 1.0
        per_token = r.compute_s / self.tokens_per_step
        return math.ceil(r.added_s / (share * per_token))


def offload_table(model: ModelConfig | str, *, gpus: int = 1, batch_size: int, seq_len: int,
                  precision: str = "bf16-mixed", link: str = "pcie5-x16", gpu: str = "H100",
                  mfu: float = 0.4, checkpointing: bool = False, free_below: float = 0.1,
                  stages: Mapping[str, int] | None = None,
                  cpu_step: CpuStepRate | float | None = None) -> OffloadTable:
    """Estimated per-GPU peak, bytes saved and host-link cost for each offload (chapter: 7).

    It gives the GPU bytes saved, the host-link bytes and seconds, the CPU's optimizer step
    and the compute seconds; the verdict weighs the transfer and the CPU step together against
    the compute. ``cpu_step`` is the CPU step's rate (a :class:`CpuStepRate` or seconds per
    parameter); ``None`` takes :func:`default_cpu_step_rate`.

    ``stages`` maps each offload to its ZeRO stage (default :data:`DEFAULT_STAGES`: none at 0,
    optimizer at 2 as ZeRO-Offload, params at 3), checked by
    :func:`memlab.distributed.zero.check_offload`; the rows follow its order and the first row is
    what the others save against. ``batch_size`` is per GPU, one micro-batch per step.
    """
    cfg = _config(model)
    gpus = check_gpus(gpus)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, tuple(COMPUTE_FORMAT))
    lk = host_link(link)
    card = get_gpu(gpu)
    fmt = COMPUTE_FORMAT[precision]
    stages = dict(DEFAULT_STAGES if stages is None else stages)
    if not stages:
        raise MemlabError(f"stages must name at least one offload; accepted: {', '.join(OFFLOADS)}")
    for off, stage in stages.items():
        check_choice("offload", off, OFFLOADS)
        check_offload(off, check_stage(stage))
    layout = LAYOUT_OF[precision]
    rate = as_cpu_step_rate(cpu_step)
    n = cfg.num_parameters()
    tokens = batch_size * seq_len
    compute_s = compute_seconds(n, tokens, gpu=card.name, compute_format=fmt, mfu=mfu,
                                checkpointing=checkpointing)
    rows: list[OffloadRow] = []
    for off, stage in stages.items():
        est = estimate_sharded(cfg, zero_stage=stage, gpus=gpus, offload=off,
                               batch_size=batch_size, seq_len=seq_len, precision=precision,
                               checkpointing=checkpointing)
        traffic = host_link_bytes(n, offload=off, zero_stage=stage, gpus=gpus, layout=layout,
                                  checkpointing=checkpointing)
        seconds = traffic.total_bytes / lk.bytes_per_s
        cpu_s = 0.0 if off == "none" else rate.seconds(-(-n // gpus))
        first = rows[0].per_gpu_peak_bytes if rows else est.per_gpu_peak_bytes
        rows.append(OffloadRow(
            offload=off, zero_stage=stage, per_gpu_peak_bytes=est.per_gpu_peak_bytes,
            gpu_bytes_saved=first - est.per_gpu_peak_bytes,
            cpu_offloaded_bytes=est.cpu_offloaded_bytes,
            host_to_device_bytes=traffic.host_to_device_bytes,
            device_to_host_bytes=traffic.device_to_host_bytes, link_bytes=traffic.total_bytes,
            transfer_s=seconds, cpu_step_s=cpu_s, compute_s=compute_s,
            transfer_over_compute=seconds / compute_s,
            verdict=offload_verdict(seconds + cpu_s, compute_s, free_below=free_below)))
    return OffloadTable(
        model=cfg.name, parameters=n, gpus=gpus, batch_size=batch_size, seq_len=seq_len,
        tokens_per_step=tokens, precision=precision, layout=layout, checkpointing=checkpointing,
        link=lk.name, link_bytes_per_s=lk.bytes_per_s, link_quoted=lk.quoted,
        link_source=lk.source, gpu=card.name, peak_flops=card.peak_ops(fmt), compute_format=fmt,
        gpu_source=card.source, mfu=float(mfu), free_below=float(free_below),
        cpu_step_s_per_parameter=rate.seconds_per_parameter, cpu_step_kind=rate.kind,
        cpu_step_label=rate.label, rows=tuple(rows))


# A from-scratch offloaded AdamW ---------------------------------------------------------------------
@dataclass(frozen=True)
class AdamWState:
    """AdamW's state for one tensor: first and second moments and the step count (chapter: 7)."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: int


def adamw_init(param: torch.Tensor) -> AdamWState:
    """Zero moments shaped like ``param``, on its device, step 0 (chapter: 7)."""
    return AdamWState(torch.zeros_like(param), torch.zeros_like(param), 0)


def adamw_update(param: torch.Tensor, grad: torch.Tensor, state: AdamWState, *, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> tuple[torch.Tensor, AdamWState]:
    """One AdamW update of one tensor, out of place (chapter: 7).

    The operations are in torch.optim.AdamW's order.

    Returns the new tensor and state. The arithmetic follows ``torch.optim.adam``'s single-tensor
    loop (decoupled weight decay, ``lerp`` for the first moment, bias corrections as Python
    floats), so on the same device it rounds as torch's for-loop AdamW does.
    """
    beta1, beta2 = betas
    step = state.step + 1
    if weight_decay:
        param = param * (1 - lr * weight_decay)
    exp_avg = state.exp_avg.lerp(grad, 1 - beta1)
    exp_avg_sq = (state.exp_avg_sq * beta2).addcmul(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = (exp_avg_sq.sqrt() / bias_correction2**0.5).add(eps)
    param = param.addcdiv(exp_avg, denom, value=-step_size)
    return param, AdamWState(exp_avg, exp_avg_sq, step)


class OffloadedAdamW:
    """AdamW with its fp32 master weights and moments on the host (chapter: 7).

    It counts the bytes each step moves.

    A step copies each gradient to the host in its own dtype (device to host), updates the fp32
    master copy there (:func:`adamw_update`), casts it to the parameter's dtype on the host and
    copies it into the parameter (host to device). On a CPU the "device" is the host: the bytes
    are still counted, no device memory is saved. Copies are synchronous; real implementations
    (DeepSpeed's) use pinned buffers and overlap them with the backward pass.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], *, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise MemlabError("OffloadedAdamW needs at least one parameter with requires_grad")
        self.lr = check_positive_number("lr", lr)
        if not (isinstance(betas, tuple) and len(betas) == 2
                and all(isinstance(b, Real) and 0 <= b < 1 for b in betas)):
            raise MemlabError(f"betas must be two numbers in [0, 1), got {betas!r}")
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = check_positive_number("eps", eps)
        if isinstance(weight_decay, bool) or not isinstance(weight_decay, Real) \
                or weight_decay < 0:
            raise MemlabError(f"weight_decay must be a non-negative number, got {weight_decay!r}")
        self.weight_decay = float(weight_decay)
        self.host = torch.device("cpu")
        with torch.no_grad():  # the master copies are made once, before the first step
            self.master = [p.detach().to(self.host).float().clone() for p in self.params]
        self.state = [adamw_init(m) for m in self.master]
        self.last_step = HostTraffic(0, 0, 0)  # bytes the latest step moved
        self.total_host_to_device_bytes = 0
        self.total_device_to_host_bytes = 0

    @property
    def host_state_bytes(self) -> int:
        """Bytes held on the host: fp32 master weights and both moments (chapter: 7)."""
        return sum(t.untyped_storage().nbytes()
                   for m, s in zip(self.master, self.state, strict=True)
                   for t in (m, s.exp_avg, s.exp_avg_sq))

    @torch.no_grad()
    def step(self) -> HostTraffic:
        """Update every parameter with a gradient; return the bytes moved each way (chapter: 7)."""
        to_host = to_device = 0
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            grad = p.grad.to(self.host).float()  # device -> host, in the gradient's dtype
            to_host += p.grad.numel() * p.grad.element_size()
            self.master[i], self.state[i] = adamw_update(
                self.master[i], grad, self.state[i], lr=self.lr, betas=self.betas, eps=self.eps,
                weight_decay=self.weight_decay)
            p.copy_(self.master[i].to(p.dtype))  # cast on the host, then host -> device
            to_device += p.numel() * p.element_size()
        self.last_step = HostTraffic(to_device, to_host, 1)
        self.total_host_to_device_bytes += to_device
        self.total_device_to_host_bytes += to_host
        return self.last_step

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (or zero) every parameter's gradient (chapter: 7)."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()


# Measured on CUDA ---------------------------------------------------------------------------------
MEASURE_PRECISIONS = ("fp32", "bf16")  # parameters stored in fp32 or bf16 on the device


@dataclass(frozen=True)
class OffloadMeasurement:
    """GPU peak bytes with torch's AdamW and with OffloadedAdamW, on CUDA (chapter: 7).

    It also gives the bytes OffloadedAdamW moves per step.
    """

    model: str
    parameters: int
    precision: str  # the parameters' dtype on the device
    batch_size: int
    seq_len: int
    steps: int
    device: str
    status: str  # 'measured on <GPU>' or 'not measurable on <device>: why'
    host_to_device_bytes_per_step: int  # counted by OffloadedAdamW, on any device
    device_to_host_bytes_per_step: int
    host_state_bytes: int  # fp32 master weights and moments held on the host
    peak_adamw_bytes: int | None  # torch.cuda.max_memory_allocated above the start (CUDA)
    peak_offloaded_bytes: int | None
    gpu_bytes_saved: int | None
    step_ms_adamw: float | None = None  # median of the steps after the first (CUDA events on a GPU)
    step_ms_offloaded: float | None = None

    @property
    def moved_gb_per_extra_s(self) -> float | None:
        """Bytes over the host link per second of the time offloading adds to a step, in GB/s (chapter: 7).

        A lower bound on the link's rate: the added time also holds the host's AdamW arithmetic.
        """
        if self.step_ms_adamw is None or self.step_ms_offloaded is None \
                or self.step_ms_offloaded <= self.step_ms_adamw:
            return None
        moved = self.host_to_device_bytes_per_step + self.device_to_host_bytes_per_step
        return moved / ((self.step_ms_offloaded - self.step_ms_adamw) * 1e-3) / 1e9

    def as_dict(self) -> dict:
        """The measurement as a plain dict (chapter: 7)."""
        return asdict(self)


def _train(net, opt, idx, targets, steps: int, device=None) -> list[float]:
    """``steps`` training steps; the milliseconds of each after the first (which creates the states)."""
    from memlab.measure.timing import time_ms

    def step() -> None:
        lm_loss(net(idx), targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    return [t for _ in range(steps - 1) for t in time_ms(step, warmup=0, repeats=1, device=device)]


def measure_offload(model: ModelConfig | str = "tiny", *, batch_size: int = 2, seq_len: int = 32,
                    precision: str = "fp32", steps: int = 2, seed: int = 0,
                    device=None) -> OffloadMeasurement:
    """GPU peak bytes with torch's AdamW and with :class:`OffloadedAdamW` (chapter: 7).

    It also gives the bytes moved per step.

    On CUDA each run builds the model, trains ``steps`` steps and reads
    ``torch.cuda.max_memory_allocated`` above what was allocated before it. Elsewhere the peaks
    are not measurable (the host is the device: nothing leaves it) and the status says so; the
    bytes per step are counted on every device. With ``precision='bf16'`` torch's AdamW keeps
    bf16 moments beside the bf16 parameters; the offloaded one keeps fp32 master weights and
    moments on the host.
    """
    cfg = _config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, MEASURE_PRECISIONS)
    check_positive_int("steps", steps)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    dev = pick_device(device)
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len), generator=gen).to(dev)

    def run(offloaded: bool) -> tuple[int | None, OffloadedAdamW | None, float | None]:
        cuda = dev.type == "cuda"
        if cuda:
            gc.collect()
            torch.cuda.synchronize(dev)
            torch.cuda.empty_cache()
            start = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        with default_dtype(dtype):
            net = build_model(cfg, device=dev, seed=seed)
        opt = (OffloadedAdamW(net.parameters(), lr=1e-4) if offloaded
               else make_optimizer("adamw", net.parameters(), lr=1e-4))
        times = _train(net, opt, idx, targets, steps, device=dev)
        peak = None
        if cuda:
            torch.cuda.synchronize(dev)
            peak = int(torch.cuda.max_memory_allocated(dev) - start)
        return peak, opt if offloaded else None, statistics.median(times) if times else None

    cuda = dev.type == "cuda"
    peak_adamw, _, ms_adamw = run(False) if cuda else (None, None, None)
    peak_off, opt, ms_off = run(True)
    status = (f"measured on {device_name(dev)}" if cuda else
              not_measurable(dev, "the GPU bytes saved are read from CUDA's allocator; here the "
                                  "host is the device, so the optimizer states never leave it"))
    return OffloadMeasurement(
        model=cfg.name, parameters=cfg.num_parameters(), precision=precision,
        batch_size=batch_size, seq_len=seq_len, steps=steps, device=dev.type, status=status,
        host_to_device_bytes_per_step=opt.last_step.host_to_device_bytes,
        device_to_host_bytes_per_step=opt.last_step.device_to_host_bytes,
        host_state_bytes=opt.host_state_bytes, peak_adamw_bytes=peak_adamw,
        peak_offloaded_bytes=peak_off,
        gpu_bytes_saved=None if peak_adamw is None else peak_adamw - peak_off,
        step_ms_adamw=ms_adamw, step_ms_offloaded=ms_off if cuda else None)


# Paged optimizers -------------------------------------------------------------------------------
PAGED_OPTIMIZERS = ("paged-adamw", "paged-adamw-8bit")  # bitsandbytes' PagedAdamW, PagedAdamW8bit
PAGED_SOURCE = "https://huggingface.co/docs/bitsandbytes/main/en/explanations/optimizers"
BNB_PAGED_MIN_NUMEL = 100_000  # bitsandbytes pages only the states of tensors this large
# Big enough that most tensors' states are paged (the embeddings and every block matrix).
PAGED_DEMO = ModelConfig(name="paged-demo", vocab_size=8192, n_layer=4, n_head=8, d_model=512,
                         max_seq_len=128)


@dataclass(frozen=True)
class PagedOptimizerResult:
    """GPU peak bytes with torch's AdamW and with a paged bitsandbytes optimizer (chapter: 7).

    The peaks are torch's allocator's, on CUDA.
    """

    status: str  # 'measured on <GPU>' or 'not measurable on <device>: why'
    optimizer: str
    model: str
    parameters: int
    steps: int
    peak_adamw_bytes: int | None  # torch.cuda.max_memory_allocated above the start
    peak_paged_bytes: int | None  # the same with the paged optimizer: its paged states not seen
    paged_state_bytes: int | None  # optimizer-state bytes bitsandbytes put in unified memory
    device_state_bytes: int | None  # optimizer-state bytes in ordinary device memory

    def as_dict(self) -> dict:
        """The result as a plain dict (chapter: 7)."""
        return asdict(self)


def paged_optimizer_status(device=None, *, optimizer: str = "paged-adamw", steps: int = 3,
                           batch_size: int = 2, seq_len: int = 64,
                           seed: int = 0) -> PagedOptimizerResult:
    """GPU peak bytes of a few steps with a paged bitsandbytes optimizer (chapter: 7).

    They are set against torch's AdamW, on CUDA.

    Paging (bitsandbytes' paged optimizers, introduced with QLoRA, Dettmers et al. 2023;
    :data:`PAGED_SOURCE`): the optimizer states of large tensors (at least
    :data:`BNB_PAGED_MIN_NUMEL` elements) are allocated in CUDA unified memory
    (``cudaMallocManaged``), one address space for the GPU and the host. Pages live on the GPU
    while there is room; when the GPU runs short (a long sequence's activations, say), the
    driver evicts state pages to host memory instead of failing, and bitsandbytes prefetches
    them back before the optimizer step. Nothing moves while memory suffices, so paging is
    insurance against spikes, not a standing saving. The managed allocations are outside
    PyTorch's caching allocator: ``torch.cuda.max_memory_allocated`` does not see them, which
    is why the paged run's peak looks like one without optimizer states; ``paged_state_bytes``
    counts them. Elsewhere than CUDA the status says why nothing was measured (bitsandbytes
    falls back to ordinary tensors there).
    """
    check_choice("optimizer", optimizer, PAGED_OPTIMIZERS)
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    dev = pick_device(device)
    cfg = PAGED_DEMO
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    if dev.type != "cuda":
        return PagedOptimizerResult(
            status=not_measurable(dev, "paged optimizers keep their states in CUDA unified "
                                       "memory, which only a CUDA GPU has"),
            optimizer=optimizer, model=cfg.name, parameters=cfg.num_parameters(), steps=steps,
            peak_adamw_bytes=None, peak_paged_bytes=None, paged_state_bytes=None,
            device_state_bytes=None)
    bnb = require("bitsandbytes", "paged optimizers", extra="quant")
    cls = bnb.optim.PagedAdamW if optimizer == "paged-adamw" else bnb.optim.PagedAdamW8bit
    gen = torch.Generator().manual_seed(seed)
    idx, targets = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len), generator=gen).to(dev)

    def run(paged: bool) -> tuple[int, int, int]:
        gc.collect()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        net = build_model(cfg, device=dev, seed=seed)
        opt = (cls(net.parameters(), lr=1e-4, weight_decay=0.0) if paged
               else make_optimizer("adamw", net.parameters(), lr=1e-4))
        _train(net, opt, idx, targets, steps)
        torch.cuda.synchronize(dev)
        peak = int(torch.cuda.max_memory_allocated(dev) - start)
        states = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        in_pages = sum(t.nbytes for t in states if getattr(t, "is_paged", False))
        on_device = sum(t.nbytes for t in states
                        if not getattr(t, "is_paged", False) and t.device.type == "cuda")
        del net, opt, states
        return peak, in_pages, on_device

    peak_adamw, _, _ = run(False)
    peak_paged, in_pages, on_device = run(True)
    return PagedOptimizerResult(
        status=f"measured on {device_name(dev)}", optimizer=optimizer, model=cfg.name,
        parameters=cfg.num_parameters(), steps=steps, peak_adamw_bytes=peak_adamw,
        peak_paged_bytes=peak_paged, paged_state_bytes=in_pages, device_state_bytes=on_device)

