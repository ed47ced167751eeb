"""Part 4, attention (chapter 4): naive attention and FlashAttention built from scratch.

The pieces live in this folder's modules; their public names are re-exported here.
"""

from memlab.attention.flash import (  # noqa: F401
    DEFAULT_BLOCK,
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
from memlab.attention.flops import (  # noqa: F401
    CPU_SDPA_OPS,
    attention_flops,
    register_cpu_sdpa_flops,
)
from memlab.attention.kv import (  # noqa: F401
    kv_bytes_per_token,
    longest_context,
    tokens_where_cache_equals_weights,
)
from memlab.attention.memory import (  # noqa: F401
    IMPLS,
    SDPA_BACKENDS,
    AttentionMemory,
    attention_memory,
    fit_exponent,
    saved_bytes,
)
