"""Packages import their names on first use (memlab._lazy): every name is its home module's object."""

import importlib
import pkgutil

import memlab

PACKAGES = ["memlab", *(f"memlab.{m.name}" for m in pkgutil.iter_modules(memlab.__path__)
                        if m.ispkg)]


def test_every_exported_name_is_the_object_of_its_home_even_after_its_module_is_imported():
    wrong, lazy = [], 0
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for sub in pkgutil.iter_modules(getattr(pkg, "__path__", [])):
            if sub.name != "__main__":
                importlib.import_module(f"{name}.{sub.name}")  # binds modules onto the package
        for attr, home in getattr(pkg, "__lazy__", {}).items():
            lazy += 1
            if getattr(pkg, attr) is not getattr(importlib.import_module(home), attr):
                wrong.append(f"{name}.{attr}")
    assert lazy > 400 and not wrong, wrong
