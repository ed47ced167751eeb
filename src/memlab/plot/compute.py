"""Figures of chapter 7, trading compute for memory, one module per topic (chapter: 7).

:mod:`memlab.plot.recompute`: FLOPs against the rules, checkpointing and gradient accumulation;
:mod:`memlab.plot.scaling`: the scaling-law fit; :mod:`memlab.plot.planning`: offload, the
memory planner and the accelerator table. Every name stays importable from here.
"""

from memlab.plot.panels import COUNTED_COLOR, ESTIMATED_COLOR, MEASURED_COLOR  # noqa: F401
from memlab.plot.planning import (  # noqa: F401
    TRAINS_COLORS,
    VENDOR_COLORS,
    accelerators,
    offload_costs,
    plan_costs,
)
from memlab.plot.recompute import (  # noqa: F401
    CURVE_MEMORY,
    KIND_STYLE,
    PLAN_STYLE,
    accumulation_buffer,
    accumulation_sweep,
    checkpoint_costs,
    checkpoint_curve,
    flops_over_seq_len,
)
from memlab.plot.scaling import (  # noqa: F401
    HOFFMANN_PARAMS_RANGE_QUOTED,
    HOFFMANN_RANGE_SOURCE,
    scaling_fit,
)
