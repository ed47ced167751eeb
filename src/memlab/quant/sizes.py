"""The memory of a 20B model under each scheme, estimated from its shape (chapter: 3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memlab.errors import check_positive_int

# Memory of a 20B model -----------------------------------------------------------------------------
# GPT-NeoX-20B's published shape (EleutherAI config.json): the model popular material's "20B" is.
NEOX_20B = dict(d_model=6144, n_layer=44, vocab_size=50432, d_ff=24576)
CLAIMED_PARAMS = 20 * 10**9  # the claim's round "20B"


def _neox_20b_linears() -> list[tuple[int, int]]:
    """(out_features, in_features) of one block's linears: fused qkv, attention out, MLP in and out."""
    d, f = NEOX_20B["d_model"], NEOX_20B["d_ff"]
    return [(3 * d, d), (d, d), (f, d), (d, f)]


def neox_20b_groups() -> dict[str, int]:
    """Parameters of GPT-NeoX-20B by kind (chapter: 3).

    Block linear weights, embeddings + head, biases and norms.
    """
    d, L, V, f = (NEOX_20B[k] for k in ("d_model", "n_layer", "vocab_size", "d_ff"))
    linear = L * sum(o * i for o, i in _neox_20b_linears())
    biases_norms = L * (3 * d + d + f + d + 4 * d) + 2 * d  # linear biases, 2 LayerNorms per block, final
    return {"linear": linear, "embeddings": 2 * V * d, "biases+norms": biases_norms}


@dataclass(frozen=True)
class MemoryRow:
    """One scheme's weight memory for GPT-NeoX-20B, estimated from its shape (chapter: 3)."""

    scheme: str
    claimed_gb: float | None  # n * bits / 8, as popular material computes it
    weights_gb: float  # block linears with their scales, the rest in 16-bit (fp32 for fp32)
    bits_per_param: float  # per weight of the block linears, scales included
    model_bits_per_param: float = math.nan  # weights_gb over every parameter: the whole model

    @property
    def linear_bits_per_param(self) -> float:
        """Bits per weight of the block linears, scales included (= ``bits_per_param``)."""
        return self.bits_per_param


def memory_20b(*, blocksize: int = 64, quantize_embeddings: bool = False) -> list[MemoryRow]:
    """The 20B weight-memory table, naive against what the stored tensors take (chapter: 3).

    In GB (10^9 bytes). ``blocksize`` is the 4-bit formats' weights per absmax (bitsandbytes'
    default 64; GPTQ keeps its groups of 128); ``quantize_embeddings`` stores the embeddings and
    the head in each format too (bitsandbytes' ``Embedding8bit`` / ``Embedding4bit``) instead
    of 16-bit. Biases and norms stay 16-bit (fp32 in fp32).
    """
    from memlab.quant.functional import bits_per_parameter

    check_positive_int("blocksize", blocksize)
    g = neox_20b_groups()
    shapes = _neox_20b_linears()
    rows_per_param = sum(o for o, _ in shapes) / sum(o * i for o, i in shapes)  # one scale per row
    plan = [  # scheme, naive bits, linear bits (scales included), embedding bits (per row: d)
        ("fp32", 32, 32.0, 32.0),
        ("fp16", 16, 16.0, 16.0),
        ("int8 (per-row absmax)", 8, 8 + 32 * rows_per_param, 8 + 32 / NEOX_20B["d_model"]),
        ("nf4", 4, bits_per_parameter("nf4", blocksize=blocksize), None),
        ("nf4 + double quant", 4, bits_per_parameter("nf4", blocksize=blocksize,
                                                     double_quant=True), None),
        ("int4 GPTQ, groups of 128", 4, bits_per_parameter("int4-zp", blocksize=128), None),
    ]
    n = sum(g.values())
    rows = []
    for s, nb, lb, eb in plan:
        rest = 32 if nb == 32 else 16  # biases and norms
        emb = (lb if eb is None else eb) if quantize_embeddings or nb >= 16 else 16
        weight_bytes = (g["linear"] * lb + g["embeddings"] * emb + g["biases+norms"] * rest) / 8
        rows.append(MemoryRow(s, CLAIMED_PARAMS * nb / 8 / 1e9, weight_bytes / 1e9, lb,
                              8 * weight_bytes / n))
    return rows


def memory_20b_frame():
    """:func:`memory_20b` as a DataFrame with the units in its column names (chapter: 3)."""
    import pandas as pd

    return pd.DataFrame([{
        "scheme": r.scheme, "claimed GB (n x bits / 8)": r.claimed_gb,
        "weights GB (estimated)": r.weights_gb, "bits per linear weight": r.bits_per_param,
        "bits per parameter (whole model)": r.model_bits_per_param,
    } for r in memory_20b()]).set_index("scheme")
