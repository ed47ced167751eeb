"""Speed per precision mode: a training step timed in each mode on a CUDA GPU (chapter: 2).

:func:`step_times` needs a CUDA GPU; elsewhere it returns a result whose ``status`` says why
nothing was measured.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field

import torch

from memlab.device import device_name, pick_device
from memlab.errors import MemlabError, check_positive_int
from memlab.measure.timing import not_measurable, time_ms
from memlab.model.config import ModelConfig
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, lm_loss
from memlab.precision.memory import traced_step
from memlab.precision.modes import MODE_PRECISION, MODES, check_modes, mode_autocast, model_config


@dataclass(frozen=True)
class StepTimeRow:
    """One mode's training-step time on the GPU, CUDA events, warm-up excluded."""

    mode: str
    median_ms: float
    min_ms: float
    max_ms: float
    tokens_per_s: float  # batch_size x seq_len / median step time
    speedup_vs_fp32: float | None


@dataclass(frozen=True)
class StepTimes:
    """Per-mode step times, or a status saying why they could not be measured here."""

    status: str  # 'measured on <GPU>' or 'not measurable on <device>: <reason>'
    device: str
    model: str
    batch_size: int
    seq_len: int
    warmup: int
    steps: int
    rows: list[StepTimeRow] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        """Whether the rows hold measurements."""
        return bool(self.rows)


def step_times(
    model: ModelConfig | str = "gpt2",
    *,
    batch_size: int = 8,
    seq_len: int = 1024,
    modes=MODES,
    steps: int = 20,
    warmup: int = 5,
    lr: float = 1e-4,
    device=None,
    model_overrides: dict | None = None,
) -> StepTimes:
    """Median training-step time per mode in ``median_ms`` (chapter: 2).

    Timed with CUDA events after ``warmup`` steps.

    A step is forward, backward, (scaler,) AdamW step and zero_grad on random tokens. Needs a
    CUDA GPU; elsewhere the result's ``status`` says "not measurable" and ``rows`` is empty.
    """
    modes = check_modes(modes)
    cfg = model_config(model, model_overrides)
    for what, v in (("batch_size", batch_size), ("seq_len", seq_len), ("steps", steps)):
        check_positive_int(what, v)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    dev = pick_device(device)
    base = dict(device=dev.type, model=cfg.name, batch_size=batch_size, seq_len=seq_len,
                warmup=warmup, steps=steps)
    if dev.type != "cuda":
        return StepTimes(status=not_measurable(dev, "step times are taken with CUDA events, "
                                                     "which need a CUDA GPU"), **base)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    from memlab.device import refuse_if_too_big

    times: dict[str, list[float]] = {}
    for m in modes:
        traced = traced_step(cfg, batch_size, seq_len, MODE_PRECISION[m])
        refuse_if_too_big(traced.peak_bytes, dev, f"a {cfg.name} {m} training step")
        times[m] = time_ms(_step_fn(m, cfg, batch_size, seq_len, lr, dev), warmup=warmup, repeats=steps,
                           device=dev)
        gc.collect()  # the mode's model and optimizer are garbage now: give their memory back
        torch.cuda.empty_cache()
    rows = []
    for m in modes:
        med = statistics.median(times[m])
        rows.append(StepTimeRow(mode=m, median_ms=med, min_ms=min(times[m]), max_ms=max(times[m]),
                                tokens_per_s=batch_size * seq_len / (med / 1e3),
                                speedup_vs_fp32=(statistics.median(times["fp32"]) / med
                                                 if "fp32" in times else None)))
    return StepTimes(status=f"measured on {device_name(dev)}", rows=rows, **base)


def _step_fn(mode: str, cfg: ModelConfig, batch_size: int, seq_len: int, lr: float,
             dev: torch.device):
    """One training step of ``mode`` on fixed random tokens, as a closure returning the loss."""
    model = build_model(cfg, device=dev, seed=0,
                        dtype=torch.bfloat16 if mode == "bf16-pure" else None)
    optimizer = make_optimizer("adamw", model.parameters(), lr=lr, weight_decay=0.01)  # torch's default
    scaler = torch.amp.GradScaler(dev.type) if mode == "fp16-scaled" else None
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len), generator=g).to(dev)
    idx, targets = tokens[0], tokens[1]  # (B, T) each

    def one_step() -> torch.Tensor:
        with mode_autocast(mode, dev):
            loss = lm_loss(model(idx), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return one_step
