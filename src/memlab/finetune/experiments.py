"""Chapter 5's experiments: the set-ups fine-tuned side by side, which GPU fits which set-up, LoRA at
long context, FLOPs per step, the reference model with adapters off, and a 20B model on 24 GB."""

from __future__ import annotations

from memlab.device import get_scale
from memlab.experiments import register, register_kept
from memlab.finetune.compare import STEPS, FinetuneComparison, LrSweep
from memlab.finetune.cuda_check import CUDA_GRIDS, CudaCheck
from memlab.finetune.flops import FlopsTable
from memlab.finetune.plan import ContextSweep, FitTable, TwentyB
from memlab.finetune.reference import ReferenceResult

_CH5 = "chapters/05_finetuning"

COMPARE_SIZES = {scale: dict(steps=STEPS[scale]) for scale in ("ci", "full")}


@register("finetune-compare", chapter=_CH5,
          summary="the chapter 3 model fine-tuned on a new chain with every set-up (full, last "
                  "block, LoRA at two ranks and on every linear, QLoRA), each at its own "
                  "learning rate: memory by category, time, trainable parameters, held-out loss",
          sizes=COMPARE_SIZES, result=FinetuneComparison, needs="any", cost_s=300, priority=320)
def finetune_compare(scale: str | None = None) -> FinetuneComparison:
    """Every set-up from the same start on the same batches (chapter: 5)."""
    from memlab.finetune.compare import finetune_comparison

    scale = get_scale(scale)
    return finetune_comparison(scale, steps=COMPARE_SIZES[scale]["steps"])


@register("finetune-lr", chapter=_CH5,
          summary="every fine-tuning set-up at 1 to 40 times the base learning rate: the "
                  "held-out loss after the same steps, which picks each set-up's learning rate",
          sizes=COMPARE_SIZES, result=LrSweep, needs="any", cost_s=700, priority=325)
def finetune_lr(scale: str | None = None) -> LrSweep:
    """Held-out loss of each set-up at each learning-rate factor (chapter: 5)."""
    from memlab.finetune.compare import lr_sweep

    scale = get_scale(scale)
    return lr_sweep(scale, steps=COMPARE_SIZES[scale]["steps"])


FIT_SIZES = {
    "ci": dict(models=("llama2-7b", "llama2-13b", "llama2-70b"), batch_size=4, seq_len=2048,
               traced=()),
    "full": dict(models=("llama2-7b", "llama2-13b", "llama2-70b"), batch_size=4, seq_len=2048,
                 traced=("llama2-7b", "llama2-13b")),
}


@register_kept("finetune-fit", kept_as="_fit", chapter=_CH5,
               summary="Llama-2 7B, 13B and 70B with each fine-tuning set-up, checkpointing off "
                       "and on: estimated peaks (traced at full scale) against the GPU catalogue",
               sizes=FIT_SIZES, result=FitTable, needs="cpu", cost_s=150, priority=240)
def finetune_fit(scale: str) -> FitTable:
    """Which GPU fits which set-up of which model (chapter: 5)."""
    from memlab.finetune.plan import fit_table

    return fit_table(**FIT_SIZES[scale])


CONTEXT_SIZES = {scale: dict(model="llama2-7b", lengths=(512, 1024, 2048, 4096, 8192, 16384))
                 for scale in ("ci", "full")}


@register("finetune-context", chapter=_CH5,
          summary="LoRA against full fine-tuning of Llama-2-7B as the context grows, and how "
                  "little rank and target modules move LoRA's peak (estimated)",
          sizes=CONTEXT_SIZES, result=ContextSweep, needs="cpu", cost_s=10, priority=250)
def finetune_context(scale: str | None = None) -> ContextSweep:
    """Full and LoRA peaks against T, and LoRA's peak by rank and targets (chapter: 5)."""
    from memlab.finetune.plan import context_sweep

    return context_sweep(**CONTEXT_SIZES[get_scale(scale)])


FLOPS_SIZES = {"ci": dict(model="tiny", batch_size=2, seq_len=32),
               "full": dict(model="tiny", batch_size=8, seq_len=128)}


@register("finetune-flops", chapter=_CH5,
          summary="forward and backward FLOPs of a step counted by FlopCounterMode: full, last "
                  "block, LoRA on q and v at two ranks and on every linear",
          sizes=FLOPS_SIZES, result=FlopsTable, needs="cpu", cost_s=15, priority=250)
def finetune_flops(scale: str | None = None) -> FlopsTable:
    """FLOPs per step of each set-up (chapter: 5)."""
    from memlab.finetune.flops import flops_table

    return flops_table(**FLOPS_SIZES[get_scale(scale)])


REFERENCE_SIZES = {scale: dict(r=8) for scale in ("ci", "full")}


@register("finetune-reference", chapter=_CH5,
          summary="the chapter 3 model with LoRA adapters switched off against the base model: "
                  "the logits bit for bit, adapters kept apart and merged, and a copy's bytes",
          sizes=REFERENCE_SIZES, result=ReferenceResult, needs="cpu", cost_s=20, priority=260)
def finetune_reference(scale: str | None = None) -> ReferenceResult:
    """Adapters off against the base, unmerged and merged (chapter: 5)."""
    from memlab.finetune.reference import reference_experiment

    scale = get_scale(scale)
    return reference_experiment(scale, **REFERENCE_SIZES[scale])


TWENTY_B_SIZES = {scale: dict(gpu="RTX-4090", batch_size=1, seq_len=512, r=16)
                  for scale in ("ci", "full")}


@register("finetune-20b", chapter=_CH5,
          summary="GPT-NeoX-20B's shapes with an int8 or NF4 base and LoRA on every linear, "
                  "checkpointing off and on, against a 24 GB consumer card (estimated)",
          sizes=TWENTY_B_SIZES, result=TwentyB, needs="cpu", cost_s=10, priority=260)
def finetune_20b(scale: str | None = None) -> TwentyB:
    """A 20B model's LoRA peaks with a quantized base (chapter: 5)."""
    from memlab.finetune.plan import twenty_b

    return twenty_b(**TWENTY_B_SIZES[get_scale(scale)])


@register("estimator-cuda", chapter="chapters/01_where_the_memory_goes",
          summary="the estimator with CUDA conventions held to torch.cuda.max_memory_allocated "
                  "over a grid of real steps (models, precisions, eager and SDPA attention, "
                  "checkpointing, optimizers, LoRA, QLoRA), PyTorch's MemTracker beside it",
          sizes=CUDA_GRIDS, result=CudaCheck, needs="cuda", cost_s=110, priority=8)
def estimator_cuda_run(scale: str | None = None) -> CudaCheck:
    """The estimator against the CUDA allocator on this GPU, or the reason it cannot run here (chapter: 1)."""
    from memlab.finetune.cuda_check import estimator_cuda

    return estimator_cuda(get_scale(scale))
