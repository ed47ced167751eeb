"""Part 9, mixture of experts (chapter 9): the memory of all the experts, the compute of the
active ones, and expert parallelism run for real.

The MoE block lives with the model that uses it (:mod:`memlab.model.moe`, a config's ``moe``);
the pieces that measure live in this folder. Public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.moe.ep_run": (
        "DEEPSEEK_V3_LIKE",
        "all_to_all_step_bytes",
        "ExpertParallelBytes",
        "ExpertParallelRun",
        "all_to_all_bytes",
        "expert_parallel_bytes",
        "expert_parallel_run",
        "expert_parallel_table",
        "hot_shares",
        "one_process",
        "received_rows",
        "run_tolerance",
        "skewed_choice",
        "trace_expert_parallel",
    ),
    "memlab.moe.expert_parallel": (
        "AllToAll",
        "ExpertParallelMoE",
        "check_expert_parallel",
        "reduce_gradients",
        "shard_experts",
    ),
    "memlab.moe.command": ("check_moe_flags", "moe_plan", "moe_step"),
    "memlab.moe.plan": ("MoEPlan", "MoEPlanRow", "expert_parallel_degrees", "moe_step_cost",
                        "plan_moe"),
    "memlab.moe.estimate": ("ep_mlp_tensors", "estimate_moe", "moe_forward_high", "rank_rows",
                            "rank_shape_groups", "rank_shapes"),
    "memlab.moe.saved": ("moe_mlp_tensors", "moe_saved_tensors", "moe_weight_numel"),
    "memlab.moe.where": ("RoutingBytes", "routing_bytes", "skewed_routing"),
})
