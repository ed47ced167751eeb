"""Attention inside a whole training step: eager, SDPA and the book's FlashAttention compared.

:func:`attention_in_step` measures a step of a small model on this device for each attention,
and estimates (optionally also traces) a large preset at long contexts: the bytes the blocks
save for backward, the part of them attention keeps, and the step's peak.

A large preset's step is estimated with the CPU's autocast conventions, the ones its trace on
this machine follows, and with CUDA's beside them (:data:`CONVENTIONS`). They differ for eager
attention under mixed precision: CPU autocast leaves the softmax in 16 bits, so the step keeps
one 16-bit copy of the T x T probabilities; CUDA autocast runs the softmax in fp32 (it keeps P
in fp32) and P @ V, a matrix product, in 16 bits, which keeps its own 16-bit copy of P. Per
head and per score that is 2 bytes against 4 + 2 (:func:`square_bytes_per_score`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import check_choice, check_positive_int
from memlab.measure.step import measure_step, trace_step
from memlab.memory.activations import saved_by_stage
from memlab.memory.estimator import estimate
from memlab.model.config import ATTENTION_IMPLS, ModelConfig, get_config

# Whose autocast rules an estimate follows: the CPU's (what a trace on this machine runs) and
# CUDA's (what a GPU runs), in the words a page prints.
CONVENTIONS = {
    "cpu": "CPU autocast: the softmax in 16 bits, one 16-bit P kept",
    "cuda": "CUDA autocast: the softmax in fp32 (P kept in fp32), P @ V in 16 bits (its 16-bit "
            "copy of P kept too)",
}


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
    estimated_peak_bytes: int  # the estimate with the CPU's autocast conventions
    # The same step estimated with CUDA's autocast conventions (None in a record made before).
    cuda_activations_bytes: int | None = None
    cuda_attention_bytes: int | None = None
    cuda_peak_bytes: int | None = None

    @property
    def attention_share(self) -> float:
        """Attention's part of the saved activations, 0..1."""
        return self.attention_bytes / self.activations_bytes

    @property
    def cuda_attention_share(self) -> float | None:
        """Attention's part of the saved activations under CUDA's conventions, 0..1."""
        if self.cuda_attention_bytes is None:
            return None
        return self.cuda_attention_bytes / self.cuda_activations_bytes

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

    def conventions(self) -> list[dict]:
        """The large preset's estimates by the CPU's and by CUDA's autocast conventions (chapter: 4).

        One dict per attention and T: saved activations (GiB), attention's share of them and
        the estimated peak (GiB) under each; the CPU's saved bytes are the row's own (estimated,
        or traced where the row was traced). Rows of a record made before the CUDA estimate was
        kept are left out.
        """
        out = []
        for r in sorted(self.large, key=lambda r: (r.attention, r.T)):
            if r.cuda_activations_bytes is None:
                continue
            out.append({"attention": r.attention, "T": r.T,
                        "CPU rows": r.how,  # estimated, or traced on fake tensors
                        "saved GiB, CPU": r.activations_bytes / 2**30,
                        "saved GiB, CUDA": r.cuda_activations_bytes / 2**30,
                        "attention share, CPU": r.attention_share,
                        "attention share, CUDA": r.cuda_attention_share,
                        "peak GiB, CPU": r.estimated_peak_bytes / 2**30,
                        "peak GiB, CUDA": r.cuda_peak_bytes / 2**30})
        return out


def autocast_casts(op: str, device: str) -> bool:
    """Whether ``device``'s autocast has a kernel for ``op`` (casts its inputs) (chapter: 4).

    Asked of PyTorch's dispatcher, which registers CUDA's autocast lists on every build, so a
    CPU-only machine can read them: ``autocast_casts("aten::softmax.int", "cuda")`` is True (CUDA's
    fp32 list), ``"cpu"`` False; ``"aten::matmul"`` is on both 16-bit lists.
    """
    import torch

    check_choice("device", device, tuple(CONVENTIONS))
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device]
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, key)


def square_bytes_per_score(config: str | ModelConfig, T: int = 1024, *,
                           precision: str = "bf16-mixed", device: str = "cpu") -> float:
    """Bytes one block keeps per head per score in T x T tensors, by ``device``'s conventions (chapter: 4).

    The estimator's saved tensors of shape (B, nh, T, T) over B * nh * T * T: 2 for eager
    attention under bf16 autocast on a CPU (one bf16 P), 6 on CUDA (fp32 P and its bf16 copy
    for P @ V); 0 for SDPA and the book's flash attention. The (T, T) causal mask, shared by
    every head, is not counted.
    """
    check_choice("device", device, tuple(CONVENTIONS))
    check_positive_int("T", T)
    cfg = config if isinstance(config, ModelConfig) else get_config(config)
    c = replace(cfg, max_seq_len=max(cfg.max_seq_len, T))
    est = estimate(c, device=device, batch_size=1, seq_len=T, precision=precision)
    square = sum(t.bytes for t in est.saved if t.scope == "layer" and t.shape == "(B, nh, T, T)")
    return square / (c.n_head * T * T)


def recorded_cuda_eager(results=None) -> tuple[str, list[dict]] | None:
    """The GPU record's eager steps under bf16 autocast: CUDA's conventions held to it (chapter: 4).

    From the ``estimator-cuda`` record (real steps on a GPU, the estimate with CUDA's conventions
    beside the allocator's peak and MemTracker's saved bytes): its label and, per step, the
    estimated and the tracked saved bytes and peaks. None where no GPU record is stored
    (``memlab run estimator-cuda --scale full --out results/`` on a GPU makes one).
    """
    from memlab.results import recorded

    rec = recorded("estimator-cuda", device="cuda", results=results)
    if rec is None:
        return None
    rows = [dict(model=r.model, T=r.seq_len, checkpointing=r.checkpointing,
                 saved_estimated=r.estimated_saved_bytes, saved_tracked=r.tracker_saved_bytes,
                 saved_ratio=r.estimated_saved_bytes / r.tracker_saved_bytes,
                 peak_ratio=r.ratio)
            for r in rec.value().rows
            if r.attention == "eager" and r.precision == "bf16-mixed" and r.setup == "full"]
    return rec.label, rows


def _row(cfg: ModelConfig, attention: str, T: int, how: str, batch_size: int,
         precision: str) -> StepRow:
    c = replace(cfg, attention=attention, max_seq_len=max(cfg.max_seq_len, T))
    kw = dict(batch_size=batch_size, seq_len=T, precision=precision)
    est = estimate(c, device="cpu", **kw)
    attn = saved_by_stage(list(est.saved))["attention"] * c.n_layer
    on_gpu = estimate(c, device="cuda", **kw)
    cuda = dict(cuda_activations_bytes=on_gpu.saved_activations_bytes,
                cuda_attention_bytes=saved_by_stage(list(on_gpu.saved))["attention"] * c.n_layer,
                cuda_peak_bytes=on_gpu.peak_bytes)
    if how == "estimated":
        return StepRow(c.name, attention, T, how, est.saved_activations_bytes, attn, est.peak_bytes,
                       est.peak_bytes, **cuda)
    got = (measure_step(c, device="cpu", **kw) if how == "measured" else trace_step(c, **kw))
    return StepRow(c.name, attention, T, how, got.saved_activations_bytes, attn, got.peak_bytes,
                   est.peak_bytes, **cuda)


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
