"""Part 1, where the memory goes (chapter 1): the tensor-by-tensor estimator, inference with a
KV cache, and other estimators compared.

The estimator is arithmetic on a model's configuration (:mod:`memlab.model.config`) and a step's
description (:class:`memlab.model.step.StepSpec`): :mod:`~memlab.memory.activations` lists the
saved tensors, :mod:`~memlab.memory.estimator` holds the result type and the walk, with one way in
per question (:func:`estimate` for a training step, :func:`estimate_inference` for an inference
pass). Neither imports torch; :mod:`~memlab.memory.inference` generates, measures and traces.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.memory import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.

Names are imported on first use (:mod:`memlab._lazy`): the configuration and the estimator
load without torch.
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.memory.activations": (
        "COMPUTE_BYTES",
        "PARAM_BYTES",
        "SavedTensor",
        "activation_bytes",
        "saved_by_stage",
        "saved_tensors",
    ),
    "memlab.memory.compare": (
        "ACCELERATE_ROW",
        "BYTES_PER_PARAM_SPLITS",
        "ELEUTHER_ALLGATHER_BUCKET",
        "ELEUTHER_GRAD_BYTES",
        "ELEUTHER_HIGH_PREC_BYTES",
        "ELEUTHER_LOW_PREC_BYTES",
        "ELEUTHER_OPTIMIZER_BYTES",
        "ELEUTHER_ZERO3_LIVE_PARAMS",
        "OtherEstimate",
        "accelerate_estimate",
        "all_estimates",
        "bytes_per_param_estimate",
        "comparison_table",
        "eleutherai_activation_bytes",
        "eleutherai_estimate",
        "eleutherai_parameter_count",
        "rule_of_thumb_loading",
    ),
    "memlab.memory.context": (
        "check_context_parallel",
        "ring_block",
        "ring_buffer_bytes",
        "ring_core_tensors",
        "ring_peaks",
        "ring_saved_tensors",
        "ring_transient_bytes",
    ),
    "memlab.memory.estimator": (
        "BNB_BLOCK",
        "BNB_MIN_NUMEL",
        "DEVICES",
        "DTYPE_BYTES",
        "DTYPES",
        "INFERENCE_PHASES",
        "MemoryEstimate",
        "adafactor_scratch_bytes",
        "batch_for_peak",
        "bytes_per_param_curve",
        "estimate",
        "estimate_inference",
        "forward_stage_bytes",
        "largest_batch_that_fits",
        "optimizer_state_bytes",
        "optimizer_step_scratch_bytes",
        "param_shape_groups",
        "param_shapes",
    ),
    "memlab.memory.inference": (
        "InferenceMemory",
        "generate",
        "measure_inference",
        "trace_inference",
    ),
})
