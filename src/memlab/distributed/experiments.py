"""Chapter 6's experiments: every data-parallel strategy run for real on several processes."""

from __future__ import annotations

import functools

from memlab.device import get_scale
from memlab.distributed.parallel import SIZES as PARALLEL_SIZES
from memlab.distributed.parallel import ParallelismResult
from memlab.distributed.sharding import DistributedMemory
from memlab.experiments import register
from memlab.results import kept_on_disk

_CH6 = "chapters/06_distributed"

# nproc None: one process per GPU (NCCL needs its own GPU per rank), 4 on a CPU
MEMORY_SIZES = {
    "ci": dict(model="dist-ci", nproc=4, steps=3, batch_size=8, seq_len=32, lr=1e-2),
    "full": dict(model="llama-1b", nproc=None, steps=4, batch_size=8, seq_len=512, lr=1e-4),
}


@functools.cache
@kept_on_disk
def _memory(scale: str) -> DistributedMemory:
    from memlab.distributed.sharding import distributed_memory, model_for, ranks_for

    size = dict(MEMORY_SIZES[scale])
    return distributed_memory(model_for(size.pop("model")), nproc=ranks_for(size.pop("nproc")),
                              **size)


@register("distributed-memory", chapter=_CH6,
          summary="DDP, ZeRO-1, ZeRO-2, ZeRO-3, hybrid sharding and CPU offload trained on N "
                  "processes (torchrun; gloo or NCCL): each rank's bytes by category, its peak, "
                  "the bytes of every collective, and the losses and weights against one process",
          sizes=MEMORY_SIZES, result=DistributedMemory)
def distributed_memory_experiment(scale: str | None = None) -> DistributedMemory:
    """Every strategy on N ranks, held to the ZeRO formulas and to one process (chapter: 6)."""
    return _memory(get_scale(scale))


@functools.cache
@kept_on_disk
def _parallel(scale: str) -> ParallelismResult:
    from memlab.distributed.parallel import parallelism

    return parallelism(scale)


@register("distributed-parallel", chapter=_CH6,
          summary="tensor parallelism of one block and pipeline parallelism (GPipe) of the model "
                  "on 2 ranks: the output against one process, each rank's share of the weights, "
                  "the collectives, and the pipeline's bubble against (p-1)/(m+p-1)",
          sizes=PARALLEL_SIZES, result=ParallelismResult)
def distributed_parallel(scale: str | None = None) -> ParallelismResult:
    """Tensor and pipeline parallelism on two ranks, each against one process (chapter: 6)."""
    return _parallel(get_scale(scale))
