"""Chapter 5's figures (memlab.plot.finetune), each drawn from a real result."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import memlab.plot as mplot  # noqa: E402
from memlab.finetune import finetune_comparison  # noqa: E402
from memlab.finetune.plan import context_sweep, fit_table  # noqa: E402
from memlab.model.lm import TINY_LM  # noqa: E402


def test_lora_diagram_labels_the_exact_counts():
    fig = mplot.lora_diagram(4096, 4096, 8)
    assert isinstance(fig, Figure)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert "16,777,216" in texts and "65,536" in texts  # W, and r x (in + out)
    plt.close(fig)


def test_memory_by_setup_stacks_each_rows_categories_to_its_peak():
    comp = finetune_comparison(config=TINY_LM, steps=1, device="cpu",
                               setups=("full", "LoRA q,v r=4"))
    fig = mplot.memory_by_setup(comp, unit="MiB")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    tops = {}
    for bar in ax.patches:
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    for x, row in enumerate(comp.rows):
        assert tops[x] == pytest.approx(sum(row.categories.values()) / 2**20)
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == [r.name for r in comp.rows]
    plt.close(fig)


def test_lora_context_draws_ratio_and_share():
    sweep = context_sweep(lengths=(512, 2048), ranks=(8,), targets=(("q_proj", "v_proj"),))
    fig = mplot.lora_context(sweep)
    assert isinstance(fig, Figure)
    ratio = fig.axes[1].lines[0]
    assert list(ratio.get_ydata()) == pytest.approx([r.lora_over_full for r in sweep.rows])
    plt.close(fig)


def test_fit_grid_has_one_cell_per_row():
    fit = fit_table(models=("llama2-7b",), checkpointing=(False, True))
    fig = mplot.fit_grid(fit)
    assert isinstance(fig, Figure)
    assert fig.axes[0].images[0].get_array().shape == (len(fit.rows) // 2, 2)
    plt.close(fig)
