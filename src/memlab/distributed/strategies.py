"""Data-parallel strategies, each PyTorch's own implementation (chapter 6).

| strategy   | PyTorch                                                   | ZeRO   | each rank keeps               |
|------------|-----------------------------------------------------------|--------|-------------------------------|
| ``ddp``    | ``DistributedDataParallel``                               | 0      | everything                    |
| ``zero1``  | DDP + ``ZeroRedundancyOptimizer``                         | 1      | 1/N of the optimizer states   |
| ``zero2``  | FSDP2 ``fully_shard(reshard_after_forward=False)``        | 2      | 1/N of states and gradients; parameters gathered from forward to backward |
| ``zero3``  | FSDP2 ``fully_shard(reshard_after_forward=True)``         | 3      | 1/N of everything; a block's parameters gathered only while it computes |
| ``replicate`` | FSDP2 over a (N x 1) mesh: sharding factor 1           | -      | everything, as DDP            |
| ``hsdp``   | FSDP2 over a 2-D mesh (replicate x shard)                 | 3 in a group | 1/shard of everything   |
| ``offload``| FSDP2 + ``CPUOffloadPolicy``                              | 3      | parameters, gradients and states in CPU memory |

Every strategy is applied to a freshly built model with the same seed, so all of them start
from the same weights. :func:`wrap` returns the wrapped model and its optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from memlab.errors import MemlabError, check_choice

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "replicate", "hsdp", "offload")
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "replicate": 3, "hsdp": 3, "offload": 3}
FSDP_STRATEGIES = ("zero2", "zero3", "replicate", "hsdp", "offload")
SHARDING_FACTORS = ("replicate", "hsdp", "zero3")  # FSDP2 sharding over 1, 2 and all ranks
LABELS = {
    "ddp": "DDP",
    "zero1": "ZeRO-1 (ZeroRedundancyOptimizer)",
    "zero2": "ZeRO-2 (FSDP2, kept after forward)",
    "zero3": "ZeRO-3 (FSDP2, resharded)",
    "replicate": "FSDP2, sharding factor 1",
    "hsdp": "hybrid (FSDP2, 2-D mesh)",
    "offload": "ZeRO-3 + CPU offload",
}


@dataclass(frozen=True)
class Wrapped:
    """A strategy applied: the model to call, its optimizer, and how many ranks share a shard."""

    strategy: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    shard_size: int  # ranks a parameter is split over (1 for DDP and ZeRO-1)
    mesh_shape: tuple[int, ...]

    @property
    def inner(self) -> nn.Module:
        """The model's own module (DDP's ``.module``; FSDP2 shards in place) (chapter: 6)."""
        return getattr(self.model, "module", self.model)


def shard_mesh(strategy: str, world: int, device: torch.device, shard_size: int | None = None):
    """The device mesh FSDP2 shards over: 1-D, or (replicate, shard) for hybrid sharding (chapter: 6)."""
    from torch.distributed.device_mesh import init_device_mesh

    if strategy in ("hsdp", "replicate"):
        shard = 1 if strategy == "replicate" else (
            shard_size or (2 if world % 2 == 0 and world > 2 else world))
        if world % shard:
            raise MemlabError(f"hybrid sharding needs a shard size that divides the {world} "
                              f"ranks, got {shard}; accepted: "
                              + ", ".join(str(d) for d in range(1, world + 1) if world % d == 0))
        return init_device_mesh(device.type, (world // shard, shard),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))


def shard_units(model: nn.Module) -> list:
    """The groups FSDP gathers one at a time (chapter: 6).

    They are the embedding, each block, and the final norm with the head.

    Wrapping the embedding and the head on their own (as torchtitan does) leaves the root with
    no parameters, so nothing stays gathered for the whole step.
    """
    units = []
    if hasattr(model, "tok_emb"):
        units.append(model.tok_emb if model.pos_emb is None else [model.tok_emb, model.pos_emb])
    units += list(getattr(model, "blocks", []))
    if hasattr(model, "lm_head") and not model.cfg.tied:
        units.append([model.norm_f, model.lm_head])
    return units


def _adamw(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=True)


def wrap(strategy: str, model: nn.Module, *, device: torch.device, lr: float = 1e-3,
         shard_size: int | None = None, mixed_precision: bool = False,
         comm_hook=None) -> Wrapped:
    """Apply ``strategy`` to ``model`` (already on ``device``) and build its AdamW (chapter: 6).

    ``mixed_precision`` (FSDP2 only): 16-bit parameters for compute (bf16), fp32 shards and
    fp32 gradient reduction. ``comm_hook`` (DDP and ZeRO-1): a DDP communication hook.
    """
    import torch.distributed as dist

    check_choice("strategy", strategy, STRATEGIES)
    world = dist.get_world_size()
    if strategy in ("ddp", "zero1"):
        if mixed_precision:
            raise MemlabError(f"mixed_precision here is FSDP2's policy; strategy {strategy!r} "
                              "takes autocast instead; accepted: " + ", ".join(FSDP_STRATEGIES))
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  gradient_as_bucket_view=True)
        if comm_hook is not None:
            ddp.register_comm_hook(None, comm_hook)
        if strategy == "ddp":
            opt = _adamw(ddp.parameters(), lr)
        else:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW,
                                          lr=lr, weight_decay=0.0, foreach=True)
        return Wrapped(strategy, ddp, opt, 1, (world,))

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = shard_mesh(strategy, world, device, shard_size)
    kw = dict(mesh=mesh, reshard_after_forward=strategy != "zero2")
    if strategy == "offload":
        # pin_memory=False: pinned host buffers have been seen to abort at tear-down on gloo
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    if mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for unit in shard_units(model):
        fully_shard(unit, **kw)
    fully_shard(model, **kw)
    opt = _adamw(model.parameters(), lr)
    return Wrapped(strategy, model, opt, mesh.shape[-1], tuple(mesh.shape))
