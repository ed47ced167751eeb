"""Chapter 1's heat map (memlab.plot.memory): each cell is a peak over a GPU's usable bytes."""

import matplotlib

matplotlib.use("Agg")

import memlab.plot as mplot  # noqa: E402
from memlab.gpus import usage_table  # noqa: E402


def test_heatmap_annotates_every_cell_and_marks_what_fits():
    table = usage_table({"small": 2**30, "big": 10**12}, gpus=["T4", "H100"])
    fig = mplot.ratio_heatmap(table, marks={"✓": lambda r: r <= 1}, title="t")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 4
    assert sum("✓" in t for t in texts) == 2  # 'small' fits both, 'big' neither
    assert fig.axes[0].get_title() == "t"
