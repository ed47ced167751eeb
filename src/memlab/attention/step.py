"""Attention inside a whole training step: eager, SDPA and the book's FlashAttention compared.

:func:`attention_in_step` measures a step of a small model on this device for each attention,
and estimates (optionally also traces) a large preset at long contexts: the bytes the blocks
save for backward, the part of them attention keeps, and the step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import check_positive_int
from memlab.measure.step import measure_step, trace_step
from memlab.memory.activations import saved_by_stage
from memlab.memory.estimator import estimate
from memlab.model.config import ATTENTION_IMPLS, ModelConfig, get_config


@dataclass(frozen=True)
class StepRow:
    """One attention at one length: saved activations, their attention share, the peak (chapter: 4)."""

    model: str
    attention: str
    T: int
    how: str  # "measured", "traced" or "estimated"
    activations_bytes: int
    attention_bytes: int  # saved by the attention core of every block (estimated split)
    peak_bytes: int
    estimated_peak_bytes: int

    @property
    def attention_share(self) -> float:
        """Attention's part of the saved activations, 0..1."""
        return self.attention_bytes / self.activations_bytes

    @property
    def peak_ratio(self) -> float:
        """Estimated peak over this row's peak (1.0 for an estimated row)."""
        return self.estimated_peak_bytes / self.peak_bytes


@dataclass(frozen=True)
class StepComparison:
    """A small model measured, a large preset estimated (and traced where asked) (chapter: 4)."""

    small: tuple[StepRow, ...]
    large: tuple[StepRow, ...]
    precision: str

    def rows(self, model: str, attention: str, how: str | None = None) -> list[StepRow]:
        """The rows of one model and attention, by T."""
        return sorted((r for r in self.small + self.large if r.model == model
                       and r.attention == attention and (how is None or r.how == how)),
                      key=lambda r: r.T)


def _row(cfg: ModelConfig, attention: str, T: int, how: str, batch_size: int,
         precision: str) -> StepRow:
    c = replace(cfg, attention=attention, max_seq_len=max(cfg.max_seq_len, T))
    kw = dict(batch_size=batch_size, seq_len=T, precision=precision)
    est = estimate(c, device="cpu", **kw)
    attn = saved_by_stage(list(est.saved))["attention"] * c.n_layer
    if how == "estimated":
        return StepRow(c.name, attention, T, how, est.saved_activations_bytes, attn, est.peak_bytes,
                       est.peak_bytes)
    got = (measure_step(c, device="cpu", **kw) if how == "measured" else trace_step(c, **kw))
    return StepRow(c.name, attention, T, how, got.saved_activations_bytes, attn, got.peak_bytes,
                   est.peak_bytes)


def attention_in_step(small: str | ModelConfig = "tiny", small_lengths=(128, 512),
                      large: str | ModelConfig = "llama2-7b",
                      large_lengths=(2048, 4096, 8192, 16384, 32768), *, traced_lengths=(),
                      batch_size: int = 1, precision: str = "bf16-mixed",
                      attentions=ATTENTION_IMPLS) -> StepComparison:
    """Training steps with each attention (chapter: 4).

    ``small`` is measured on the CPU, ``large`` estimated and traced at ``traced_lengths``.

    The large preset's ``max_seq_len`` is raised to the longest length asked (a context
    extension: the shapes are the model's, the positions are more).
    """
    check_positive_int("batch_size", batch_size)
    small_cfg = small if isinstance(small, ModelConfig) else get_config(small)
    large_cfg = large if isinstance(large, ModelConfig) else get_config(large)
    s = tuple(_row(small_cfg, a, T, "measured", batch_size, "fp32")
              for a in attentions for T in small_lengths)
    big = tuple(_row(large_cfg, a, T, "traced" if T in traced_lengths else "estimated",
                     batch_size, precision)
                for a in attentions for T in large_lengths)
    return StepComparison(s, big, precision)
