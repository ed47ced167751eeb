"""What each GPU holds under data parallelism: the ZeRO paper's formulas (chapter 6).

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"
(SC 2020; arXiv 1910.02054, 2019: :data:`ZERO_CITATION`, section 3.1 and figure 1) count a
model's *states* with Ψ parameters as

    parameters p·Ψ + gradients g·Ψ + optimizer states k·Ψ bytes,

with (p, g, k) = (2, 2, 12) for mixed-precision Adam: 16-bit parameters and gradients, and an
fp32 master copy, momentum and variance in the optimizer. Stage 1 splits the optimizer states
over the N data-parallel GPUs, stage 2 the gradients too, stage 3 the parameters too:

    stage 0 (DDP): (p + g + k)Ψ        stage 2: pΨ + (g + k)Ψ/N
    stage 1:       (p + g)Ψ + kΨ/N     stage 3: (p + g + k)Ψ/N

PyTorch's own training keeps fp32 parameters and gradients even under autocast (the 16-bit
copies are temporaries), so its layout is (4, 4, 8): the "fp32" row of :data:`LAYOUTS`.
Offloading moves a category to CPU memory: ``optimizer`` the optimizer states (and, as
ZeRO-Offload does, the gradients that feed them), ``params`` everything.
"""

from __future__ import annotations

from dataclasses import dataclass

from memlab.errors import MemlabError, check_choice

# The paper every page cites for ZeRO, one way: published at SC 2020, first on arXiv in 2019.
ZERO_CITATION = dict(
    authors="Samyam Rajbhandari, Jeff Rasley, Olatunji Ruwase, Yuxiong He",
    title="ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
    venue="SC 2020 (International Conference for High Performance Computing, Networking, "
          "Storage and Analysis)",
    year=2020, arxiv="1910.02054", arxiv_year=2019, url="https://arxiv.org/abs/1910.02054",
    short="Rajbhandari et al. 2020",
    text='Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter '
         'Models", SC 2020; arXiv 1910.02054, 2019',
)
STAGES = (0, 1, 2, 3)
LAYOUTS = {  # bytes per parameter: (parameters, gradients, optimizer states), AdamW
    "mixed": (2, 2, 12),  # the ZeRO paper: 16-bit working copy, fp32 master + m + v
    "fp32": (4, 4, 8),  # PyTorch fp32 or autocast: fp32 parameters and gradients, m + v
    "bf16": (2, 2, 4),  # pure bf16: parameters, gradients, m and v all 16-bit
}
OFFLOADS = ("none", "optimizer", "params")
SYMBOL = "Ψ"


def check_stage(stage) -> int:
    """``stage`` if it is 0, 1, 2 or 3; else a one-line error (chapter: 6)."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise MemlabError(f"ZeRO stage must be one of 0, 1, 2, 3, got {stage!r}")
    return int(stage)


def check_gpus(gpus) -> int:
    """``gpus`` if it is a positive integer; else a one-line error (chapter: 6)."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise MemlabError(f"the number of GPUs must be a positive integer, got {gpus!r}")
    return gpus


def check_offload(offload: str, stage: int) -> str:
    """``offload`` if it is known and makes sense with ``stage``; else a one-line error (chapter: 6)."""
    check_choice("offload", offload, OFFLOADS)
    if offload == "optimizer" and stage == 0:
        raise MemlabError("offload 'optimizer' needs ZeRO stage 1, 2 or 3 (ZeRO-Offload moves the "
                          "partitioned optimizer states); with stage 0 accepted: none")
    if offload == "params" and stage != 3:
        raise MemlabError(f"offload 'params' needs ZeRO stage 3 (only sharded parameters are "
                          f"offloaded), got stage {stage}; accepted with stage {stage}: none"
                          + (", optimizer" if stage else ""))
    return offload


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer states one GPU holds (and what sits in CPU memory)."""

    parameters: int
    gradients: int
    optimizer_states: int
    cpu_bytes: int = 0  # offloaded: held in the host's memory instead

    @property
    def total(self) -> int:
        """Parameters + gradients + optimizer states on the GPU, bytes (chapter: 6)."""
        return self.parameters + self.gradients + self.optimizer_states


def model_states(parameters: int, stage: int, gpus: int, *, layout: str = "mixed",
                 offload: str = "none") -> ModelStates:
    """Bytes of model states one of ``gpus`` GPUs holds at ZeRO ``stage`` (chapter: 6).

    ``layout`` names the bytes per parameter (:data:`LAYOUTS`); shards are rounded up, as
    FSDP pads every parameter to a multiple of N.
    """
    stage, gpus = check_stage(stage), check_gpus(gpus)
    check_choice("layout", layout, tuple(LAYOUTS))
    check_offload(offload, stage)
    p, g, k = LAYOUTS[layout]

    def share(n_bytes: int, split: bool) -> int:
        return -(-n_bytes * parameters // gpus) if split else n_bytes * parameters

    par, grad, opt = share(p, stage >= 3), share(g, stage >= 2), share(k, stage >= 1)
    cpu = 0
    if offload == "optimizer":  # ZeRO-Offload: states and the gradients they consume
        cpu, opt, grad = opt + grad, 0, 0
    elif offload == "params":
        cpu, par, grad, opt = par + grad + opt, 0, 0, 0
    return ModelStates(par, grad, opt, cpu)


def formula(stage: int, *, layout: str = "mixed") -> str:
    """The per-GPU formula of ``stage`` in Ψ and N, e.g. ``'4Ψ + 12Ψ/N'`` (chapter: 6)."""
    stage = check_stage(stage)
    check_choice("layout", layout, tuple(LAYOUTS))
    p, g, k = LAYOUTS[layout]
    whole = (p if stage < 3 else 0) + (g if stage < 2 else 0) + (k if stage < 1 else 0)
    split = p + g + k - whole
    parts = ([f"{whole}{SYMBOL}"] if whole else []) + ([f"{split}{SYMBOL}/N"] if split else [])
    return " + ".join(parts)


def reduction(stage: int, gpus: int, *, layout: str = "mixed") -> float:
    """How many times less than DDP one GPU holds at ``stage`` with ``gpus`` GPUs (chapter: 6)."""
    stage, gpus = check_stage(stage), check_gpus(gpus)
    check_choice("layout", layout, tuple(LAYOUTS))
    return sum(LAYOUTS[layout]) / _per_param(stage, gpus, layout)


def _per_param(stage: int, gpus: int, layout: str) -> float:
    p, g, k = LAYOUTS[layout]
    return ((p if stage < 3 else p / gpus) + (g if stage < 2 else g / gpus)
            + (k if stage < 1 else k / gpus))


# Communication -------------------------------------------------------------------------------
COMM_FACTOR = {0: 2, 1: 2, 2: 2, 3: 3}  # in units of Ψ elements, ZeRO paper section 7


def comm_volume(parameters: int, stage: int, *, bytes_per_value: int = 2) -> int:
    """Bytes one GPU moves per step at ``stage``: 2Ψ for DDP and stages 1-2, 3Ψ for stage 3 (chapter: 6).

    An all-reduce is a reduce-scatter plus an all-gather (Ψ each); stage 3 gathers the
    parameters twice (forward and backward) and reduce-scatters the gradients once.
    """
    return COMM_FACTOR[check_stage(stage)] * parameters * bytes_per_value
