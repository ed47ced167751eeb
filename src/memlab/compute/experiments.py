"""Chapter 7's experiments, measured on this device.

Checkpointing, accumulation, offload and MFU are measured, and a scaling law is fitted on models
trained here.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.compute.accumulation import ACCUMULATION_SIZES, AccumulationExperiment
from memlab.compute.checkpointing import CKPT_CI, COST_SIZES, CheckpointCosts
from memlab.compute.grid import GRIDS, ScalingGrid
from memlab.compute.hardware import StepMFU, TriedPeak
from memlab.compute.offload import OffloadMeasurement, PagedOptimizerResult
from memlab.experiments import register_kept

_CH7 = "chapters/07_compute_for_memory"


@register_kept("checkpointing-costs", kept_as="_costs", chapter=_CH7,
               summary="The book's model stepped for real with no, selective, every-K, segments-K "
                       "and full checkpointing: saved bytes and peak measured beside the "
                       "estimate, FLOPs counted with and without the checkpoint's early stop, time "
                       "per step measured",
               sizes=COST_SIZES, result=CheckpointCosts, needs="any", cost_s=120, priority=50)
def checkpointing_costs_experiment(scale: str) -> CheckpointCosts:
    """Each checkpointing plan's bytes, FLOPs and time on this device (chapter: 7)."""
    from memlab.compute.checkpointing import checkpointing_costs

    return checkpointing_costs(scale)


@register_kept("accumulation", kept_as="_accumulation", chapter=_CH7,
               summary="Peak memory against the micro-batch at a fixed global batch (measured and "
                       "estimated), the same update as one large batch, and the fp32 "
                       "accumulation buffer beside 16-bit gradients",
               sizes=ACCUMULATION_SIZES, result=AccumulationExperiment, needs="any", cost_s=60,
               priority=55)
def accumulation_run(scale: str) -> AccumulationExperiment:
    """Gradient accumulation measured on this device (chapter: 7)."""
    from memlab.compute.accumulation import accumulation_experiment

    return accumulation_experiment(scale)


MFU_SIZES = {
    "ci": dict(model=CKPT_CI, batch_size=4, seq_len=256, precision="fp32", repeats=5),
    "full": dict(model="llama-1b", batch_size=4, seq_len=2048, precision="bf16-mixed",
                 repeats=10),
}


@dataclass(frozen=True)
class MFURun:
    """A large matmul's tried peak and a training step's MFU against it (chapter: 7).

    On a GPU, MFU is also given against the datasheet's peak.
    """

    scale: str
    peak: TriedPeak
    step: StepMFU
    flops_formula: int  # the step's FLOPs from the shapes (memlab.compute.flops.step_flops)


@register_kept("step-mfu", kept_as="_mfu", chapter=_CH7,
               summary="Model FLOPs utilisation: a training step's counted FLOPs over its measured "
                       "time, against a large matmul tried on the same device (and, on a GPU, the "
                       "quoted dense datasheet peak)",
               sizes=MFU_SIZES, result=MFURun, needs="any", cost_s=45, priority=18)
def mfu_run(scale: str) -> MFURun:
    """A step's MFU on this device (chapter: 7)."""
    from memlab.compute.flops import step_flops
    from memlab.compute.hardware import step_mfu, tried_peak
    from memlab.device import pick_device
    from memlab.measure.step import autocast_dtype, param_dtype, trace_step
    from memlab.model.step import StepSpec

    size = dict(MFU_SIZES[scale])
    repeats = size.pop("repeats")
    spec = StepSpec(size.pop("model"), **size)
    counted = trace_step(spec, count_flops=True).flops  # the counter's count, on fake tensors
    dev = pick_device()
    fmt = autocast_dtype(spec.precision) or param_dtype(spec.precision)
    peak = tried_peak(dev, fmt, scale=scale)
    step = step_mfu(spec, flops_per_step=counted, device=dev, peak=peak, repeats=repeats)
    return MFURun(scale=scale, peak=peak, step=step, flops_formula=step_flops(spec).total)


OFFLOAD_SIZES = {
    "ci": dict(model="tiny", batch_size=2, seq_len=32, precision="fp32"),
    "full": dict(model="llama-1b", batch_size=4, seq_len=1024, precision="bf16", steps=4),
}


@dataclass(frozen=True)
class OffloadRun:
    """GPU bytes and host traffic of the from-scratch offloaded AdamW (chapter: 7).

    A paged optimizer's are given beside them, on this device.
    """

    scale: str
    offload: OffloadMeasurement
    paged: PagedOptimizerResult


@register_kept("offload", kept_as="_offload", chapter=_CH7,
               summary="Optimizer states kept in host memory by a from-scratch offloaded AdamW "
                       "(GPU peak against torch's AdamW, bytes over the host link counted) and "
                       "bitsandbytes' paged AdamW; both need a GPU to save anything, and say so "
                       "elsewhere",
               sizes=OFFLOAD_SIZES, result=OffloadRun, needs="cuda", cost_s=60, priority=24)
def offload_run(scale: str) -> OffloadRun:
    """Offload measured on this device, or its status where nothing can be saved (chapter: 7)."""
    from memlab.compute.offload import measure_offload, paged_optimizer_status

    size = OFFLOAD_SIZES[scale]
    return OffloadRun(scale=scale, offload=measure_offload(**size),
                      paged=paged_optimizer_status())


@register_kept("scaling-grid", kept_as="_grid", chapter=_CH7,
               summary="A grid of the book's models trained for several run lengths on a Markov "
                       "chain whose best loss is exact; L(N, D) = E + A/N^alpha + B/D^beta fitted "
                       "with E free and E fixed to the entropy, bootstrapped, and the "
                       "compute-optimal split",
               sizes=GRIDS, result=ScalingGrid, needs="any", cost_s=300, priority=330)
def scaling_grid_run(scale: str) -> ScalingGrid:
    """The scaling grid trained and fitted on this device (chapter: 7)."""
    from memlab.compute.grid import scaling_grid

    return scaling_grid(scale)
