"""Part 0, how memlab measures memory (chapter 0): the peak of a callable, a training step by
category, a step traced without allocating it, and timing with CUDA events.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.measure import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

from memlab.measure.step import (  # noqa: F401
    CATEGORIES,
    METHODS,
    PHASES,
    PeakMemory,
    StepMemory,
    StepSpec,
    default_dtype,
    measure_peak,
    measure_step,
    trace_step,
)
from memlab.measure.timing import (  # noqa: F401
    not_measurable,
    time_ms,
)
