"""Chapter 0's figures (memlab.plot.measure): a step's bytes by category and by phase."""

import matplotlib
import pytest

matplotlib.use("Agg")

import memlab.plot as mplot  # noqa: E402
from memlab.measure.step import measure_step  # noqa: E402


def test_step_breakdown_draws_one_bar_per_result():
    step = measure_step("tiny", batch_size=2, seq_len=16)
    fig = mplot.step_breakdown({"measured": step, "again": step}, unit="MiB", title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["measured", "again"]
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"parameters", "optimizer states"} <= labels
    assert all(label in mplot.CATEGORY_LABELS.values() for label in labels)
    widths = {}
    for patch, label in ((p, c.get_label()) for c in ax.containers for p in c):
        widths.setdefault(label, []).append(patch.get_width())
    assert widths["parameters"][0] == step.parameters_bytes / 2**20
    assert fig.axes[0].get_title() == "t"


def test_step_phases_has_one_bar_per_phase_and_takes_only_the_dataclass():
    from memlab.errors import MemlabError

    step = measure_step("tiny", batch_size=2, seq_len=16)
    with pytest.raises(MemlabError, match="takes a result dataclass .* got dict"):
        mplot.step_phases(step.as_dict())
    fig = mplot.step_phases(step)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "forward peak", "backward peak", "optimizer peak"
    ]
    assert ax.get_xlabel() == "bytes alive (MiB)"
    totals = [float(t.get_text().split()[0]) for t in ax.texts]
    expected = [step.phase_peak_bytes[p] / 2**20 for p in ("forward", "backward", "optimizer")]
    assert totals == [round(e, 2) for e in expected]
