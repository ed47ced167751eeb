"""What an MoE model keeps for the backward pass, for a given routing (chapter: 9).

Read against :class:`memlab.model.moe.MoE` line by line: the router's input, its fp32
probabilities (the softmax's output), the top-k ids, the renormalization's operands, the sorted
order and each row's token (int64), the dispatch buffer ``h[token]`` (R rows, R the rows the
experts keep), each expert's SwiGLU tensors on its own rows, the combine's concatenated outputs
and weights, the shared expert and its gate, and the balancing loss's two (E,) factors.
Everything outside the MLP is the dense block's (:func:`memlab.memory.activations.saved_tensors`).
"""

from __future__ import annotations

from dataclasses import replace

from memlab.compute.flops import moe_rows
from memlab.errors import MemlabError
from memlab.memory.activations import COMPUTE_BYTES, SavedTensor, saved_tensors
from memlab.model.config import ModelConfig
from memlab.model.moe import Routing


def _dt(nbytes: int) -> str:
    return "fp32" if nbytes == 4 else "bf16"


_DENSE_MLP = {"gate projection", "silu(gate)", "up projection", "silu(gate) * up"}


def moe_weight_numel(cfg: ModelConfig) -> int:
    """Elements of one MoE block's Linear weights: attention, router, experts, shared (chapter: 9)."""
    C, kv = cfg.d_model, cfg.kv_heads * cfg.head_dim
    return 2 * C * C + 2 * C * kv + cfg.moe.block_parameters(C)


def moe_mlp_tensors(cfg: ModelConfig, B: int, T: int, precision: str,
                    routing: Routing | None = None, *, rows=None) -> list[SavedTensor]:
    """What one block's MoE MLP saves beyond the MLP norm, in forward order (chapter: 9).

    ``rows``: R, the rows the experts keep, given (the page's walk, whose sizes are symbols);
    by default those of :func:`memlab.compute.flops.moe_rows` under ``routing``.
    """
    m, C, N = cfg.moe, cfg.d_model, B * T
    E, k = m.experts, m.top_k
    R = sum(moe_rows(cfg, N, routing)) if rows is None else rows
    cb = COMPUTE_BYTES[precision]
    mixed = precision.endswith("-mixed")
    hb = 4 if mixed else cb  # the norm's output: fp32 under autocast
    cdt, hdt = _dt(cb), _dt(hb)

    def t(name, shape, dtype, nbytes):
        return SavedTensor(f"MLP (experts) {name}", "layer", shape, dtype, nbytes)

    out = [t("router probabilities (fp32 softmax)", "(N, E)", "fp32", N * E * 4),
           t("top-k expert ids", "(N, k)", "int64", N * k * 8)]
    if m.norm_topk_prob:
        out += [t("top-k weights before renormalizing", "(N, k)", "fp32", N * k * 4),
                t("sum of the top-k weights", "(N, 1)", "fp32", N * 4)]
    if m.aux_loss_coef:  # a loss not trained keeps no graph (memlab.model.moe.keep_aux_loss)
        out.append(t("balancing loss: routed shares and mean probabilities", "2 x (E,)", "fp32",
                     8 * E))
    out += [t("rows sorted by expert (argsort order)", "(R,)", "int64", R * 8),
            t("token of each row", "(R,)", "int64", R * 8)]
    if mixed:
        out.append(t("dispatched rows cast to 16 bits, once per Linear (2)", "2 x (R, C)", "bf16",
                     2 * R * C * 2))
    else:
        out.append(t("dispatch buffer h[token]", "(R, C)", hdt, R * C * hb))
    out += [t(f"experts: {name}", "(R, F)", cdt, R * m.d_ff * cb)
            for name in ("gate projection", "silu(gate)", "up projection", "silu(gate) * up")]
    out.append(t("experts' outputs, concatenated", "(R, C)", cdt, R * C * cb))
    wb = 2 if precision == "bf16" else 4  # the rows' weights, cast to the stream's dtype
    out += [t("routing weights of the rows", "(R,)", _dt(wb), R * wb),
            t("weighted rows (the combine's source, kept by index_add_)", "(R, C)", _dt(wb),
              R * C * wb)]
    if m.shared_d_ff:
        Fs = m.shared_d_ff
        out += [t(f"shared expert: {name}", "(N, F_s)", cdt, N * Fs * cb)
                for name in ("gate projection", "silu(gate)", "up projection", "silu(gate) * up")]
        if m.shared_gate:
            out += [t("shared expert's output", "(N, C)", cdt, N * C * cb),
                    t("sigmoid of the shared gate", "(N, 1)", cdt, N * cb)]
    return out


def moe_saved_tensors(cfg: ModelConfig, *, batch_size: int, seq_len: int,
                      precision: str = "fp32", device: str = "cpu",
                      routing: Routing | None = None, rows=None) -> list[SavedTensor]:
    """Every tensor an MoE model saves for backward, without checkpointing (chapter: 9).

    The dense parts are :func:`memlab.memory.activations.saved_tensors`'s; the MLP is
    :func:`moe_mlp_tensors` under ``routing`` (default balanced, as a trace routes), or over
    ``rows`` rows.
    """
    if cfg.moe is None or cfg.style != "llama":
        raise MemlabError(f"moe_saved_tensors needs a Llama-style MoE config, got {cfg.name!r}")
    m = cfg.moe
    dense = saved_tensors(replace(cfg, moe=None), batch_size=batch_size, seq_len=seq_len,
                          precision=precision, device=device)
    linears = 1 + (2 if m.shared_d_ff else 0) + (1 if m.shared_gate else 0)
    N, C = batch_size * seq_len, cfg.d_model
    out = []
    for s in dense:
        if s.scope == "layer" and s.name in _DENSE_MLP:
            continue
        if s.name.startswith("Linear weights cast"):
            s = replace(s, bytes=2 * moe_weight_numel(cfg))
        elif s.name.startswith("MLP norm: output cast"):
            s = replace(s, name=f"MLP norm: output cast to 16 bits, once per Linear ({linears})",
                        shape=f"{linears} x (B, T, C)", bytes=linears * N * C * 2)
        out.append(s)
    at = max(i for i, s in enumerate(out) if s.name.startswith("MLP norm")) + 1
    return out[:at] + moe_mlp_tensors(cfg, batch_size, seq_len, precision, routing,
                                          rows=rows) + out[at:]
