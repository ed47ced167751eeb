"""Part 0, how memlab measures memory (chapter 0): the peak of a callable, a training step by
category, a step traced without allocating it, a step's memory over time with the CUDA
allocator's rules and its out-of-memory message, and timing with CUDA events.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.measure import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.measure.allocator": (
        "ALLOCATOR_SOURCE",
        "Fragmentation",
        "OutOfMemory",
        "cuda_allocated_size",
        "cuda_block_size",
        "cuda_pool",
        "cuda_segment_size",
        "first_oom",
        "format_size",
        "fragmentation",
        "measure_cuda_blocks",
        "model_state_requests",
    ),
    "memlab.measure.peak": (
        "METHODS",
        "PeakMemory",
        "measure_peak",
    ),
    "memlab.measure.step": (
        "StepMemory",
        "autocast_dtype",
        "default_dtype",
        "measure_step",
        "param_dtype",
        "trace_step",
    ),
    "memlab.measure.timeline": (
        "MemoryTimeline",
        "measure_timeline",
        "profiler_export_categories",
    ),
    "memlab.measure.timing": (
        "not_measurable",
        "time_ms",
    ),
})
