"""Chapter 1's GPU-fit table: each cell is a peak over a GPU's usable bytes (its heat map: tests/plot)."""

import pytest

from memlab.errors import MemlabError
from memlab.gpus import RESERVED_BYTES, get_gpu, usage_table


def test_usage_table_divides_by_the_usable_bytes():
    t4 = get_gpu("T4")
    table = usage_table({"at the edge": t4.usable_bytes, "the nvidia-smi total": t4.total_bytes},
                        gpus=["T4"])
    assert table.loc["at the edge", t4.column] == 1.0
    assert table.loc["the nvidia-smi total", t4.column] == t4.total_bytes / (
        t4.total_bytes - RESERVED_BYTES) > 1
    with pytest.raises(MemlabError):
        usage_table({})
