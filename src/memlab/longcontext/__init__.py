"""Part 8, long context and large vocabularies (chapter 8): where long sequences put the memory,
and the levers that move it: chunked cross-entropy, activation offloading, context parallelism
(ring attention), optimizer states that cost less and recomputation from a memory budget.

The chunked loss lives with the model that calls it (:mod:`memlab.model.loss`, the step's
``loss_chunks``); the pieces that measure live in this folder. Public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.longcontext.budget": (
        "BUDGETS",
        "BUDGET_SIZES",
        "budget_table",
        "check_budget",
        "partition_step",
        "sac_estimator_lacks",
    ),
    "memlab.longcontext.context_parallel": (
        "ContextParallelRow",
        "RingCore",
        "context_parallel_table",
        "fake_ring",
        "measure_ring",
        "ring_rank_bytes",
        "sequence_parallel_bytes",
        "trace_context_parallel",
        "use_ring_attention",
    ),
    "memlab.longcontext.optimizers": (
        "COMPARED",
        "LOSS_SIZES",
        "LossComparison",
        "OptimizerLoss",
        "StateBytesRow",
        "StateBytesTable",
        "loss_comparison",
        "measured_state_bytes",
        "state_bytes_table",
    ),
    "memlab.longcontext.ring": (
        "LAYOUTS",
        "RingAttention",
        "causal_pairs",
        "kv_bytes_sent_per_step",
        "local_tokens",
        "ring_attention",
        "token_positions",
    ),
})
