"""Chapter 9's experiments, measured on this device.

An MoE step with its own router and with a hot expert, beside the estimate; and expert
parallelism launched over several processes, against one process and the formulas.
"""

from __future__ import annotations

from memlab.experiments import register_kept
from memlab.moe.ep_run import ExpertParallelRun
from memlab.moe.measured import MOE_STEP_SIZES, MoEStepMeasured

_CH9 = "chapters/09_mixture_of_experts"

EP_SIZES = {
    "ci": dict(world=2, batch_size=4, seq_len=32, steps=3),
    "full": dict(world=4, batch_size=8, seq_len=128, steps=5),
}


@register_kept("moe-step", kept_as="_moe_step", chapter=_CH9,
               summary="An MoE training step measured with its own router and with one hot "
                       "expert, beside the estimate for the rows each routed",
               sizes=MOE_STEP_SIZES, result=MoEStepMeasured, needs="any", cost_s=60,
               priority=30)
def moe_step_run(scale: str) -> MoEStepMeasured:
    """An MoE step's bytes with two routers on this device (chapter: 9)."""
    from memlab.moe.measured import measure_moe_steps

    return measure_moe_steps(scale)


@register_kept("expert-parallel", kept_as="_ep", chapter=_CH9,
               summary="Expert parallelism launched over 2 (ci) or 4 (full) gloo ranks: losses "
                       "and weights against one process, each rank's bytes, all-to-all payload "
                       "and imbalanced rows beside the formulas",
               sizes=EP_SIZES, result=ExpertParallelRun, needs="any", cost_s=60, priority=40)
def expert_parallel_experiment(scale: str) -> ExpertParallelRun:
    """Expert parallelism over torch.distributed, checked and measured (chapter: 9)."""
    from memlab.moe.ep_run import expert_parallel_run

    return expert_parallel_run(**EP_SIZES[scale])
