"""DeepSpeed's ZeRO, the reference implementation of the three stages (chapter 6).

Each stage is measured rank by rank.

:func:`deepspeed_ranks` is what each rank runs (through :func:`memlab.distributed.launch.launch`):
for every run in ``spec['runs']`` it builds the same model from the same seed, hands it to
``deepspeed.initialize`` (fp32: no fp16 or bf16 section; PyTorch's AdamW inside,
``torch_adam``), trains the same steps on this rank's rows of the same global batches as
:mod:`memlab.distributed.runs`, and reports, for the last step, every tensor storage the rank
holds, found by walking the engine, its ZeRO optimizer and the parameters, each storage counted
once, in the first category that reaches it:

* ``parameters``: the storages the model's parameters live in (stages 1 and 2: one flat buffer
  of all of them, ``bit16_groups_flat``, named "bit16" even when it holds fp32), and at stage 3
  each parameter's partition ``p.ds_tensor`` plus any parameter still gathered whole;
* ``optimizer_states``: the inner AdamW's ``state`` (``exp_avg``, ``exp_avg_sq``, ``step``);
* ``master_weights``: the flat fp32 partition the inner AdamW updates
  (``single_partition_of_fp32_groups`` at stages 1-2, ``fp32_partitioned_groups_flat`` at
  stage 3). DeepSpeed keeps it even when training in fp32: a second copy of the rank's share
  of the parameters, which the ZeRO formulas for fp32 do not count;
* ``gradients``, counted after the backward pass and before the step (the step frees them):
  every storage reached through an attribute whose name says "grad", ``p.grad`` included
  (stages 1-2: ``averaged_gradients``, views of ``grads_in_partition``, which holds *whole* the
  parameters that overlap the rank's partition; stage 3: ``grad_partitions_flat_buffer``);
* ``other``: anything else (a few scalars).

The peak of a step is measured too. At stages 1 and 2 it is dominated by a buffer the counts
above never see: the gradient bucket (``ipg_buffer``), allocated for the backward pass at its
configured size, ``reduce_bucket_size`` = 5e8 elements (2 GB in fp32) by default, whatever the
model's size, and freed at its end.

The parent, :func:`deepspeed_comparison`, sets each stage beside the ZeRO formula
(:func:`memlab.distributed.zero.model_states`, layout ``fp32``), beside PyTorch's own
strategies on the same model (:func:`memlab.distributed.sharding.distributed_memory`), and its
losses and weights beside one process trained on the whole batch.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from memlab.distributed import zero
from memlab.distributed.runs import LR, batches, single_process
from memlab.distributed.sharding import (
    Agreement,
    DistributedMemory,
    RankMemory,
    agreement,
    distributed_memory,
    model_for,
    ranks_for,
    tolerance,
)
from memlab.errors import MemlabError, check_choice, require
from memlab.model.config import ModelConfig
from memlab.model.transformer import build_model, lm_loss
from memlab.units import to_unit

PURPOSE = "DeepSpeed's ZeRO"
CATEGORIES = ("parameters", "gradients", "optimizer_states", "master_weights", "other")
MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
# DeepSpeed's default: stage 3 keeps every parameter with fewer elements than this gathered
# whole on every rank ("persistent"), besides its partition. Every parameter of dist-ci is
# below it, so there every rank keeps the whole model as well: run ds-zero3 sets it to 0,
# ds-zero3-default keeps the default.
DEFAULT_PERSISTENCE_THRESHOLD = 100_000

REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size (stages 1-2)

# name -> (stage, stage3_param_persistence_threshold; None: DeepSpeed's default)
RUNS = {
    "ds-zero1": (1, None),
    "ds-zero2": (2, None),
    "ds-zero3": (3, 0),
    "ds-zero3-default": (3, None),
}
LABELS = {
    "ds-zero1": "ZeRO-1 (DeepSpeed)",
    "ds-zero2": "ZeRO-2 (DeepSpeed)",
    "ds-zero3": "ZeRO-3 (DeepSpeed, all partitioned)",
    "ds-zero3-default": "ZeRO-3 (DeepSpeed, default persistence)",
}
PYTORCH_STRATEGY = {"ds-zero1": "zero1", "ds-zero2": "zero2", "ds-zero3": "zero3",
                    "ds-zero3-default": "zero3"}

# nproc None: one process per GPU, 4 on a CPU; the same sizes as the distributed-memory runs
SIZES = {
    "ci": dict(model="dist-ci", nproc=4, steps=3, batch_size=8, seq_len=32, lr=LR,
               timeout_s=600.0),  # the first launch compiles DeepSpeed's shm op (~1.5-2 min)
    "full": dict(model="llama-1b", nproc=None, steps=4, batch_size=8, seq_len=512, lr=1e-4,
                 timeout_s=1200.0),
}


def require_deepspeed():
    """The ``deepspeed`` module, or a one-line error saying how to install it (chapter: 6)."""
    return require("deepspeed", PURPOSE, extra="deepspeed")


def deepspeed_version() -> str:
    """The installed DeepSpeed's version, found without importing it (chapter: 6).

    Importing it takes seconds. Without DeepSpeed, a one-line error.
    """
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("deepspeed") is None:
        require_deepspeed()  # raises the one-line error
    try:
        return version("deepspeed")
    except PackageNotFoundError:  # importable but not installed as a distribution
        return require_deepspeed().__version__


def ds_config(stage: int, *, micro_batch: int, lr: float,
              persistence_threshold: int | None = None) -> dict:
    """DeepSpeed's config for fp32 training with PyTorch's AdamW at ZeRO ``stage`` (chapter: 6)."""
    conf = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0,
                                                   "torch_adam": True}},
        "zero_optimization": {"stage": zero.check_stage(stage)},
        "steps_per_print": 2**31 - 1,  # no progress lines
    }
    if persistence_threshold is not None:
        conf["zero_optimization"]["stage3_param_persistence_threshold"] = persistence_threshold
    return conf


# What a rank holds ---------------------------------------------------------------------------
class _Storages:
    """Every storage reached, once, with the category and name that reached it first."""

    def __init__(self):
        self.found: dict[tuple[str, int], tuple[str, str, int]] = {}

    def add(self, t, category: str, name: str) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        s = t.untyped_storage()
        if s.nbytes() == 0:  # a released stage-3 parameter
            return
        self.found.setdefault((t.device.type, s.data_ptr()), (category, name, s.nbytes()))

    def walk(self, obj, name: str, category_of, depth: int = 0) -> None:
        """Tensors inside lists, tuples and dicts, to a small depth (not into other objects)."""
        if isinstance(obj, torch.Tensor):
            self.add(obj, category_of(name, obj), name)
            if obj.grad is not None:
                self.add(obj.grad, "gradients", name + ".grad")
        elif depth < 4 and isinstance(obj, (list, tuple)):
            for x in obj:
                self.walk(x, name, category_of, depth + 1)
        elif depth < 4 and isinstance(obj, dict):
            for x in obj.values():
                self.walk(x, name, category_of, depth + 1)

    def by_category(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {c: {} for c in CATEGORIES}
        for category, name, nbytes in self.found.values():
            out[category][name] = out[category].get(name, 0) + nbytes
        return out


def _by_name(name: str, t: torch.Tensor) -> str:
    if name in MASTER_ATTRS:
        return "master_weights"
    if "grad" in name.lower() and t.numel() > 1:
        return "gradients"
    return "other"


def held_buffers(engine) -> dict[str, dict[str, int]]:
    """Bytes of every storage a DeepSpeed engine holds on this rank (chapter: 6).

    They are given by category and by where each was found.
    """
    found = _Storages()
    params = list({id(p): p for p in engine.module.parameters()}.values())
    for p in params:
        found.add(p.data, "parameters", "param.data")
        for k, v in vars(p).items():
            if isinstance(v, torch.Tensor):
                found.add(v, "parameters" if k == "ds_tensor" else _by_name(k, v), f"param.{k}")
        found.add(p.grad, "gradients", "param.grad")
    zopt = engine.optimizer
    inner = getattr(zopt, "optimizer", zopt)
    for st in inner.state.values():
        for v in st.values():
            found.add(v, "optimizer_states", "optimizer.state")
    for g in inner.param_groups:
        for p in g["params"]:
            found.add(p, "master_weights", "optimizer.param_groups")
    if zopt is not inner:
        for k, v in vars(zopt).items():
            if k != "optimizer":
                found.walk(v, k, _by_name)
    for k, v in vars(engine).items():
        if k not in ("module", "optimizer", "basic_optimizer", "_modules", "_parameters"):
            found.walk(v, f"engine.{k}", _by_name)
    return found.by_category()


def _totals(buffers: dict[str, dict[str, int]]) -> dict[str, int]:
    return {c: sum(buffers[c].values()) for c in CATEGORIES}


# What each rank runs -------------------------------------------------------------------------
def _one_run(name: str, spec: dict, device: torch.device, data) -> dict:
    import deepspeed
    import torch.distributed as dist

    from memlab.measure.peak import measure_peak

    stage, threshold = RUNS[name]
    world, rank = dist.get_world_size(), dist.get_rank()
    n = spec["batch_size"] // world
    rows = slice(rank * n, (rank + 1) * n)
    cfg = ModelConfig(**spec["config"])
    model = build_model(cfg, seed=0).to(device)
    conf = ds_config(stage, micro_batch=n, lr=spec["lr"], persistence_threshold=threshold)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                      config=conf)
    out: dict = dict(name=name, stage=stage, persistence_threshold=threshold,
                     optimizer=type(engine.optimizer).__name__)
    losses, times = [], []
    steps = len(data)
    for s, (x, y) in enumerate(data):
        x, y = x[rows].to(device), y[rows].to(device)
        last = s == steps - 1
        seen: dict = {}

        def step(x=x, y=y, last=last, seen=seen, engine=engine):
            loss = lm_loss(engine(x), y)
            if last:
                seen["forward"] = held_buffers(engine)
            engine.backward(loss)
            if last:
                seen["backward"] = held_buffers(engine)
            engine.step()
            return loss.detach()

        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if last:
            before = sum(_totals(held_buffers(engine)).values())
            loss, peak = measure_peak(step, device=device)
            after = held_buffers(engine)
            out["after_forward"] = seen["forward"]
            out["after_backward"] = seen["backward"]
            out["after_step"] = after
            out["held_before_step_bytes"] = before
            out["peak_bytes"] = before + peak.peak_allocated_bytes
            out["peak_method"] = peak.method
        else:
            loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        mean = loss.clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        losses.append(float(mean) / world)
    out["losses"] = losses
    out["step_seconds"] = times
    weights = _full_weights(engine.module, stage)  # a collective at stage 3: every rank joins
    if rank == 0 and spec.get("weights_dir"):
        torch.save(weights, Path(spec["weights_dir"]) / f"{name}.pt")
    engine.destroy()
    del engine, model, weights
    return out


def _full_weights(module: nn.Module, stage: int) -> dict[str, torch.Tensor]:
    import deepspeed

    def copy():
        return {n: p.detach().float().cpu().clone() for n, p in module.named_parameters()}

    if stage < 3:
        return copy()
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        return copy()


def deepspeed_ranks(spec: dict, device: torch.device) -> dict:
    """One rank's part of every DeepSpeed run in ``spec['runs']``, in turn (chapter: 6)."""
    import torch.distributed as dist

    deepspeed = require_deepspeed()
    deepspeed.init_distributed(dist_backend=dist.get_backend())  # joins the existing group
    cfg = ModelConfig(**spec["config"])
    data = batches(cfg, spec["steps"], spec["batch_size"], spec["seq_len"])
    return dict(runs={r: _one_run(r, spec, device, data) for r in spec["runs"]},
                deepspeed_version=deepspeed.__version__)


# The parent ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeepSpeedRank:
    """What one rank held in DeepSpeed's measured step; bytes."""

    rank: int
    parameters: int  # held between steps (after the optimizer step)
    parameters_after_forward: int  # between forward and backward
    gradients: int  # after backward, before the step frees them
    optimizer_states: int  # the inner AdamW's exp_avg, exp_avg_sq, step
    master_weights: int  # the flat fp32 partition the inner AdamW updates
    other: int
    peak_bytes: int  # held before the step + the step's measured peak above that
    buffers: dict  # after backward: category -> {where found: bytes}

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer states, as the ZeRO formula counts them, bytes (chapter: 6)."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def held(self) -> int:
        """Model states + DeepSpeed's fp32 master partition, bytes (chapter: 6)."""
        return self.model_states + self.master_weights


@dataclass(frozen=True)
class DeepSpeedRun:
    """One DeepSpeed stage on every rank, beside the ZeRO formula, PyTorch and one process."""

    name: str
    label: str
    stage: int
    persistence_threshold: int  # stage 3: parameters below this many elements stay whole
    formula: str
    formula_bytes: int  # zero.model_states(Ψ, stage, N, layout="fp32").total
    ranks: tuple[DeepSpeedRank, ...]
    losses: tuple[float, ...]  # the global batch's loss at each step
    step_seconds: float  # median of the unmeasured steps
    against_one_process: Agreement
    tolerance: Agreement
    pytorch_strategy: str  # the PyTorch strategy of the same stage
    pytorch_label: str
    pytorch_ranks: tuple[RankMemory, ...]

    @property
    def state_ratio(self) -> float:
        """Largest rank's model states (master copy left out) over the formula (chapter: 6)."""
        return max(r.model_states for r in self.ranks) / self.formula_bytes

    @property
    def held_ratio(self) -> float:
        """Largest rank's model states + master copy over the formula (chapter: 6)."""
        return max(r.held for r in self.ranks) / self.formula_bytes

    @property
    def pytorch_ratio(self) -> float:
        """Largest rank's DeepSpeed bytes (master copy included) over PyTorch's model states (chapter: 6)."""
        return max(r.held for r in self.ranks) / max(r.model_states for r in self.pytorch_ranks)

    @property
    def matches_one_process(self) -> bool:
        """Losses and weights within the stated tolerance of one process (chapter: 6)."""
        return self.against_one_process.within(self.tolerance)


@dataclass(frozen=True)
class DeepSpeedComparison:
    """DeepSpeed's three ZeRO stages measured rank by rank, beside the formulas and PyTorch (chapter: 6)."""

    config: dict  # the model's ModelConfig as a dict
    parameters: int
    world_size: int
    backend: str
    device: str
    batch_size: int  # global, split evenly over the ranks
    seq_len: int
    steps: int
    lr: float
    deepspeed_version: str
    reference_losses: tuple[float, ...]  # one process, whole batch
    runs: tuple[DeepSpeedRun, ...]
    launch_seconds: float  # the DeepSpeed launch, start-up and any op compilation included

    def run(self, name: str) -> DeepSpeedRun:
        """The run called ``name`` (chapter: 6)."""
        for r in self.runs:
            if r.name == name:
                return r
        raise MemlabError(f"no DeepSpeed run {name!r}; accepted: "
                          + ", ".join(r.name for r in self.runs))

    def table(self, unit: str = "MiB") -> str:
        """Rank 0's bytes by category for DeepSpeed and PyTorch at each stage (chapter: 6).

        With the formula, and the check against one process.
        """
        head = (f"{self.parameters:,} parameters on {self.world_size} ranks ({self.backend}, "
                f"{self.device}), DeepSpeed {self.deepspeed_version}, global batch "
                f"{self.batch_size} x {self.seq_len}, {self.steps} steps, fp32; {unit} per rank")
        cols = (f"{'run':<42}{'params':>8}{'grads':>8}{'optim':>8}{'master':>8}{'total':>8}"
                f"{'formula':>9}{'ratio':>7}{'peak':>9}  same as 1 process")
        lines = [head, cols]
        for r in self.runs:
            k, p = r.ranks[0], r.pytorch_ranks[0]
            lines.append(
                f"{r.label:<42}{to_unit(k.parameters, unit):>8.2f}"
                f"{to_unit(k.gradients, unit):>8.2f}{to_unit(k.optimizer_states, unit):>8.2f}"
                f"{to_unit(k.master_weights, unit):>8.2f}{to_unit(k.held, unit):>8.2f}"
                f"{to_unit(r.formula_bytes, unit):>9.2f}{r.held_ratio:>7.3f}"
                f"{to_unit(k.peak_bytes, unit):>9.1f}  {'yes' if r.matches_one_process else 'NO'}")
            lines.append(
                f"{'  ' + r.pytorch_label:<42}{to_unit(p.parameters_after_forward, unit):>8.2f}"
                f"{to_unit(p.gradients, unit):>8.2f}{to_unit(p.optimizer_states, unit):>8.2f}"
                f"{to_unit(0, unit):>8.2f}{to_unit(p.model_states, unit):>8.2f}"
                f"{to_unit(r.formula_bytes, unit):>9.2f}"
                f"{p.model_states / r.formula_bytes:>7.3f}{to_unit(p.peak_bytes, unit):>9.1f}")
        return "\n".join(lines)


def _unmeasured(times: list[float]) -> list[float]:
    return times[1:-1] or times[:-1] or times


def _rank(answer: dict, name: str) -> DeepSpeedRank:
    a = answer["runs"][name]
    step, back = _totals(a["after_step"]), _totals(a["after_backward"])
    return DeepSpeedRank(
        rank=answer["rank"], parameters=step["parameters"],
        parameters_after_forward=_totals(a["after_forward"])["parameters"],
        gradients=back["gradients"], optimizer_states=step["optimizer_states"],
        master_weights=step["master_weights"], other=back["other"], peak_bytes=a["peak_bytes"],
        buffers={c: dict(v) for c, v in a["after_backward"].items() if v})


def deepspeed_comparison(scale: str, *, pytorch: DistributedMemory | None = None
                         ) -> DeepSpeedComparison:
    """DeepSpeed's ZeRO stages 1-3 on N ranks against the formulas (chapter: 6).

    Also against PyTorch's strategies and one process.

    ``pytorch``: a :func:`memlab.distributed.sharding.distributed_memory` result of the same
    model and sizes to compare with; run here (ZeRO-1, ZeRO-2, ZeRO-3 only) when None.
    """
    from memlab.device import pick_device
    from memlab.distributed.launch import launch
    from memlab.distributed.sharding import check_fits

    check_choice("scale", scale, tuple(SIZES))
    version = deepspeed_version()

    size = dict(SIZES[scale])
    cfg = model_for(size["model"])
    nproc = ranks_for(size["nproc"])
    steps, batch_size, seq_len, lr = (size[k] for k in ("steps", "batch_size", "seq_len", "lr"))
    device = pick_device()
    if device.type not in ("cpu", "cuda"):
        device = torch.device("cpu")
    check_fits(cfg, nproc, batch_size, seq_len, device)
    runs = list(RUNS)
    env = dict(DS_ACCELERATOR="cuda" if device.type == "cuda" else "cpu")
    with tempfile.TemporaryDirectory(prefix="memlab-weights-") as wd:
        spec = dict(config=asdict(cfg), runs=runs, steps=steps, batch_size=batch_size,
                    seq_len=seq_len, lr=lr, weights_dir=wd)
        done = launch("memlab.distributed.deepspeed_zero:deepspeed_ranks", spec, nproc=nproc,
                      timeout_s=size["timeout_s"], env=env)
        weights = {r: torch.load(Path(wd) / f"{r}.pt", weights_only=True) for r in runs}
    if pytorch is None:
        pytorch = distributed_memory(cfg, nproc=nproc, strategies=("zero1", "zero2", "zero3"),
                                     steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr)
    ref_losses, ref_weights = single_process(cfg, steps=steps, batch_size=batch_size,
                                             seq_len=seq_len, lr=lr, device=device)
    tol = tolerance(lr, steps, pytorch.reference_noise)
    n = cfg.num_parameters()
    out = []
    for r in runs:
        stage, threshold = RUNS[r]
        first = done.ranks[0]["runs"][r]
        losses = tuple(first["losses"])
        torch_run = pytorch.run(PYTORCH_STRATEGY[r])
        out.append(DeepSpeedRun(
            name=r, label=LABELS[r], stage=stage,
            persistence_threshold=DEFAULT_PERSISTENCE_THRESHOLD if threshold is None
            else threshold,
            formula=zero.formula(stage, layout="fp32"),
            formula_bytes=zero.model_states(n, stage, nproc, layout="fp32").total,
            ranks=tuple(_rank(a, r) for a in done.ranks), losses=losses,
            step_seconds=statistics.median(_unmeasured(first["step_seconds"])),
            against_one_process=agreement(losses, weights[r], ref_losses, ref_weights),
            tolerance=tol, pytorch_strategy=torch_run.strategy, pytorch_label=torch_run.label,
            pytorch_ranks=torch_run.ranks))
    return DeepSpeedComparison(
        config=asdict(cfg), parameters=n, world_size=nproc, backend=done.ranks[0]["backend"],
        device=done.ranks[0]["device"].split(":")[0], batch_size=batch_size, seq_len=seq_len,
        steps=steps, lr=lr, deepspeed_version=version,
        reference_losses=tuple(ref_losses), runs=tuple(out), launch_seconds=done.wall_s)
