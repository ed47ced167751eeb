import pytest

from memlab.errors import MemlabError
from memlab.units import fmt_bytes, to_unit


def test_gb_and_gib_differ():
    assert to_unit(10**9, "GB") == 1.0
    assert to_unit(2**30, "GiB") == 1.0
    assert to_unit(140 * 10**9, "GiB") == pytest.approx(130.385, abs=1e-3)


def test_fmt_bytes_picks_binary_unit():
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(3 * 2**20) == "3.00 MiB"
    assert fmt_bytes(25.1 * 2**30, digits=1) == "25.1 GiB"
    assert fmt_bytes(4e9, "GB") == "4.00 GB"
    assert fmt_bytes(None) == "n/a"


def test_unknown_unit_is_one_line_error():
    with pytest.raises(MemlabError, match="unknown unit 'GiG'; accepted: B, KB"):
        to_unit(1, "GiG")
