"""Part 7, trading compute for memory (chapter 7): FLOPs, checkpointing, accumulation, offload,
a memory planner and a scaling law fitted on models the book trains.

The pieces live in this folder's modules; their public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.compute.accumulation": (
        "accumulated_step",
        "accumulated_update",
        "accumulation_buffer",
        "accumulation_sweep",
        "micro_batch_trade",
    ),
    "memlab.compute.checkpointing": (
        "CKPT_CI",
        "CheckpointCosts",
        "CheckpointCurve",
        "checkpointing_costs",
        "checkpointing_curve",
        "curve_plans",
    ),
    "memlab.compute.flops": (
        "StepFlops",
        "attention_share",
        "counted_flops",
        "matmul_parameters",
        "palm_flops",
        "rule_flops",
        "six_nd",
        "step_flops",
    ),
    "memlab.compute.grid": (
        "GRIDS",
        "ScalingGrid",
        "scaling_grid",
    ),
    "memlab.compute.hardware": (
        "ACCELERATORS",
        "accelerator_table",
        "get_accelerator",
        "mfu",
        "step_mfu",
        "time_train_step",
        "tried_peak",
    ),
    "memlab.compute.cpu_step": (
        "CpuStepRate",
        "measure_cpu_step_rate",
    ),
    "memlab.compute.offload": (
        "HOST_LINKS",
        "OffloadedAdamW",
        "host_link_bytes",
        "offload_table",
        "paged_optimizer_status",
        "recorded_cpu_step_rate",
    ),
    "memlab.compute.plan": (
        "MemoryPlan",
        "micro_batch_words",
        "plan_training",
        "step_cost",
    ),
    "memlab.compute.scaling": (
        "PUBLISHED",
        "bootstrap_fit",
        "compute_optimal",
        "fit_scaling_law",
        "n_opt_exponent",
    ),
    "memlab.model.checkpoint": (
        "Checkpointing",
        "parse_checkpointing",
        "sqrt_segments",
    ),
})
