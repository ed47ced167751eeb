"""All of the book's figures: one house style, one module per part, no experiments inside.

Functions take results (the dataclasses experiments return; a record's is ``Record.value()``)
and return a matplotlib ``Figure``; they never measure anything themselves. Every name is re-exported
here: ``import memlab.plot as mplot; mplot.loss_curves(...)``.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.plot.alt": (
        "describe",
        "figure_alt",
        "figure_problems",
    ),
    "memlab.plot.attention": (
        "IMPL_STYLE",
        "attention_in_step",
        "attention_memory",
        "tiling",
        "traffic",
    ),
    "memlab.plot.distributed": (
        "COLLECTIVE_COLORS",
        "STAGE_COLORS",
        "comm_by_strategy",
        "gather_timeline",
        "per_gpu_memory",
        "pipeline_bubble",
        "pipeline_schedule",
        "rank_memory",
        "throughput_scaling",
        "who_holds_what",
    ),
    "memlab.plot.finetune": (
        "SETUP_COLORS",
        "fit_grid",
        "lora_context",
        "lora_diagram",
        "memory_by_setup",
    ),
    "memlab.plot.longcontext": (
        "PIECE_STYLE",
        "budget_frontier",
        "chunk_sweep",
        "long_context_pieces",
        "offload_cut",
    ),
    "memlab.plot.measure": (
        "compare_phases",
        "step_breakdown",
        "step_phases",
    ),
    "memlab.plot.memory": (
        "bytes_per_param",
        "error_histogram",
        "ratio_heatmap",
    ),
    "memlab.plot.moe": (
        "RANK_PARTS",
        "expert_parallel_share",
    ),
    "memlab.plot.planning": (
        "accelerators",
        "offload_costs",
        "plan_costs",
    ),
    "memlab.plot.precision": (
        "FORMAT_COLORS",
        "MEMORY_PARTS",
        "MODE_COLORS",
        "format_ranges",
        "gradient_histogram",
        "loss_curves",
        "memory_by_mode",
        "memory_phase_parts",
        "relative_error_curves",
        "representable_values",
    ),
    "memlab.plot.quant": (
        "gptq_propagation",
        "layer_errors",
        "optimizer_curves",
        "outlier_sweep",
        "quant_levels",
        "scheme_tradeoff",
    ),
    "memlab.plot.recompute": (
        "accumulation_buffer",
        "accumulation_sweep",
        "checkpoint_costs",
        "checkpoint_curve",
        "flops_over_seq_len",
    ),
    "memlab.plot.scaling": (
        "scaling_fit",
    ),
    "memlab.plot.style": (
        "CATEGORY_COLORS",
        "CATEGORY_LABELS",
        "MAX_FIGURE_WIDTH_IN",
        "as_dict",
        "style",
    ),
    "memlab.plot.timeline": (
        "memory_timeline",
    ),
})
