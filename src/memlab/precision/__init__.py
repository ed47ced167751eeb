"""Part 2, number formats (chapter 2): formats bit by bit, and mixed-precision training measured.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.precision import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

from memlab.precision.formats import (  # noqa: F401
    FORMATS,
    PATTERN_FORMATS,
    BitPattern,
    FormatSpec,
    Thresholds,
    bits,
    bitsandbytes_functional,
    codebook,
    decode,
    decode_many,
    int8_cast,
    parse_value,
    probe_formats,
    relative_error,
    representable,
    round_to,
    same_number,
    spec,
    storage_bytes,
    thresholds,
    thresholds_table,
    value_kind,
)
from memlab.precision.mixed import (  # noqa: F401
    EVAL_SEQUENCES,
    HIST_EDGES,
    HOWS,
    MODE_PRECISION,
    MODES,
    SETTINGS,
    AutocastCrossover,
    Fp8Matmul,
    MixedPrecisionResult,
    ModeMemory,
    Setting,
    StepTimeRow,
    StepTimes,
    TrainRun,
    autocast_crossover,
    fp8_matmul,
    grad_scaler_bytes,
    memory_by_mode,
    mixed_precision_run,
    step_times,
    train,
    train_setting,
    weight_cast_cache_bytes,
)
