"""How many GPUs a model needs at each ZeRO stage: sweeps of the per-GPU estimate (chapter 6).

Pure computation over :func:`memlab.distributed.estimate.estimate_sharded` and the GPU
catalogue (:mod:`memlab.gpus`): per-GPU model states and peaks as the number of GPUs N
grows, the smallest N whose estimated peak fits a GPU's usable memory, and the ZeRO paper's
worked example (:data:`memlab.distributed.zero.ZERO_CITATION`, figure 1: Ψ = 7.5B parameters
on 64 GPUs with mixed-precision Adam).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memlab.distributed.estimate import estimate_sharded
from memlab.distributed.zero import STAGES, check_gpus, check_stage, model_states
from memlab.errors import MemlabError
from memlab.gpus import fits, get_gpu
from memlab.model.config import ModelConfig
from memlab.units import to_unit

# The ZeRO paper's example (zero.ZERO_CITATION, figure 1) and the per-GPU model states it
# quotes, GB (10^9 bytes).
ZERO_PAPER = dict(parameters=7_500_000_000, gpus=64)
ZERO_PAPER_QUOTED_GB = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.875}  # quoted, stages 0-3
# A Llama-style shape with 7,499,681,792 parameters (within 0.005% of the paper's 7.5B), so
# the estimator can be run on the example: Llama 2 7B's shape with d_ff = 12944.
ZERO_PAPER_MODEL = ModelConfig(name="zero-paper-7.5b", vocab_size=32000, n_layer=32, n_head=32,
                               d_model=4096, d_ff=12944, max_seq_len=4096)

SWEEP_MODELS = ("llama2-7b", "llama2-70b", "llama3-405b")
SWEEP_GPUS = tuple(2**k for k in range(11))  # 1, 2, 4, ..., 1024
MAX_GPUS = 1024


def zero_paper_model_states(parameters: int = ZERO_PAPER["parameters"],
                            gpus: int = ZERO_PAPER["gpus"]) -> dict[int, float]:
    """Per-GPU model states of the ZeRO paper's example, GB (10^9 bytes), by stage 0-3 (chapter: 6)."""
    return {stage: to_unit(model_states(parameters, stage, gpus, layout="mixed").total, "GB")
            for stage in STAGES}


def _name(model: str | ModelConfig) -> str:
    return model.name if isinstance(model, ModelConfig) else model


def _sweep_kwargs(precision, batch_size, seq_len, checkpointing, offload, device) -> dict:
    return dict(precision=precision, batch_size=batch_size, seq_len=seq_len,
                checkpointing=checkpointing, offload=offload, device=device)


@dataclass(frozen=True)
class GpuSweep:
    """Per-GPU bytes over model x ZeRO stage x number of GPUs: model states and the step's peak."""

    models: tuple[str, ...]
    stages: tuple[int, ...]
    gpus: tuple[int, ...]
    # model -> stage -> one value per entry of ``gpus``, bytes on one GPU
    model_state_bytes: dict[str, dict[int, tuple[int, ...]]]
    peak_bytes: dict[str, dict[int, tuple[int, ...]]]
    parameters: dict[str, int]  # parameter count of each model
    setup: dict

    def as_dict(self) -> dict:
        """The sweep as a plain dict, bytes as ints (chapter: 6)."""
        return asdict(self)

    def table(self, model: str, unit: str = "GiB") -> str:
        """One model's per-GPU peaks (model states in brackets) as a text table, a row per stage (chapter: 6)."""
        if model not in self.models:
            raise MemlabError(f"unknown model {model!r} in this sweep; accepted: "
                              f"{', '.join(self.models)}")
        lines = [f"estimated per-GPU peak (model states), {unit}: {model}, "
                 f"{self.setup['precision']}, batch {self.setup['batch_size']} x seq "
                 f"{self.setup['seq_len']} per GPU"
                 + (", checkpointing" if self.setup["checkpointing"] else ""),
                 f"{'N':>8}" + "".join(f"{f'stage {s}':>22}" for s in self.stages)]
        for i, n in enumerate(self.gpus):
            cells = "".join(
                f"{to_unit(self.peak_bytes[model][s][i], unit):>10.1f} "
                f"({to_unit(self.model_state_bytes[model][s][i], unit):>8.1f})"
                for s in self.stages)
            lines.append(f"{n:>8}{cells}")
        return "\n".join(lines)


def per_gpu_sweep(models=SWEEP_MODELS, gpus=SWEEP_GPUS, *, stages=STAGES,
                  precision: str = "bf16-mixed", batch_size: int = 1, seq_len: int = 4096,
                  checkpointing: bool = True, offload: str = "none",
                  device: str = "cuda") -> GpuSweep:
    """Per-GPU model states and estimated peak bytes (chapter: 6).

    For each model, ZeRO stage and number of GPUs.
    """
    stages, gpus = tuple(check_stage(s) for s in stages), tuple(check_gpus(n) for n in gpus)
    models = tuple(models)
    if not models or not gpus or not stages:
        raise MemlabError("per_gpu_sweep needs at least one model, one stage and one GPU count")
    kw = _sweep_kwargs(precision, batch_size, seq_len, checkpointing, offload, device)
    states: dict[str, dict[int, tuple[int, ...]]] = {}
    peaks: dict[str, dict[int, tuple[int, ...]]] = {}
    params: dict[str, int] = {}
    names = tuple(_name(m) for m in models)
    for m, name in zip(models, names, strict=True):
        states[name], peaks[name] = {}, {}
        for s in stages:
            ests = [estimate_sharded(m, zero_stage=s, gpus=n, **kw) for n in gpus]
            states[name][s] = tuple(e.per_gpu_model_state_bytes for e in ests)
            peaks[name][s] = tuple(e.per_gpu_peak_bytes for e in ests)
            params[name] = ests[0].parameters
    return GpuSweep(models=names, stages=stages, gpus=gpus, model_state_bytes=states,
                    peak_bytes=peaks, parameters=params, setup=kw)


def smallest_gpus(model: str | ModelConfig, stage: int, *, gpu: str = "A100-80GB",
                  precision: str = "bf16-mixed", batch_size: int = 1, seq_len: int = 4096,
                  checkpointing: bool = True, offload: str = "none", device: str = "cuda",
                  max_gpus: int = MAX_GPUS, headroom_bytes: int = 0) -> int | None:
    """Smallest number of GPUs whose estimated per-GPU peak fits ``gpu`` (chapter: 6).

    The peak is held to ``gpu``'s usable bytes; any integer up to ``max_gpus``, or None if none
    fits.

    The per-GPU peak never grows with N (each shard only shrinks), so the answer is found by
    bisection; at stage 0 (DDP) nothing is sharded, so it is 1 or None.
    """
    stage, max_gpus = check_stage(stage), check_gpus(max_gpus)
    target = get_gpu(gpu)
    kw = _sweep_kwargs(precision, batch_size, seq_len, checkpointing, offload, device)

    def ok(n: int) -> bool:
        peak = estimate_sharded(model, zero_stage=stage, gpus=n, **kw).per_gpu_peak_bytes
        return fits(peak, target, headroom_bytes)

    if not ok(max_gpus):
        return None
    if ok(1):
        return 1
    lo, hi = 1, max_gpus  # ok(hi) holds, ok(lo) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


@dataclass(frozen=True)
class FitCounts:
    """The smallest number of GPUs for each model and ZeRO stage on one GPU model.

    None means not up to ``max_gpus``.
    """

    gpu: str
    usable_bytes: int  # the GPU's usable memory (memlab.gpus.GPU.usable_bytes)
    models: tuple[str, ...]
    stages: tuple[int, ...]
    counts: dict[str, dict[int, int | None]]  # model -> stage -> smallest N, or None
    max_gpus: int
    setup: dict

    def as_dict(self) -> dict:
        """The table as a plain dict (chapter: 6)."""
        return asdict(self)

    def table(self) -> str:
        """The counts as a text table, a row per model and a column per stage (chapter: 6)."""
        s = self.setup
        lines = [f"smallest number of {self.gpu} GPUs ({to_unit(self.usable_bytes, 'GiB'):.1f} "
                 f"GiB usable) whose estimated per-GPU peak fits: {s['precision']}, batch "
                 f"{s['batch_size']} x seq {s['seq_len']} per GPU"
                 + (", checkpointing" if s["checkpointing"] else "")
                 + f"; '-': more than {self.max_gpus}",
                 f"{'model':<14}" + "".join(f"{f'stage {st}':>10}" for st in self.stages)]
        for m in self.models:
            cells = "".join(f"{'-' if self.counts[m][st] is None else self.counts[m][st]:>10}"
                            for st in self.stages)
            lines.append(f"{m:<14}{cells}")
        return "\n".join(lines)


def fit_counts(models=SWEEP_MODELS, stages=STAGES, *, gpu: str = "A100-80GB",
               precision: str = "bf16-mixed", batch_size: int = 1, seq_len: int = 4096,
               checkpointing: bool = True, offload: str = "none", device: str = "cuda",
               max_gpus: int = MAX_GPUS) -> FitCounts:
    """The smallest number of ``gpu`` GPUs that fits each model at each ZeRO stage (chapter: 6).

    The fit is judged by the estimate.
    """
    stages = tuple(check_stage(s) for s in stages)
    kw = _sweep_kwargs(precision, batch_size, seq_len, checkpointing, offload, device)
    counts = {_name(m): {s: smallest_gpus(m, s, gpu=gpu, max_gpus=max_gpus, **kw)
                         for s in stages} for m in models}
    g = get_gpu(gpu)
    return FitCounts(gpu=g.name, usable_bytes=g.usable_bytes, models=tuple(counts),
                     stages=stages,
                     counts=counts, max_gpus=max_gpus, setup=kw)
