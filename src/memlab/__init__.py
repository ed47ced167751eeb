"""memlab: measure and explain the memory and compute of training large language models.

The library behind the memlab book. Chapters import it; experiments also run from the
command line (``python -m memlab run <experiment> --scale full --out results/``).
"""

from memlab._lazy import lazy_exports
from memlab._version import __version__
from memlab.display import register as _show_tables
from memlab.errors import MemlabError

_show_tables()  # in a notebook, a table's missing values show as — (memlab.display)

# The rest on first use: the configuration and the estimator import without torch.
__getattr__, __dir__ = lazy_exports(__name__, {
    "memlab.device": ("env_report", "get_scale", "pick_device", "seed_all"),
    "memlab.model.config": ("ModelConfig", "get_config"),
    "memlab.model.transformer": ("build_model",),
})

__all__ = [
    "MemlabError",
    "ModelConfig",
    "__version__",
    "build_model",
    "env_report",
    "get_config",
    "get_scale",
    "pick_device",
    "seed_all",
]
