"""Where an MoE step's bytes go when the router is balanced and when it is not (chapter: 9).

A skewed router sends more of a block's N·k rows to one expert. Dropless (no capacity factor)
the experts keep N·k rows in all whatever the split, so the saved bytes do not move; only the
busiest expert's working set (its SwiGLU's (rows_e, F) tensors and their gradients) grows with
its share, which moves the step's peak only where that working set is what sets it. With a capacity factor (GShard, Lepikhin et al. 2020;
Switch Transformer, Fedus et al. 2021) the rows past an expert's capacity are dropped, and the
saved bytes fall as the skew grows: R = sum_e min(rows_e, capacity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memlab.compute.flops import moe_rows
from memlab.errors import MemlabError, check_positive_int
from memlab.memory.activations import activation_bytes
from memlab.model.config import ModelConfig, get_config
from memlab.model.moe import Routing
from memlab.moe.saved import moe_mlp_tensors, moe_saved_tensors


def skewed_routing(experts: int, top_k: int, share: float) -> Routing:
    """One expert gets ``share`` of the N·k rows, the others split the rest evenly (chapter: 9).

    ``share`` runs from 1/E (balanced) to 1/k (every token sends one row to that expert).
    """
    lo, hi = 1 / experts, 1 / top_k
    if not isinstance(share, (int, float)) or not lo - 1e-12 <= share <= hi + 1e-12:
        raise MemlabError(f"share must be a number from 1/experts = {lo:.4g} to 1/top_k = "
                          f"{hi:.4g}, got {share!r}")
    if experts == 1:
        return Routing([1.0])
    return Routing([share] + [(1 - share) / (experts - 1)] * (experts - 1))


@dataclass(frozen=True)
class RoutingBytes:
    """One step's saved activations and MoE bytes under one routing, estimated and traced (chapter: 9)."""

    share: float  # the busiest expert's share of the rows
    rows: tuple  # rows each expert computes in a block
    moe_block_bytes: int  # what one block's MoE MLP saves (estimated)
    saved_bytes: int  # the step's saved activations (estimated)
    traced_saved_bytes: int | None  # the same, traced (None when not traced)
    traced_peak_bytes: int | None  # the step's peak, traced

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 9)."""
        return asdict(self)


def routing_bytes(cfg: ModelConfig | str, *, batch_size: int, seq_len: int,
                  precision: str = "bf16-mixed", shares=(None,), trace: bool = True,
                  device: str = "cpu") -> list[RoutingBytes]:
    """Saved bytes and peak of a step for balanced (None) and skewed routings (chapter: 9).

    Each share is the busiest expert's (:func:`skewed_routing`); the trace routes every block
    the same way (:func:`memlab.model.moe.trace_routing`).
    """
    from memlab.measure.step import trace_step
    from memlab.model.moe import trace_routing

    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if cfg.moe is None:
        raise MemlabError(f"routing_bytes needs an MoE config, got {cfg.name!r} (dense)")
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    m, N = cfg.moe, batch_size * seq_len
    out = []
    for share in shares:
        routing = (Routing.balanced(m.experts) if share is None
                   else skewed_routing(m.experts, m.top_k, share))
        saved = moe_saved_tensors(cfg, batch_size=batch_size, seq_len=seq_len,
                                  precision=precision, device=device, routing=routing)
        block = sum(t.bytes for t in moe_mlp_tensors(cfg, batch_size, seq_len, precision, routing))
        traced = None
        if trace:
            with trace_routing(routing):
                traced = trace_step(cfg, batch_size=batch_size, seq_len=seq_len,
                                    precision=precision)
        out.append(RoutingBytes(
            share=1 / m.experts if share is None else share,
            rows=tuple(moe_rows(cfg, N, routing)), moe_block_bytes=block,
            saved_bytes=activation_bytes(saved, cfg.n_layer),
            traced_saved_bytes=traced.saved_activations_bytes if traced else None,
            traced_peak_bytes=traced.peak_bytes if traced else None))
    return out
