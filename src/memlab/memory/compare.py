"""Other popular memory estimators, each computed by its own conventions.

The book's estimator (:mod:`memlab.memory.estimator`) models a training step tensor by tensor and takes
the largest phase. The estimators people usually reach for make different choices, and the
chapter shows their ratio to a traced or measured step side by side. Each one here follows
its source's conventions faithfully, quirks included, and says which in ``convention`` and
``notes``:

* :func:`accelerate_estimate`: Hugging Face accelerate's ``accelerate estimate-memory``,
  run through accelerate's own functions on the book's model (built on the meta device).
* :func:`eleutherai_estimate`: EleutherAI cookbook's ``calc/calc_transformer_mem.py``
  (Anthony, Schoelkopf, Minhas), the arithmetic of "Transformer Math 101".
* :func:`bytes_per_param_estimate`: the "16 bytes per parameter" rule of ZeRO
  (Rajbhandari et al., arXiv 1910.02054, section 3.1), or 18, 20, 24.
* :func:`rule_of_thumb_loading`: "4 GB per billion parameters", the fp32 weights alone.

Every function returns an :class:`OtherEstimate`; :func:`all_estimates` gives the list the
chapter tabulates and :func:`comparison_table` divides each by a measured peak (chapter 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from memlab.errors import MemlabError, check_choice, check_positive_int, require
from memlab.model.config import PRECISIONS, ModelConfig, get_config
from memlab.model.transformer import build_model
from memlab.units import to_unit

# accelerate's estimate_training_usage() rows: 'float32' for fp32 training, the 16-bit row for
# the rest. The CLI itself offers only float32 and float16 (plus int8/int4, which it shows as
# "N/A" for training); the function treats 'bfloat16' exactly like 'float16'.
ACCELERATE_ROW = {"fp32": "float32", "fp16-mixed": "float16", "bf16-mixed": "bfloat16",
                  "bf16": "bfloat16"}

# EleutherAI's calc_transformer_mem.py defaults (DEFAULTS in the script).
ELEUTHER_LOW_PREC_BYTES = 2  # --low-prec-bytes-per-val
ELEUTHER_HIGH_PREC_BYTES = 4  # --high-prec-bytes-per-val
ELEUTHER_GRAD_BYTES = 4  # --bytes-per-grad-ele
ELEUTHER_OPTIMIZER_BYTES = 12  # AdamW: fp32 master copy, momentum, variance
ELEUTHER_ALLGATHER_BUCKET = 500_000_000  # --zero-allgather-bucket-size (elements)
ELEUTHER_ZERO3_LIVE_PARAMS = 1_000_000_000  # --zero3-max-live-params

# Documented splits of the bytes-per-parameter rules: (weights, gradients, optimizer states).
BYTES_PER_PARAM_SPLITS = {
    16: ((2, 2, 12), "ZeRO section 3.1: fp16 weights and gradients, fp32 master copy + Adam m, v"),
    18: ((2, 4, 12), "Megatron / GPT-NeoX: 16-bit weights, fp32 gradients, 12 bytes of AdamW"),
}


@dataclass(frozen=True)
class OtherEstimate:
    """Bytes of a training step by another estimator's conventions (None: it has no such term)."""

    name: str
    convention: str  # one line: what the method counts and how it combines the terms
    parameters_bytes: int | None
    gradients_bytes: int | None
    optimizer_states_bytes: int | None
    saved_activations_bytes: int | None
    total_bytes: int  # the number the method reports
    notes: str  # its quirks, and how this reproduction relates to its source
    details: dict = field(default_factory=dict)  # method-specific extras (parameter counts, ...)

    def ratio_to(self, measured_bytes: int) -> float:
        """This estimate's total divided by a measured or traced peak (chapter: 1)."""
        if isinstance(measured_bytes, bool) or not isinstance(measured_bytes, (int, float)) \
                or measured_bytes <= 0:
            raise MemlabError(f"measured_bytes must be a positive number, got {measured_bytes!r}")
        return self.total_bytes / measured_bytes

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 1)."""
        return asdict(self)


def _config(model: ModelConfig | str) -> ModelConfig:
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return get_config(model)
    raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")


def _check_bool(what: str, value) -> bool:
    if not isinstance(value, bool):
        raise MemlabError(f"{what} must be True or False, got {value!r}")
    return value


# Hugging Face accelerate ---------------------------------------------------------------------
def accelerate_estimate(model: ModelConfig | str, precision: str = "fp32", *,
                        drop_lm_head: bool = False) -> OtherEstimate:
    """Training bytes by ``accelerate estimate-memory`` ("Training using Adam"), run offline (chapter: 1).

    Source: ``accelerate/commands/estimate.py`` (accelerate 1.15). The CLI builds the Hub
    model in float32 on the meta device, calls ``calculate_maximum_sizes(model)`` (bytes of
    every parameter and buffer, a tied weight once) and, for each dtype row,
    ``estimate_training_usage(total_fp32_bytes, dtype)``, which returns four stages of an
    fp32-sized model F: float32 ``model F, gradients F, optimizer 2F, step 4F``; float16 /
    bfloat16 ``model F, gradients 1.5F, optimizer 2F, step 2F``. The table shows the *largest*
    stage, not their sum: 16 bytes/param in float32, 8 in 16 bits. Here the model is the
    book's :class:`memlab.model.transformer.Transformer`, built on the meta device; ``drop_lm_head``
    reproduces the CLI's ``AutoModel``, which for untied models has no LM head.
    """
    cfg = _config(model)
    check_choice("precision", precision, PRECISIONS)
    _check_bool("drop_lm_head", drop_lm_head)
    require("accelerate", "accelerate_estimate", extra="compare")
    import torch

    mdl = build_model(cfg, device="meta", dtype=torch.float32)  # the CLI passes float32 too
    if drop_lm_head:
        del mdl.lm_head  # a tied head's weight stays, counted under the embedding
    return _accelerate_from_model(mdl, precision, name=cfg.name, drop_lm_head=drop_lm_head)


def _accelerate_from_model(mdl, precision: str, *, name: str = "model",
                           drop_lm_head: bool = False) -> OtherEstimate:
    """Run accelerate's sizing functions on any module (the part tests can feed buffers to)."""
    try:
        from accelerate.commands.estimate import estimate_training_usage
        from accelerate.utils import calculate_maximum_sizes
    except ImportError as exc:  # an accelerate too old or too new for these two functions
        raise MemlabError(f"accelerate_estimate needs accelerate's calculate_maximum_sizes and "
                          f"estimate_training_usage, which this accelerate lacks ({exc}); "
                          "install it with: pip install 'memlab[compare]'") from None

    total_size, (largest_bytes, largest_names) = calculate_maximum_sizes(mdl)
    row = ACCELERATE_ROW[precision]
    stages = estimate_training_usage(total_size, row)
    training = max(stages.values())  # estimate_command(): max(item.values()) of the dict
    # The "Total Size" column: the fp32 total, halved for the 16-bit row (gather_data()).
    load = total_size if row == "float32" else total_size // 2
    params = sum(p.numel() for p in mdl.parameters())
    buffers = sum(b.numel() * b.element_size() for b in mdl.buffers())
    head = " without the LM head (AutoModel)" if drop_lm_head else ""
    return OtherEstimate(
        name="accelerate estimate-memory" + (" (AutoModel: no LM head)" if drop_lm_head else ""),
        convention=(f"{row} row: the largest of four stages of an fp32-sized model F "
                    "(model, gradients, optimizer, step); batch size 1, no activations"),
        parameters_bytes=stages["model"],
        gradients_bytes=stages["gradients"],
        optimizer_states_bytes=stages["optimizer"],
        saved_activations_bytes=None,
        total_bytes=training,
        notes=(f"{name}{head}: {params:,} parameters and {buffers:,} bytes of buffers, both "
               "counted by calculate_maximum_sizes. The total is a max over stages, not a sum: "
               f"the 'step' stage ({stages['step']:,} bytes) is {stages['step'] / total_size:g} F. "
               "The CLI prints GiB under the label 'GB' (convert_bytes divides by 1024)."
               + (" Its 16-bit figure (8 bytes/param) is below the 16 bytes/param that "
                  "fp32 master weights, gradients and Adam states alone need under autocast."
                  if precision.endswith("-mixed") else "")),
        details={"accelerate_row": row, "stage_bytes": dict(stages), "parameters": params,
                 "buffer_bytes": buffers, "load_bytes": load,
                 "largest_layer_bytes": largest_bytes, "largest_layer": list(largest_names)},
    )


# EleutherAI cookbook ---------------------------------------------------------------------------
def eleutherai_parameter_count(model: ModelConfig | str, *, seq_len: int) -> int:
    """Parameters by calc_transformer_mem.py's own formula (chapter: 1).

    They are for comparison with the true count.

    ``2Vh + hs + 8hL + 2h + 2(1 + kv)Lh^2 + n_mlp L f h^2`` with ``f`` the FFN expansion
    factor, ``kv`` the key/value-to-query head ratio (``--kv-size-ratio``), ``n_mlp`` 3 for
    SwiGLU and 2 for GELU: it always counts an untied head, learned positions for
    ``seq_len`` tokens and LayerNorm biases, whatever the model actually has. ``kv`` is the
    model's true ratio, as a user passing ``-kv`` would set it; the script's Hugging Face
    config path leaves it at 1.0 (its ``num_key_value_heads`` line is commented out).
    """
    cfg = _config(model)
    check_positive_int("seq_len", seq_len)
    h, L, V = cfg.d_model, cfg.n_layer, cfg.vocab_size
    kv_ratio = cfg.kv_heads / cfg.n_head
    n_mlp = 2 if cfg.style == "gpt2" else 3
    ffn_factor = cfg.ffn_dim / h
    total = (2 * V * h + h * seq_len + 8 * h * L + 2 * h
             + int(2 * (1 + kv_ratio) * L * h * h) + n_mlp * L * h * ffn_factor * h)
    return round(total)


def eleutherai_activation_bytes(model: ModelConfig | str, *, batch_size: int, seq_len: int,
                                checkpointing: bool = False) -> int:
    """Activation bytes by calc_transformer_mem.py (chapter: 1).

    The formula is sbhL(34 + 5as/h), or 34sbhL when checkpointing.

    The script writes the coefficients as ``16 p + 2`` and ``2 p + 1`` with ``p`` the 2-byte
    low precision (Korthikanti et al., arXiv 2205.05198, Table 2). Computed exactly here as
    ``34 sbhL + 5 a s^2 b L``.
    """
    cfg = _config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    _check_bool("checkpointing", checkpointing)
    s, b, h, L, a = seq_len, batch_size, cfg.d_model, cfg.n_layer, cfg.n_head
    p = ELEUTHER_LOW_PREC_BYTES
    per_token = (16 * p + 2) * s * b * h * L
    if checkpointing:
        return per_token
    return per_token + (2 * p + 1) * a * s * s * b * L


def _shard(n_bytes: int, ways: int) -> int:
    return -(-n_bytes // ways)  # a shard is a whole number of bytes: round up


def eleutherai_estimate(model: ModelConfig | str, *, batch_size: int, seq_len: int,
                        precision: str = "bf16-mixed", checkpointing: bool = False,
                        zero_stage: int = 0, num_gpus: int = 1) -> OtherEstimate:
    """Per-GPU training bytes by EleutherAI's calc_transformer_mem.py conventions (chapter: 1).

    Source: EleutherAI/cookbook ``calc/calc_transformer_mem.py`` (read at commit 069ae2e).
    Mixed precision: 2-byte weights, 4-byte gradients, 12 bytes of AdamW state (18
    bytes/param); with ``precision='fp32'`` (the script's ``--disable-mixed-precision``) the
    weights take 4 bytes but gradients, optimizer and activations keep their mixed-precision
    sizes, as in the script. Activations are :func:`eleutherai_activation_bytes`. ZeRO
    divides optimizer states (stage >= 1), gradients (>= 2) and weights (3) by ``num_gpus``
    and adds communication buffers; the total is the sum of all terms. Parameters:
    ``cfg.num_parameters()``, not the script's formula (:func:`eleutherai_parameter_count`).
    """
    cfg = _config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, PRECISIONS)
    _check_bool("checkpointing", checkpointing)
    if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
        raise MemlabError(f"unknown zero_stage {zero_stage!r}; accepted: 0, 1, 2, 3")
    check_positive_int("num_gpus", num_gpus)

    n = cfg.num_parameters()
    mixed = precision != "fp32"
    bytes_per_param = ELEUTHER_LOW_PREC_BYTES if mixed else ELEUTHER_HIGH_PREC_BYTES
    weights = n * bytes_per_param
    grads = n * ELEUTHER_GRAD_BYTES
    optimizer = n * ELEUTHER_OPTIMIZER_BYTES
    if zero_stage == 3:
        weights = _shard(weights, num_gpus)
    if zero_stage >= 2:
        grads = _shard(grads, num_gpus)
    if zero_stage >= 1:
        optimizer = _shard(optimizer, num_gpus)
    comm = 0
    if zero_stage >= 1 and num_gpus > 1:
        comm += ELEUTHER_ALLGATHER_BUCKET * bytes_per_param
    if zero_stage == 3 and num_gpus > 1:
        comm += ELEUTHER_ZERO3_LIVE_PARAMS * bytes_per_param
    acts = eleutherai_activation_bytes(cfg, batch_size=batch_size, seq_len=seq_len,
                                       checkpointing=checkpointing)
    total = weights + grads + optimizer + acts + comm
    their_n = eleutherai_parameter_count(cfg, seq_len=seq_len)
    notes = [
        f"{n:,} parameters from the config (the script's own formula gives {their_n:,}: it "
        "always adds learned positions, LayerNorm biases and an untied head).",
        "Activations assume a GPT layer with dropout and materialised attention scores "
        "(Korthikanti et al. Table 2): no FlashAttention, no logits or loss term, no "
        "optimizer temporaries; all terms are summed, not maxed over phases.",
    ]
    if checkpointing:
        notes.append("With --checkpoint-activations the script keeps 34sbhL, which is "
                     "Korthikanti's selective recompute; full checkpointing stores only about "
                     "2sbhL (each block's input).")
    if precision == "bf16":
        notes.append("The script has no pure-16-bit mode: pure bf16 is counted as mixed "
                     "precision (fp32 gradients and master weights).")
    if precision == "fp32":
        notes.append("--disable-mixed-precision changes only the weights (4 bytes); "
                     "gradients, optimizer and activations keep their mixed-precision sizes.")
    return OtherEstimate(
        name="EleutherAI calc_transformer_mem",
        convention=(f"{bytes_per_param} + 4 + 12 bytes/param plus sbhL(34 + 5as/h) activations"
                    + (" (34sbhL with checkpointing)" if checkpointing else "")
                    + ", all summed"),
        parameters_bytes=weights,
        gradients_bytes=grads,
        optimizer_states_bytes=optimizer,
        saved_activations_bytes=acts,
        total_bytes=total,
        notes=" ".join(notes),
        details={"parameters": n, "parameters_their_formula": their_n,
                 "communication_bytes": comm, "zero_stage": zero_stage, "num_gpus": num_gpus,
                 "checkpointing": checkpointing, "mixed_precision": mixed},
    )


# Rules of thumb --------------------------------------------------------------------------------
def bytes_per_param_estimate(model: ModelConfig | str, bytes_per_param: float = 16) -> OtherEstimate:
    """Training bytes by the "N bytes per parameter" rule, no activations (chapter: 1).

    N is 16 by default; 18, 20 and 24 are also seen.

    Source of the 16: ZeRO (Rajbhandari et al., arXiv 1910.02054, section 3.1), mixed-
    precision Adam as 2 + 2 + 12 bytes. 18 is Megatron/GPT-NeoX accounting (fp32
    gradients). Other values have no canonical split, so only the total is given.
    """
    cfg = _config(model)
    if isinstance(bytes_per_param, bool) or not isinstance(bytes_per_param, (int, float)) \
            or bytes_per_param <= 0:
        raise MemlabError(f"bytes_per_param must be a positive number, got {bytes_per_param!r}")
    n = cfg.num_parameters()
    split = BYTES_PER_PARAM_SPLITS.get(bytes_per_param)
    w = g = o = None
    if split is not None:
        (bw, bg, bo), why = split
        w, g, o = bw * n, bg * n, bo * n
        note = f"Split {bw} + {bg} + {bo}: {why}."
    else:
        note = "No documented split of this rule into weights, gradients and optimizer states."
    return OtherEstimate(
        name=f"{bytes_per_param:g} bytes/param",
        convention=f"{bytes_per_param:g} bytes per parameter for weights, gradients and Adam "
                   "states; no activations",
        parameters_bytes=w,
        gradients_bytes=g,
        optimizer_states_bytes=o,
        saved_activations_bytes=None,
        total_bytes=round(bytes_per_param * n),
        notes=note + " Ignores activations, temporaries and the batch entirely.",
        details={"parameters": n, "bytes_per_param": bytes_per_param},
    )


def rule_of_thumb_loading(model: ModelConfig | str) -> OtherEstimate:
    """Bytes by "4 GB per billion parameters": fp32 weights only, GB = 10^9 bytes (chapter: 1)."""
    cfg = _config(model)
    n = cfg.num_parameters()
    total = 4 * n  # 4e9 bytes * (n / 1e9), exactly
    return OtherEstimate(
        name="4 GB per billion parameters",
        convention="fp32 weights only (4 bytes/param), in GB of 10^9 bytes: loading, not training",
        parameters_bytes=total,
        gradients_bytes=None,
        optimizer_states_bytes=None,
        saved_activations_bytes=None,
        total_bytes=total,
        notes=("A rule for loading a model in fp32; it has no gradients, optimizer states or "
               f"activations. {n / 1e9:.3f} billion parameters -> {total / 1e9:.2f} GB "
               f"({to_unit(total, 'GiB'):.2f} GiB)."),
        details={"parameters": n},
    )


# All of them -----------------------------------------------------------------------------------
def all_estimates(model: ModelConfig | str, *, batch_size: int, seq_len: int,
                  precision: str = "fp32", checkpointing: bool = False) -> list[OtherEstimate]:
    """Every other estimator for one training setup, in the order the chapter lists them (chapter: 1).

    accelerate (the book's full model, and without the LM head as the CLI's AutoModel has it,
    for untied models), EleutherAI, 16 bytes/param, 4 GB per billion parameters.
    """
    cfg = _config(model)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_choice("precision", precision, PRECISIONS)
    _check_bool("checkpointing", checkpointing)
    out = [accelerate_estimate(cfg, precision)]
    if not cfg.tied:
        out.append(accelerate_estimate(cfg, precision, drop_lm_head=True))
    out += [
        eleutherai_estimate(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                            checkpointing=checkpointing),
        bytes_per_param_estimate(cfg, 16),
        rule_of_thumb_loading(cfg),
    ]
    return out


def comparison_table(estimates: list[OtherEstimate], measured_bytes: int, unit: str = "GiB"):
    """A pandas DataFrame of estimates in ``unit`` with each total's ratio to a measured peak (chapter: 1)."""
    pd = require("pandas", "comparison_table", extra="notebook")
    to_unit(0, unit)  # checks the unit
    rows = []
    for e in estimates:
        if not isinstance(e, OtherEstimate):
            raise MemlabError(f"estimates must be OtherEstimate objects, got {e!r}")

        def conv(v):
            return None if v is None else to_unit(v, unit)

        rows.append({
            "method": e.name,
            f"weights ({unit})": conv(e.parameters_bytes),
            f"gradients ({unit})": conv(e.gradients_bytes),
            f"optimizer ({unit})": conv(e.optimizer_states_bytes),
            f"activations ({unit})": conv(e.saved_activations_bytes),
            f"total ({unit})": conv(e.total_bytes),
            "ratio to measured": e.ratio_to(measured_bytes),
            "convention": e.convention,
        })
    return pd.DataFrame(rows).set_index("method")
