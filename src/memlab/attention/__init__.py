"""Part 4, attention (chapter 4): naive attention and FlashAttention built from scratch, their
memory, FLOPs, traffic and time; grouped-query attention and the KV cache; a fused block.

The kernel itself lives with the model that calls it (:mod:`memlab.model.flash`, the model's
``attention="flash"``); the measuring pieces live in this folder. Public names are re-exported here.
"""

from memlab.attention.flops import attention_flops  # noqa: F401
from memlab.attention.fusion import (  # noqa: F401
    FUSION_SIZES,
    FusionComparison,
    fusion_comparison,
)
from memlab.attention.gqa import (  # noqa: F401
    GqaComparison,
    GqaRow,
    gqa_comparison,
    kv_head_choices,
)
from memlab.attention.kv import (  # noqa: F401
    kv_bytes_per_token,
    longest_context,
    tokens_where_cache_equals_weights,
)
from memlab.attention.memory import (  # noqa: F401
    IMPLS,
    QUOTED_MEMORY_REDUCTION,
    QUOTED_SHAPE,
    QUOTED_SOURCE,
    QUOTED_SPEEDUP,
    SDPA_BACKENDS,
    AttentionMemory,
    attention_memory,
    fit_exponent,
    saved_bytes,
)
from memlab.attention.step import StepComparison, StepRow, attention_in_step  # noqa: F401
from memlab.attention.sweep import (  # noqa: F401
    FlopSweep,
    MemorySweep,
    TimeSweep,
    flop_sweep,
    memory_sweep,
    time_sweep,
    traffic_rows,
)
from memlab.measure.flops import CPU_SDPA_OPS, register_cpu_sdpa_flops  # noqa: F401
from memlab.model.config import DEFAULT_BLOCK  # noqa: F401
from memlab.model.flash import (  # noqa: F401
    FlashAttention,
    TrafficCounter,
    flash_attention,
    naive_attention,
    online_softmax,
    online_softmax_update,
    sram_blocks,
    standard_traffic,
    tiled_traffic,
)
