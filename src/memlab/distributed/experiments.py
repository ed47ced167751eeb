"""Chapter 6's experiments: every data-parallel strategy run for real on several processes."""

from __future__ import annotations

from memlab.device import get_scale
from memlab.distributed.accel import ACCELERATE_SIZES, AccelerateResult
from memlab.distributed.deepspeed_zero import SIZES as DEEPSPEED_SIZES
from memlab.distributed.deepspeed_zero import DeepSpeedComparison
from memlab.distributed.parallel import SIZES as PARALLEL_SIZES
from memlab.distributed.parallel import ParallelismResult
from memlab.distributed.sharding import DistributedMemory
from memlab.distributed.traced import TracedGrid
from memlab.errors import MemlabError
from memlab.experiments import register, register_kept

_CH6 = "chapters/06_distributed"

# nproc None: one process per GPU (NCCL needs its own GPU per rank), 4 on a CPU
MEMORY_SIZES = {
    "ci": dict(model="dist-ci", nproc=4, steps=3, batch_size=8, seq_len=32, lr=1e-2),
    "full": dict(model="llama-1b", nproc=None, steps=4, batch_size=8, seq_len=512, lr=1e-4),
}


def _memory_scale(scale: str | None) -> str:
    """The scale distributed-memory runs at: ``ci`` for the default full scale on fewer than 4 GPUs."""
    from memlab.distributed.sharding import ranks_for

    if scale is None and get_scale() == "full" and ranks_for(None) < 4:
        return "ci"
    return get_scale(scale)


@register_kept("distributed-memory", kept_as="_memory", pick_scale=_memory_scale, chapter=_CH6,
               summary="DDP, ZeRO-1, ZeRO-2, ZeRO-3, hybrid sharding and CPU offload trained on N "
                       "processes (torchrun; gloo or NCCL): each rank's bytes by category, its "
                       "peak, the bytes of every collective, and the losses and weights against "
                       "one process",
               sizes=MEMORY_SIZES, result=DistributedMemory, needs="any", cost_s=150, priority=60)
def distributed_memory_experiment(scale: str) -> DistributedMemory:
    """Every strategy on N ranks, held to the ZeRO formulas and to one process (chapter: 6).

    Sharding needs ranks to shard over: a machine with fewer than 4 GPUs runs the CI sizes on
    its CPU unless full scale is asked for by name (a run of one rank per GPU, as recorded).
    """
    from memlab.distributed.sharding import distributed_memory, model_for, ranks_for

    size = dict(MEMORY_SIZES[scale])
    return distributed_memory(model_for(size.pop("model")), nproc=ranks_for(size.pop("nproc")),
                              **size)


def _parallel_scale(scale: str | None) -> str:
    """The scale distributed-parallel runs at: ``ci`` for the default full scale without a GPU per rank."""
    from memlab.distributed.launch import launch_device
    from memlab.distributed.parallel import WORLD

    chosen = get_scale(scale)
    if chosen == "full" and launch_device(WORLD) == "cpu":
        if scale is not None:
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise MemlabError(f"distributed-parallel at full scale needs {WORLD} GPUs, one per "
                              f"rank; this machine has {have}: use --scale ci for the CPU's "
                              "sizes on gloo")
        chosen = "ci"
    return chosen


@register_kept("distributed-parallel", kept_as="_parallel", pick_scale=_parallel_scale,
               chapter=_CH6,
               summary="tensor parallelism of one block and pipeline parallelism (GPipe) of the "
                       "model on 2 ranks: the output against one process, each rank's share of "
                       "the weights, the collectives, and the pipeline's bubble against "
                       "(p-1)/(m+p-1)",
               sizes=PARALLEL_SIZES, result=ParallelismResult, needs="any", cost_s=90,
               priority=62, gpus=2)
def distributed_parallel(scale: str) -> ParallelismResult:
    """Tensor and pipeline parallelism on two ranks, each against one process (chapter: 6).

    Full scale needs a GPU per rank. Asked for by name (``memlab run … --scale full``) on a
    machine with fewer, it is refused in one line, so no record is labelled full that ran the
    CPU's sizes; chosen by default (a notebook on one GPU), the CI sizes run on the CPU and
    the result says so (its device and backend).
    """
    from memlab.distributed.parallel import parallelism

    return parallelism(scale)


TRACED_SIZES = {
    "ci": dict(models=("llama2-7b",), gpus=(8,), precisions=("fp32", "bf16-mixed"), batch_size=1,
               seq_len=2048),
    "full": dict(models=("llama2-7b", "llama2-70b"), gpus=(8, 64),
                 precisions=("fp32", "bf16-mixed"), batch_size=1, seq_len=2048),
}


@register_kept("distributed-traced", kept_as="_traced", chapter=_CH6,
               summary="one rank of Llama-2 7B and 70B sharded by FSDP2 over 8 and 64 ranks, "
                       "traced in one process on fake tensors (a fake process group, "
                       "FSDPMemTracker), with the estimator's per-GPU peak beside each",
               sizes=TRACED_SIZES, result=TracedGrid, needs="cpu", cost_s=60, priority=270)
def distributed_traced(scale: str) -> TracedGrid:
    """Per-rank peaks of big sharded models, traced and estimated (chapter: 6)."""
    from memlab.distributed.traced import traced_grid

    return traced_grid(**TRACED_SIZES[scale])


@register("distributed-deepspeed", chapter=_CH6,
          summary="DeepSpeed's ZeRO stages 1-3 (the reference implementation; optional, CPU with "
                  "gloo) on the chapter's model and 4 ranks: each rank's bytes beside PyTorch's "
                  "strategies and the formulas; run from the command line, kept as a record",
          sizes=DEEPSPEED_SIZES, result=DeepSpeedComparison, needs="cpu", cost_s=120, priority=280)
def distributed_deepspeed(scale: str | None = None) -> DeepSpeedComparison:
    """DeepSpeed's three stages against FSDP2 and ZeroRedundancyOptimizer (chapter: 6)."""
    from memlab.distributed.deepspeed_zero import deepspeed_comparison

    scale = get_scale(scale)
    return deepspeed_comparison(scale, pytorch=distributed_memory_experiment(scale))


@register("distributed-accelerate", chapter=_CH6,
          summary="Hugging Face accelerate on this machine: on CPUs, DDP through "
                  "Accelerator(cpu=True) and an FSDP request that splits nothing (refused in one "
                  "line); on GPUs, the FSDP2 config file; each beside one process",
          sizes=ACCELERATE_SIZES, result=AccelerateResult, needs="any", cost_s=90, priority=65)
def distributed_accelerate(scale: str | None = None) -> AccelerateResult:
    """accelerate's launches on this machine's devices, each beside one process (chapter: 6)."""
    from memlab.distributed.accel import accelerate_experiment

    return accelerate_experiment(get_scale(scale))
