import base64

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from memlab.errors import MemlabError  # noqa: E402
from memlab.gpus import CATALOGUE  # noqa: E402
from memlab.interactive.estimator import estimate_summary, render_outputs  # noqa: E402
from memlab.memory.training import estimate  # noqa: E402


def _text(outputs) -> str:
    return outputs[0]["data"]["text/plain"]


def test_estimate_summary_returns_a_figure_and_names_the_peak_and_gpus():
    fig, text = estimate_summary("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed")
    try:
        assert isinstance(fig, Figure)
        ax = fig.axes[0]
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            "forward peak", "backward peak", "optimizer peak"
        ]
    finally:
        plt.close(fig)
    est = estimate("llama2-7b", batch_size=1, seq_len=2048, precision="bf16-mixed")
    assert f"estimated peak {est.peak_bytes / 2**30:,.2f} GiB" in text
    assert f"in the {est.peak_phase} phase" in text
    for gpu in CATALOGUE:
        assert f"{gpu.name} {'✓' if est.peak_bytes <= gpu.usable_bytes else '✗'}" in text
    assert "capped" not in text


def test_seq_len_above_the_model_maximum_is_capped_with_a_note():
    fig, text = estimate_summary("gpt2", seq_len=4096)
    plt.close(fig)
    assert "gpt2 takes at most 1,024 tokens; sequence length 4,096 capped at 1,024" in text
    peak = estimate("gpt2", batch_size=1, seq_len=1024, precision="bf16-mixed").peak_bytes
    assert f"estimated peak {peak / 2**30:,.2f} GiB" in text


def test_render_outputs_holds_text_and_png_and_reports_bad_input():
    before = plt.get_fignums()  # other tests may have left figures open
    outputs = render_outputs(model="gpt2", seq_len=256)
    assert [o["output_type"] for o in outputs] == ["display_data", "display_data"]
    png = base64.b64decode(outputs[1]["data"]["image/png"])
    assert png.startswith(b"\x89PNG")
    assert outputs[1]["metadata"]["image/png"]["width"] > 0
    bad = render_outputs(model="gpt2", seq_len=256, optimizer="lion")
    assert len(bad) == 1 and _text(bad).startswith("memlab: error: unknown optimizer 'lion'")
    assert plt.get_fignums() == before  # the widget closes every figure it draws


def test_widget_builds_with_the_default_picture_and_no_open_figure():
    pytest.importorskip("ipywidgets")
    from memlab.interactive.estimator import estimator_widget

    before = plt.get_fignums()
    box = estimator_widget()
    assert plt.get_fignums() == before  # nothing left for an inline backend to show again
    c = box.controls
    assert set(c) == {"model", "batch_size", "seq_len", "precision", "optimizer",
                      "optimizer_impl", "checkpointing"}
    assert not any(str(v).startswith("tiny") for v in c["model"].options)
    assert c["seq_len"].options == (128, 256, 512, 1024, 2048, 4096)  # llama2-7b: 4096 max
    assert box.output in box.children
    outputs = box.output.outputs
    assert "image/png" in outputs[1]["data"]
    assert "llama2-7b, batch 1 x 2,048 tokens, bf16-mixed, adamw (foreach)" in _text(outputs)


def test_changing_a_control_redraws():
    pytest.importorskip("ipywidgets")
    from memlab.interactive.estimator import estimator_widget

    box = estimator_widget()
    first = box.output.outputs
    box.controls["batch_size"].value = 8
    second = box.output.outputs
    assert "batch 8 x" in _text(second) and _text(second) != _text(first)
    assert second[1]["data"]["image/png"] != first[1]["data"]["image/png"]
    box.controls["checkpointing"].value = True
    assert "checkpointing" in _text(box.output.outputs)
    box.controls["optimizer_impl"].value = "fused"
    assert "adamw (fused)" in _text(box.output.outputs)


def test_model_change_caps_the_sequence_length_and_remembers_the_request():
    pytest.importorskip("ipywidgets")
    from memlab.interactive.estimator import estimator_widget

    box = estimator_widget(model="llama3-8b", seq_len=8192)
    seq = box.controls["seq_len"]
    assert seq.value == 8192
    box.controls["model"].value = "gpt2"
    assert seq.options == (128, 256, 512, 1024) and seq.value == 1024
    assert "sequence length 8,192 capped at 1,024" in _text(box.output.outputs)
    box.controls["model"].value = "llama3-8b"  # the length asked for comes back
    assert seq.value == 8192 and "capped" not in _text(box.output.outputs)
    seq.value = 512
    box.controls["model"].value = "gpt2"
    assert seq.value == 512 and "capped" not in _text(box.output.outputs)


def test_widget_caps_a_too_long_initial_length_instead_of_raising():
    pytest.importorskip("ipywidgets")
    from memlab.interactive.estimator import estimator_widget

    box = estimator_widget(model="gpt2", seq_len=4096)
    assert box.controls["seq_len"].value == 1024
    assert "capped at 1,024" in _text(box.output.outputs)
    with pytest.raises(MemlabError, match="unknown precision 'fp8'"):
        estimator_widget(precision="fp8")


def test_updates_do_not_leak_figures():
    pytest.importorskip("ipywidgets")
    from memlab.interactive.estimator import estimator_widget

    box = estimator_widget(model="gpt2", seq_len=512)
    before = len(plt.get_fignums())
    sizes = box.controls["batch_size"].options
    for i in range(10):
        box.controls["batch_size"].value = sizes[i % len(sizes)] if i % 2 else sizes[-1 - i]
    assert len(plt.get_fignums()) == before
