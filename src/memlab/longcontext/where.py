"""Where long context puts the memory: the logits against the blocks, by sequence length (chapter: 8).

For one model at batch B and T tokens, the pieces of a training step that grow with T, each from
the estimator (:mod:`memlab.memory.activations`, held to traces in the tests):

* the LM head and the loss at their highest point: the (B, T, V) logits in the compute dtype and
  their fp32 copy in the forward pass, the fp32 gradients of log-softmax in the backward
  (:func:`memlab.memory.activations.head_peaks`): 6 or 8 bytes per token per vocabulary entry;
* the blocks' saved activations at the end of the forward pass: every block's list, or with
  full checkpointing each block's input (L x C elements per token);
* of those, attention's: SDPA keeps q, k, v, its output and a log-sum-exp (linear in T); an eager
  softmax keeps the (T x T) probabilities per head as well (quadratic);
* the KV cache a model serving the same T tokens holds (chapter 4), for comparison.

Every term but eager attention's is linear in T, so which one sets the peak does not change
with T; it changes with checkpointing, which divides the blocks' share by about 30 (chapter 7)
and leaves the logits alone, and with the vocabulary. The table says which is larger at each
length, with and without checkpointing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from memlab.errors import MemlabError, check_positive_int
from memlab.memory.activations import (
    activation_bytes,
    block_tensors,
    head_peaks,
    saved_tensors,
    stage_of,
)
from memlab.memory.estimator import estimate
from memlab.model.config import ModelConfig, get_config, kv_cache_bytes

SEQ_LENS = (2048, 8192, 32768, 131072)


@dataclass(frozen=True)
class LengthRow:
    """One sequence length, with or without checkpointing: the pieces that grow with T (chapter: 8)."""

    seq_len: int
    checkpointing: bool
    logits_bytes: int  # the head and the loss at their highest point (max of forward, backward)
    blocks_bytes: int  # the blocks' saved activations at the end of the forward pass
    attention_sdpa_bytes: int  # attention's share of those with SDPA, over all blocks
    attention_eager_bytes: int  # the same with an eager softmax (its T x T tensors added)
    kv_cache_bytes: int  # serving the same T tokens in 16 bits
    peak_bytes: int  # the whole step's estimated peak
    peak_phase: str

    @property
    def larger(self) -> str:
        """'logits' or 'blocks': the larger of the two at this length."""
        return "logits" if self.logits_bytes > self.blocks_bytes else "blocks"

    def as_dict(self) -> dict:
        return asdict(self) | {"larger": self.larger}


def _attention_saved(cfg: ModelConfig, B: int, T: int, precision: str, device: str) -> int:
    block = block_tensors(cfg, B, T, precision, device)
    return cfg.n_layer * sum(t.bytes for t in block if stage_of(t) == "attention")


def length_row(model: ModelConfig | str, seq_len: int, *, batch_size: int = 1,
               precision: str = "bf16-mixed", checkpointing: bool = False,
               loss_chunks: int = 1, device: str = "cuda") -> LengthRow:
    """The pieces of one step at ``seq_len`` tokens (chapter: 8)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_positive_int("seq_len", seq_len)
    if seq_len > cfg.max_seq_len:  # the shapes hold at any length: give it room
        cfg = replace(cfg, max_seq_len=seq_len)
    B, T = batch_size, seq_len
    logits = max(head_peaks(cfg, B, T, precision, loss_chunks))
    saved = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                          checkpointing=checkpointing, device=device, loss_chunks=loss_chunks)
    blocks = activation_bytes([t for t in saved if t.scope in ("layer", "lowest", "blocks")],
                              cfg.n_layer)
    sdpa = _attention_saved(replace(cfg, attention="sdpa"), B, T, precision, device)
    eager = _attention_saved(replace(cfg, attention="eager"), B, T, precision, device)
    est = estimate(cfg, batch_size=B, seq_len=T, precision=precision,
                   checkpointing=checkpointing, loss_chunks=loss_chunks, device=device)
    kv = kv_cache_bytes(cfg, batch_size=B, tokens=T)
    return LengthRow(T, bool(checkpointing), logits, blocks, sdpa, eager, kv, est.peak_bytes,
                     est.peak_phase)


@dataclass(frozen=True)
class LengthTable:
    """The pieces of a step over sequence lengths, with and without checkpointing (chapter: 8)."""

    model: str
    vocab_size: int
    batch_size: int
    precision: str
    loss_chunks: int
    rows: tuple[LengthRow, ...]

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "rows"} | {
            "rows": [r.as_dict() for r in self.rows]}

    def row(self, seq_len: int, checkpointing: bool) -> LengthRow:
        for r in self.rows:
            if r.seq_len == seq_len and r.checkpointing == checkpointing:
                return r
        raise MemlabError(f"no row for seq_len {seq_len!r} with checkpointing={checkpointing!r}; "
                          f"lengths: {', '.join(str(r.seq_len) for r in self.rows)}")

    def larger(self, checkpointing: bool) -> set[str]:
        """Which piece is larger, over every length, with or without checkpointing."""
        return {r.larger for r in self.rows if r.checkpointing == checkpointing}


def length_table(model: ModelConfig | str = "llama3.1-8b", seq_lens=SEQ_LENS, *,
                 batch_size: int = 1, precision: str = "bf16-mixed", loss_chunks: int = 1,
                 device: str = "cuda") -> LengthTable:
    """:func:`length_row` at each length, with and without full checkpointing (chapter: 8)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    seq_lens = tuple(seq_lens)
    if not seq_lens:
        raise MemlabError("seq_lens must name at least one sequence length")
    rows = tuple(length_row(cfg, T, batch_size=batch_size, precision=precision,
                            checkpointing=ckpt, loss_chunks=loss_chunks, device=device)
                 for ckpt in (False, True) for T in seq_lens)
    return LengthTable(cfg.name, cfg.vocab_size, batch_size, precision, loss_chunks, rows)
