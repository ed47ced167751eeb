import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.errors import MemlabError  # noqa: E402
from memlab.measure.timeline import MemoryTimeline  # noqa: E402

MiB = 2**20
PHASES = {"forward": (0.0, 10.0), "backward": (10.0, 20.0), "optimizer": (20.0, 30.0)}


def _timeline(**extra) -> MemoryTimeline:
    return MemoryTimeline(
        method="profiler", device="cpu", setup={"model": "t"},
        times_us=(1.0, 5.0, 12.0, 22.0),
        category_bytes={"parameters": (MiB,) * 4, "activations": (0, 2 * MiB, MiB, 0),
                        "gradients": (0, 0, MiB, MiB), "other": (0, 0, 0, 0)},
        phase_spans_us=PHASES, **extra)


def test_memory_timeline_stacks_the_categories_and_marks_the_peak():
    tl = _timeline()
    assert tl.peak_bytes == 3 * MiB and tl.peak_phase == "forward"
    assert tl.phase_peak_bytes() == {"forward": 3 * MiB, "backward": 3 * MiB,
                                     "optimizer": 2 * MiB}
    fig = mplot.memory_timeline(tl, title="t")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["activations", "gradients", "parameters"]  # top first; empty 'other' left out
    assert ax.get_ylabel() == "bytes alive (MiB)"
    assert ax.get_xlabel() == "allocations and frees, in order"
    assert any(t.get_text() == "peak 3.00 MiB" for t in ax.texts)
    assert {t.get_text() for t in ax.texts} >= {"forward", "backward", "optimizer"}
    assert ax.get_title() == "t"


def test_memory_timeline_in_time_with_reserved_bytes():
    tl = _timeline(reserved_bytes=(4 * MiB,) * 4)
    with pytest.raises(MemlabError, match="takes a result dataclass"):
        mplot.memory_timeline(tl.as_dict())
    fig = mplot.memory_timeline(tl, x="time", unit="KiB")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "time into the step (ms)"
    assert "reserved" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_xlim()[1] == pytest.approx(PHASES["optimizer"][1] / 1e3)
    with pytest.raises(MemlabError, match="unknown x axis 'steps'"):
        mplot.memory_timeline(tl, x="steps")
