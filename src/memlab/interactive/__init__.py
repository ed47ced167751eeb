"""Interactive pieces: the bit viewer (works without a kernel) and the memory estimator widget.

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
    PNG_SCALE,
    SEQ_LENS,
    WIDGET_OPTIMIZERS,
    estimate_summary,
    estimator_widget,
    render_outputs,
)
