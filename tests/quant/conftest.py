"""Fixtures of the quantization tests: the book's smallest model, trained once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_reference():
    """The fp32 model of ``memlab.model.lm.TINY_LM``, trained once (about a second) and shared."""
    import memlab.model.lm as lm

    return lm.reference_model(device="cpu", config=lm.TINY_LM)
