"""Part 2, number formats (chapter 2): formats bit by bit, and mixed-precision training measured.

The pieces live in this folder's modules: ``formats`` (formats bit by bit), ``tf32``, and for
mixed precision ``modes`` (the five modes), ``runs`` (every mode trained, kept on disk, and the
chapter's experiment), ``memory`` (bytes per mode), ``speed`` (step times per mode) and ``fp8``;
their public names are re-exported here, so that ``from memlab.precision import ...`` reaches
them. ``experiments.py`` and ``claims.py`` register
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
from memlab.precision.fp8 import Fp8Matmul, fp8_matmul  # noqa: F401
from memlab.precision.memory import (  # noqa: F401
    HOWS,
    AutocastCrossover,
    ModeMemory,
    autocast_crossover,
    grad_scaler_bytes,
    memory_by_mode,
    weight_cast_cache_bytes,
)
from memlab.precision.modes import MODE_PRECISION, MODES  # noqa: F401
from memlab.precision.runs import (  # noqa: F401
    EVAL_SEQUENCES,
    HIST_EDGES,
    SETTINGS,
    MixedPrecisionResult,
    Setting,
    TrainRun,
    mixed_precision_run,
    train,
    train_setting,
)
from memlab.precision.speed import StepTimeRow, StepTimes, step_times  # noqa: F401
