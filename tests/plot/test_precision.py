"""Chapter 2's figures (memlab.plot.precision): each autocast mode's bytes by phase."""

from dataclasses import dataclass

import matplotlib
import pytest

matplotlib.use("Agg")

import memlab.plot as mplot  # noqa: E402


def _bar_tops(ax):
    """Top of each stacked bar by x position, and the legend's labels."""
    tops = {}
    for container in ax.containers:
        for patch in container:
            x = round(patch.get_x() + patch.get_width() / 2, 6)
            tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    return [tops[x] for x in sorted(tops)], [t.get_text() for t in ax.get_legend().get_texts()]


@dataclass(frozen=True)
class _Modes:
    """The two fields of a MixedPrecisionResult that memory_by_mode draws."""

    memory: list
    memory_large: list


def test_memory_by_mode_draws_each_phase_up_to_its_peak():
    from memlab.precision.memory import memory_by_mode

    large = memory_by_mode("llama2-7b", batch_size=1, seq_len=2048, how="estimated")
    small = memory_by_mode("tiny", batch_size=2, seq_len=16, device="cpu")
    for which, rows in (("large", large), ("small", small)):
        fig = mplot.memory_by_mode(_Modes(small, large), which=which)
        ax = fig.axes[0]
        unit = 2**30 if which == "large" else 2**20
        tops, legend = _bar_tops(ax)
        expected = [r.phase_peak_bytes[p] / unit for r in rows
                    for p in ("forward", "backward", "optimizer")]
        assert tops == pytest.approx(expected, rel=1e-12)
        assert "weight-cast cache (part of the activations)" in legend
        assert f"batch {rows[0].batch_size} x seq {rows[0].seq_len}" in ax.get_xlabel()
        assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["fwd", "bwd", "opt"]
    # a part with no bytes in any bar gets no legend entry
    from memlab.plot.precision import MEMORY_PARTS, memory_phase_parts

    no_autocast = [r for r in large if r.mode in ("fp32", "bf16-pure")]
    fig = mplot.memory_by_mode(_Modes(small, no_autocast), which="large")
    _, legend = _bar_tops(fig.axes[0])
    parts = [memory_phase_parts(r.__dict__, p) for r in no_autocast
             for p in ("forward", "backward", "optimizer")]
    assert legend == [label for key, label, _ in MEMORY_PARTS if any(p[key] for p in parts)]
    assert not any("cast" in label for label in legend)
