"""How a model is trained: the precision and optimizer vocabularies, one optimizer factory, one loop.

Every part that builds an optimizer or names a precision uses these: the estimator (chapter 1),
the measured and traced steps (chapter 0), mixed precision (chapter 2), the book's small LM and
8-bit AdamW (chapter 3).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from memlab.errors import MemlabError, check_choice, check_positive_int, require
from memlab.model.config import OPTIMIZER_IMPLS, OPTIMIZERS

_IMPL_KWARGS = {None: {}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
                "fused": {"fused": True}}


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter], *, lr: float,
                   impl: str | None = None, betas: tuple[float, float] = (0.9, 0.999),
                   eps: float = 1e-8, weight_decay: float = 0.0,
                   momentum: float = 0.9) -> torch.optim.Optimizer:
    """One optimizer by the book's name (:data:`OPTIMIZERS`), on any device (chapters: 0-3, 8).

    ``impl`` picks torch's loop (:data:`OPTIMIZER_IMPLS`; ``None`` is torch's default for the
    device). ``lr`` and ``weight_decay`` are plain floats; ``betas`` and ``eps`` apply to the Adam
    family, ``momentum`` to 'sgd-momentum'; 'adafactor' takes ``lr`` as torch's Adafactor does
    (a relative step size, at most 1/sqrt(step)) and keeps its own beta2 schedule and epsilons.
    """
    check_choice("optimizer", name, OPTIMIZERS)
    if impl is not None:
        check_choice("optimizer_impl", impl, OPTIMIZER_IMPLS)
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise MemlabError(f"lr must be a positive number, got {lr!r}")
    params = list(params)
    if name == "adamw-8bit":
        if impl == "fused":
            raise MemlabError("optimizer 'adamw-8bit' has its own kernels; accepted optimizer_impl "
                              "for it: foreach, for-loop")
        bnb = require("bitsandbytes", "8-bit AdamW", extra="quant")
        return bnb.optim.AdamW8bit(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "adamw-bf16-moments":
        if impl == "fused":
            raise MemlabError("optimizer 'adamw-bf16-moments' updates tensor by tensor; accepted "
                              "optimizer_impl for it: foreach, for-loop")
        from memlab.model.optim import AdamWBf16Moments

        return AdamWBf16Moments(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "adafactor":  # torch's: its own relative step size and beta2 schedule
        if impl == "fused":
            raise MemlabError("optimizer 'adafactor' has no fused kernel in torch; accepted "
                              "optimizer_impl for it: foreach, for-loop")
        return torch.optim.Adafactor(params, lr=lr, weight_decay=weight_decay,
                                     **_IMPL_KWARGS[impl])
    kw = _IMPL_KWARGS[impl]
    try:
        if name in ("adamw", "adam"):
            cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
            return cls(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kw)
        return torch.optim.SGD(params, lr=lr, momentum=momentum if name == "sgd-momentum" else 0.0,
                               weight_decay=weight_decay, **kw)
    except (RuntimeError, ValueError) as exc:  # e.g. no fused kernel for this device or dtype
        raise MemlabError(f"optimizer {name!r} with optimizer_impl {impl!r} is not available here "
                          f"({exc}); accepted: {', '.join(OPTIMIZER_IMPLS)}") from None


# One training loop ---------------------------------------------------------------------------------
SCHEDULES = ("constant", "cosine")  # cosine: linear warm-up, then cosine decay to zero
AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: steps, optimizer, learning-rate schedule, autocast, loss scaling.

    The one description every training run of the book uses (chapters: 2, 3); :func:`train_loop`
    runs it. ``loss_divisor`` K divides the loss before backward, as accumulating K micro-batches
    does; ``grad_scaler`` is the first scale of ``torch.amp.GradScaler`` (``None``: no scaler).
    """

    steps: int
    lr: float
    optimizer: str = "adamw"
    optimizer_impl: str | None = None  # None: torch's default for the device
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup: int = 0  # steps of linear warm-up (schedule 'cosine')
    loss_divisor: int = 1
    autocast: str | None = None  # None, 'fp16' or 'bf16': the forward's compute dtype
    grad_scaler: float | None = None

    def __post_init__(self) -> None:
        check_positive_int("steps", self.steps)
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not self.lr > 0:
            raise MemlabError(f"lr must be a positive number, got {self.lr!r}")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.optimizer_impl is not None:
            check_choice("optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        check_choice("schedule", self.schedule, SCHEDULES)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise MemlabError(f"warmup must be a non-negative integer, got {self.warmup!r}")
        check_positive_int("loss_divisor", self.loss_divisor)
        if self.autocast is not None:
            check_choice("autocast", self.autocast, tuple(AUTOCAST_DTYPES))
        if self.grad_scaler is not None and not (
                isinstance(self.grad_scaler, (int, float)) and self.grad_scaler > 0):
            raise MemlabError(f"grad_scaler must be a positive initial scale or None, got "
                              f"{self.grad_scaler!r}")

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0-based) under the schedule (chapters: 2, 3)."""
        if self.schedule == "constant":
            return self.lr
        warm = min(1.0, (step + 1) / max(1, self.warmup))
        return self.lr * warm * 0.5 * (1 + math.cos(math.pi * step / self.steps))


@dataclass
class TrainLog:
    """What :func:`train_loop` recorded: the loss per step (nats, before the division), loss scales."""

    losses: list[float]
    scales: list[float] | None  # the GradScaler's scale at each step (None: no scaler)
    skipped_steps: list[int]  # steps whose update the scaler skipped (inf or NaN gradients)
    seconds: float
    optimizer: torch.optim.Optimizer


def lm_step_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model(x)`` against ``y``, nats (chapters: 2, 3)."""
    from memlab.model.transformer import lm_loss

    return lm_loss(model(x), y)


def train_loop(model: torch.nn.Module, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
               config: TrainConfig, *, device: torch.device,
               step_loss: Callable[..., torch.Tensor] = lm_step_loss,
               after_backward: Callable[[int, torch.Tensor], None] | None = None,
               after_step: Callable[[int, torch.Tensor], None] | None = None) -> TrainLog:
    """Train ``model`` in place for ``config.steps`` steps; the book's one training loop (chapters: 2, 3).

    Each step: set the learning rate, take ``batch(step)``, compute ``step_loss(model, x, y)``
    under autocast, divide it by ``loss_divisor``, backward (scaled and unscaled again with a
    GradScaler), call ``after_backward(step, loss)`` with the gradients in place, step the
    optimizer (the scaler may skip it), call ``after_step(step, loss)``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(config.optimizer, params, lr=config.lr, impl=config.optimizer_impl,
                         betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)
    scaler = (torch.amp.GradScaler(device.type, init_scale=config.grad_scaler)
              if config.grad_scaler is not None else None)
    dtype = AUTOCAST_DTYPES.get(config.autocast)
    losses: list[float] = []
    scales: list[float] = []
    skipped: list[int] = []
    start = time.perf_counter()
    model.train()
    for step in range(config.steps):
        for group in opt.param_groups:
            group["lr"] = config.lr_at(step)
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        with (torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None
              else contextlib.nullcontext()):
            loss = step_loss(model, x, y)
        scaled = loss / config.loss_divisor if config.loss_divisor != 1 else loss
        if scaler is not None:
            scales.append(float(scaler.get_scale()))
            scaler.scale(scaled).backward()
            scaler.unscale_(opt)  # in place: the gradients are divided back
        else:
            scaled.backward()
        if after_backward is not None:
            after_backward(step, loss)
        if scaler is not None:
            before = scaler.get_scale()
            scaler.step(opt)  # skipped when unscale_ found inf or NaN
            scaler.update()
            if scaler.get_scale() < before:
                skipped.append(step)
        else:
            opt.step()
        losses.append(float(loss.detach()))
        if after_step is not None:
            after_step(step, loss)
    model.eval()
    return TrainLog(losses, scales if scaler is not None else None, skipped,
                    time.perf_counter() - start, opt)
