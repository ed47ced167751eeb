"""Interactive memory estimator for chapter 1: controls in, one stacked bar per phase out.

:func:`estimate_summary` does the work without a display: it runs :func:`memlab.memory.estimate`
and returns the figure and a text line naming the peak and the GPUs it fits on.
:func:`estimator_widget` wraps it in ipywidgets controls and redraws on every change.

The picture goes into an ``ipywidgets.Output`` as a PNG set on the widget's ``outputs``, not
displayed: the saved widget state then carries the default picture, so a built page shows it
without a kernel, and the figure never also appears as a cell output of its own.
"""

from __future__ import annotations

import base64
import html
import io

import matplotlib.pyplot as plt

from memlab import plot
from memlab.errors import MemlabError, check_choice, check_positive_int, require
from memlab.gpus import CATALOGUE, fits, get_gpu
from memlab.measure.step import StepSpec
from memlab.memory.training import estimate
from memlab.model.train import OPTIMIZER_IMPLS, PRECISIONS
from memlab.model.transformer import PRESETS, ModelConfig, get_config
from memlab.units import to_unit

BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
WIDGET_OPTIMIZERS = ("adamw", "sgd", "sgd-momentum", "adamw-8bit")
PNG_SCALE = 2  # PNG pixels per CSS pixel: sharp on high-density screens


def _model_names() -> tuple[str, ...]:
    """The presets the widget offers: real models, not the tiny test ones."""
    return tuple(name for name in PRESETS if not name.startswith("tiny"))


def _clamp_seq_len(cfg: ModelConfig, seq_len: int) -> tuple[int, str]:
    """``seq_len`` capped at the model's ``max_seq_len``, and a note when it was capped."""
    check_positive_int("seq_len", seq_len)
    if seq_len <= cfg.max_seq_len:
        return seq_len, ""
    return cfg.max_seq_len, (f"note: {cfg.name} takes at most {cfg.max_seq_len:,} tokens; "
                             f"sequence length {seq_len:,} capped at {cfg.max_seq_len:,}")


def estimate_summary(model: str | ModelConfig = "llama2-7b", batch_size: int = 1,
                     seq_len: int = 2048, precision: str = "bf16-mixed",
                     optimizer: str = "adamw", optimizer_impl: str = "foreach",
                     checkpointing: bool = False, gpus=CATALOGUE, unit: str = "GiB"):
    """Figure (one stacked bar per phase) and text (peak in ``unit``, fits per GPU) of an estimate (chapter: 1).

    A ``seq_len`` above the model's ``max_seq_len`` is capped, and the text says so.
    The figure is open: close it (``plt.close(fig)``) when done.
    """
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    seq_len, note = _clamp_seq_len(cfg, seq_len)
    est = estimate(StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                            optimizer=optimizer, optimizer_impl=optimizer_impl,
                            checkpointing=checkpointing))
    setup = (f"{cfg.name}, batch {batch_size} x {seq_len:,} tokens, {precision}, "
             f"{optimizer} ({optimizer_impl})" + (", checkpointing" if checkpointing else ""))
    gpu_list = [get_gpu(g) for g in gpus]
    marks = " · ".join(f"{g.name} {'✓' if fits(est.peak_bytes, g) else '✗'}" for g in gpu_list)
    lines = [note] if note else []
    lines.append(f"{setup}: estimated peak {to_unit(est.peak_bytes, unit):,.2f} {unit}, "
                 f"in the {est.peak_phase} phase")
    if gpu_list:
        lines.append(f"fits on (total as nvidia-smi reports it, no headroom): {marks}")
    fig = plot.step_phases(est, unit=unit, title=f"estimated memory per phase: {cfg.name}")
    return fig, "\n".join(lines)


def _png_output(fig) -> dict:
    """A display_data output holding ``fig`` as a PNG, at its CSS size."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi * PNG_SCALE, bbox_inches="tight")
    png = buf.getvalue()
    width, height = (int.from_bytes(png[i:i + 4], "big") for i in (16, 20))  # IHDR
    return {
        "output_type": "display_data",
        "data": {"image/png": base64.b64encode(png).decode("ascii"),
                 "text/plain": f"<Figure size {width // PNG_SCALE}x{height // PNG_SCALE}>"},
        "metadata": {"image/png": {"width": width // PNG_SCALE, "height": height // PNG_SCALE}},
    }


def _text_output(text: str) -> dict:
    body = "<br>".join(html.escape(line) for line in text.splitlines())
    return {"output_type": "display_data",
            "data": {"text/html": f"<div>{body}</div>", "text/plain": text}, "metadata": {}}


def render_outputs(**setup) -> tuple[dict, ...]:
    """The Output widget's outputs for one setup: the text and the PNG, or the error (chapter: 1)."""
    try:
        fig, text = estimate_summary(**setup)
    except MemlabError as err:
        return (_text_output(f"memlab: error: {err}"),)
    try:
        return (_text_output(text), _png_output(fig))
    finally:
        plt.close(fig)


def _with(options: tuple, value) -> tuple:
    """``options`` plus ``value`` where it is missing, in order."""
    return options if value in options else tuple(sorted({*options, value}))


def _seq_options(cfg: ModelConfig, requested: int) -> tuple[int, ...]:
    cap = min(requested, cfg.max_seq_len)
    return tuple(sorted({s for s in SEQ_LENS if s <= cfg.max_seq_len} | {cap}))


def estimator_widget(model: str = "llama2-7b", batch_size: int = 1, seq_len: int = 2048,
                     precision: str = "bf16-mixed", optimizer: str = "adamw",
                     checkpointing: bool = False, optimizer_impl: str = "foreach"):
    """An ipywidgets memory estimator: controls, one bar per phase, peak and GPU fits (chapter: 1).

    Returns the container (a ``VBox``); its ``controls`` dict maps each setting to its control
    and ``output`` is the ``Output`` holding the text and the picture.
    """
    widgets = require("ipywidgets", "estimator_widget", extra="notebook")
    names = _model_names()
    check_choice("model", model, PRESETS)
    cfg = get_config(model)
    StepSpec(cfg, batch_size=batch_size, seq_len=min(check_positive_int("seq_len", seq_len),
                                                     cfg.max_seq_len),
             precision=precision, optimizer=optimizer, optimizer_impl=optimizer_impl,
             checkpointing=checkpointing)  # every switch checked once, as estimate checks it

    style = {"description_width": "110px"}
    wide = widgets.Layout(width="340px")
    model_labels = [(f"{n} ({PRESETS[n].num_parameters() / 1e9:.2f}B)", n)
                    for n in _with(names, model)]
    controls = {
        "model": widgets.Dropdown(options=model_labels, value=model, description="model",
                                  style=style, layout=wide),
        "batch_size": widgets.SelectionSlider(
            options=_with(BATCH_SIZES, batch_size), value=batch_size, description="batch size",
            continuous_update=False, style=style, layout=wide),
        "seq_len": widgets.Dropdown(
            options=_seq_options(PRESETS[model], seq_len),
            value=min(seq_len, PRESETS[model].max_seq_len), description="sequence length",
            style=style, layout=wide),
        "precision": widgets.Dropdown(options=PRECISIONS, value=precision,
                                      description="precision", style=style, layout=wide),
        "optimizer": widgets.Dropdown(options=_with(WIDGET_OPTIMIZERS, optimizer),
                                      value=optimizer, description="optimizer", style=style,
                                      layout=wide),
        # A Dropdown, not ToggleButtons: those draw Font Awesome icons, whose fonts the
        # widget manager of a built page would fetch from beside the page.
        "optimizer_impl": widgets.Dropdown(options=OPTIMIZER_IMPLS, value=optimizer_impl,
                                           description="implementation", style=style,
                                           layout=wide),
        "checkpointing": widgets.Checkbox(value=checkpointing,
                                          description="activation checkpointing", style=style),
    }
    output = widgets.Output(layout=widgets.Layout(min_height="340px"))
    state = {"seq_len": seq_len, "syncing": False}  # the length asked for, before capping

    def redraw() -> None:
        setup = {k: c.value for k, c in controls.items()}
        setup["seq_len"] = state["seq_len"]
        output.outputs = render_outputs(**setup)

    def on_model(change) -> None:
        cfg = PRESETS[change["new"]]
        seq = controls["seq_len"]
        state["syncing"] = True  # new options reset the value: not a choice of the reader
        try:
            seq.options = _seq_options(cfg, state["seq_len"])
            seq.value = min(state["seq_len"], cfg.max_seq_len)
        finally:
            state["syncing"] = False
        redraw()

    def on_seq_len(change) -> None:
        if not state["syncing"]:
            state["seq_len"] = change["new"]
            redraw()

    def on_other(change) -> None:
        redraw()

    controls["model"].observe(on_model, names="value")
    controls["seq_len"].observe(on_seq_len, names="value")
    for key, control in controls.items():
        if key not in ("model", "seq_len"):
            control.observe(on_other, names="value")

    c = controls
    box = widgets.VBox([
        widgets.HBox([
            widgets.VBox([c["model"], c["batch_size"], c["seq_len"], c["checkpointing"]]),
            widgets.VBox([c["precision"], c["optimizer"], c["optimizer_impl"]]),
        ]),
        output,
    ])
    box.controls = controls
    box.output = output
    redraw()
    return box
