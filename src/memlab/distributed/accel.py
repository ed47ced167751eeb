"""Hugging Face accelerate on the same worker: DDP on CPUs, FSDP on GPUs (chapter 6).

``accelerate launch`` is how many readers start distributed training. Two facts shape what the
book shows with it (accelerate 1.15):

* On GPUs, a config file with an FSDP section (``configs/accelerate/fsdp2.yaml``) wraps the
  model in FSDP2; each process needs its own GPU.
* On a machine without GPUs, asked for FSDP, the processes it starts join one process group,
  but each ``Accelerator`` reports ``DistributedType.NO``, one process, index 0: every copy
  trains the whole batch on its own and the launch exits 0. :func:`accelerate_run` compares
  what accelerate saw with the launch and says so. What works on CPUs is
  ``Accelerator(cpu=True)``: DDP over gloo (``MULTI_CPU``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from memlab.distributed.runs import batch_rows, batches, local_state_bytes
from memlab.model.config import ModelConfig
from memlab.model.transformer import build_model, lm_loss

# For GPUs only. The file ships in the package (distributed/configs/); the book's checkout links it
# from configs/accelerate/, the path the chapter shows and a reader types.
ACCELERATE_FSDP_CONFIG = "configs/accelerate/fsdp2.yaml"


def fsdp_config_file() -> Path:
    """The FSDP2 config file accelerate launches with on GPUs, inside the package (chapter: 6)."""
    return Path(__file__).resolve().parent / "configs" / Path(ACCELERATE_FSDP_CONFIG).name


def accelerate_ranks(spec: dict, device: torch.device) -> dict:
    """One rank trains the chapter's model through ``Accelerator.prepare`` (chapter: 6).

    It returns what accelerate made of it.
    """
    import torch.distributed as dist
    from accelerate import Accelerator

    acc = Accelerator(cpu=bool(spec.get("cpu", False)))
    cfg = ModelConfig(**spec["config"])
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=0.0, foreach=True)
    model, opt = acc.prepare(model, opt)
    rows = batch_rows(acc.num_processes, acc.process_index, spec["batch_size"])
    losses = []
    for x, y in batches(cfg, spec["steps"], spec["batch_size"], spec["seq_len"]):
        loss = lm_loss(model(x[rows].to(acc.device)), y[rows].to(acc.device))
        acc.backward(loss)
        opt.step()
        held = local_state_bytes(model, opt, acc.device)
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        if dist.is_initialized():
            dist.all_reduce(mean)
        losses.append(float(mean) / acc.num_processes)
    return dict(distributed_type=str(acc.distributed_type).split(".")[-1],
                num_processes=acc.num_processes, process_index=acc.process_index,
                wrapper=type(model).__name__, losses=losses, state_bytes=held)


def accelerate_run(spec: dict, *, nproc: int = 2, accelerate_args: tuple[str, ...] | None = None,
                   timeout_s: float = 180.0) -> list[dict]:
    """The chapter's training through ``Accelerator``; each process's answer (chapter: 6).

    Refused in one line if accelerate saw no group.

    ``accelerate_args`` None starts the processes with torchrun (how DDP on CPUs works:
    ``accelerate launch`` has no multi-CPU mode without a cluster config); a tuple starts them
    with ``accelerate launch`` and those options. ``spec`` holds ``config`` (a ModelConfig as a
    dict), ``steps``, ``batch_size``, ``seq_len``, ``lr`` and ``cpu`` (``Accelerator(cpu=...)``).
    """
    from memlab.distributed.launch import check_group, launch
    from memlab.errors import require

    require("accelerate", "accelerate's launches", extra="compare")
    done = launch("memlab.distributed.accel:accelerate_ranks", spec, nproc=nproc,
                  accelerate_args=None if accelerate_args is None else tuple(accelerate_args),
                  timeout_s=timeout_s)
    seen = [dict(rank=a["process_index"], world_size=a["num_processes"]) for a in done.ranks]
    try:
        check_group(seen, nproc)
    except Exception as exc:
        kinds = sorted({a["distributed_type"] for a in done.ranks})
        raise type(exc)(f"accelerate ({', '.join(kinds)}): {exc}") from None
    return list(done.ranks)


@dataclass(frozen=True)
class AccelerateRun:
    """One way of starting the training with accelerate, and what accelerate made of it."""

    name: str
    command: str  # the launcher and accelerate's options
    processes: int
    distributed_type: str  # as accelerate reports it ("" when the launch was refused)
    wrapper: str  # the class accelerate wrapped the model in
    losses: tuple[float, ...]  # rank 0's view of the global batch's loss
    state_bytes: dict  # rank 0's parameter, gradient and optimizer-state bytes on its device
    refused: str  # the one-line error when the processes did not train as one group, else ""


@dataclass(frozen=True)
class AccelerateResult:
    """accelerate on this machine's devices, each launch beside one process (chapter: 6)."""

    device: str
    model: str
    reference_losses: tuple[float, ...]
    runs: tuple[AccelerateRun, ...]

    def table(self) -> str:
        """One line per launch: what accelerate chose, and whether it trained as one group (chapter: 6)."""
        lines = [f"{self.model} on {self.device}; one process: losses "
                 + ", ".join(f"{x:.4f}" for x in self.reference_losses)]
        for r in self.runs:
            what = (f"refused: {r.refused}" if r.refused else
                    f"{r.distributed_type}, {r.wrapper}, losses "
                    + ", ".join(f"{x:.4f}" for x in r.losses))
            lines.append(f"{r.name} ({r.processes} processes; {r.command}): {what}")
        return "\n".join(lines)


# name, accelerate's options (None: torchrun), Accelerator(cpu=...)
CPU_LAUNCHES = (("DDP: torchrun + Accelerator(cpu=True)", None, True),
                ("FSDP asked of a CPU-only machine", ("--use_fsdp", "--fsdp_version", "2"), False))
GPU_LAUNCHES = (("FSDP2 from the config file", ("--config_file", ACCELERATE_FSDP_CONFIG), False),)
ACCELERATE_SIZES = {"ci": dict(model="dist-ci", steps=2, batch_size=4, seq_len=16, lr=1e-2),
                    "full": dict(model="llama-1b", steps=2, batch_size=8, seq_len=512, lr=1e-4)}


def accelerate_experiment(scale: str) -> AccelerateResult:
    """The CPU launches, or on GPUs the FSDP2 config file, each beside one process (chapter: 6).

    On the CPU, DDP runs and FSDP is refused.
    """
    from dataclasses import asdict as _asdict

    from memlab.distributed.launch import launch_device
    from memlab.distributed.runs import single_process
    from memlab.distributed.sharding import model_for
    from memlab.errors import MemlabError, check_choice

    check_choice("scale", scale, tuple(ACCELERATE_SIZES))
    size = dict(ACCELERATE_SIZES[scale])
    cfg = model_for(size.pop("model"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    on_gpu = gpus >= 1 and launch_device(gpus) == "cuda"
    launches, nproc = (GPU_LAUNCHES, gpus) if on_gpu else (CPU_LAUNCHES, 2)
    spec = dict(config=_asdict(cfg), **size)
    ref, _ = single_process(cfg, steps=size["steps"], batch_size=size["batch_size"],
                            seq_len=size["seq_len"], lr=size["lr"],
                            device="cuda" if on_gpu else "cpu")
    runs = []
    for name, args, cpu in launches:
        command = "torchrun" if args is None else "accelerate launch " + " ".join(args)
        try:
            answers = accelerate_run(dict(spec, cpu=cpu), nproc=nproc, accelerate_args=args and tuple(
                str(fsdp_config_file()) if a == ACCELERATE_FSDP_CONFIG else a for a in args))
        except MemlabError as exc:
            runs.append(AccelerateRun(name, command, nproc, "", "", (), {}, str(exc)))
            continue
        a = answers[0]
        runs.append(AccelerateRun(name, command, nproc, a["distributed_type"], a["wrapper"],
                                  tuple(a["losses"]), a["state_bytes"], ""))
    return AccelerateResult(device="cuda" if on_gpu else "cpu", model=cfg.name,
                            reference_losses=tuple(ref), runs=tuple(runs))
