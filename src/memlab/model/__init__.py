"""The model the book measures: its configuration and presets, the description of one training
step (:class:`StepSpec`), a readable decoder-only transformer, the Markov tasks it learns, how it
is trained (precisions, optimizers), and the book's small language model.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.model import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.

Names are imported on first use (:mod:`memlab._lazy`): the configuration and the estimator
load without torch.
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.model.config": (
        "ATTENTION_IMPLS",
        "OPTIMIZER_IMPLS",
        "OPTIMIZERS",
        "PRECISIONS",
        "PRESETS",
        "ModelConfig",
        "config_from_hf",
        "get_config",
    ),
    "memlab.model.lm": (
        "CALIB_SEED",
        "EVAL_SEED",
        "SIZES",
        "TINY_LM",
        "LMConfig",
        "Quality",
        "StateBytes",
        "TrainedLM",
        "config_for",
        "eval_batch",
        "evaluate",
        "lm_config",
        "measure_state",
        "paired_delta",
        "reference_model",
        "train_lm",
        "trained_reference",
    ),
    "memlab.model.step": (
        "CATEGORIES",
        "PHASES",
        "STEP_BYTES",
        "STEP_WORDS",
        "StepSpec",
        "checkpointing_words",
        "step_bytes",
    ),
    "memlab.model.tasks": (
        "MarkovTask",
    ),
    "memlab.model.train": (
        "AUTOCAST_DTYPES",
        "SCHEDULES",
        "TrainConfig",
        "TrainLog",
        "lm_step_loss",
        "make_optimizer",
        "train_loop",
    ),
    "memlab.model.transformer": (
        "MLP",
        "Attention",
        "Block",
        "KVCache",
        "RMSNorm",
        "Transformer",
        "apply_rope",
        "block_linears",
        "build_model",
        "count_parameters",
        "lm_loss",
        "replace_module",
        "rope_cache",
    ),
})
