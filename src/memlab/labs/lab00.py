"""Lab 0, "Measure the memory of a training step": predict, then measure.

Every expected value is computed from what the notebook measured (passed in as
context) or from the model's config, never typed in.
"""

from __future__ import annotations

from memlab.labs.grader import define_lab


def _at_optimizer_step(step) -> dict:
    """Bytes by category at the optimizer step's peak, when gradients and states are all alive."""
    return step.phase_breakdown["optimizer"]


def _forward_activations(step) -> int:
    """Activation bytes at the forward pass's peak, when all of them are alive."""
    return step.phase_breakdown["forward"]["activations"]


lab = define_lab("lab00", "Measure the memory of a training step")

lab.exercise(
    "0.1",
    "bytes of the model's fp32 parameters, predicted from its parameter count (within 1%)",
    expected=lambda step: _at_optimizer_step(step)["parameters"],
    rtol=0.01,  # on CUDA each tensor is rounded up to the allocator's 512-byte blocks
    hint="an fp32 value takes 4 bytes; use cfg.num_parameters()",
)
lab.exercise(
    "0.2",
    "bytes of AdamW's optimizer states, predicted from the parameter count (within 1%)",
    expected=lambda step: _at_optimizer_step(step)["optimizer_states"],
    rtol=0.01,
    hint="AdamW keeps two fp32 values per parameter: the first moment m and the second moment v",
)
lab.exercise(
    "0.3",
    "bytes per parameter of parameters + gradients + AdamW states in fp32 (within 1%)",
    expected=lambda step: sum(
        _at_optimizer_step(step)[c] for c in ("parameters", "gradients", "optimizer_states")
    ) / step.setup["parameters"],
    rtol=0.01,
    hint="add the bytes per parameter of the weight, its gradient and the two Adam moments",
)
lab.exercise(
    "0.4",
    "peak bytes of allocating one (B, T, C) fp32 activation, measured with measure_peak",
    expected=lambda shape: 4 * shape[0] * shape[1] * shape[2],
    hint="call memlab.measure.step.measure_peak(torch.empty, B, T, C) and read peak_allocated_bytes",
)
lab.exercise(
    "0.5",
    "the phase of the step ('forward', 'backward' or 'optimizer') that holds the peak",
    expected=lambda step: step.peak_phase,
    hint="look at step.phase_peak_bytes, or think about when the gradients and the Adam "
    "scratch tensors are alive together",
)
lab.exercise(
    "0.6",
    "activation bytes at batch 2B divided by those at batch B, predicted (within 10%)",
    expected=lambda step, step_2b: _forward_activations(step_2b) / _forward_activations(step),
    rtol=0.10,
    hint="every stored activation has a batch dimension",
)

# The model and batch the lab measures, per scale (B is doubled in exercise 0.6).
SIZES = {
    "ci": dict(model="tiny", batch_size=4, seq_len=64),
    "full": dict(model="gpt2", batch_size=2, seq_len=512),
}
