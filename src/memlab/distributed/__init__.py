"""Part 6, many devices (chapter 6): DDP, ZeRO and FSDP run for real with torch.distributed.

The pieces live in this folder's modules; their public names are re-exported here.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.distributed.comm": (
        "CommCounter",
        "python_allreduce_hook",
        "ring_sent_bytes",
    ),
    "memlab.distributed.estimate": (
        "ShardedEstimate",
        "estimate_sharded",
    ),
    "memlab.distributed.launch": (
        "Launch",
        "check_group",
        "launch",
        "launch_device",
    ),
    "memlab.distributed.sharding": (
        "DIST_CI",
        "DistributedMemory",
        "RankMemory",
        "StrategyRun",
        "distributed_memory",
    ),
    "memlab.distributed.strategies": (
        "LABELS",
        "STAGE",
        "STRATEGIES",
        "wrap",
    ),
    "memlab.distributed.zero": (
        "LAYOUTS",
        "STAGES",
        "ZERO_CITATION",
        "comm_volume",
        "formula",
        "model_states",
        "reduction",
    ),
})
