"""Part 4, attention (chapter 4): naive attention and FlashAttention built from scratch, their
memory, FLOPs, traffic and time; grouped-query attention and the KV cache; a fused block.

The kernel itself lives with the model that calls it (:mod:`memlab.model.flash`, the model's
``attention="flash"``); the measuring pieces live in this folder. Public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.attention.flops": (
        "attention_flops",
    ),
    "memlab.attention.fusion": (
        "FUSION_SIZES",
        "FusionComparison",
        "fusion_comparison",
    ),
    "memlab.attention.gqa": (
        "GqaComparison",
        "GqaRow",
        "gqa_comparison",
        "kv_head_choices",
    ),
    "memlab.attention.kv": (
        "kv_bytes_per_token",
        "longest_context",
        "tokens_where_cache_equals_weights",
    ),
    "memlab.attention.memory": (
        "IMPLS",
        "QUOTED_MEMORY_REDUCTION",
        "QUOTED_SHAPE",
        "QUOTED_SOURCE",
        "QUOTED_SPEEDUP",
        "SDPA_BACKENDS",
        "AttentionMemory",
        "attention_memory",
        "fit_exponent",
        "saved_bytes",
    ),
    "memlab.attention.step": (
        "CONVENTIONS",
        "StepComparison",
        "StepRow",
        "attention_in_step",
        "autocast_casts",
        "recorded_cuda_eager",
        "square_bytes_per_score",
    ),
    "memlab.attention.sweep": (
        "FlopSweep",
        "MemorySweep",
        "TimeSweep",
        "flop_sweep",
        "memory_sweep",
        "time_sweep",
        "traffic_rows",
    ),
    "memlab.measure.flops": (
        "CPU_SDPA_OPS",
        "register_cpu_sdpa_flops",
    ),
    "memlab.model.config": (
        "DEFAULT_BLOCK",
    ),
    "memlab.model.flash": (
        "FlashAttention",
        "TrafficCounter",
        "flash_attention",
        "naive_attention",
        "online_softmax",
        "online_softmax_update",
        "sram_blocks",
        "standard_traffic",
        "tiled_traffic",
    ),
})
