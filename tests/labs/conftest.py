"""Fixtures the labs' tests share: the file's lab, and the one line a check prints."""

from __future__ import annotations

import pytest

from memlab.labs.grader import get_lab


@pytest.fixture
def lab(request):
    """The lab a test file checks (test_lab05.py: lab05), its recorded checks reset."""
    lab = get_lab(request.path.stem.removeprefix("test_"))
    lab.reset()
    return lab


@pytest.fixture
def printed(capsys):
    """``printed()``: what the last check printed, which must be exactly one line."""

    def read() -> str:
        out = capsys.readouterr().out
        assert out.count("\n") == 1, f"a check prints exactly one line, got {out!r}"
        return out.rstrip("\n")

    return read
