"""Chapter 8's experiments, measured on this device.

The chunked loss against K, activation offloading with and without checkpointing, ring
attention over several processes, the cheaper optimizers' loss, and the compiler's memory
budgets beside chapter 7's plans.
"""

from __future__ import annotations

from memlab.experiments import register_kept
from memlab.longcontext.budget import BUDGET_SIZES, BudgetTable
from memlab.longcontext.chunked import CHUNK_SIZES, ChunkSweep
from memlab.longcontext.context_parallel import RING_SIZES, RingRun
from memlab.longcontext.offload import OFFLOAD_SIZES, OffloadMeasured
from memlab.longcontext.optimizers import LOSS_SIZES, LossComparison

_CH8 = "chapters/08_long_context"


@register_kept("chunked-loss", kept_as="_chunks", chapter=_CH8,
               summary="A step of a wide-vocabulary model measured at each number of loss chunks "
                       "K beside the estimate, and the chunked loss and gradients against the "
                       "unchunked ones with a derived rounding bound",
               sizes=CHUNK_SIZES, result=ChunkSweep, needs="any", cost_s=60, priority=30)
def chunked_loss_run(scale: str) -> ChunkSweep:
    """The chunked loss's bytes against K on this device (chapter: 8)."""
    from memlab.longcontext.chunked import chunk_sweep

    return chunk_sweep(scale)


@register_kept("activation-offload", kept_as="_offload", chapter=_CH8,
               summary="A step measured and timed with and without activation offloading, with "
                       "and without checkpointing: device bytes saved, host bytes and the bytes "
                       "copied each way",
               sizes=OFFLOAD_SIZES, result=OffloadMeasured, needs="any", cost_s=90, priority=30)
def activation_offload_run(scale: str) -> OffloadMeasured:
    """Activation offloading measured on this device (chapter: 8)."""
    from memlab.longcontext.offload import measure_offload_steps

    return measure_offload_steps(scale)


@register_kept("memory-budget", kept_as="_budget", chapter=_CH8,
               summary="One compiled step split by PyTorch's min-cut partitioner at each "
                       "activation memory budget, its saved bytes and FLOPs beside chapter 7's "
                       "hand-written checkpointing plans",
               sizes=BUDGET_SIZES, result=BudgetTable, needs="cpu", cost_s=120, priority=60)
def memory_budget_run(scale: str) -> BudgetTable:
    """The compiler's memory budgets beside the hand-written plans (chapter: 8)."""
    from memlab.longcontext.budget import budget_table

    size = dict(BUDGET_SIZES[scale])
    return budget_table(size.pop("model"), **size)


@register_kept("ring-attention", kept_as="_ring", chapter=_CH8,
               summary="Ring attention launched over 2 (ci) or 4 (full) ranks: outputs and "
                       "gradients against SDPA on the whole sequence, and one rank's saved, peak "
                       "and sent bytes measured beside the formulas",
               sizes=RING_SIZES, result=RingRun, needs="any", cost_s=60, priority=40)
def ring_attention_run(scale: str) -> RingRun:
    """Ring attention checked and measured over torch.distributed (chapter: 8)."""
    from memlab.longcontext.context_parallel import ring_run

    return ring_run(scale)


@register_kept("optimizer-states", kept_as="_optim", chapter=_CH8,
               summary="AdamW, 8-bit AdamW, AdamW with bf16 moments and Adafactor: state bytes "
                       "measured beside the estimate, and the book's model trained with each "
                       "over seeds, held-out loss paired by seed with 2 standard errors",
               sizes=LOSS_SIZES, result=LossComparison, needs="any", cost_s=120, priority=40)
def optimizer_states_run(scale: str) -> LossComparison:
    """The cheaper optimizers' loss against AdamW's on this device (chapter: 8)."""
    from memlab.longcontext.optimizers import loss_comparison

    return loss_comparison(scale)
