"""Which GPU fits which fine-tuning set-up.

Estimated for real model shapes, traced where tracing works.

Every row comes from :func:`memlab.finetune.estimate.estimate_finetune`; a row is also traced on
fake tensors (:func:`memlab.measure.step.trace_step`) when asked and when the set-up can be traced
(bitsandbytes' 4-bit weights cannot be faked). Full fine-tuning and frozen blocks keep fp32 master
weights (``bf16-mixed``); LoRA and QLoRA store the frozen base in 16 bits (pure ``bf16``) with fp32
adapters, as a model loaded in bf16 and wrapped by peft does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from memlab.errors import MemlabError, check_positive_int
from memlab.finetune.compare import Setup
from memlab.finetune.estimate import estimate_finetune
from memlab.finetune.lora import LoraConfig
from memlab.gpus import CATALOGUE, get_gpu
from memlab.measure.step import trace_step
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec
from memlab.quant.sizes import NEOX_20B as NEOX_20B_SHAPE

# GPT-NeoX-20B's shapes, as chapter 3 counts its weights (memlab.quant.sizes: 44 layers,
# d_model 6144, d_ff 24576, vocabulary 50,432) with its 64 heads (Black et al. 2022,
# arXiv:2204.06745, Table 1) and untied embeddings. The book's gpt2 style (LayerNorm, GELU MLP,
# learned positions instead of rotary) gives the same linear layers.
NEOX_20B = ModelConfig(name="neox-20b", style="gpt2", n_head=64, max_seq_len=2048,
                       tie_embeddings=False, **NEOX_20B_SHAPE)

# The set-ups of the fit table, each with the precision it is usually run in.
PLAN_SETUPS = (
    (Setup("full"), "bf16-mixed"),
    (Setup("last 2 blocks", train_last=2), "bf16-mixed"),
    (Setup("LoRA q,v r=8", lora=LoraConfig(r=8)), "bf16"),
    (Setup("LoRA all r=16", lora=LoraConfig(r=16, alpha=32, target_modules="all-linear")), "bf16"),
    (Setup("QLoRA all r=16", lora=LoraConfig(r=16, alpha=32, target_modules="all-linear"),
           quantize_base="nf4-dq"), "bf16"),
)


@dataclass(frozen=True)
class FitRow:
    """One model and set-up: its estimated (and perhaps traced) peak and the GPUs it fits (chapter: 5)."""

    model: str
    setup: str
    precision: str
    checkpointing: bool
    trainable_parameters: int
    weights_bytes: int
    activations_bytes: int
    peak_bytes: int  # estimated
    traced_peak_bytes: int | None  # traced on fake tensors; None where not traced
    fits: dict[str, bool]  # GPU name -> the estimated peak within its usable bytes


@dataclass(frozen=True)
class FitTable:
    """Fine-tuning set-ups of several models at one batch and sequence (chapter: 5).

    They are set against the GPU catalogue.
    """

    batch_size: int
    seq_len: int
    rows: tuple[FitRow, ...]

    def row(self, model: str, setup: str, checkpointing: bool = False) -> FitRow:
        """The row of ``model`` and ``setup`` (chapter: 5)."""
        for r in self.rows:
            if (r.model, r.setup, r.checkpointing) == (model, setup, checkpointing):
                return r
        raise MemlabError(f"no row for {model!r}, {setup!r}, checkpointing={checkpointing}; "
                          f"accepted set-ups: {', '.join(dict.fromkeys(r.setup for r in self.rows))}")

    def smallest_gpu(self, row: FitRow) -> str | None:
        """The catalogue's smallest GPU that fits ``row``, or None (chapter: 5)."""
        fitting = [get_gpu(g) for g, ok in row.fits.items() if ok]
        return min(fitting, key=lambda g: g.usable_bytes).name if fitting else None


def _row(cfg: ModelConfig, setup: Setup, precision: str, B: int, T: int, ckpt: bool,
         trace: bool, gpus) -> FitRow:
    spec = StepSpec(cfg, batch_size=B, seq_len=T, precision=precision, checkpointing=ckpt,
                    prepare=setup)
    est = estimate_finetune(spec)
    traced = None
    if trace and setup.quantize_base is None:
        traced = trace_step(spec).peak_bytes
    return FitRow(cfg.name, setup.name, precision, ckpt, est.setup["trainable_parameters"],
                  est.parameters_bytes, est.saved_activations_bytes, est.peak_bytes, traced,
                  {get_gpu(g).name: est.peak_bytes <= get_gpu(g).usable_bytes for g in gpus})


def fit_table(models=("llama2-7b", "llama2-13b", "llama2-70b"), *, batch_size: int = 4,
              seq_len: int = 2048, checkpointing=(False, True), traced=(), setups=PLAN_SETUPS,
              gpus=CATALOGUE) -> FitTable:
    """Every set-up of every model, estimated, against each GPU (chapter: 5).

    Traced too for the models in ``traced``.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    cfgs = [m if isinstance(m, ModelConfig) else get_config(m) for m in models]
    unknown = [t for t in traced if t not in {c.name for c in cfgs}]
    if unknown:
        raise MemlabError(f"traced names {unknown[0]!r}, which is not among the models; accepted: "
                          + ", ".join(c.name for c in cfgs))
    rows = tuple(_row(cfg, s, prec, batch_size, seq_len, ckpt, cfg.name in traced, gpus)
                 for cfg in cfgs for s, prec in setups for ckpt in checkpointing)
    return FitTable(batch_size, seq_len, rows)


@dataclass(frozen=True)
class ContextRow:
    """Full fine-tuning and LoRA at one sequence length: peaks and the activations' share (chapter: 5).

    LoRA is estimated twice: in full fine-tuning's precision (the base kept as full fine-tuning
    keeps its weights), and with the frozen base stored in 16 bits. The first ratio is what
    training fewer parameters saves; the second what storing the frozen base in 16 bits saves;
    their product is LoRA as usually run against full fine-tuning.
    """

    seq_len: int
    full_peak_bytes: int
    lora_peak_bytes: int  # LoRA in lora_precision (a base stored in 16 bits)
    lora_activation_bytes: int
    lora_same_peak_bytes: int  # LoRA in full fine-tuning's precision
    lora_same_activation_bytes: int

    @property
    def fewer_trained(self) -> float:
        """LoRA's peak over full fine-tuning's, both in full fine-tuning's precision."""
        return self.lora_same_peak_bytes / self.full_peak_bytes

    @property
    def base_in_16_bits(self) -> float:
        """LoRA's peak with a 16-bit base over LoRA's in full fine-tuning's precision."""
        return self.lora_peak_bytes / self.lora_same_peak_bytes

    @property
    def lora_over_full(self) -> float:
        """LoRA's peak (a 16-bit base) over full fine-tuning's: the product of the two savings."""
        return self.lora_peak_bytes / self.full_peak_bytes

    @property
    def activation_share(self) -> float:
        """The share of LoRA's peak (a 16-bit base) that is saved activations."""
        return self.lora_activation_bytes / self.lora_peak_bytes

    @property
    def same_activation_share(self) -> float:
        """The share of LoRA's peak in full fine-tuning's precision that is saved activations."""
        return self.lora_same_activation_bytes / self.lora_same_peak_bytes


@dataclass(frozen=True)
class ContextSweep:
    """LoRA against full fine-tuning as the context grows (chapter: 5).

    Also the choice of rank and targets at one length.
    """

    model: str
    batch_size: int
    precision: str  # full fine-tuning's
    lora_precision: str  # LoRA's, as usually run
    checkpointing: bool
    rows: tuple[ContextRow, ...]
    choice_seq_len: int
    choices: dict[str, int]  # 'r=8 on q_proj,v_proj' -> estimated peak bytes


def context_sweep(model: str = "llama2-7b", *, batch_size: int = 1,
                  lengths=(512, 1024, 2048, 4096, 8192, 16384), ranks=(4, 8, 16, 64),
                  targets=(("q_proj", "v_proj"), "all-linear"), choice_seq_len: int = 4096,
                  precision: str = "bf16-mixed", lora_precision: str = "bf16",
                  checkpointing: bool = False) -> ContextSweep:
    """Estimated peaks of full fine-tuning and LoRA against T (chapter: 5).

    LoRA with r=8 on q, v; then rank and targets at one T.

    Full fine-tuning runs in ``precision`` (fp32 master weights by default); LoRA in that
    precision too, and in ``lora_precision``, a base stored in 16 bits by default, as a model
    loaded in bf16 and wrapped by peft is.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    # Longer than the model was trained for is a shape question here: memory, not quality.
    cfg = replace(cfg, max_seq_len=max(cfg.max_seq_len, *lengths, choice_seq_len))
    lora = LoraConfig(r=8)
    rows = []
    for T in lengths:
        kw = dict(batch_size=batch_size, seq_len=T, checkpointing=checkpointing)
        full = estimate_finetune(cfg, precision=precision, **kw)
        lo = estimate_finetune(cfg, lora=lora, precision=lora_precision, **kw)
        same = estimate_finetune(cfg, lora=lora, precision=precision, **kw)
        rows.append(ContextRow(T, full.peak_bytes, lo.peak_bytes, lo.saved_activations_bytes,
                               same.peak_bytes, same.saved_activations_bytes))
    choices = {}
    for tgt in targets:
        for r in ranks:
            lc = LoraConfig(r=r, alpha=2 * r, target_modules=tgt)
            name = tgt if isinstance(tgt, str) else ",".join(tgt)
            choices[f"r={r} on {name}"] = estimate_finetune(
                cfg, lora=lc, batch_size=batch_size, seq_len=choice_seq_len,
                precision=lora_precision, checkpointing=checkpointing).peak_bytes
    return ContextSweep(cfg.name, batch_size, precision, lora_precision, checkpointing,
                        tuple(rows), choice_seq_len, choices)


@dataclass(frozen=True)
class TwentyB:
    """NeoX-20B shapes with an 8-bit or 4-bit base and LoRA, against a 24 GB card (chapter: 5).

    With checkpointing off and on. The card is a consumer one (``memlab.gpus.CONSUMER``).
    """

    gpu: str
    usable_bytes: int
    batch_size: int
    seq_len: int
    peaks: dict[str, int]  # 'int8' / 'int8 + checkpointing' / 'nf4-dq' / ... -> estimated peak
    weights: dict[str, int]  # scheme -> the stored base and adapters, bytes


def twenty_b(*, gpu: str = "RTX-4090", batch_size: int = 1, seq_len: int = 512, r: int = 16,
             schemes=("int8", "nf4-dq")) -> TwentyB:
    """Estimated peaks of LoRA on NeoX-20B with a quantized base, checkpointing off and on (chapter: 5)."""
    g = get_gpu(gpu)
    lora = LoraConfig(r=r, alpha=2 * r, target_modules="all-linear")
    peaks, weights = {}, {}
    for scheme in schemes:
        for ckpt in (False, True):
            est = estimate_finetune(NEOX_20B, batch_size=batch_size, seq_len=seq_len,
                                    precision="bf16", checkpointing=ckpt, lora=lora,
                                    quantize_base=scheme)
            peaks[scheme + (" + checkpointing" if ckpt else "")] = est.peak_bytes
            weights[scheme] = est.parameters_bytes
    return TwentyB(g.name, g.usable_bytes, batch_size, seq_len, peaks, weights)
