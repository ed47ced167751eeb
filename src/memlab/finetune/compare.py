"""Fine-tuning set-ups side by side on the book's model: memory, time, trainable parameters, quality.

The chapter 3 model (trained on one Markov chain) is fine-tuned on a new chain of the same family
(:func:`shifted`), so that fine-tuning has something to learn. Every set-up starts from the same
weights and sees the same batches for the same number of steps; quality is the held-out loss on
the new chain, paired against full fine-tuning as in chapter 3.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from memlab.device import get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.finetune.freeze import count_trainable, freeze_all_but_last
from memlab.finetune.lora import LoraConfig, inject_lora
from memlab.finetune.qlora import qlora
from memlab.measure.step import measure_step
from memlab.model.lm import (
    LMConfig,
    Quality,
    config_for,
    evaluate,
    paired_delta,
    reference_model,
    train_lm,
)
from memlab.model.step import StepSpec
from memlab.results import kept_on_disk


@dataclass(frozen=True)
class Setup:
    """One way to fine-tune: what trains, and how the base is stored (chapter: 5)."""

    name: str
    lora: LoraConfig | None = None
    train_last: int | None = None
    quantize_base: str | None = None  # a bitsandbytes scheme for the frozen base (QLoRA)

    def __post_init__(self) -> None:
        if self.quantize_base is not None and self.lora is None:
            raise MemlabError(f"set-up {self.name!r}: a quantized base needs LoRA adapters")
        if self.lora is not None and self.train_last is not None:
            raise MemlabError(f"set-up {self.name!r}: choose LoRA or the last blocks, not both")

    def __call__(self, model: nn.Module) -> None:
        """Freeze, add adapters or quantize ``model`` in place, as this set-up says (chapter: 5)."""
        self.prepare(model)

    def prepare(self, model: nn.Module) -> None:
        """Freeze, add adapters or quantize ``model`` in place, as this set-up says (chapter: 5)."""
        if self.quantize_base is not None:
            qlora(model, self.lora, self.quantize_base)
        elif self.lora is not None:
            inject_lora(model, self.lora)
        elif self.train_last is not None:
            freeze_all_but_last(model, self.train_last)


SETUPS = (
    Setup("full"),
    Setup("last block", train_last=1),
    Setup("LoRA q,v r=4", lora=LoraConfig(r=4, alpha=8)),
    Setup("LoRA q,v r=16", lora=LoraConfig(r=16, alpha=32)),
    Setup("LoRA all r=8", lora=LoraConfig(r=8, alpha=16, target_modules="all-linear")),
    Setup("QLoRA q,v r=8", lora=LoraConfig(r=8, alpha=16), quantize_base="nf4-dq"),
)
# Each set-up fine-tunes at its own multiple of the pre-training learning rate: its best factor
# in lr_sweep's grid, bracketed (the factors on either side give a higher held-out loss). The
# recorded sweep (results/finetune-lr) is shown in chapter 5, and a test holds these factors to it.
LR_FACTORS = (1.0, 4.0, 10.0, 20.0, 40.0)
FINETUNE_LR_FACTORS = {"full": 4.0, "last block": 10.0, "LoRA q,v r=4": 10.0,
                       "LoRA q,v r=16": 10.0, "LoRA all r=8": 4.0, "QLoRA q,v r=8": 20.0}
STEPS = {"ci": 40, "full": 600}  # fine-tuning steps per set-up


@dataclass(frozen=True)
class SetupResult:
    """One set-up, measured on the book's model (chapter: 5)."""

    name: str
    trainable_parameters: int
    peak_bytes: int  # one training step on this device, measured
    categories: dict[str, int]  # bytes by category at the step's peak
    lr_factor: float  # the multiple of the pre-training learning rate it fine-tuned at
    step_ms: float  # mean time per fine-tuning step
    quality: Quality  # held-out on the new chain
    delta_loss: float  # held-out loss minus full fine-tuning's, nats
    delta_se: float  # paired standard error


@dataclass(frozen=True)
class FinetuneComparison:
    """Every set-up, from the same start, on the same batches (chapter: 5)."""

    config: LMConfig  # the new chain's config
    steps: int
    device: str
    base_lr: float  # the pre-training learning rate; each row fine-tuned at its lr_factor times it
    start_loss: float  # the chapter 3 model's held-out loss on the new chain, before fine-tuning
    rows: tuple[SetupResult, ...]

    def row(self, name: str) -> SetupResult:
        """The result of the set-up called ``name`` (chapter: 5)."""
        return rows_named(self.rows, name)[0]


def rows_named(rows, name: str) -> list:
    """The rows whose ``name`` is ``name``; an unknown name is refused with the accepted ones (chapter: 5)."""
    found = [r for r in rows if r.name == name]
    if not found:
        raise MemlabError(f"unknown set-up {name!r}; accepted: "
                          + ", ".join(dict.fromkeys(r.name for r in rows)))
    return found


def lr_factor(name: str) -> float:
    """The multiple of the pre-training learning rate the set-up ``name`` fine-tunes at (chapter: 5)."""
    return FINETUNE_LR_FACTORS[check_choice("set-up", name, tuple(FINETUNE_LR_FACTORS))]


def shifted(cfg: LMConfig) -> LMConfig:
    """The same family of language, a new chain: the fine-tuning task (chapter: 5)."""
    return replace(cfg, seed=cfg.seed + 1)


def finetune_comparison(scale: str | None = None, *, config: LMConfig | None = None,
                        steps: int | None = None, setups=None, device=None) -> FinetuneComparison:
    """Fine-tune the chapter 3 model on a new chain with each set-up (chapter: 5).

    It gives memory, time and quality.
    """
    scale = get_scale(scale)
    cfg = config_for(scale, config)
    steps = check_positive_int("steps", steps if steps is not None else STEPS[scale])
    names = [s.name for s in SETUPS]
    if isinstance(setups, str):
        setups = (setups,)
    chosen = tuple(SETUPS) if setups is None else tuple(
        SETUPS[names.index(check_choice("set-up", n, names))] for n in dict.fromkeys(setups))
    if not chosen:
        raise MemlabError(f"name at least one set-up; accepted: {', '.join(names)}")
    if chosen[0].name != "full":  # the reference of the paired differences, first and once
        chosen = (SETUPS[0], *(s for s in chosen if s.name != "full"))
    return _comparison(cfg, steps, chosen, str(pick_device(device)))


def _fine_tune(base: nn.Module, setup: Setup, task: LMConfig, steps: int, lr: float,
               device: str):
    """A copy of ``base`` prepared by ``setup`` and trained on ``task``; the run.

    The adapters are drawn from a fixed seed, so a set-up at one learning rate is the same run
    in the sweep and in the comparison.
    """
    model = copy.deepcopy(base)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        setup.prepare(model)
    return train_lm(task, model=model, steps=steps, lr=lr, device=device)


@functools.cache
@kept_on_disk
def _comparison(cfg: LMConfig, steps: int, setups: tuple[Setup, ...],
                device: str) -> FinetuneComparison:
    start = reference_model(config=cfg, device=device)
    new = shifted(cfg)
    start_q = evaluate(start.model, new, device=device)
    rows, ref_q = [], None
    for s in setups:
        factor = lr_factor(s.name)
        run = _fine_tune(start.model, s, new, steps, cfg.lr * factor, device)
        q = evaluate(run.model, new, device=device)
        ref_q = ref_q or q
        d, se = paired_delta(q, ref_q) if s.name != "full" else (0.0, float("nan"))
        mem = measure_step(StepSpec(cfg.model_config(), batch_size=cfg.batch_size,
                                    seq_len=cfg.seq_len, prepare=s), device=device)
        rows.append(SetupResult(s.name, count_trainable(run.model), mem.peak_bytes,
                                mem.breakdown(), factor,
                                1e3 * run.train_s / steps, q, d, se))
    return FinetuneComparison(new, steps, device, cfg.lr, start_q.loss, tuple(rows))


@dataclass(frozen=True)
class LrRow:
    """One set-up at one learning-rate factor: its held-out loss after the same steps (chapter: 5)."""

    name: str
    lr_factor: float
    loss: float  # held-out on the new chain, nats


@dataclass(frozen=True)
class LrSweep:
    """Held-out loss of each set-up at several learning rates, from the same start (chapter: 5)."""

    lr: float  # the pre-training learning rate the factors multiply
    steps: int
    device: str
    rows: tuple[LrRow, ...]

    def losses(self, name: str) -> dict[float, float]:
        """The held-out loss of the set-up called ``name`` at each factor, in factor order (chapter: 5)."""
        return {r.lr_factor: r.loss for r in sorted(rows_named(self.rows, name),
                                                    key=lambda r: r.lr_factor)}

    def best(self, name: str) -> float:
        """The factor with the lowest held-out loss for the set-up called ``name`` (chapter: 5)."""
        losses = self.losses(name)
        return min(losses, key=losses.get)

    def bracketed(self, name: str) -> bool:
        """Whether the best factor of ``name`` has a factor on each side with a higher loss (chapter: 5).

        A best at either end of the grid is not bracketed: a factor beyond it might do better.
        """
        factors = list(self.losses(name))
        i = factors.index(self.best(name))
        return 0 < i < len(factors) - 1


def lr_sweep(scale: str | None = None, *, config: LMConfig | None = None, factors=LR_FACTORS,
             steps: int | None = None, setups=SETUPS, device=None) -> LrSweep:
    """Fine-tune with each set-up at each learning-rate factor; the held-out loss of each (chapter: 5)."""
    scale = get_scale(scale)
    cfg = config_for(scale, config)
    steps = check_positive_int("steps", steps if steps is not None else STEPS[scale])
    device = str(pick_device(device))
    start = reference_model(config=cfg, device=device)
    new = shifted(cfg)
    rows = []
    for s in setups:
        for f in factors:
            run = _fine_tune(start.model, s, new, steps, cfg.lr * f, device)
            rows.append(LrRow(s.name, float(f), evaluate(run.model, new, device=device).loss))
    return LrSweep(cfg.lr, steps, device, tuple(rows))
