"""Part 2, number formats (chapter 2): formats bit by bit, and mixed-precision training measured.

The pieces live in this folder's modules: ``formats`` (formats bit by bit), ``tf32``, and for
mixed precision ``modes`` (the five modes), ``runs`` (every mode trained, kept on disk, and the
chapter's experiment), ``memory`` (bytes per mode), ``speed`` (step times per mode) and ``fp8``;
their public names are re-exported here, so that ``from memlab.precision import ...`` reaches
them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.precision.formats": (
        "FORMATS",
        "PATTERN_FORMATS",
        "BitPattern",
        "FormatSpec",
        "Thresholds",
        "bits",
        "bitsandbytes_functional",
        "codebook",
        "decode",
        "decode_many",
        "int8_cast",
        "parse_value",
        "probe_formats",
        "relative_error",
        "representable",
        "round_to",
        "same_number",
        "spec",
        "storage_bytes",
        "thresholds",
        "thresholds_table",
        "value_kind",
    ),
    "memlab.precision.fp8": (
        "Fp8Matmul",
        "fp8_matmul",
    ),
    "memlab.precision.memory": (
        "HOWS",
        "AutocastCrossover",
        "ModeMemory",
        "autocast_crossover",
        "grad_scaler_bytes",
        "memory_by_mode",
        "weight_cast_cache_bytes",
    ),
    "memlab.precision.modes": (
        "MODE_PRECISION",
        "MODES",
    ),
    "memlab.precision.runs": (
        "EVAL_SEQUENCES",
        "HIST_EDGES",
        "SETTINGS",
        "MixedPrecisionResult",
        "Setting",
        "TrainRun",
        "mixed_precision_run",
        "train",
        "train_setting",
    ),
    "memlab.precision.speed": (
        "StepTimeRow",
        "StepTimes",
        "step_times",
    ),
})
