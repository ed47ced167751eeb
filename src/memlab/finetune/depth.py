"""Training only the last k blocks of a deep model: what stays, estimated and traced.

The book's own model has two blocks, so its "last block" is half the model. Llama-2-7B has 32:
training its last 1, 2 or 4 is what "train only the top layers" means in practice. Each row is
estimated (:func:`memlab.finetune.estimate.estimate_finetune`) and, where asked, traced on fake
tensors with the FLOPs of the step counted (:func:`memlab.measure.step.trace_step`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import MemlabError, check_positive_int
from memlab.finetune.estimate import estimate_finetune
from memlab.measure.step import trace_step
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec


@dataclass(frozen=True)
class DepthRow:
    """The last ``blocks`` blocks trained: estimated, and traced where asked (chapter: 5)."""

    blocks: int  # the last k blocks train; k = n_layer is full fine-tuning
    trainable_parameters: int
    saved_activations_bytes: int  # estimated
    peak_bytes: int  # estimated
    peak_phase: str  # estimated
    traced_peak_bytes: int | None  # None: not traced
    forward_flops: int | None  # counted on the traced step; None: not traced
    backward_flops: int | None


@dataclass(frozen=True)
class DepthTable:
    """The last k blocks of one model trained, for several k, at one batch and length (chapter: 5)."""

    model: str
    n_layer: int
    parameters: int
    batch_size: int
    seq_len: int
    precision: str
    rows: tuple[DepthRow, ...]

    def row(self, blocks: int) -> DepthRow:
        """The row with the last ``blocks`` blocks trained (chapter: 5)."""
        for r in self.rows:
            if r.blocks == blocks:
                return r
        raise MemlabError(f"no row trains the last {blocks!r} blocks; accepted: "
                          + ", ".join(str(r.blocks) for r in self.rows))


def depth_table(model: str | ModelConfig = "llama2-7b", *, blocks=(1, 2, 4, 8, 16, 32),
                traced=(), batch_size: int = 1, seq_len: int = 2048,
                precision: str = "bf16-mixed") -> DepthTable:
    """The last k blocks trained, for each k in ``blocks``, estimated (chapter: 5).

    Those in ``traced`` are also traced on fake tensors, with the step's FLOPs counted.
    """
    from memlab.finetune.compare import Setup

    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    ks = tuple(dict.fromkeys(blocks))
    for k in ks:
        check_positive_int("blocks", k)
        if k > cfg.n_layer:
            raise MemlabError(f"blocks {k} exceeds {cfg.name}'s {cfg.n_layer} blocks; accepted: "
                              f"1 to {cfg.n_layer}")
    unknown = [k for k in traced if k not in ks]
    if unknown:
        raise MemlabError(f"traced names {unknown[0]!r} blocks, which is not among blocks; "
                          f"accepted: {', '.join(map(str, ks))}")
    rows = []
    for k in ks:
        setup = Setup("full") if k == cfg.n_layer else Setup(f"last {k}", train_last=k)
        spec = StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        prepare=setup)
        est = estimate_finetune(spec)
        tr = trace_step(spec, count_flops=True) if k in traced else None
        rows.append(DepthRow(k, est.setup["trainable_parameters"], est.saved_activations_bytes,
                             est.peak_bytes, est.peak_phase,
                             tr.peak_bytes if tr else None,
                             tr.flops_by_phase["forward"] if tr else None,
                             tr.flops_by_phase["backward"] if tr else None))
    return DepthTable(cfg.name, cfg.n_layer, cfg.num_parameters(), batch_size, seq_len,
                      precision, tuple(rows))
