"""Every strategy trained for real on N processes, and what each rank held and sent (chapter 6).

:func:`strategy_ranks` is what each rank runs (through :func:`memlab.distributed.launch.launch`):
for every strategy in turn it builds the same model from the same seed, wraps it
(:func:`memlab.distributed.strategies.wrap`), trains a few steps on this rank's share of the
same global batches and reports, for the last step:

* the bytes of its *local* parameter, gradient and optimizer-state shards (a DTensor's local
  shard, not its logical size), right after the optimizer step;
* the bytes saved for the backward pass (saved-tensor hooks; parameters are not counted);
* its peak, measured with :func:`memlab.measure.measure_peak` on top of what it held before;
* the payload bytes of every collective (:class:`memlab.distributed.comm.CommCounter`);
* the loss of every step (the mean over ranks: the global batch's loss).

Rank 0 also writes the final weights, gathered whole, so the parent can hold every strategy
to one process trained on the whole batch (:func:`single_process`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from memlab.distributed.comm import CommCounter, python_allreduce_hook
from memlab.distributed.strategies import wrap
from memlab.errors import MemlabError
from memlab.model.config import ModelConfig
from memlab.model.tasks import MarkovTask
from memlab.model.transformer import build_model, lm_loss

LR = 1e-2  # large enough that the weights move visibly in a few steps


def _nbytes(t: torch.Tensor) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def _device_type(t: torch.Tensor) -> str:
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).device.type


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer,
                      device: torch.device | None = None) -> dict[str, int]:
    """Bytes of this rank's shards on ``device``, by category (chapter: 6).

    The shards are its parameter, gradient and optimizer-state shards.

    ``offloaded``: the same categories' bytes kept in CPU memory while the rank computes on a GPU.
    """
    params = list({id(p): p for p in model.parameters()}.values())
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    states = [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    groups = dict(parameters=params, gradients=[p.grad for p in params if p.grad is not None],
                  optimizer_states=states)
    here = (device or torch.device("cpu")).type
    out = {k: sum(_nbytes(t) for t in ts if _device_type(t) == here) for k, ts in groups.items()}
    out["offloaded"] = sum(_nbytes(t) for ts in groups.values() for t in ts
                           if _device_type(t) != here)
    return out


class SavedBytes:
    """Count the bytes saved for backward inside the block, parameters left out (chapter: 6)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.bytes = 0
        self._seen: set[int] = set()

    def _pack(self, t: torch.Tensor):
        if isinstance(t, nn.Parameter):
            return t
        from torch.distributed.tensor import DTensor

        storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
        if storage.nbytes() == 0:  # a storage FSDP has freed (resized to zero)
            return t
        ptr = storage.data_ptr()
        # FSDP gathers a block's parameters during the forward: look at the live ones now
        if ptr not in self._seen and ptr not in _gathered_param_storages(self.model):
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _fsdp_groups(model: nn.Module) -> list:
    """FSDP2's parameter groups of every unit, each once; empty for a model FSDP does not shard.

    Read against torch 2.13's ``_fully_shard``: a unit's state (``_get_fsdp_state()``) keeps its
    ``_fsdp_param_groups``; a unit of several modules shares one state.
    """
    groups, seen = [], set()
    for m in model.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        if get_state is None:
            continue
        state = get_state()
        if id(state) in seen:
            continue
        seen.add(id(state))
        if not hasattr(state, "_fsdp_param_groups"):  # another torch: fail loudly, not with zeros
            raise MemlabError(f"this torch ({torch.__version__}) keeps FSDP's parameter groups "
                              "elsewhere; the gathered bytes cannot be read")
        groups += list(state._fsdp_param_groups)
    return groups


def _storage_bytes(t) -> tuple[int, int]:
    """(data pointer, bytes) of a tensor's storage, (0, 0) for None or a freed storage."""
    if not isinstance(t, torch.Tensor):
        return 0, 0
    storage = t.untyped_storage()
    return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else (0, 0)


def param_bytes_now(model: nn.Module) -> int:
    """Bytes of parameter storage alive now: every rank's shards plus what FSDP has gathered (chapter: 6).

    FSDP2 registers the gathered parameters on the modules while they compute, but keeps each
    rank's shard alive beside them; both are counted.
    """
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for p in model.parameters():
        ptr, n = _storage_bytes(p.to_local() if isinstance(p, DTensor) else p)
        if n:
            seen[ptr] = n
    for group in _fsdp_groups(model):
        for fp in group.fsdp_params:
            for t in (getattr(fp, "_sharded_param_data", None),
                      getattr(fp, "_unsharded_param", None)):
                ptr, n = _storage_bytes(t)
                if n:
                    seen[ptr] = n
    return sum(seen.values())


def gathered_bytes(model: nn.Module) -> int:
    """Bytes of parameters FSDP holds gathered right now, over every unit (chapter: 6).

    They are the unsharded parameters and the all-gather buffers.

    An all-gather's output buffer is alive from the collective until its unit copies it out
    (FSDP prefetches the next unit's, so it can overlap the current unit's compute). Zero for a
    model FSDP does not shard.
    """
    seen: dict[int, int] = {}
    for group in _fsdp_groups(model):
        for fp in group.fsdp_params:
            ptr, n = _storage_bytes(getattr(fp, "_unsharded_param", None))
            if n:
                seen[ptr] = n
        result = getattr(group, "_all_gather_result", None)
        ptr, n = _storage_bytes(getattr(result, "all_gather_output", None))
        if n:
            seen[ptr] = n
    return sum(seen.values())


class GatherTimeline:
    """Gathered parameter bytes at every unit's forward and backward (chapter: 6).

    At their start and end, and after each collective.
    """

    def __init__(self, model: nn.Module, units: dict[str, nn.Module]):
        self.model = model
        self.units = units
        self.events: list[tuple[str, int]] = []  # (what happened, gathered bytes after it)
        self._handles = []

    def mark(self, what: str) -> None:
        """Record ``what`` with the bytes gathered now (chapter: 6)."""
        self.events.append((what, gathered_bytes(self.model)))

    def __enter__(self):
        # Two notices that say nothing about this step: the embedding's input (token ids) needs
        # no gradient, so its backward hook fires on its output; FSDP2 warns that the model's
        # output is a view, against in-place ops, which the loss does not do.
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view",
                                category=UserWarning)
        for name, m in self.units.items():
            self._handles += [
                m.register_forward_pre_hook(lambda *_, n=name: self.mark(f"forward {n} starts")),
                m.register_forward_hook(lambda *_, n=name: self.mark(f"forward {n} ends")),
                m.register_full_backward_pre_hook(
                    lambda *_, n=name: self.mark(f"backward {n} starts")),
                m.register_full_backward_hook(lambda *_, n=name: self.mark(f"backward {n} ends")),
            ]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._warnings.__exit__(*exc)
        return False


def timeline_units(model: nn.Module) -> dict[str, nn.Module]:
    """The modules a timeline marks: the embedding, each block by its index, the head (chapter: 6)."""
    units = {"embedding": model.tok_emb} if hasattr(model, "tok_emb") else {}
    units |= {f"block {i}": b for i, b in enumerate(getattr(model, "blocks", []))}
    if hasattr(model, "lm_head"):
        units["head"] = model.lm_head
    return units


def _gathered_param_storages(model: nn.Module) -> set[int]:
    from torch.distributed.tensor import DTensor

    out = set()
    for p in model.parameters():
        storage = (p.to_local() if isinstance(p, DTensor) else p).untyped_storage()
        if storage.nbytes():
            out.add(storage.data_ptr())
    return out


def batches(cfg: ModelConfig, steps: int, batch_size: int, seq_len: int):
    """The same global batches for every strategy and for one process: Markov-chain tokens (chapter: 6)."""
    task = MarkovTask(cfg.vocab_size, order=1, seed=0)
    return [task.sample(batch_size, seq_len, seed=1000 + s) for s in range(steps)]


def batch_rows(world: int, rank: int, batch_size: int) -> slice:
    """This rank's rows of a global batch of ``batch_size`` sequences (chapter: 6).

    The batch is split over ``world`` ranks.
    """
    if batch_size % world:
        raise MemlabError(f"the global batch ({batch_size}) must split evenly over {world} ranks; "
                          f"accepted: a multiple of {world}")
    n = batch_size // world
    return slice(rank * n, (rank + 1) * n)


def _full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    inner = getattr(model, "module", model)
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().cpu().clone()
            for n, p in inner.named_parameters()}


def _one_strategy(strategy: str, spec: dict, device: torch.device, data) -> dict:
    import torch.distributed as dist

    from memlab.measure.peak import measure_peak

    world, rank = dist.get_world_size(), dist.get_rank()
    rows = batch_rows(world, rank, spec["batch_size"])
    cfg = ModelConfig(**spec["config"])
    model = build_model(cfg, seed=0).to(device)
    counter = CommCounter()
    w = wrap(strategy, model, device=device, lr=spec["lr"],
             comm_hook=python_allreduce_hook() if strategy in ("ddp", "zero1") else None)
    losses, times = [], []
    out: dict = dict(strategy=strategy, shard_size=w.shard_size, mesh_shape=list(w.mesh_shape))
    steps = len(data)
    for s, (x, y) in enumerate(data):
        x, y = x[rows].to(device), y[rows].to(device)
        last = s == steps - 1
        before = local_state_bytes(w.model, w.optimizer, device)

        def step(x=x, y=y, last=last, w=w):
            saved = SavedBytes(w.model) if last else None
            with saved or contextlib.nullcontext():
                loss = lm_loss(w.model(x), y)
            kept = param_bytes_now(w.model)  # what stays gathered from forward to backward
            loss.backward()
            w.optimizer.step()
            return loss.detach(), saved.bytes if saved else 0, kept

        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if last:
            timeline = GatherTimeline(w.inner, timeline_units(w.inner))
            counter.probe = timeline.mark
            with counter, timeline:
                (loss, saved, kept), peak = measure_peak(step, device=device)
            counter.probe = None
            out["gather_timeline"] = timeline.events
            out["state_bytes"] = local_state_bytes(w.model, w.optimizer, device)
            out["saved_activation_bytes"] = saved
            out["parameters_after_forward_bytes"] = kept
            held = sum(v for k, v in before.items() if k != "offloaded")
            out["held_before_step_bytes"] = held
            out["peak_above_start_bytes"] = peak.peak_allocated_bytes
            out["peak_bytes"] = held + peak.peak_allocated_bytes
            out["peak_method"] = peak.method
            out["param_device"] = _param_device(w.inner)
        else:
            loss, _, _ = step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        # DDP's gradients are views of its communication buckets (gradient_as_bucket_view),
        # which stay allocated between steps: keep them, so that what a rank holds before
        # the next step counts them. FSDP frees its gradient shards until the next backward.
        w.optimizer.zero_grad(set_to_none=strategy not in ("ddp", "zero1"))
        mean = loss.clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM)
        losses.append(float(mean) / world)
    out["losses"] = losses
    out["step_seconds"] = times
    out["comm"] = counter.summary()
    out["comm_volume_bytes"] = counter.volume_bytes()
    weights = _full_weights(w.model)  # a collective for sharded strategies: every rank joins
    if rank == 0 and spec.get("weights_dir"):
        torch.save(weights, Path(spec["weights_dir"]) / f"{strategy}.pt")
    del w, model, weights
    return out


def _param_device(model: nn.Module) -> str:
    from torch.distributed.tensor import DTensor

    p = next(iter(model.parameters()))
    return str(p.to_local().device if isinstance(p, DTensor) else p.device)


def strategy_ranks(spec: dict, device: torch.device) -> dict:
    """One rank's part of every strategy in ``spec['strategies']``, run in turn (chapter: 6)."""
    cfg = ModelConfig(**spec["config"])
    data = batches(cfg, spec["steps"], spec["batch_size"], spec["seq_len"])
    return dict(strategies={s: _one_strategy(s, spec, device, data) for s in spec["strategies"]})


def single_process(cfg: ModelConfig, *, steps: int, batch_size: int, seq_len: int,
                   lr: float = LR, device: torch.device | str = "cpu"
                   ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same training in one process on the whole batch: its losses and final weights (chapter: 6)."""
    device = torch.device(device)
    model = build_model(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, foreach=True)
    losses = []
    for x, y in batches(cfg, steps, batch_size, seq_len):
        loss = lm_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}




def one_process_memory(cfg: ModelConfig, *, batch_size: int, seq_len: int,
                       device: torch.device | str = "cpu") -> dict[str, int]:
    """Saved activations and peak of one step of one process on the whole batch, bytes (chapter: 6).

    Measured as the ranks measure theirs: the second step (AdamW's states exist), the peak
    above what is held before it plus that.
    """
    from memlab.measure.peak import measure_peak

    device = torch.device(device)
    model = build_model(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=True)
    data = batches(cfg, 2, batch_size, seq_len)

    def step(x, y, saved):
        with saved or contextlib.nullcontext():
            loss = lm_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        return saved.bytes if saved else 0

    step(*data[0], None)
    opt.zero_grad(set_to_none=True)
    held = sum(v for k, v in local_state_bytes(model, opt, device).items() if k != "offloaded")
    saved, peak = measure_peak(step, *data[1], SavedBytes(model), device=device)
    return dict(activations=saved, peak_bytes=held + peak.peak_allocated_bytes)
