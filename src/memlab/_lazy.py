"""Re-exports that import their module on first use, so that a package's arithmetic imports no torch.

``from memlab.model import ModelConfig`` loads :mod:`memlab.model.config` only, and
``import memlab.memory.estimator`` loads the estimator and the configuration it reads, without
torch (README, "The estimator without torch"). :func:`lazy_exports` gives a package the module
``__getattr__`` and ``__dir__`` of PEP 562 for a table of names and the modules that hold them.
"""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, homes: dict[str, tuple[str, ...]]):
    """``(__getattr__, __dir__)`` for ``package``: each name of ``homes[module]`` from that module."""
    where = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    # A name its module shares (memlab.finetune.qlora, the function in qlora.py) is bound now:
    # once that module is imported, the import system binds the module to the package's
    # attribute, which would hide the name from __getattr__.
    pkg = sys.modules[package]
    pkg.__getattr__, pkg.__dir__ = __getattr__, __dir__
    pkg.__lazy__ = dict(where)  # name -> its home module, for tests and readers
    for name, module in where.items():
        if module == f"{package}.{name}":
            setattr(pkg, name, getattr(importlib.import_module(module), name))
    return __getattr__, __dir__
