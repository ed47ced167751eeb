"""Chapter 1's tables: the estimator next to a measured or traced step, as DataFrames (chapter: 1).

Each function runs the library and assembles one table the chapter shows; pandas is imported
when a table is made (the ``notebook`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable

from memlab.measure.step import StepMemory, trace_step
from memlab.memory.compare import all_estimates
from memlab.memory.estimator import MemoryEstimate, estimate, estimate_inference
from memlab.model.config import get_config
from memlab.model.step import STEP_WORDS
from memlab.units import fmt_bytes

Pairs = dict[tuple, tuple[StepMemory, MemoryEstimate]]


def category_table(est: MemoryEstimate, step: StepMemory, label: str,
                   fields: tuple[str, ...] = ("parameters_bytes", "gradients_bytes",
                                              "optimizer_states_bytes", "saved_activations_bytes",
                                              "peak_bytes")):
    """The same byte fields of an estimate and a measured (or traced) step, and their ratio (chapter: 1)."""
    import pandas as pd

    rows = [(STEP_WORDS[f], getattr(est, f), getattr(step, f)) for f in fields]
    return pd.DataFrame([(k, f"{e:,}", f"{m:,}", f"{e / m:.4f}") for k, e, m in rows],
                        columns=[label, "estimated (bytes)", f"{step.mode} here (bytes)",
                                 f"estimated / {step.mode}"])


def trace_and_estimate(setups: Iterable[tuple[str, str, int]], *, seq_len: int = 2048,
                       optimizer: str = "adamw") -> Pairs:
    """Each ``(model, precision, batch size)`` traced and estimated (CPU conventions) (chapter: 1)."""
    pairs = {}
    for name, precision, batch_size in setups:
        kw = dict(batch_size=batch_size, seq_len=seq_len, precision=precision, optimizer=optimizer)
        pairs[name, precision, batch_size] = (trace_step(name, **kw), estimate(name, device="cpu", **kw))
    return pairs


def trace_table(pairs: Pairs):
    """Saved activations and peak, traced and estimated, with the peak's ratio and phase (chapter: 1)."""
    import pandas as pd

    return pd.DataFrame(
        [(n, p, fmt_bytes(t.saved_activations_bytes), fmt_bytes(e.saved_activations_bytes),
          fmt_bytes(t.peak_bytes), fmt_bytes(e.peak_bytes), f"{e.peak_bytes / t.peak_bytes:.4f}",
          t.peak_phase) for (n, p, _), (t, e) in pairs.items()],
        columns=["model", "precision", "activations (traced)", "activations (estimated)",
                 "peak (traced)", "peak (estimated)", "estimated / traced", "peak phase"])


def estimators_table(pairs: Pairs, *, seq_len: int = 2048):
    """Every other estimator's total over the traced peak, and memlab's, per set-up (chapter: 1)."""
    import pandas as pd

    rows = []
    for (name, precision, batch_size), (t, e) in pairs.items():
        setup = f"{name}, {precision}, {batch_size} x {seq_len}"
        for o in all_estimates(get_config(name), batch_size=batch_size, seq_len=seq_len,
                               precision=precision):
            rows.append((o.name, setup, o.total_bytes / t.peak_bytes))
        rows.append(("memlab.memory.estimate", setup, e.peak_bytes / t.peak_bytes))
    ratios = pd.DataFrame(rows, columns=["method", "setup", "ratio"]).pivot(
        index="method", columns="setup", values="ratio")
    return ratios.round(3).rename_axis(columns="estimate / traced peak")


def job_peaks(models: Iterable[str], *, seq_len: int = 2048, new_tokens: int = 64) -> dict[str, int]:
    """Estimated peak bytes of inference and three training set-ups per model, by job name (chapter: 1).

    Inference is bf16 with a ``seq_len``-token KV cache; training is bf16-mixed fused AdamW at
    batch 1 and 8, and 8 with checkpointing. ``seq_len`` is capped by each model's context.
    """
    rows = {}
    for name in models:
        cfg = get_config(name)
        T = min(seq_len, cfg.max_seq_len)
        rows[f"{name}: inference, {T}-token cache"] = estimate_inference(
            cfg, 1, T - new_tokens, "bf16", new_tokens).peak_bytes
        for B, ckpt in ((1, False), (8, False), (8, True)):
            rows[f"{name}: training, {B} x {T}{', checkpointing' if ckpt else ''}"] = estimate(
                cfg, batch_size=B, seq_len=T, precision="bf16-mixed", optimizer="adamw",
                optimizer_impl="fused", checkpointing=ckpt).peak_bytes
    return rows
