"""Interactive pieces that work without a kernel: the bit viewer and the memory estimator.

The pieces live in this folder's modules; their public names are re-exported here, so that
``from memlab.interactive import ...`` reaches them. ``experiments.py`` and ``claims.py`` register
experiments and verdicts; this package does not import them.

Names are imported on first use (:mod:`memlab._lazy`).
"""

from memlab._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.interactive.bitviewer": (
        "DEFAULT_FORMATS",
        "FIELD_COLOURS",
        "FIELD_LETTERS",
        "FIELD_NAMES",
        "VIEWER_FORMATS",
        "BitViewer",
        "bit_viewer",
        "bit_widget",
        "format_config",
        "test_vectors",
    ),
    "memlab.interactive.estimator": (
        "BATCH_SIZES",
        "PASTED_KEY",
        "PASTED_SOURCE",
        "SEQ_LENS",
        "EstimatorView",
        "estimate_readout",
        "estimate_summary",
        "estimator_data",
        "memory_estimator",
    ),
})
