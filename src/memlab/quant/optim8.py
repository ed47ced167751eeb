"""8-bit AdamW on this device (chapter 3).

The optimizer's state bytes, the peak of its step and its time.

:mod:`memlab.quant.qat` trains with 8-bit AdamW and counts its states; this module measures, on
the device at hand, what one optimizer step costs: the bytes its states hold (each state tensor
counted), the peak above the parameters and gradients while it steps, and its time, for
torch's AdamW and bitsandbytes' ``AdamW8bit``, on the same parameters and gradients.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass

import torch

from memlab.device import pick_device

OPTIM8_SIZES = {"ci": dict(model="tiny", repeats=5), "full": dict(model="llama-1b", repeats=10)}
OPTIMIZERS_COMPARED = ("adamw", "adamw-8bit")


@dataclass(frozen=True)
class OptimStepRow:
    """One optimizer on the model's parameters: state bytes, step peak, step time (chapter: 3)."""

    optimizer: str
    state_bytes: int  # every tensor in optimizer.state, counted
    bytes_per_param: float
    step_peak_bytes: int  # above parameters, gradients and states, while it steps
    step_ms: float  # median


@dataclass(frozen=True)
class OptimStepMemory:
    """AdamW against 8-bit AdamW on this device (chapter: 3)."""

    device: str
    model: str
    parameters: int
    rows: list[OptimStepRow]

    def table_rows(self) -> list[dict]:
        """One row per optimizer for a page's table (chapter: 3)."""
        return [dict(optimizer=r.optimizer, state_bytes=r.state_bytes,
                     bytes_per_parameter=round(r.bytes_per_param, 3),
                     step_peak_bytes=r.step_peak_bytes, step_ms=round(r.step_ms, 2))
                for r in self.rows]


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def optimizer_step_memory(model: str = "tiny", *, repeats: int = 5, device=None) -> OptimStepMemory:
    """State bytes, step peak and step time of each optimizer on ``model``'s parameters (chapter: 3)."""
    from memlab.measure.peak import measure_peak
    from memlab.measure.timing import time_ms
    from memlab.model.config import get_config
    from memlab.model.train import make_optimizer
    from memlab.model.transformer import build_model

    dev = pick_device(device)
    cfg = get_config(model)
    net = build_model(cfg, device=dev, seed=0)
    params = [p for p in net.parameters()]
    g = torch.Generator(device=dev).manual_seed(0)  # gradients made where they live
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, device=dev) * 1e-3
    rows = []
    for name in OPTIMIZERS_COMPARED:
        opt = make_optimizer(name, params, lr=1e-4)
        opt.step()  # the first step creates the states
        state = _state_bytes(opt)
        _, peak = measure_peak(opt.step, device=dev)
        times = time_ms(opt.step, warmup=1, repeats=repeats, device=dev)
        rows.append(OptimStepRow(name, state, state / cfg.num_parameters(),
                                 peak.peak_allocated_bytes, statistics.median(times)))
        del opt
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return OptimStepMemory(dev.type, cfg.name, cfg.num_parameters(), rows)
