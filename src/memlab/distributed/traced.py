"""Per-rank memory of a sharded (FSDP2) training step, traced in one process.

A model sharded over W GPUs with ``torch.distributed.fsdp.fully_shard`` is built and stepped
on fake tensors: a fake process group of W ranks stands in for the cluster (its collectives
only produce tensors of the right shapes), ``FakeTensorMode`` stands in for the GPU, and
``FSDPMemTracker`` files every storage rank 0 would hold as a sharded or unsharded parameter,
a sharded or unsharded gradient, an all-gather or reduce-scatter buffer, an activation, a
temporary, an optimizer state or an input. Nothing is allocated: a 70B model over 64 ranks is
counted on a laptop. This is how torchtitan estimates memory before a run.

Each block is one FSDP unit, and the root (embedding, final norm, head) another, as torchtitan
wraps a Llama. ``reshard_after_forward=True`` frees a block's gathered parameters after its
forward and gathers them again for its backward (ZeRO-3); ``False`` keeps them from forward to
backward (ZeRO-2).
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import torch

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import FakeScalars, default_dtype
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import check_loss_chunks
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model, model_loss
from memlab.units import to_unit

TRACED_PRECISIONS = ("fp32", "bf16-mixed")  # bf16-mixed: bf16 gathered parameters, fp32 reductions
# Optimizers a sharded step is traced with (on fake tensors: not bitsandbytes' 8-bit kernels).
TRACED_OPTIMIZERS = ("adamw", "adam", "adamw-bf16-moments", "adafactor")



@contextlib.contextmanager
def fake_process_group(world: int, what: str):
    """A fake process group of ``world`` ranks in this process, as rank 0 (chapters: 6, 8, 9).

    Its collectives return at once and move nothing, so one rank's step runs (or is traced)
    without the others. ``what`` names the work in the one-line error when a group exists.
    """
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    check_positive_int("world", world)
    if dist.is_initialized():
        raise MemlabError(f"a process group is already initialized: {what} in a process "
                          "without one")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()

@dataclass(frozen=True)
class ShardedTrace:
    """Bytes one rank holds in a steady-state FSDP2 training step, traced on fake tensors.

    ``peak_by_category`` is FSDPMemTracker's breakdown at the step's peak, one key per category
    it knows (lower-case), zeros included: ``sharded_param`` (this rank's shard of every
    parameter, dim 0 padded to a multiple of the ranks), ``unsharded_param`` (gathered
    parameters), ``sharded_grad``, ``unsharded_grad``, ``all_gather`` and ``reduce_scatter``
    (the collectives' buffers), ``act`` (forward tensors, recomputation included), ``temp``
    (backward temporaries), ``opt`` (optimizer states and the step's scratch), ``buffer``
    and ``inp`` (the batch of token ids).
    """

    model: str
    parameters: int
    gpus: int
    reshard_after_forward: bool
    precision: str
    batch_size: int
    seq_len: int
    checkpointing: bool
    peak_bytes: int  # per-rank peak of the step
    peak_by_category: dict[str, int]  # FSDPMemTracker's categories at the peak
    # sharded params + sharded grads (at the end of the backward) + optimizer states, one rank
    model_state_bytes: int
    optimizer: str = "adamw"
    loss_chunks: int = 1
    offload_activations: bool = False

    def as_dict(self) -> dict:
        """The fields as a plain dict, bytes as ints (chapter: 6)."""
        return asdict(self)

    def table(self, unit: str | None = None) -> str:
        """The categories at the peak as a text table in MiB or GiB with their share (chapter: 6)."""
        unit = unit or ("GiB" if self.peak_bytes >= 2**30 else "MiB")
        zero = "ZeRO-3" if self.reshard_after_forward else "ZeRO-2"
        ckpt = ", checkpointing" if self.checkpointing else ""
        lines = [
            f"traced FSDP2 step, one of {self.gpus} ranks: {self.model} "
            f"({self.parameters:,} parameters), batch {self.batch_size} x seq {self.seq_len}, "
            f"{self.precision}, {zero} (reshard_after_forward={self.reshard_after_forward}){ckpt}",
            f"{'category':<18}{unit:>12}{'share of peak':>16}",
        ]
        for name, b in self.peak_by_category.items():
            share = 100.0 * b / self.peak_bytes if self.peak_bytes else 0.0
            lines.append(f"{name:<18}{to_unit(b, unit):>12.3f}{share:>15.1f}%")
        lines.append(f"{'peak':<18}{to_unit(self.peak_bytes, unit):>12.3f}{100.0:>15.1f}%")
        lines.append(f"model states (params + grads + optimizer states, one rank): "
                     f"{to_unit(self.model_state_bytes, unit):.3f} {unit}")
        return "\n".join(lines)


def _check(model, gpus, reshard_after_forward, precision, batch_size, seq_len,
           checkpointing, optimizer="adamw", loss_chunks=1, offload_activations=False
           ) -> ModelConfig:
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        raise MemlabError(f"gpus must be an integer >= 2, got {gpus!r}")
    if gpus == 1:
        raise MemlabError("gpus must be >= 2 to shard, got 1; trace one unsharded GPU's step "
                          "with memlab.measure.trace_step")
    if gpus < 2:
        raise MemlabError(f"gpus must be an integer >= 2, got {gpus!r}")
    for name, flag in (("reshard_after_forward", reshard_after_forward),
                       ("checkpointing", checkpointing),
                       ("offload_activations", offload_activations)):
        if not isinstance(flag, bool):
            raise MemlabError(f"{name} must be True or False, got {flag!r}")
    check_choice("precision", precision, TRACED_PRECISIONS)
    check_choice("optimizer", optimizer, TRACED_OPTIMIZERS)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_loss_chunks(loss_chunks, batch_size * seq_len)
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    return cfg


def _tracker_class():
    """FSDPMemTracker keeping the step-wide peak only, and its category enum.

    The one place that touches FSDPMemTracker internals (read against torch 2.13's
    ``fsdp2_mem_tracker.py`` and ``mem_tracker.py``): after every operation
    ``_update_peak_stats`` compares the current bytes (``_curr_mem_snap``) with the peak
    (``_peak_mem``, ``_peak_mem_snap``), and also with every FSDP module's own peak. The
    override drops the per-module peaks, which this module never reports; they cost about a
    quarter of a 7B trace.
    """
    try:
        from torch.distributed._tools import fsdp2_mem_tracker as fmt
    except ImportError as exc:
        raise MemlabError(f"tracing a sharded step needs torch.distributed._tools."
                          f"fsdp2_mem_tracker, which torch {torch.__version__} here lacks "
                          f"({exc})") from None
    total = fmt._TOTAL_KEY

    class _Tracker(fmt.FSDPMemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[total]:
                    self._peak_mem[dev] = snap[total]
                    self._peak_mem_snap[dev] = dict(snap)

    return _Tracker, fmt._FSDPRefType


def _bytes(snapshot: dict, categories) -> dict[str, int]:
    """A tracker snapshot summed over devices, one lower-case key per category, zeros kept."""
    out = {c.name.lower(): 0 for c in categories}
    out["total"] = 0
    for snap in snapshot.values():
        for key, n_bytes in snap.items():
            out[key.name.lower() if isinstance(key, categories) else key.lower()] += n_bytes
    return out


def _optimizer_step(params: list, shards: list, optimizer: torch.optim.Optimizer) -> None:
    """Step ``optimizer`` over the local ``shards`` with the gradients' local shards, then drop them."""
    for p, shard in zip(params, shards, strict=True):
        shard.grad = None if p.grad is None else p.grad.to_local()  # a view: no new bytes
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for p in params:
        p.grad = None  # grads do not survive into the next step


def trace_sharded(model: str | ModelConfig, gpus: int, *, reshard_after_forward: bool = True,
                  precision: str = "fp32", batch_size: int = 1, seq_len: int = 2048,
                  checkpointing: bool = False, optimizer: str = "adamw", loss_chunks: int = 1,
                  offload_activations: bool = False) -> ShardedTrace:
    """Per-rank memory of one FSDP2 training step over ``gpus`` ranks, traced on fake tensors (chapter: 6).

    ``optimizer`` (foreach) steps each rank's shards (:data:`TRACED_OPTIMIZERS`: bitsandbytes'
    8-bit AdamW runs its own kernels, not on fake tensors), each block and then the root
    wrapped by ``fully_shard``; ``precision``
    'bf16-mixed' gathers parameters in bf16 and reduces gradients in fp32
    (``MixedPrecisionPolicy``), the shards staying fp32. Bytes are rank 0's, which holds a
    full shard of every padded parameter.
    """
    cfg = _check(model, gpus, reshard_after_forward, precision, batch_size, seq_len,
                 checkpointing, optimizer, loss_chunks, offload_activations)
    import torch.distributed as dist

    if not dist.is_available():
        raise MemlabError(f"tracing a sharded step needs torch.distributed, which torch "
                          f"{torch.__version__} here lacks")
    if dist.is_initialized():
        raise MemlabError(f"a process group (backend {dist.get_backend()!r}) is already "
                          "initialised; trace_sharded makes its own fake one: call it from a "
                          "process without one")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    Tracker, categories = _tracker_class()
    # W fake ranks, this process rank 0: collectives return tensors of the right shapes only.
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gpus)
    try:
        mesh = init_device_mesh("cpu", (gpus,))  # outside the fake mode: it fails inside
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if precision == "bf16-mixed" else MixedPrecisionPolicy())
        with FakeTensorMode(), FakeScalars():  # Adafactor reads scalars: 1 in a trace
            with default_dtype(torch.float32):
                net = build_model(cfg, device="cpu", seed=None, checkpointing=checkpointing,
                                  offload_activations=offload_activations)
            for block in net.blocks:  # one FSDP unit per block, then the root's own params
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward,
                            mp_policy=mp)
            fully_shard(net, mesh=mesh, reshard_after_forward=reshard_after_forward,
                        mp_policy=mp)
            # The optimizer steps this rank's shards (views of the DTensor parameters) directly:
            # DTensor's foreach dispatch would run the same local kernels on the same shards,
            # but its sharding propagation costs time quadratic in the number of parameters
            # (more than half of a 70B trace), and counts no bytes.
            params = list(net.parameters())
            with torch.no_grad():
                shards = [p.to_local() for p in params]
            opt = make_optimizer(optimizer, shards, lr=1e-4, impl="foreach")
            for shard in shards:  # a first step on zero gradients creates the optimizer states
                shard.grad = torch.zeros_like(shard)
            opt.step()
            opt.zero_grad(set_to_none=True)
            gen = torch.Generator().manual_seed(0)
            tokens = torch.randint(0, cfg.vocab_size, (2, batch_size, seq_len), generator=gen)
            idx, targets = tokens[0], tokens[1]  # (B, T) each

            tracker = Tracker(net, opt)  # counts the shards and states made above
            tracker.track_inputs((tokens,))
            with tracker:
                loss = model_loss(net, idx, targets, loss_chunks)  # the logits die inside
                loss.backward()
                del loss
                grads = _bytes(tracker.get_tracker_snapshot("current"), categories)
                _optimizer_step(params, shards, opt)
                after = _bytes(tracker.get_tracker_snapshot("current"), categories)
            peak = _bytes(tracker.get_tracker_snapshot("peak"), categories)
    finally:
        dist.destroy_process_group()
    peak_bytes = peak.pop("total")
    return ShardedTrace(
        model=cfg.name, parameters=cfg.num_parameters(), gpus=gpus,
        reshard_after_forward=reshard_after_forward, precision=precision,
        batch_size=batch_size, seq_len=seq_len, checkpointing=checkpointing,
        peak_bytes=peak_bytes, peak_by_category=peak,
        model_state_bytes=after["sharded_param"] + grads["sharded_grad"] + after["opt"],
        optimizer=optimizer, loss_chunks=loss_chunks, offload_activations=offload_activations,
    )



@dataclass(frozen=True)
class TracedRow:
    """One traced set-up with the estimator's per-GPU peak for the same set-up beside it."""

    trace: ShardedTrace
    estimate_peak_bytes: int  # memlab.distributed.estimate_sharded, stage 3 or 2

    @property
    def ratio(self) -> float:
        """Estimated over traced per-rank peak (chapter: 6)."""
        return self.estimate_peak_bytes / self.trace.peak_bytes


@dataclass(frozen=True)
class TracedGrid:
    """Per-rank peaks of big models sharded over many ranks (chapter: 6).

    They are traced in one process, and estimated.
    """

    rows: tuple[TracedRow, ...]
    batch_size: int
    seq_len: int

    def row(self, model: str, gpus: int, precision: str = "fp32") -> TracedRow:
        """The row of ``model`` on ``gpus`` ranks in ``precision`` (chapter: 6)."""
        for r in self.rows:
            t = r.trace
            if (t.model, t.gpus, t.precision) == (model, gpus, precision):
                return r
        raise MemlabError(f"no traced row for {model!r} on {gpus!r} ranks in {precision!r}; "
                          "accepted: " + ", ".join(f"{r.trace.model}/{r.trace.gpus}/"
                                                   f"{r.trace.precision}" for r in self.rows))

    def table(self, unit: str = "GiB") -> str:
        """Traced and estimated per-rank peaks, with model states and activations (chapter: 6)."""
        lines = [f"FSDP2 (ZeRO-3), one rank's step, batch {self.batch_size} x {self.seq_len}; "
                 f"traced on fake tensors in one process, {unit}",
                 f"{'model':<12}{'ranks':>6}{'precision':>12}{'states':>9}{'acts':>9}"
                 f"{'traced':>9}{'estimated':>11}{'ratio':>8}"]
        for r in self.rows:
            t = r.trace
            lines.append(f"{t.model:<12}{t.gpus:>6}{t.precision:>12}"
                         f"{to_unit(t.model_state_bytes, unit):>9.2f}"
                         f"{to_unit(t.peak_by_category.get('act', 0), unit):>9.2f}"
                         f"{to_unit(t.peak_bytes, unit):>9.2f}"
                         f"{to_unit(r.estimate_peak_bytes, unit):>11.2f}{r.ratio:>8.3f}")
        return "\n".join(lines)


def traced_grid(models=("llama2-7b", "llama2-70b"), gpus=(8, 64), precisions=TRACED_PRECISIONS,
                *, batch_size: int = 1, seq_len: int = 2048) -> TracedGrid:
    """Trace every model x ranks x precision (ZeRO-3) and estimate each the same way (chapter: 6)."""
    from memlab.distributed.estimate import estimate_sharded

    rows = []
    for m in models:
        for w in gpus:
            for p in precisions:
                t = trace_sharded(m, w, precision=p, batch_size=batch_size, seq_len=seq_len)
                est = estimate_sharded(m, zero_stage=3, gpus=w, precision=p,
                                       batch_size=batch_size, seq_len=seq_len, device="cpu")
                rows.append(TracedRow(t, est.per_gpu_peak_bytes))
    return TracedGrid(tuple(rows), batch_size, seq_len)
