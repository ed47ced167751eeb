"""An offload's CPU optimizer step, seconds per parameter: recorded or measured (chapter 7).

Offloading the optimizer (ZeRO-Offload, FSDP2's ``CPUOffloadPolicy``) moves AdamW's step to
the host: every parameter's fp32 master copy and both moments are read and written by the
CPU once per optimizer step, a time that grows with the parameters and not with the tokens,
so an offload's cost model has to count it beside the transfers over the host link. Two
rates, one number each (seconds per parameter per step):

* :func:`memlab.compute.offload.recorded_cpu_step_rate` -- from chapter 6's GPU record of
  ``distributed-memory`` (ZeRO-3 with and without ``CPUOffloadPolicy``, one rank, the same steps): the seconds the
  offload added to a step, less the seconds its host-link bytes take at the quoted link of
  that GPU (:func:`memlab.compute.offload.host_link_bytes`, the same count the cost model
  uses), over the parameters. What is left is the CPU's AdamW and the host's own work around
  it; the cost model applied to the record's run gives back its measured step.
* :func:`measure_cpu_step_rate` -- measured here: PyTorch's AdamW stepping fp32 tensors of a
  given number of parameters on this CPU, the median of a few steps after the first (which
  creates the moments), over the parameters.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import torch

from memlab.errors import MemlabError, check_positive_int
from memlab.measure.timing import time_ms
from memlab.model.train import make_optimizer


@dataclass(frozen=True)
class CpuStepRate:
    """Seconds the CPU's optimizer step takes per parameter, and where the number comes from (chapter: 7)."""

    seconds_per_parameter: float
    kind: str  # 'recorded' (a GPU record's host) or 'measured' (this machine)
    label: str  # the provenance and the arithmetic, in words
    parameters: int  # the parameters of the step it was read from

    def seconds(self, parameters: int) -> float:
        """Seconds of one optimizer step over ``parameters`` parameters at this rate (chapter: 7)."""
        if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 0:
            raise MemlabError(f"parameters must be a non-negative integer, got {parameters!r}")
        return self.seconds_per_parameter * parameters

    def as_dict(self) -> dict:
        """The rate as a plain dict (chapter: 7)."""
        return asdict(self)


def measure_cpu_step_rate(parameters: int = 2**23, *, tensors: int = 8, repeats: int = 3,
                          seed: int = 0) -> CpuStepRate:
    """Seconds per parameter of PyTorch's AdamW stepping fp32 tensors on this CPU, measured (chapter: 7).

    ``parameters`` split over ``tensors`` tensors, random gradients; the median of ``repeats``
    steps after the first.
    """
    n = check_positive_int("parameters", parameters)
    k = check_positive_int("tensors", tensors)
    check_positive_int("repeats", repeats)
    if k > n:
        raise MemlabError(f"tensors {k} exceeds parameters {n}")
    gen = torch.Generator().manual_seed(seed)
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt = make_optimizer("adamw", params, lr=1e-4, weight_decay=0.1)
    ms = statistics.median(time_ms(opt.step, warmup=1, repeats=repeats, device="cpu"))
    rate = ms * 1e-3 / n
    label = (f"measured here: torch's AdamW over {n:,} fp32 parameters on the CPU, "
             f"{ms:.1f} ms per step (median of {repeats})")
    return CpuStepRate(seconds_per_parameter=rate, kind="measured", label=label, parameters=n)
