"""The memory estimator of chapter 1: controls in, the peak per phase and the GPUs it fits on out.

:func:`memory_estimator` renders a self-contained HTML block (inline style, inline script, no
external resource) that recomputes in the browser with no kernel: in the built book, and in a
live Jupyter, Colab or VS Code output. Its scripts (``static/estimator_activations.js``, then
``static/estimator.js``) interpret :func:`memlab.memory.estimate`'s walk for a training step as
Python writes it down (:mod:`memlab.interactive.walk`: the saved tensors of each layer kind, the
parameter tensors), with chapter 8's levers: the chunked loss, activation offloading and
context parallelism; a mixture of experts (chapter 9) is :func:`memlab.moe.estimate.estimate_moe`'s
step, its block read from the walk's ``moe`` tables and the levers that estimate lacks turned off
(:mod:`memlab.interactive.estimator_moe`);
every number it multiplies by (bytes per dtype and per precision, bitsandbytes' block size,
FlashAttention's tiles, the presets' shapes, each GPU's usable bytes, the table that reads a
Hugging Face ``config.json``) is passed to it as JSON by :func:`estimator_data`. :func:`estimate_readout` is what the page shows for one setting,
computed by Python: the first render, and what the browser test holds the script to.
:func:`estimate_summary` draws one setting's phases as a figure, with the same text.
"""

from __future__ import annotations

import html
import random
import uuid

import torch

from memlab import plot
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.gpus import CATALOGUE, RESERVED_BYTES, fits, get_gpu
from memlab.interactive.estimator_moe import (
    MOE_UNMODELLED,
    moe_data,
    moe_estimate,
    refuse_other_moe,
    script_moe,
    unmodelled_note,
)
from memlab.interactive.page import mount_scripts
from memlab.interactive.walk import page_walk
from memlab.memory.activations import COMPUTE_BYTES, FLASH_TILES, PARAM_BYTES
from memlab.memory.estimator import BNB_BLOCK, BNB_MIN_NUMEL, DEVICES, estimate
from memlab.model.config import (
    ATTENTION_IMPLS,
    HF_ARCHITECTURES,
    HF_BIAS_FLAGS,
    HF_FIELDS,
    HF_FIXED,
    HF_KINDS,
    HF_MOE_FIELDS,
    HF_STYLES,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    PRESETS,
    ModelConfig,
    config_from_hf_dict,
    get_config,
    hf_model_type,
)
from memlab.model.config import DEFAULT_BLOCK as FLASH_BLOCK
from memlab.model.step import PHASES, StepSpec
from memlab.plot.style import CATEGORY_COLORS, CATEGORY_LABELS
from memlab.units import UNITS, fmt_bytes, to_unit

BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
# The config.json families the page reads: not the dense ones with fixed biases on q, k and v,
# which the page's tables have no variant for (as its presets, _model_names); the mixtures of
# experts' tables have one.
PAGE_STYLES = {t: s for t, s in HF_STYLES.items()
               if not HF_FIXED.get(t, {}).get("qkv_bias") or t in HF_MOE_FIELDS}


def _model_names() -> tuple[str, ...]:
    """The presets the widget offers: real models, not the tiny test ones.

    Nor, for now, dense models with biases on q, k and v (the page's tables have no such variant).
    """
    return tuple(name for name, cfg in PRESETS.items()
                 if not name.startswith("tiny") and (not cfg.qkv_bias or cfg.moe is not None))


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
    """An estimate as a figure and a text (chapter: 1).

    The figure has one stacked bar per phase; the text gives the peak in ``unit`` and whether
    it fits each GPU.

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
        lines.append(f"fits on (peak at most the usable memory, {_usable_rule()}): {marks}")
    fig = plot.step_phases(est, unit=unit, title=f"estimated memory per phase: {cfg.name}")
    return fig, "\n".join(lines)


# ---- the kernel-free estimator ----------------------------------------------------------------

PASTED_KEY = "pasted"  # the model menu's entry for a pasted config.json
PASTED_SOURCE = "the pasted config"  # how the one-line errors name it


def pasted_config(raw) -> ModelConfig:
    """The model of a config.json pasted into the page, read as its script reads it (chapters: 1, 9).

    A family with experts that the page does not read is refused by name.
    """
    refuse_other_moe(raw, PASTED_SOURCE, PAGE_STYLES)
    return config_from_hf_dict(raw, PASTED_SOURCE, styles=PAGE_STYLES)


READOUT_UNITS = ("GiB", "MiB")  # GiB when the peak reaches 1 GiB, else MiB
DECIMALS = 2  # digits after the point of every amount shown
BILLION = 10**9  # the menu's parameter counts are in billions: "llama2-7b (6.74B)"


def _usable_rule() -> str:
    return f"nvidia-smi total minus {fmt_bytes(RESERVED_BYTES)}"


def _amount(n_bytes: int, unit: str) -> str:
    """Bytes in ``unit`` as the page writes them (the same text as the script's amount)."""
    return f"{n_bytes / UNITS[unit]:,.{DECIMALS}f} {unit}"


def _model_label(cfg: ModelConfig) -> str:
    active = ("" if cfg.moe is None
              else f", {cfg.active_parameters() / BILLION:,.{DECIMALS}f}B active")
    return f"{cfg.name} ({cfg.num_parameters() / BILLION:,.{DECIMALS}f}B{active})"


def _categories() -> list[str]:
    """The categories a training step's bars show (no KV cache in training)."""
    return list(CATEGORY_COLORS)


def estimate_readout(model: str | ModelConfig = "llama2-7b", *, batch_size=1, seq_len=2048,
                     precision: str = "bf16-mixed", optimizer: str = "adamw",
                     optimizer_impl: str = "foreach", attention: str | None = None,
                     checkpointing: bool = False, grad_accum_steps=1, device: str = "cuda",
                     gpus=CATALOGUE, context_parallel: int = 1, loss_chunks=1,
                     offload_activations=False) -> dict:
    """What the estimator page shows for one setting, texts and bytes (chapters: 1, 8, 9).

    The bytes are those of :func:`memlab.memory.estimate`; a mixture of experts' are
    :func:`memlab.moe.estimate.estimate_moe`'s, its active parameters beside the total (and the
    levers that estimate does not model refused in one line).

    A ``seq_len`` above the model's ``max_seq_len`` is capped, with a note; a bad switch gives
    ``{"error": "memlab: error: ..."}``, as the page shows it. ``attention=None``: the model's own.
    ``loss_chunks`` K > 1 and ``offload_activations`` are chapter 8's levers, named in the setup
    line (with the bytes offloading keeps on the host).
    """
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    gpu_list = [get_gpu(g) for g in gpus]
    attention = cfg.attention if attention is None else attention
    try:
        seq, note = _clamp_seq_len(cfg, seq_len)
        if cfg.moe is not None:
            est = moe_estimate(cfg, batch_size=batch_size, seq_len=seq, precision=precision,
                               optimizer=optimizer, optimizer_impl=optimizer_impl,
                               attention=attention, device=device, checkpointing=checkpointing,
                               grad_accum_steps=grad_accum_steps,
                               context_parallel=context_parallel, loss_chunks=loss_chunks,
                               offload_activations=offload_activations)
        else:
            est = estimate(StepSpec(cfg, batch_size=batch_size, seq_len=seq, precision=precision,
                                    optimizer=optimizer, optimizer_impl=optimizer_impl,
                                    checkpointing=checkpointing,
                                    grad_accum_steps=grad_accum_steps, attention=attention,
                                    loss_chunks=loss_chunks,
                                    offload_activations=offload_activations), device=device,
                           context_parallel=context_parallel)
    except MemlabError as err:
        return {"error": f"memlab: error: {err}"}
    big, small = READOUT_UNITS
    unit = big if est.peak_bytes >= UNITS[big] else small
    active = None if cfg.moe is None else cfg.active_parameters()
    counted = f"{est.parameters:,} parameters" + ("" if active is None else f", {active:,} active")
    setup = (f"{cfg.name}: {counted}; batch {batch_size} \u00d7 {seq:,} tokens, "
             f"{precision}, {optimizer} ({optimizer_impl}), {attention} attention"
             + (", checkpointing" if checkpointing else "")
             + (f", {grad_accum_steps} accumulation steps" if grad_accum_steps > 1 else "")
             + (f", one of {context_parallel} context-parallel ranks" if context_parallel > 1
                else "")
             + (f", the loss in {loss_chunks} chunks" if loss_chunks > 1 else "")
             + (f", {_amount(est.setup['offloaded_bytes'], unit)} of activations offloaded to "
                "the host" if offload_activations else "")
             + f", {device} conventions")
    phases = {p: {"total": _amount(est.phase_peak_bytes[p], unit),
                  "bytes": est.phase_peak_bytes[p],
                  "categories": {c: est.phase_breakdown[p][c] for c in _categories()}}
              for p in PHASES}
    fitting = {g.name: fits(est.peak_bytes, g) for g in gpu_list}
    names = [name for name, ok in fitting.items() if ok]
    return {
        "error": None,
        "model": cfg.name,
        "parameters": est.parameters,
        **({} if active is None else {"active_parameters": active}),
        "note": note,
        "setup": setup,
        "peak": f"estimated peak {_amount(est.peak_bytes, unit)}, in the {est.peak_phase} phase",
        "peak_bytes": est.peak_bytes,
        "peak_phase": est.peak_phase,
        "unit": unit,
        "phases": phases,
        "at_peak": {c: _amount(est.phase_breakdown[est.peak_phase][c], unit)
                    for c in _categories()},
        "gpus": fitting,
        "fits": "fits on: " + ", ".join(names) if names else "fits on none of these GPUs",
    }


def _script_model(cfg: ModelConfig) -> dict:
    """A config's shape as the script reads it: every derived size resolved by ModelConfig."""
    return dict(name=cfg.name, style=cfg.style, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer,
                n_head=cfg.n_head, kv_heads=cfg.kv_heads, d_model=cfg.d_model,
                head_dim=cfg.head_dim, ffn_dim=cfg.ffn_dim, max_seq_len=cfg.max_seq_len,
                tied=cfg.tied, attention=cfg.attention,
                **({} if cfg.moe is None else script_moe(cfg)))


def _menu_models(model: str | ModelConfig) -> tuple[list[tuple[str, ModelConfig]], str]:
    """(key, config) of each model the menu offers, and the key of ``model``."""
    menu = [(name, PRESETS[name]) for name in _model_names()]
    if isinstance(model, ModelConfig):
        for key, cfg in menu:
            if cfg == model:
                return menu, key
        key = f"config: {model.name}"
        return menu + [(key, model)], key
    check_choice("model", model, PRESETS)
    if model not in dict(menu):
        menu.append((model, PRESETS[model]))
    return menu, model


def estimator_data(model: str | ModelConfig = "llama2-7b", gpus=CATALOGUE) -> dict:
    """Everything the estimator's script multiplies by, as JSON-ready data (chapter: 1).

    Every number is read from the library.

    Bytes of each dtype (torch), of parameters and matmul outputs per precision and
    bitsandbytes' blocks (memlab.memory.estimator), the walk's tables (``walk``: the committed
    ``static/estimator_walk.json`` of :mod:`memlab.interactive.walk`), the menu's models
    resolved by ModelConfig, each GPU's usable bytes (memlab.gpus), the config.json table
    (memlab.model.config).
    """
    menu, _ = _menu_models(model)
    gpu_list = [get_gpu(g) for g in gpus]
    big, small = READOUT_UNITS
    return {
        "version": 2,
        # what the script's own arithmetic multiplies by: token ids, fp32 sums, 8-bit states
        "bytes": {"int64": torch.int64.itemsize, "fp32": torch.float32.itemsize,
                  "bf16": torch.bfloat16.itemsize, "uint8": torch.uint8.itemsize},
        "param_bytes": dict(PARAM_BYTES),
        "compute_bytes": dict(COMPUTE_BYTES),
        "bnb": {"block": BNB_BLOCK, "min_numel": BNB_MIN_NUMEL,
                "map_entries": 1 << torch.iinfo(torch.uint8).bits},  # one fp32 per 8-bit code
        "phases": list(PHASES),
        "precisions": list(PRECISIONS),
        "optimizers": list(OPTIMIZERS),
        "optimizer_impls": list(OPTIMIZER_IMPLS),
        "attentions": list(ATTENTION_IMPLS),
        "flash_block": FLASH_BLOCK,  # the book's FlashAttention tiles (memlab.model.flash)
        "flash_tiles": dict(FLASH_TILES),
        "devices": list(DEVICES),
        "walk": page_walk(),
        "categories": [{"key": c, "label": CATEGORY_LABELS[c], "color": CATEGORY_COLORS[c]}
                       for c in _categories()],
        "units": {u: UNITS[u] for u in READOUT_UNITS},
        "big_unit": big,
        "small_unit": small,
        "decimals": DECIMALS,
        "billion": BILLION,
        "gpus": [{"name": g.name, "usable_bytes": g.usable_bytes} for g in gpu_list],
        "models": [{"key": key, "config": _script_model(cfg)} for key, cfg in menu],
        "pasted_key": PASTED_KEY,
        "pasted_source": PASTED_SOURCE,
        "hf": {
            "styles": PAGE_STYLES,
            "architectures": dict(HF_ARCHITECTURES),
            "kinds": dict(HF_KINDS),
            "bias_flags": list(HF_BIAS_FLAGS),
            "fields": {style: [{"field": f.field, "keys": list(f.keys), "kind": f.kind,
                                "required": f.required, "default": f.default} for f in fs]
                       for style, fs in HF_FIELDS.items()},
            "tied_by_default": {s: ModelConfig(style=s).tied for s in HF_FIELDS},
            # GPT-2's MLP width when n_inner is null, per unit of model width
            "gpt2_ffn_per_width": ModelConfig(style="gpt2", d_model=1, n_head=1).ffn_dim,
            "attention": ModelConfig().attention,
        },
        "moe": moe_data(),  # levers off for experts, the config.json table of their families
    }


_ESTIMATOR_STYLE = """
.memlab-est{--est-line:rgba(127,127,127,.55);--est-focus:#0072B2;color:inherit;
  border:1px solid var(--est-line);border-radius:6px;padding:.6em .8em;margin:.6em 0;
  max-width:100%;overflow-x:auto;line-height:1.35;font-size:.95em}
html[data-theme="dark"] .memlab-est,body[data-jp-theme-light="false"] .memlab-est,
body.vscode-dark .memlab-est,body.vscode-high-contrast .memlab-est{--est-focus:#56B4E9}
.memlab-est [hidden]{display:none!important}
.memlab-est .est-title{margin-bottom:.45em}
.memlab-est .est-badge{display:inline-block;border:1px solid var(--est-line);border-radius:3px;
  padding:0 .35em;font-size:.85em;font-style:italic;margin-right:.35em}
.memlab-est .est-controls{display:grid;grid-template-columns:repeat(auto-fill,minmax(15.5em,1fr));
  gap:.35em .9em;align-items:center}
.memlab-est .est-controls label{display:flex;gap:.4em;align-items:center;justify-content:space-between}
.memlab-est .est-controls label.est-check{justify-content:flex-start}
.memlab-est .est-controls select,.memlab-est .est-controls input[type=number]{font-size:.95em;
  width:10.5em;max-width:60%}
.memlab-est select:focus-visible,.memlab-est input:focus-visible,.memlab-est button:focus-visible,
.memlab-est textarea:focus-visible,.memlab-est summary:focus-visible{
  outline:3px solid var(--est-focus);outline-offset:1px}
.memlab-est .est-paste{margin:.5em 0 .2em;font-size:.92em}
.memlab-est .est-paste summary{cursor:pointer}
.memlab-est .est-paste textarea{display:block;width:100%;box-sizing:border-box;margin:.35em 0;
  font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em}
.memlab-est [data-role="config-status"]{margin-top:.25em}
.memlab-est [data-role="error"],.memlab-est [data-role="config-status"][data-state="error"]{
  color:#D55E00;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.88em}
.memlab-est [data-role="results"]{border-top:1px solid var(--est-line);margin-top:.5em;padding-top:.4em}
.memlab-est [data-role="note"]{font-style:italic}
.memlab-est [data-role="setup"]{font-size:.9em;opacity:.85}
.memlab-est .est-peak{font-weight:700;margin:.2em 0 .35em}
.memlab-est .est-row{display:grid;grid-template-columns:6.5em 1fr 7.5em;gap:.5em;align-items:center;
  margin:.15em 0}
.memlab-est .est-row[data-peak="true"] .est-phase{font-weight:700}
.memlab-est .est-bar{display:flex;height:1.1em;border:1px solid var(--est-line);border-radius:2px;
  overflow:hidden}
.memlab-est .est-bar span{display:block;height:100%}
.memlab-est .est-total{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.9em;
  text-align:right}
.memlab-est .est-legend,.memlab-est .est-gpus{display:flex;flex-wrap:wrap;gap:.2em 1em;font-size:.88em;
  margin:.35em 0}
.memlab-est .est-sw{display:inline-block;width:.85em;height:.85em;border-radius:2px;
  margin-right:.3em;vertical-align:-.1em}
.memlab-est [data-role="gpu"][data-fits="true"] [data-role="gpu-mark"]{color:#009E73;font-weight:700}
.memlab-est [data-role="gpu"][data-fits="false"] [data-role="gpu-mark"]{color:#D55E00;font-weight:700}
.memlab-est .est-usable,.memlab-est .est-foot{opacity:.8}
.memlab-est .est-foot{font-size:.82em;margin-top:.35em}
.memlab-est .est-levers{font-size:.85em;font-style:italic;margin:.3em 0}
"""


def _options(values, selected, labels=None) -> str:
    e = html.escape
    labels = labels or {}
    return "".join(f'<option value="{e(str(v))}"{" selected" if v == selected else ""}>'
                   f"{e(labels.get(v, str(v)))}</option>" for v in values)


def _results_html(r: dict, data: dict) -> str:
    """The read-out in the state the script also computes on load (or the error)."""
    e = html.escape
    ok = r["error"] is None
    phases_html = []
    for p in data["phases"]:
        ph = r["phases"][p] if ok else {"total": "", "bytes": 0,
                                        "categories": {c: 0 for c in _categories()}}
        segs = []
        for c in data["categories"]:
            b = ph["categories"][c["key"]]
            width = b / r["peak_bytes"] * 100 if ok and r["peak_bytes"] else 0
            title = f"{c['label']}: {_amount(b, r['unit'])}" if ok else c["label"]
            segs.append(f'<span data-category="{c["key"]}" data-bytes="{b}" title="{e(title)}" '
                        f'style="width:{width}%;background:{c["color"]}"></span>')
        peak = str(ok and p == r["peak_phase"]).lower()
        phases_html.append(
            f'<div class="est-row" data-role="phase" data-phase="{p}" data-bytes="{ph["bytes"]}" '
            f'data-peak="{peak}"><span class="est-phase">{p}</span>'
            f'<span class="est-bar" aria-hidden="true">{"".join(segs)}</span>'
            f'<span class="est-total" data-role="phase-total">{e(ph["total"])}</span></div>')
    legend = "".join(
        f'<span><span class="est-sw" style="background:{c["color"]}"></span>{e(c["label"])} '
        f'<span data-role="at-peak" data-category="{c["key"]}" data-bytes="'
        f'{r["phases"][r["peak_phase"]]["categories"][c["key"]] if ok else 0}">'
        f'{e(r["at_peak"][c["key"]]) if ok else ""}</span></span>' for c in data["categories"])
    gpus = "".join(
        f'<span data-role="gpu" data-gpu="{e(g["name"])}" data-fits="'
        f'{str(ok and r["gpus"][g["name"]]).lower()}">{e(g["name"])} '
        f'<span data-role="gpu-mark">{("✓" if r["gpus"][g["name"]] else "✗") if ok else ""}'
        f'</span> <span class="est-usable">({_amount(g["usable_bytes"], "GiB")} usable)</span>'
        f"</span>" for g in data["gpus"])
    return (
        f'<div data-role="error" role="alert"{"" if not ok else " hidden"}>'
        f'{e(r["error"] or "")}</div>'
        f'<div data-role="results" aria-live="polite"{" hidden" if not ok else ""}>'
        f'<div data-role="note"{"" if ok and r["note"] else " hidden"}>'
        f'{e(r["note"]) if ok else ""}</div>'
        f'<div data-role="setup">{e(r["setup"]) if ok else ""}</div>'
        f'<div class="est-peak" data-role="peak" data-bytes="{r["peak_bytes"] if ok else 0}" '
        f'data-phase="{r["peak_phase"] if ok else ""}">{e(r["peak"]) if ok else ""}</div>'
        f'<div class="est-bars">{"".join(phases_html)}</div>'
        f'<div class="est-legend"><span>at the peak (<span data-role="at-peak-phase">'
        f'{r["peak_phase"] if ok else ""}</span> phase):</span>{legend}</div>'
        f'<div class="est-gpus">{gpus}</div>'
        f'<div data-role="fits">{e(r["fits"]) if ok else ""}</div></div>')


def _estimator_html(setting: dict, model: str | ModelConfig, gpus) -> str:
    vid = f"memlab-est-{uuid.uuid4().hex[:12]}"
    e = html.escape
    data = estimator_data(model, gpus)
    menu, key = _menu_models(model)
    cfg = dict(menu)[key]
    r = estimate_readout(cfg, gpus=gpus, **setting)
    labels = {k: _model_label(c) for k, c in menu}
    model_opts = (_options([k for k, _ in menu], key, labels)
                  + f'<option value="{PASTED_KEY}" disabled>pasted config.json (paste one below)'
                  f"</option>")

    def number(role, label, value, options=None):
        listed = f' list="{vid}-{role}"' if options else ""
        datalist = (f'<datalist id="{vid}-{role}">{"".join(f"<option value={v}>" for v in options)}'
                    f"</datalist>") if options else ""
        return (f'<label>{label} <input type="number" data-role="{role}" min="1" step="1" '
                f'inputmode="numeric" value="{e(str(value))}"{listed}>{datalist}</label>')

    def select(role, label, values, value):
        return (f'<label>{label} <select data-role="{role}">{_options(values, value)}</select>'
                f"</label>")

    s = setting
    controls = (
        f'<label>model <select data-role="model">{model_opts}</select></label>'
        + number("batch_size", "batch size", s["batch_size"], BATCH_SIZES)
        + number("seq_len", "sequence length", s["seq_len"], SEQ_LENS)
        + select("precision", "precision", PRECISIONS, s["precision"])
        + select("optimizer", "optimizer", OPTIMIZERS, s["optimizer"])
        + select("optimizer_impl", "implementation", OPTIMIZER_IMPLS, s["optimizer_impl"])
        + select("attention", "attention", ATTENTION_IMPLS, s["attention"] or cfg.attention)
        + number("grad_accum_steps", "accumulation steps", s["grad_accum_steps"])
        + select("device", "conventions", DEVICES, s["device"])
        + number("context_parallel", "context-parallel ranks", s.get("context_parallel", 1),
                 (1, 2, 4, 8, 16, 32, 64))
        + number("loss_chunks", "loss chunks K", s.get("loss_chunks", 1), (1, 2, 4, 8, 16, 32))
        + f'<label class="est-check"><input type="checkbox" data-role="checkpointing"'
        f'{" checked" if s["checkpointing"] else ""}> activation checkpointing</label>'
        + f'<label class="est-check"><input type="checkbox" data-role="offload_activations"'
        f'{" checked" if s.get("offload_activations") else ""}> offload activations to the host'
        f"</label>")
    if cfg.moe is not None:  # the levers its estimate does not model: off (the script's too)
        for role in MOE_UNMODELLED:
            controls = controls.replace(f'data-role="{role}"', f'data-role="{role}" disabled')
    accepted = ", ".join(PAGE_STYLES)
    foot = (f"estimated: the formulas of memlab.memory.estimate, recomputed in this page at every "
            f"change (no kernel). A peak fits on a GPU when it is at most the GPU's usable memory "
            f"(memlab.gpus): the total nvidia-smi reports minus {fmt_bytes(RESERVED_BYTES)} kept "
            f"for CUDA's own share, the context and allocator slack.")
    return (
        f'<div class="memlab-est" id="{vid}" data-memlab-estimator="{data["version"]}" '
        f'data-state="{"ok" if r["error"] is None else "error"}">'
        f"<style>{_ESTIMATOR_STYLE}</style>"
        f'<div class="est-title"><span class="est-badge">estimated</span>'
        f"<strong>training memory per phase</strong>: change a control and the numbers follow"
        f"</div>"
        f'<div class="est-controls">{controls}</div>'
        f'<div class="est-levers" data-role="levers-note"{"" if cfg.moe else " hidden"}>'
        f'{e(unmodelled_note(cfg)) if cfg.moe else ""}</div>'
        f'<details class="est-paste"><summary>paste a Hugging Face config.json '
        f"(model_type {e(accepted)}, or architectures naming one)</summary>"
        f'<textarea data-role="config-text" rows="6" spellcheck="false" '
        f'aria-label="a Hugging Face config.json" placeholder="{e(_PLACEHOLDER)}"></textarea>'
        f'<button type="button" data-role="config-apply">estimate this config</button>'
        f'<div data-role="config-status" role="status"></div></details>'
        f"{_results_html(r, data)}"
        f'<div class="est-foot">{e(foot)}</div>'
        + mount_scripts(vid, data, script="estimator.js", module="memlabEstimator",
                        needs=("estimator_activations.js",))
        + "</div>"
    )


_PLACEHOLDER = ('{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, '
                '"num_attention_heads": 32, "num_key_value_heads": 4, "num_hidden_layers": 22, '
                '"vocab_size": 32000, "max_position_embeddings": 2048}')


class EstimatorView:
    """The kernel-free memory estimator for one starting setting (chapter: 1).

    It displays as self-contained HTML.
    """

    def __init__(self, model: str | ModelConfig, setting: dict, gpus) -> None:
        self.model = model
        self.setting = setting
        self.gpus = gpus

    def html(self) -> str:
        """The HTML block: style, controls, the read-out, the data and the script (chapter: 1)."""
        return _estimator_html(self.setting, self.model, self.gpus)

    def _repr_html_(self) -> str:
        return self.html()

    def readout(self) -> dict:
        """What the page shows first (:func:`estimate_readout`) (chapter: 1)."""
        return estimate_readout(self.model, gpus=self.gpus, **self.setting)

    def __repr__(self) -> str:
        r = self.readout()
        if r["error"]:
            return r["error"]
        lines = [r["note"]] if r["note"] else []
        lines += [r["setup"], r["peak"]]
        lines += [f"{p:<10} {r['phases'][p]['total']:>14}" for p in PHASES]
        lines.append(r["fits"] + f" (usable memory: {_usable_rule()})")
        return "\n".join(lines)


def memory_estimator(model: str | ModelConfig = "llama2-7b", *, batch_size: int = 1,
                     seq_len: int = 2048, precision: str = "bf16-mixed", optimizer: str = "adamw",
                     optimizer_impl: str = "foreach", attention: str | None = None,
                     checkpointing: bool = False, grad_accum_steps: int = 1,
                     device: str = "cuda", gpus=CATALOGUE,
                     context_parallel: int = 1, loss_chunks: int = 1,
                     offload_activations: bool = False) -> EstimatorView:
    """The memory estimator as a page piece that recomputes in the browser, no kernel needed (chapter: 1).

    ``model``: a preset name or a ModelConfig (e.g. from ``get_config("config.json")``); the
    other arguments are the starting setting, checked as memlab.memory.estimate checks them
    (a ``seq_len`` above the model's maximum is capped, with a note). A reader can also paste
    a Hugging Face config.json into the page.
    """
    _, key = _menu_models(model)
    setting = dict(batch_size=batch_size, seq_len=seq_len, precision=precision,
                   optimizer=optimizer, optimizer_impl=optimizer_impl,
                   attention=attention if attention is not None
                   else (model if isinstance(model, ModelConfig) else PRESETS[key]).attention,
                   checkpointing=checkpointing, grad_accum_steps=grad_accum_steps, device=device,
                   context_parallel=context_parallel, loss_chunks=loss_chunks,
                   offload_activations=offload_activations)
    gpus = tuple(get_gpu(g) for g in gpus)
    r = estimate_readout(model, gpus=gpus, **setting)
    if r["error"]:
        raise MemlabError(r["error"].removeprefix("memlab: error: "))
    return EstimatorView(model, setting, gpus)


# ---- settings for checking the script against Python ------------------------------------------

def _random_hf_config(rng: random.Random) -> dict:
    """A valid config.json of a random shape: GPT-2 or Llama style, GQA or not, any vocabulary,
    tied or not, MLP width given or GPT-2's default, experts or not."""
    mtype = rng.choice(sorted(PAGE_STYLES))
    nh = rng.choice([1, 2, 4, 6, 8, 12, 25, 32])
    C = nh * rng.choice([2, 6, 16, 64, 128])
    L = rng.choice([1, 2, 3, 12, 24])
    V = rng.choice([17, 512, 32000, 49152, 50257, 128256, 151936])
    if HF_STYLES[mtype] == "gpt2":
        raw = {"model_type": mtype, "n_embd": C, "n_layer": L, "n_head": nh,
               "n_positions": rng.choice([64, 1024, 2048]), "vocab_size": V}
        if rng.random() < 0.5:
            raw["n_inner"] = rng.choice([None, 3 * C, 4 * C + 5])
    else:
        raw = {"model_type": mtype, "hidden_size": C, "num_hidden_layers": L,
               "num_attention_heads": nh, "vocab_size": V,
               "intermediate_size": rng.choice([C, 3 * C, 2 * C + 7])}
        if rng.random() < 0.7:
            raw["num_key_value_heads"] = rng.choice([d for d in range(1, nh + 1) if nh % d == 0])
        if rng.random() < 0.7:
            raw["max_position_embeddings"] = rng.choice([64, 2048, 8192])
        if rng.random() < 0.3:
            raw["head_dim"] = C // nh
    if mtype in HF_MOE_FIELDS:
        raw.update(_random_experts(rng, mtype))
    if rng.random() < 0.4:
        raw["tie_word_embeddings"] = rng.choice([True, False, None])
    if rng.random() < 0.3:
        raw["_name_or_path"] = rng.choice(["org/a-model", ""])
    return raw


def _random_experts(rng: random.Random, mtype: str) -> dict:
    """The expert keys of a random mixture-of-experts config.json (Mixtral's or Qwen2-MoE's)."""
    E = rng.choice([1, 2, 4, 8, 60])
    raw = {"num_experts_per_tok": rng.choice([k for k in (1, 2, 4) if k <= E])}
    if rng.random() < 0.5:
        raw["router_aux_loss_coef"] = rng.choice([0, 0.001, 0.02])
    if mtype == "mixtral":
        return raw | {"num_local_experts": E}
    raw |= {"num_experts": E, "moe_intermediate_size": rng.choice([7, 64, 1408]),
            "shared_expert_intermediate_size": rng.choice([16, 5632])}
    for key, values in (("norm_topk_prob", [True, False, None]), ("decoder_sparse_step", [1]),
                        ("mlp_only_layers", [[]]), ("use_sliding_window", [False])):
        if rng.random() < 0.3:
            raw[key] = rng.choice(values)
    return raw


def _is_moe(key: str | None, raw: dict | None) -> bool:
    return PRESETS[key].moe is not None if raw is None else hf_model_type(raw) in HF_MOE_FIELDS


def test_settings(n: int = 420, seed: int = 0, hf_configs=()) -> list[tuple]:
    """Seeded settings for holding the script to Python (chapter: 1).

    Each is (preset, None, setting) or (None, config.json dict, setting).

    Every switch at random (some combinations are refused, as memlab.memory.estimate refuses
    them; a mixture of experts' unmodelled levers off, as the page sets them); one setting in
    three pastes a config.json, drawn from ``hf_configs`` or of a random shape. Each one's
    expected page is :func:`estimate_readout`.
    """
    rng = random.Random(seed)
    presets = [key for key, _ in _menu_models("llama2-7b")[0]]
    hf_configs = list(hf_configs)
    out = []
    for i in range(n):
        setting = dict(batch_size=rng.choice([1, 2, 3, 4, 8, 16, 64]),
                       seq_len=rng.choice([1, 7, 128, 512, 1000, 2048, 4096, 8192]),
                       precision=rng.choice(PRECISIONS), optimizer=rng.choice(OPTIMIZERS),
                       optimizer_impl=rng.choice(OPTIMIZER_IMPLS),
                       attention=rng.choice(ATTENTION_IMPLS), checkpointing=rng.random() < 0.5,
                       grad_accum_steps=rng.choice([1, 1, 1, 2, 4]), device=rng.choice(DEVICES))
        # context parallelism over ranks whose zig-zag split the sequence allows
        setting["context_parallel"] = rng.choice([n for n in (1, 1, 2, 4, 8)
                                                  if n == 1 or setting["seq_len"] % (2 * n) == 0])
        # the chunked loss (now and then one chunk more than the tokens, refused) and activation
        # offloading (now and then with the ring, refused)
        tokens = setting["batch_size"] * setting["seq_len"]
        chunks = rng.choice([k for k in (1, 1, 1, 1, 2, 3, 8, 64) if k <= tokens])
        setting["loss_chunks"] = tokens + 1 if rng.random() < 0.03 else chunks
        setting["offload_activations"] = rng.random() < (0.3 if setting["context_parallel"] == 1
                                                         else 0.03)
        if i % 3 == 2:
            key, raw = None, (rng.choice(hf_configs) if hf_configs and rng.random() < 0.5
                              else _random_hf_config(rng))
        else:
            key, raw = rng.choice(presets), None
        if _is_moe(key, raw):  # the page turns off what the MoE estimate does not model
            setting |= {role: off for role, (off, _) in MOE_UNMODELLED.items()}
        out.append((key, raw, setting))
    return out
