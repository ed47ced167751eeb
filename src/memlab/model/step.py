"""One training step, described once: the model, the batch shape, precision, optimizer and switches.

:class:`StepSpec` is the description that the estimator (:func:`memlab.memory.estimate`), the
traced and measured steps (:func:`memlab.measure.trace_step`, :func:`memlab.measure.measure_step`),
the command line and the page's estimator all take. The step's phases and the categories of its
bytes are named here too, so that an estimate, a trace and a measurement speak one vocabulary
(STYLE.md): :data:`STEP_BYTES` are the byte fields every result of a step carries, in the same
meaning.

Plain Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.model.checkpoint import parse_checkpointing
from memlab.model.config import (
    ATTENTION_IMPLS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    ModelConfig,
    get_config,
)

if TYPE_CHECKING:
    import torch

PHASES = ("forward", "backward", "optimizer")  # a training step's phases (inference: memory.inference)
# What a step's bytes are filed under, at any moment (MemTracker's categories, in the book's words).
CATEGORIES = (
    "parameters", "gradients", "optimizer_states", "activations", "temporaries", "other",
)
# The byte fields of every result of a step (an estimate, a trace, a measurement), one meaning each
# (STYLE.md): parameters, gradients and optimizer states whole, as the optimizer step holds them;
# the saved activations, at the end of the forward pass; the activations, temporaries and other
# bytes at the moment of the peak; and the peak. :func:`step_bytes` computes them all.
STEP_BYTES = (
    "parameters_bytes", "gradients_bytes", "optimizer_states_bytes", "saved_activations_bytes",
    "activations_at_peak_bytes", "temporaries_bytes", "other_bytes", "peak_bytes",
)

# The same fields in STYLE.md's words, as tables label them.
STEP_WORDS = {
    "parameters_bytes": "parameters", "gradients_bytes": "gradients",
    "optimizer_states_bytes": "optimizer states", "saved_activations_bytes": "saved activations",
    "activations_at_peak_bytes": "activations at the peak",
    "temporaries_bytes": "temporaries at the peak", "other_bytes": "other at the peak",
    "peak_bytes": "peak",
}


def step_bytes(phase_breakdown: dict[str, dict[str, int]], phase_peak_bytes: dict[str, int],
               peak_phase: str, saved_activations_bytes: int) -> dict:
    """The fields :data:`STEP_BYTES` names (chapters: 0, 1).

    From a step's categories at each phase's highest point.

    The one place an estimate and a trace get their byte fields from, so the same name means the
    same bytes in both. Without an optimizer phase (an inference pass) the model states are read
    at the peak. Also returns ``peak_phase``, ``phase_peak_bytes`` and ``phase_breakdown``.
    """
    at_peak = phase_breakdown[peak_phase]
    whole = phase_breakdown.get("optimizer", at_peak)
    return dict(
        parameters_bytes=whole["parameters"], gradients_bytes=whole["gradients"],
        optimizer_states_bytes=whole["optimizer_states"],
        saved_activations_bytes=saved_activations_bytes,
        activations_at_peak_bytes=at_peak["activations"], temporaries_bytes=at_peak["temporaries"],
        other_bytes=at_peak["other"], peak_bytes=phase_peak_bytes[peak_phase],
        peak_phase=peak_phase, phase_peak_bytes=dict(phase_peak_bytes),
        phase_breakdown=phase_breakdown)


def checkpointing_words(label) -> str:
    """A setup's checkpointing suffix, as tables write it (chapters: 0, 7).

    ', checkpointing' (full), ', <plan> checkpointing' or '' for a setup's value.
    """
    plan = parse_checkpointing(label)
    if not plan:
        return ""
    return ", checkpointing" if plan.kind == "full" else f", {plan.name} checkpointing"


def check_loss_chunks(chunks, n_tokens: int | None = None) -> int:
    """``chunks`` if it is a whole number from 1 to the tokens (B x T) it splits (chapter: 8).

    Else a one-line error naming the value and the accepted range.
    """
    top = "the number of tokens (batch x sequence length)" if n_tokens is None else f"{n_tokens:,}"
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1 or (
            n_tokens is not None and chunks > n_tokens):
        raise MemlabError(f"loss_chunks must be a whole number from 1 to {top}, got {chunks!r}")
    return chunks


@dataclass(frozen=True)
class StepSpec:
    """One training step, validated once: model, batch shape, precision, optimizer and switches.

    The one description of a step that :func:`memlab.measure.measure_step`,
    :func:`memlab.measure.trace_step`, :func:`memlab.memory.estimate`, the command line and the
    page's estimator all take (chapters: 0, 1).
    ``attention`` (``None``: the model's own) replaces the config's attention implementation.
    """

    config: ModelConfig | str
    batch_size: int
    seq_len: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    optimizer_impl: str = "foreach"  # 'foreach' (CUDA's default), 'fused' or 'for-loop'
    # Activation checkpointing (memlab.model.checkpoint): False (none), True (full: one saved
    # input per block), or a plan name: 'selective', 'every-K', 'segments-K'.
    checkpointing: bool | str = False
    grad_accum_steps: int = 1  # micro-batches whose gradients add up before one optimizer step
    attention: str | None = None
    # The LM head and the loss over this many chunks of tokens (memlab.model.loss): 1 computes
    # the (B, T, V) logits whole.
    loss_chunks: int = 1
    # The blocks' saved tensors kept in the host's memory between the forward and backward passes
    # (memlab.model.offload): with checkpointing, the checkpointed units' inputs.
    offload_activations: bool = False
    # Applied to the built model before the step (inside the fake mode when traced): freezing,
    # adapters, a quantized base (chapter 5). Named in ``as_dict`` by its ``name`` attribute.
    prepare: Callable[[torch.nn.Module], object] | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        if isinstance(cfg, str):
            cfg = get_config(cfg)
        if not isinstance(cfg, ModelConfig):
            raise MemlabError(f"model must be a preset name or a ModelConfig, got {cfg!r}")
        if self.attention is not None:
            check_choice("attention", self.attention, ATTENTION_IMPLS)
            if self.attention != cfg.attention:
                cfg = replace(cfg, attention=self.attention)
        object.__setattr__(self, "config", cfg)
        object.__setattr__(self, "attention", cfg.attention)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("seq_len", self.seq_len)
        if self.seq_len > cfg.max_seq_len:
            raise MemlabError(
                f"seq_len {self.seq_len} exceeds max_seq_len {cfg.max_seq_len} of model {cfg.name!r}"
            )
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.optimizer == "adamw-8bit" and self.optimizer_impl == "fused":
            raise MemlabError("optimizer 'adamw-8bit' has its own kernels; accepted optimizer_impl "
                              "for it: foreach, for-loop")
        if self.optimizer in ("adamw-bf16-moments", "adafactor") and self.optimizer_impl == "fused":
            raise MemlabError(f"optimizer {self.optimizer!r} has no fused kernel; accepted "
                              "optimizer_impl for it: foreach, for-loop")
        object.__setattr__(self, "checkpointing", parse_checkpointing(self.checkpointing).label)
        check_positive_int("grad_accum_steps", self.grad_accum_steps)
        check_loss_chunks(self.loss_chunks, self.batch_size * self.seq_len)
        if not isinstance(self.offload_activations, bool):
            raise MemlabError(f"offload_activations must be True or False, got "
                              f"{self.offload_activations!r}")
        if self.prepare is not None and not callable(self.prepare):
            raise MemlabError(f"prepare must be a callable taking the model, got {self.prepare!r}")

    @classmethod
    def of(cls, config_or_spec, **switches) -> StepSpec:
        """A spec from a spec (no switches allowed), a config or a preset name and switches (chapters: 0, 1)."""
        if isinstance(config_or_spec, StepSpec):
            if switches:
                raise MemlabError(f"pass either a StepSpec or switches, not both: {sorted(switches)}")
            return config_or_spec
        return cls(config_or_spec, **switches)

    def as_dict(self) -> dict:
        """Model name, parameter count, batch shape and switches, as stored in StepMemory.setup (chapter: 0)."""
        cfg = self.config
        return {
            "model": cfg.name,
            "parameters": cfg.num_parameters(),
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "optimizer_impl": self.optimizer_impl,
            "checkpointing": self.checkpointing,
            "grad_accum_steps": self.grad_accum_steps,
            "attention": cfg.attention,
            **({"loss_chunks": self.loss_chunks} if self.loss_chunks != 1 else {}),
            **({"offload_activations": True} if self.offload_activations else {}),
            **({"prepare": getattr(self.prepare, "name", getattr(self.prepare, "__name__",
                                                                 "custom"))}
               if self.prepare is not None else {}),
        }
