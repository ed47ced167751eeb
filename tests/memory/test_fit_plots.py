"""Chapter 1's GPU-fit table and its heat map: each cell is a peak over a GPU's usable bytes."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.errors import MemlabError  # noqa: E402
from memlab.gpus import RESERVED_BYTES, get_gpu, usage_table  # noqa: E402


def test_usage_table_divides_by_the_usable_bytes():
    t4 = get_gpu("T4")
    table = usage_table({"at the edge": t4.usable_bytes, "the nvidia-smi total": t4.total_bytes},
                        gpus=["T4"])
    assert table.loc["at the edge", t4.column] == 1.0
    assert table.loc["the nvidia-smi total", t4.column] == t4.total_bytes / (
        t4.total_bytes - RESERVED_BYTES) > 1
    with pytest.raises(MemlabError):
        usage_table({})


def test_heatmap_annotates_every_cell_and_marks_what_fits():
    table = usage_table({"small": 2**30, "big": 10**12}, gpus=["T4", "H100"])
    fig = mplot.ratio_heatmap(table, marks={"✓": lambda r: r <= 1}, title="t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 4
    assert sum("✓" in t for t in texts) == 2  # 'small' fits both, 'big' neither
    assert fig.axes[0].get_title() == "t"
