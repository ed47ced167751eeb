"""The kernel-free estimator's mixture of experts: what the page computes for a model with experts.

The bytes are :func:`memlab.moe.estimate.estimate_moe`'s (balanced routing, as a trace routes);
the page's script reads the MoE block from the walk's ``moe`` tables
(:func:`memlab.moe.saved.moe_saved_tensors`, written down by :mod:`memlab.interactive.walk`).
The page's levers that ``estimate_moe`` does not model yet (:data:`MOE_UNMODELLED`) are off
and disabled for a mixture of experts, with the reason shown; one it learns (checkpointing,
expert parallelism) leaves that table and is passed on in :func:`moe_estimate`.
"""

from __future__ import annotations

from memlab.errors import MemlabError, check_choice
from memlab.memory.estimator import DEVICES, MemoryEstimate
from memlab.model.config import (
    HF_FIXED,
    HF_MOE_FIELDS,
    HF_MOE_FIXED,
    HF_STYLES,
    ModelConfig,
    hf_model_type,
)
from memlab.model.step import StepSpec
from memlab.moe.estimate import estimate_moe

# Each lever the MoE estimate does not model yet, with the value that leaves it off, and its
# words on the page (the control's role is the key).
MOE_UNMODELLED = {
    "checkpointing": (False, "activation checkpointing"),
    "grad_accum_steps": (1, "gradient accumulation"),
    "context_parallel": (1, "context parallelism"),
    "loss_chunks": (1, "the chunked loss"),
    "offload_activations": (False, "activation offloading"),
}
# The mixture-of-experts families a pasted config.json may be (memlab.model.config reads them),
# and the keys that give a config's experts away when its family is another one: those families'
# own, DeepSeek-V2/V3's routed experts and the experts per token most families name so.
MOE_STYLES = {t: HF_STYLES[t] for t in HF_MOE_FIELDS}
EXPERT_KEYS = tuple(sorted({k for fs in HF_MOE_FIELDS.values() for f in fs
                            if f.field in ("experts", "top_k") for k in f.keys}
                           | {"n_routed_experts"}))
# The families whose config.json may make some blocks dense (_hf_moe refuses those).
SPARSE_STEP_FAMILIES = ("qwen2_moe",)


def _unmodelled_text() -> str:
    words = [w for _, w in MOE_UNMODELLED.values()]
    return (f"is a mixture of experts: its estimate (memlab.moe.estimate_moe, balanced "
            f"routing) does not model {', '.join(words[:-1])} or {words[-1]} yet, so those "
            f"controls are off")


def unmodelled_note(cfg: ModelConfig) -> str:
    """Why some of the page's controls are off for a mixture of experts (chapter: 9)."""
    return f"{cfg.name} {_unmodelled_text()}"


def check_levers(cfg: ModelConfig, levers: dict) -> None:
    """A one-line error for the first lever set that the MoE estimate does not model (chapter: 9)."""
    for role, (off, words) in MOE_UNMODELLED.items():
        value = levers.get(role, off)
        if (bool(value) if isinstance(off, bool) else value) != off:
            raise MemlabError(f"{words} is not modelled for a mixture of experts yet "
                              f"({cfg.name}): got {role} {value!r}; accepted: {off!r}")


def moe_estimate(cfg: ModelConfig, *, batch_size, seq_len, precision: str, optimizer: str,
                 optimizer_impl: str, attention: str, device: str, **levers) -> MemoryEstimate:
    """The page's estimate of an MoE model: the switches checked as for a dense one (chapter: 9).

    Then :func:`memlab.moe.estimate.estimate_moe`; a lever of :data:`MOE_UNMODELLED` that is
    on gives a one-line error.
    """
    spec = StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                    optimizer=optimizer, optimizer_impl=optimizer_impl,
                    checkpointing=levers.get("checkpointing", False),
                    grad_accum_steps=levers.get("grad_accum_steps", 1), attention=attention,
                    loss_chunks=levers.get("loss_chunks", 1),
                    offload_activations=levers.get("offload_activations", False))
    check_choice("device", device, DEVICES)
    check_levers(cfg, levers)
    # The seam: a lever estimate_moe learns (checkpointing=..., an expert-parallel degree) leaves
    # MOE_UNMODELLED and is passed on here; the walk's moe tables then take its variants
    # (memlab.interactive.walk.MOE_SWITCHES), and the script's estimate reads them.
    return estimate_moe(spec.config, batch_size=batch_size, seq_len=seq_len,
                        precision=precision, optimizer=optimizer, optimizer_impl=optimizer_impl,
                        device=device)


def refuse_other_moe(raw, source: str, styles: dict) -> None:
    """A one-line error for a config.json with experts whose family the page does not read (chapter: 9)."""
    mtype = hf_model_type(raw) if isinstance(raw, dict) else None
    if isinstance(mtype, str) and mtype not in styles and any(k in raw for k in EXPERT_KEYS):
        raise MemlabError(f"{source} has model_type {mtype!r}, a mixture of experts this page does "
                          f"not read; accepted mixtures of experts: {', '.join(MOE_STYLES)}")


def script_moe(cfg: ModelConfig) -> dict:
    """A config's experts as the page's script reads them (chapter: 9)."""
    m = cfg.moe
    return dict(qkv_bias=cfg.qkv_bias,
                moe=dict(experts=m.experts, top_k=m.top_k, d_ff=m.d_ff, shared_d_ff=m.shared_d_ff,
                         shared_gate=m.shared_gate, norm_topk_prob=m.norm_topk_prob,
                         capacity_factor=m.capacity_factor, aux_loss_coef=m.aux_loss_coef))


def moe_data() -> dict:
    """What the script needs for experts beyond the walk: levers off, config.json's table (chapter: 9)."""
    return {
        "unmodelled": [{"role": role, "off": off, "words": words}
                       for role, (off, words) in MOE_UNMODELLED.items()],
        "note": _unmodelled_text(),  # after the model's name
        "styles": dict(MOE_STYLES),
        "expert_keys": list(EXPERT_KEYS),
        "sparse_step_families": list(SPARSE_STEP_FAMILIES),
        "fields": {t: [{"field": f.field, "keys": list(f.keys), "kind": f.kind,
                        "required": f.required, "default": f.default} for f in fs]
                   for t, fs in HF_MOE_FIELDS.items()},
        "fixed": {t: dict(HF_MOE_FIXED.get(t, {})) for t in HF_MOE_FIELDS},
        "config_fixed": {t: dict(HF_FIXED.get(t, {})) for t in HF_MOE_FIELDS},
    }
