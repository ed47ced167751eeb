"""Every data-parallel strategy run on N processes (chapter 6).

Each is held to the formulas and to one process.

:func:`distributed_memory` launches the strategies once (``torchrun``, N ranks, one launch for
all of them: process start-up costs more than the training), trains the same model from the
same weights on the same global batches with each, and sets beside what every rank measured:

* the ZeRO formula for the rank's model states (:mod:`memlab.distributed.zero`);
* 2Ψ or 3Ψ for the bytes it communicated;
* one process trained on the whole batch: the losses and the final weights.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from memlab.device import device_memory_bytes
from memlab.distributed import zero
from memlab.distributed.launch import launch, launch_device
from memlab.distributed.runs import LR, one_process_memory, single_process
from memlab.distributed.strategies import LABELS, STAGE, STRATEGIES
from memlab.errors import MemlabError
from memlab.model.config import ModelConfig
from memlab.units import to_unit

# The chapter's model at CI scale: small enough for 4 processes on 2 cores, with enough blocks
# that the embedding and the head do not dominate (ZeroRedundancyOptimizer splits whole tensors).
DIST_CI = ModelConfig(name="dist-ci", vocab_size=512, n_layer=4, n_head=4, d_model=128, d_ff=352,
                      max_seq_len=64)
MODELS = {"dist-ci": DIST_CI}


def model_for(name: str) -> ModelConfig:
    """The chapter's model ``dist-ci``, or any preset or config.json (chapter: 6)."""
    from memlab.model.config import get_config

    return MODELS[name] if name in MODELS else get_config(name)


def ranks_for(nproc: int | None) -> int:
    """``nproc``, or one rank per GPU when None (4 on a machine without GPUs) (chapter: 6)."""
    if nproc is not None:
        return nproc
    return torch.cuda.device_count() if torch.cuda.is_available() else 4


# The stated tolerance against one process. Losses: relative 1e-5 (the ranks sum the same
# products in another order). Weights: AdamW divides each gradient by its own root mean
# square, so where a gradient is ~0 a rounding difference can flip the sign of a whole step;
# such weights may differ by up to the learning rate per step, all others by at most 1e-5.
# On a GPU some kernels (the embedding's backward) add in a different order on every run, so
# one process run twice differs too: the tolerance is then at least twice that difference.
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
WEIGHT_OUTLIER_SHARE = 1e-3  # at most this share of weights may exceed WEIGHT_ATOL


@dataclass(frozen=True)
class Agreement:
    """How far a run is from one process: losses (relative), weights (absolute), outlier share."""

    max_loss_diff: float
    max_weight_diff: float
    weight_outlier_share: float

    def within(self, tolerance: Agreement) -> bool:
        """Every measure at or below ``tolerance``'s (chapter: 6)."""
        return (self.max_loss_diff <= tolerance.max_loss_diff
                and self.max_weight_diff <= tolerance.max_weight_diff
                and self.weight_outlier_share <= tolerance.weight_outlier_share)


def agreement(losses, weights: dict[str, torch.Tensor], ref_losses,
              ref_weights: dict[str, torch.Tensor]) -> Agreement:
    """Losses and final weights of a run against a reference run (chapter: 6)."""
    diffs = torch.cat([(weights[k] - ref_weights[k]).abs().flatten() for k in ref_weights])
    return Agreement(
        max_loss_diff=max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True)),
        max_weight_diff=float(diffs.max()),
        weight_outlier_share=float((diffs > WEIGHT_ATOL).double().mean()))


def tolerance(lr: float, steps: int, noise: Agreement | None = None) -> Agreement:
    """The stated tolerance, widened where one process's run has noise (chapter: 6).

    It is widened to twice one process's run-to-run noise where there is some.
    """
    tol = Agreement(LOSS_RTOL, lr * steps, WEIGHT_OUTLIER_SHARE)
    if noise is None:
        return tol
    return Agreement(max(tol.max_loss_diff, 2 * noise.max_loss_diff),
                     max(tol.max_weight_diff, 2 * noise.max_weight_diff),
                     max(tol.weight_outlier_share, 2 * noise.weight_outlier_share))


@dataclass(frozen=True)
class RankMemory:
    """What one rank held and sent in the measured step; bytes."""

    rank: int
    parameters: int  # its local parameter shards, after the optimizer step
    gradients: int  # its local gradient shards
    optimizer_states: int  # its local optimizer states
    parameters_after_forward: int  # parameter bytes alive between forward and backward
    activations: int  # saved for backward (parameters not counted)
    peak_bytes: int  # held before the step + the step's measured peak above that
    offloaded_bytes: int  # model states kept in CPU memory instead of the rank's device
    comm: dict  # collective -> {"calls", "bytes" (payload), "sent_bytes" (ring)}
    comm_volume_bytes: int  # the ZeRO paper's volume: payloads, an all-reduce twice

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer states, bytes (chapter: 6).

        The parameters are counted as held between forward and backward.
        """
        return self.parameters_after_forward + self.gradients + self.optimizer_states


@dataclass(frozen=True)
class StrategyRun:
    """One strategy on every rank, beside its formulas and one process."""

    strategy: str
    label: str
    stage: int
    shard_size: int  # ranks a parameter is split over
    mesh_shape: tuple[int, ...]
    formula: str  # the ZeRO formula of the rank's model states, in Ψ and N
    formula_bytes: int  # that formula for this model and N
    built_bytes: int  # what PyTorch's class holds by construction (FSDP2 kept after forward:
    # its shard beside the gathered parameters, pΨ + (p+g+k)Ψ/N); the formula elsewhere
    comm_formula_bytes: int  # 2Ψ (DDP, stages 1-2) or 3Ψ (stage 3), in the run's bytes
    ranks: tuple[RankMemory, ...]
    losses: tuple[float, ...]  # the global batch's loss at each step
    step_seconds: float  # median of the unmeasured steps
    against_one_process: Agreement
    tolerance: Agreement
    # rank 0's measured step: (event, bytes of parameters FSDP holds gathered just then)
    gather_timeline: tuple[tuple[str, int], ...] = ()

    @property
    def state_ratio(self) -> float:
        """Largest rank's measured model states over the ZeRO formula (chapter: 6)."""
        return max(r.model_states for r in self.ranks) / self.formula_bytes

    @property
    def built_ratio(self) -> float:
        """Largest rank's measured model states over what PyTorch's class holds by construction (chapter: 6)."""
        return max(r.model_states for r in self.ranks) / self.built_bytes

    @property
    def comm_ratio(self) -> float | None:
        """Rank 0's measured communication volume over 2Ψ or 3Ψ (chapter: 6).

        None on one rank, which sends nothing.
        """
        if len(self.ranks) == 1:
            return None
        return self.ranks[0].comm_volume_bytes / self.comm_formula_bytes

    @property
    def matches_one_process(self) -> bool:
        """Losses and weights within the stated tolerance of one process (chapter: 6)."""
        return self.against_one_process.within(self.tolerance)


@dataclass(frozen=True)
class DistributedMemory:
    """Every strategy, measured rank by rank (chapter: 6)."""

    config: dict  # the model's ModelConfig as a dict
    parameters: int
    world_size: int
    backend: str
    device: str
    batch_size: int  # global, split evenly over the ranks
    seq_len: int
    steps: int
    layout: str  # bytes per parameter of the runs: the formulas' layout
    lr: float
    reference_losses: tuple[float, ...]  # one process, whole batch
    reference_noise: Agreement | None  # one process run twice (a GPU); None where it repeats exactly
    reference_activations: int  # one process, whole batch: saved for backward, bytes
    reference_peak_bytes: int  # one process, whole batch: its step's peak, bytes
    runs: tuple[StrategyRun, ...]
    launch_seconds: float  # the whole launch, process start-up included

    def run(self, strategy: str) -> StrategyRun:
        """The run of ``strategy`` (chapter: 6)."""
        for r in self.runs:
            if r.strategy == strategy:
                return r
        raise MemlabError(f"no run of strategy {strategy!r}; accepted: "
                          + ", ".join(r.strategy for r in self.runs))

    def cannot_show(self) -> tuple[str, ...]:
        """What this run is no evidence of, each found in its numbers (chapter: 6).

        On one rank nothing is split, sent or gathered: its collectives move no byte, FSDP issues
        none, and every mark of its gather timelines reads 0. Empty for a run that shows them.
        """
        out = []
        if self.world_size == 1:
            out.append("sharding: one rank holds every strategy's whole model states")
        fsdp = [r for r in self.runs if r.stage >= 2]
        if fsdp and not any(r.ranks[0].comm for r in fsdp):
            out.append("FSDP's collectives: " + ", ".join(r.strategy for r in fsdp)
                       + " issued no all-gather or reduce-scatter, so no payload of theirs "
                         "was counted")
        if self.world_size == 1 or not any(
                v.get("sent_bytes", 0) for r in self.runs for k in r.ranks for v in k.comm.values()):
            out.append("bytes on a link: no rank sent a byte to another")
        timelines = [r for r in self.runs if r.gather_timeline]
        if timelines and not any(b for r in timelines for _, b in r.gather_timeline):
            out.append("FSDP's gathering: every mark of every gather timeline reads 0 bytes")
        return tuple(out)

    def table(self, unit: str = "MiB") -> str:
        """Per-rank bytes by category (rank 0), the formula, and the check against one process (chapter: 6)."""
        head = (f"{self.parameters:,} parameters on {self.world_size} ranks ({self.backend}, "
                f"{self.device}), global batch {self.batch_size} x {self.seq_len}, "
                f"{self.steps} steps, {self.layout}; {unit} per rank")
        cols = f"{'strategy':<34}{'params':>8}{'grads':>8}{'optim':>8}{'acts':>8}{'peak':>8}" \
               f"{'states/formula':>16}{'/as built':>10}{'comm/formula':>14}  same as 1 process"
        lines = [head, cols]
        for r in self.runs:
            k = r.ranks[0]
            lines.append(
                f"{r.label:<34}{to_unit(k.parameters_after_forward, unit):>8.2f}"
                f"{to_unit(k.gradients, unit):>8.2f}{to_unit(k.optimizer_states, unit):>8.2f}"
                f"{to_unit(k.activations, unit):>8.2f}{to_unit(k.peak_bytes, unit):>8.2f}"
                f"{r.state_ratio:>16.3f}{r.built_ratio:>10.3f}"
                + (f"{r.comm_ratio:>14.3f}  " if r.comm_ratio is not None else f"{'-':>14}  ")
                +
                f"{'yes' if r.matches_one_process else 'NO'}")
        return "\n".join(lines)


def built_bytes(strategy: str, parameters: int, gpus: int, layout: str = "fp32") -> int:
    """Model states one rank of ``strategy`` holds by construction, bytes (chapter: 6).

    The ZeRO formula, except for FSDP2 kept after forward.

    FSDP2 without resharding after the forward keeps every parameter gathered from forward to
    backward, and its own shard beside it: pΨ + (p+g+k)Ψ/N, where ZeRO-2's formula has
    pΨ + (g+k)Ψ/N.
    """
    p = zero.LAYOUTS[layout][0]
    if strategy == "zero2":
        return zero.model_states(parameters, 3, gpus, layout=layout).total + p * parameters
    return zero.model_states(parameters, STAGE[strategy], gpus, layout=layout).total


def _unmeasured(times: list[float]) -> list[float]:
    """The steps timed without the first (warm-up) and the last (measured under trackers)."""
    return times[1:-1] or times[:-1] or times


def _formula_gpus(strategy: str, world: int, shard_size: int) -> int:
    return shard_size if strategy in ("hsdp", "replicate") else world


def _rank_memory(answer: dict, strategy: str) -> RankMemory:
    a = answer["strategies"][strategy]
    s = a["state_bytes"]
    return RankMemory(rank=answer["rank"], parameters=s["parameters"], gradients=s["gradients"],
                      optimizer_states=s["optimizer_states"],
                      parameters_after_forward=a["parameters_after_forward_bytes"],
                      activations=a["saved_activation_bytes"], peak_bytes=a["peak_bytes"],
                      offloaded_bytes=s.get("offloaded", 0), comm=a["comm"],
                      comm_volume_bytes=a["comm_volume_bytes"])


def check_fits(cfg: ModelConfig, nproc: int, batch_size: int, seq_len: int,
               device: torch.device) -> int:
    """Refuse, before any process starts, a run whose ranks would not fit (chapter: 6).

    It returns the estimated bytes.

    The estimate is DDP's (every rank holds everything: the most any strategy holds) plus one
    rank's activations; on a CPU the ranks share the host's memory.
    """
    from memlab.memory.estimator import estimate

    one = estimate(cfg, batch_size=max(batch_size // nproc, 1), seq_len=seq_len,
                   device="cuda" if device.type == "cuda" else "cpu")
    need = one.peak_bytes * (nproc if device.type == "cpu" else 1)
    have = device_memory_bytes(device)
    if have is not None and need > 0.8 * have:
        where = "the host's memory" if device.type == "cpu" else "one GPU"
        raise MemlabError(f"{nproc} ranks of {cfg.name} need about {to_unit(need, 'GiB'):.1f} GiB "
                          f"(estimated), more than 80% of {where} ({to_unit(have, 'GiB'):.1f} "
                          "GiB); use --scale ci or fewer ranks")
    return need


def distributed_memory(cfg: ModelConfig, *, nproc: int = 4, strategies=STRATEGIES,
                       steps: int = 3, batch_size: int = 8, seq_len: int = 32, lr: float = LR,
                       timeout_s: float = 180.0) -> DistributedMemory:
    """Run every strategy on ``nproc`` ranks; per-rank bytes, communication and losses (chapter: 6)."""
    from memlab.errors import check_choice

    for s in strategies:
        check_choice("strategy", s, STRATEGIES)
    if nproc < 4:  # a 2-D mesh needs 4 ranks; on fewer, sharding factors are not told apart
        strategies = tuple(s for s in strategies if s not in ("hsdp", "replicate"))
    device = torch.device(launch_device(nproc))  # the ranks' device; one process uses it too
    check_fits(cfg, nproc, batch_size, seq_len, device)
    with tempfile.TemporaryDirectory(prefix="memlab-weights-") as wd:
        spec = dict(config=asdict(cfg), strategies=list(strategies), steps=steps,
                    batch_size=batch_size, seq_len=seq_len, lr=lr, weights_dir=wd)
        done = launch("memlab.distributed.runs:strategy_ranks", spec, nproc=nproc,
                      timeout_s=timeout_s)
        one = dict(steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr, device=device)
        ref_losses, ref_weights = single_process(cfg, **one)
        noise = None
        if device.type == "cuda":  # the noise floor: one process, twice
            noise = agreement(*single_process(cfg, **one), ref_losses, ref_weights)
        tol = tolerance(lr, steps, noise)
        ref_memory = one_process_memory(cfg, batch_size=batch_size, seq_len=seq_len,
                                        device=device)
        runs = []
        n = cfg.num_parameters()
        for s in strategies:
            first = done.ranks[0]["strategies"][s]
            shard = first["shard_size"]
            stage = STAGE[s]
            gpus = _formula_gpus(s, nproc, shard)
            losses = tuple(first["losses"])
            got = agreement(losses, torch.load(Path(wd) / f"{s}.pt", weights_only=True),
                            ref_losses, ref_weights)
            runs.append(StrategyRun(
                strategy=s, label=LABELS[s], stage=stage, shard_size=shard,
                mesh_shape=tuple(first["mesh_shape"]),
                formula=zero.formula(stage, layout="fp32"),
                formula_bytes=zero.model_states(n, stage, gpus, layout="fp32").total,
                built_bytes=built_bytes(s, n, gpus),
                comm_formula_bytes=zero.comm_volume(n, 0 if shard == 1 else stage,
                                                    bytes_per_value=4),
                ranks=tuple(_rank_memory(a, s) for a in done.ranks),
                losses=losses,
                step_seconds=statistics.median(_unmeasured(first["step_seconds"])),
                against_one_process=got, tolerance=tol,
                gather_timeline=tuple((e, int(b)) for e, b in first.get("gather_timeline", ()))))
    return DistributedMemory(
        config=asdict(cfg), parameters=n, world_size=nproc, backend=done.ranks[0]["backend"],
        device=done.ranks[0]["device"].split(":")[0], batch_size=batch_size, seq_len=seq_len,
        steps=steps, layout="fp32", lr=lr, reference_losses=tuple(ref_losses),
        reference_noise=noise, reference_activations=ref_memory["activations"],
        reference_peak_bytes=ref_memory["peak_bytes"], runs=tuple(runs),
        launch_seconds=done.wall_s)
