"""Part 6, many devices (chapter 6): DDP, ZeRO and FSDP run for real with torch.distributed.

The pieces live in this folder's modules; their public names are re-exported here.
"""

from memlab.distributed.comm import CommCounter, python_allreduce_hook, ring_sent_bytes  # noqa: F401
from memlab.distributed.estimate import ShardedEstimate, estimate_sharded  # noqa: F401
from memlab.distributed.launch import Launch, check_group, launch, launch_device  # noqa: F401
from memlab.distributed.sharding import (  # noqa: F401
    DIST_CI,
    DistributedMemory,
    RankMemory,
    StrategyRun,
    distributed_memory,
)
from memlab.distributed.strategies import LABELS, STAGE, STRATEGIES, wrap  # noqa: F401
from memlab.distributed.zero import (  # noqa: F401
    LAYOUTS,
    STAGES,
    comm_volume,
    formula,
    model_states,
    reduction,
)
