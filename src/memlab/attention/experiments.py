"""Chapter 4's experiments: attention's memory, FLOPs and time against T, attention in a training
step, grouped-query attention trained, and a compiled block."""

from __future__ import annotations

import functools

from memlab.attention.fusion import FUSION_SIZES, FusionComparison
from memlab.attention.gqa import GQA_STEPS, GqaComparison
from memlab.attention.step import StepComparison
from memlab.attention.sweep import FlopSweep, MemorySweep, TimeSweep
from memlab.device import get_scale
from memlab.experiments import register, register_kept

_CH4 = "chapters/04_attention"

MEMORY_SIZES = {
    "ci": dict(lengths=(256, 512, 1024, 2048, 4096, 8192), flash_lengths=(256, 512, 1024),
               n_head=1, head_size=64),
    "full": dict(lengths=(256, 1024, 4096, 16384, 65536), flash_lengths=(256, 1024, 4096),
                 n_head=8, head_size=64, dtype="bf16"),
}


@register_kept("attention-memory", kept_as="_memory", chapter=_CH4,
               summary="bytes saved for backward and peak of one causal attention call against "
                       "T: naive, the book's FlashAttention, each SDPA backend",
               sizes=MEMORY_SIZES, result=MemorySweep, needs="any", cost_s=60, priority=45)
def attention_memory_sweep(scale: str) -> MemorySweep:
    """Saved and peak bytes of every attention implementation against T (chapter: 4)."""
    from memlab.attention.sweep import memory_sweep

    return memory_sweep(**MEMORY_SIZES[scale])


FLOP_SIZES = {"ci": dict(lengths=(128, 256, 512)), "full": dict(lengths=(128, 256, 512))}


@functools.cache
def _flops(scale: str) -> FlopSweep:
    from memlab.attention.sweep import flop_sweep

    kw = FLOP_SIZES[scale]
    return FlopSweep(flop_sweep(**kw).rows + flop_sweep(kw["lengths"][:1], causal=True).rows)


@register("attention-flops", chapter=_CH4,
          summary="forward and backward FLOPs counted by FlopCounterMode for naive attention, "
                  "the book's FlashAttention and SDPA, causal and not",
          sizes=FLOP_SIZES, result=FlopSweep, needs="cpu", cost_s=15, priority=220)
def attention_flops_sweep(scale: str | None = None) -> FlopSweep:
    """FLOPs of each implementation against T, and causal at the shortest T (chapter: 4)."""
    return _flops(get_scale(scale))


TIME_SIZES = {
    "ci": dict(lengths=(256, 512, 1024), n_head=1, head_size=64, repeats=3),
    "full": dict(lengths=(1024, 2048, 4096, 8192, 16384), n_head=16, head_size=64,
                 dtype="bf16", repeats=10,
                 impls=("naive", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")),
}


@register("attention-time", chapter=_CH4,
          summary="time of one forward + backward against T for each attention implementation "
                  "this device offers",
          sizes=TIME_SIZES, result=TimeSweep, needs="any", cost_s=60, priority=16)
def attention_time_sweep(scale: str | None = None) -> TimeSweep:
    """Median forward + backward milliseconds of each implementation against T (chapter: 4)."""
    from memlab.attention.sweep import time_sweep

    return time_sweep(**TIME_SIZES[get_scale(scale)])


STEP_SIZES = {
    "ci": dict(small="tiny", small_lengths=(128, 512), large="llama2-7b",
               large_lengths=(2048, 4096, 8192, 16384, 32768), traced_lengths=()),
    "full": dict(small="tiny", small_lengths=(128, 512, 1024), large="llama2-7b",
                 large_lengths=(2048, 4096, 8192, 16384, 32768),
                 traced_lengths=(2048, 4096, 8192, 16384, 32768)),
}


@register_kept("attention-step", kept_as="_step", chapter=_CH4,
               summary="a training step with eager, SDPA and the book's FlashAttention: a small "
                       "model measured, Llama-2-7B estimated (and traced at full scale) from 2k to "
                       "32k tokens",
               sizes=STEP_SIZES, result=StepComparison, needs="cpu", cost_s=150, priority=230)
def attention_step(scale: str) -> StepComparison:
    """Saved activations, attention's share and the peak of a step for each attention (chapter: 4)."""
    from memlab.attention.step import attention_in_step

    return attention_in_step(**STEP_SIZES[scale])


GQA_SIZES = {scale: dict(steps=GQA_STEPS[scale]) for scale in ("ci", "full")}  # None: the config's


@register("gqa", chapter=_CH4,
          summary="the book's model trained with multi-head, grouped-query and multi-query "
                  "attention: parameters, KV-cache bytes, activations, held-out loss",
          sizes=GQA_SIZES, result=GqaComparison, needs="any", cost_s=200, priority=310)
def gqa(scale: str | None = None) -> GqaComparison:
    """MHA vs GQA vs MQA trained on the same batches (chapter: 4)."""
    from memlab.attention.gqa import gqa_comparison

    scale = get_scale(scale)
    return gqa_comparison(scale, steps=GQA_SIZES[scale]["steps"])


@register("fusion-block", chapter=_CH4,
          summary="one transformer block eager against torch.compile: kernels, bytes of "
                  "intermediates, time per step, compile time",
          sizes=FUSION_SIZES, result=FusionComparison, needs="any", cost_s=90, priority=35)
def fusion_block(scale: str | None = None) -> FusionComparison:
    """A compiled block against eager on this device, or the reason it cannot compile (chapter: 4)."""
    from memlab.attention.fusion import fusion_comparison

    return fusion_comparison(**FUSION_SIZES[get_scale(scale)])
