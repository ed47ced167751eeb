"""All of the book's figures: one house style, one module per part, no experiments inside.

Functions take results (the dataclasses experiments return; a record's is ``Record.value()``)
and return a matplotlib ``Figure``; they never measure anything themselves. Every name is re-exported
here: ``import memlab.plot as mplot; mplot.loss_curves(...)``.
"""

from memlab.plot.attention import (  # noqa: F401
    IMPL_STYLE,
    attention_in_step,
    attention_memory,
    tiling,
    traffic,
)
from memlab.plot.distributed import (  # noqa: F401
    COLLECTIVE_COLORS,
    STAGE_COLORS,
    comm_by_strategy,
    gather_timeline,
    per_gpu_memory,
    pipeline_bubble,
    rank_memory,
    throughput_scaling,
    who_holds_what,
)
from memlab.plot.finetune import (  # noqa: F401
    SETUP_COLORS,
    fit_grid,
    lora_context,
    lora_diagram,
    memory_by_setup,
)
from memlab.plot.measure import (  # noqa: F401
    compare_phases,
    step_breakdown,
    step_phases,
)
from memlab.plot.memory import (  # noqa: F401
    bytes_per_param,
    error_histogram,
    ratio_heatmap,
)
from memlab.plot.planning import (  # noqa: F401
    accelerators,
    offload_costs,
    plan_costs,
)
from memlab.plot.precision import (  # noqa: F401
    FORMAT_COLORS,
    MEMORY_PARTS,
    MODE_COLORS,
    format_ranges,
    gradient_histogram,
    loss_curves,
    memory_by_mode,
    memory_phase_parts,
    relative_error_curves,
    representable_values,
)
from memlab.plot.quant import (  # noqa: F401
    gptq_propagation,
    layer_errors,
    optimizer_curves,
    outlier_sweep,
    quant_levels,
    scheme_tradeoff,
)
from memlab.plot.recompute import (  # noqa: F401
    accumulation_buffer,
    accumulation_sweep,
    checkpoint_costs,
    checkpoint_curve,
    flops_over_seq_len,
)
from memlab.plot.scaling import (  # noqa: F401
    scaling_fit,
)
from memlab.plot.style import (  # noqa: F401
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    as_dict,
    style,
)
from memlab.plot.timeline import (  # noqa: F401
    memory_timeline,
)
