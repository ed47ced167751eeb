"""Interactive pieces that work without a kernel: the bit viewer and the memory estimator.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.interactive import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.
"""

from memlab.interactive.bitviewer import (  # noqa: F401
    DEFAULT_FORMATS,
    FIELD_COLOURS,
    FIELD_LETTERS,
    FIELD_NAMES,
    VIEWER_FORMATS,
    BitViewer,
    bit_viewer,
    bit_widget,
    format_config,
    test_vectors,
)
from memlab.interactive.estimator import (  # noqa: F401
    BATCH_SIZES,
    PASTED_KEY,
    PASTED_SOURCE,
    SEQ_LENS,
    EstimatorView,
    estimate_readout,
    estimate_summary,
    estimator_data,
    memory_estimator,
)
