"""Part 7, trading compute for memory (chapter 7): FLOPs, checkpointing, accumulation, offload,
a memory planner and a scaling law fitted on models the book trains.

The pieces live in this folder's modules; their public names are re-exported here.
"""

from memlab.compute.accumulation import (  # noqa: F401
    accumulated_step,
    accumulated_update,
    accumulation_buffer,
    accumulation_sweep,
)
from memlab.compute.checkpointing import (  # noqa: F401
    CKPT_CI,
    CheckpointCosts,
    CheckpointCurve,
    checkpointing_costs,
    checkpointing_curve,
    curve_plans,
)
from memlab.compute.flops import (  # noqa: F401
    StepFlops,
    attention_share,
    counted_flops,
    matmul_parameters,
    palm_flops,
    rule_flops,
    six_nd,
    step_flops,
)
from memlab.compute.grid import GRIDS, ScalingGrid, scaling_grid  # noqa: F401
from memlab.compute.hardware import (  # noqa: F401
    ACCELERATORS,
    accelerator_table,
    get_accelerator,
    mfu,
    step_mfu,
    time_train_step,
    tried_peak,
)
from memlab.compute.offload import (  # noqa: F401
    HOST_LINKS,
    OffloadedAdamW,
    host_link_bytes,
    offload_table,
    paged_optimizer_status,
)
from memlab.compute.plan import MemoryPlan, plan_training  # noqa: F401
from memlab.compute.scaling import (  # noqa: F401
    PUBLISHED,
    bootstrap_fit,
    compute_optimal,
    fit_scaling_law,
    n_opt_exponent,
)
from memlab.model.checkpoint import Checkpointing, parse_checkpointing, sqrt_segments  # noqa: F401
