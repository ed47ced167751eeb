"""memlab: measure and explain the memory and compute of training large language models.

The library behind the memlab book. Chapters import it; experiments also run from the
command line (``python -m memlab run <experiment> --scale full --out results/``).
"""

from memlab._version import __version__
from memlab.device import env_report, get_scale, pick_device, seed_all
from memlab.errors import MemlabError
from memlab.model.config import ModelConfig, get_config
from memlab.model.transformer import build_model

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
