"""Chapter 0's experiments: one training step measured on this device, and a 7B step traced."""

from __future__ import annotations

from memlab.device import get_scale, pick_device, refuse_if_too_big
from memlab.experiments import register
from memlab.measure.allocator_gpu import BLOCK_REQUESTS, SNAPSHOT_STEP, AllocatorRecord
from memlab.measure.step import StepMemory

STEP_SIZES = {
    "ci": dict(model="tiny", batch_size=4, seq_len=64),
    "full": dict(model="gpt2", batch_size=8, seq_len=1024),
}


@register(
    "step-memory",
    chapter="chapters/00_toolkit",
    summary="peak memory of one AdamW training step, by category, measured on this device",
    sizes=STEP_SIZES,
    result=StepMemory,
    needs="any", cost_s=20, priority=10,
)
def step_memory(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """A real training step's bytes by category, measured on this device, as ``StepMemory`` (chapter: 0)."""
    from memlab.measure.step import measure_step, trace_step

    scale = get_scale(scale)
    size = STEP_SIZES[scale]
    device = pick_device()
    kwargs = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                  precision=precision, optimizer=optimizer)
    if scale == "full" or device.type != "cpu":  # trace first: refuse before allocating
        traced = trace_step(size["model"], **kwargs)
        refuse_if_too_big(traced.peak_bytes, device, f"a {size['model']} training step")
    return measure_step(size["model"], device=device, **kwargs)


TRACE_SIZES = {
    "ci": dict(model="llama2-7b", batch_size=1, seq_len=256),
    "full": dict(model="llama2-7b", batch_size=1, seq_len=2048),
}


@register(
    "trace-7b",
    chapter="chapters/00_toolkit",
    summary="a Llama-2-7B AdamW training step traced under FakeTensorMode, nothing allocated",
    sizes=TRACE_SIZES,
    result=StepMemory,
    needs="cpu", cost_s=20, priority=200,
)
def trace_7b(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """A Llama-2-7B training step's bytes by category, as ``StepMemory`` (chapter: 0).

    They are traced without allocating.
    """
    from memlab.measure.step import trace_step

    size = TRACE_SIZES[get_scale(scale)]
    return trace_step(size["model"], batch_size=size["batch_size"], seq_len=size["seq_len"],
                      precision=precision, optimizer=optimizer)


@register(
    "allocator",
    chapter="chapters/00_toolkit",
    summary="the CUDA caching allocator on this GPU: each request's block and segment against "
            "the rules, fragmentation with expandable_segments off and on (a process each), a "
            "real out-of-memory message read number by number, a step's memory snapshot",
    sizes={scale: dict(requests=BLOCK_REQUESTS, step=SNAPSHOT_STEP[scale])
           for scale in ("ci", "full")},
    result=AllocatorRecord,
    needs="cuda", cost_s=45, priority=5,
)
def allocator(scale: str | None = None) -> AllocatorRecord:
    """The caching allocator measured on this GPU, or the reason it cannot be here (chapter: 0)."""
    from memlab.measure.allocator_gpu import allocator_record

    return allocator_record(get_scale(scale))
