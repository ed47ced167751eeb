"""The estimator held to the CUDA caching allocator over a grid (chapter 1).

The allocator's number is ``torch.cuda.max_memory_allocated``.

It lives with the fine-tuning part because its grid includes LoRA and QLoRA steps, which that
part builds; chapter 1 shows it.

Chapter 1 holds the estimator to traces on fake CPU tensors, which follow CPU conventions. On a
GPU the same step differs in what CUDA's kernels and autocast keep (the fp32 softmax and its
16-bit copy for ``P @ V``, SDPA's CUDA kernels), and the allocator itself counts every byte a
kernel asks for. :func:`estimator_cuda` runs a grid of real steps on the GPU and sets beside each:

* the estimate with CUDA conventions (:func:`memlab.finetune.estimate_finetune`, ``device="cuda"``);
* the allocator's peak of the steady-state step (``max_memory_allocated`` less what was allocated
  before the model was built), the quantity the estimate is held to;
* PyTorch's own tracker (``MemTracker``) on the same step, for comparison.

cuBLAS's workspace is the allocator's too, allocated once per stream at the first matrix
product and kept: it is measured on its own at the start (``workspace_bytes``) and left out of
each step, as the CUDA context, which the allocator never sees, is.
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
from dataclasses import dataclass

import torch

from memlab.device import pick_device
from memlab.errors import MemlabError

SETUPS = ("full", "lora", "qlora")
CUDA_GRIDS = {
    "ci": dict(models=("tiny", "tiny-gpt2"), batch_size=2, seq_len=64,
               precisions=("fp32", "bf16-mixed", "bf16"), attentions=("sdpa", "eager"),
               checkpointing=(False, True), optimizers=("adamw", "sgd"), adapters="tiny"),
    "full": dict(models=("gpt2", "llama-1b"), batch_size=2, seq_len=1024,
                 precisions=("fp32", "bf16-mixed", "bf16"), attentions=("sdpa", "eager"),
                 checkpointing=(False, True), optimizers=("adamw", "sgd"), adapters="llama-1b"),
}


@dataclass(frozen=True)
class CudaRow:
    """One step on the GPU: its estimate and two peaks (chapter: 1).

    The estimate follows CUDA conventions; the peaks are the allocator's and MemTracker's.
    """

    model: str
    setup: str  # one of SETUPS
    precision: str
    attention: str
    checkpointing: bool
    optimizer: str
    batch_size: int
    seq_len: int
    estimated_peak_bytes: int
    allocator_peak_bytes: int  # max_memory_allocated over the step, less what was there before
    tracker_peak_bytes: int  # MemTracker's peak of the same step
    estimated_saved_bytes: int
    tracker_saved_bytes: int

    @property
    def ratio(self) -> float:
        """Estimate over the allocator's peak (chapter: 1)."""
        return self.estimated_peak_bytes / self.allocator_peak_bytes

    @property
    def tracker_ratio(self) -> float:
        """MemTracker's peak over the allocator's (chapter: 1)."""
        return self.tracker_peak_bytes / self.allocator_peak_bytes


@dataclass(frozen=True)
class CudaCheck:
    """The estimator against the CUDA allocator over a grid, or the reason it was not run (chapter: 1)."""

    status: str  # "measured", or why not
    device_name: str
    workspace_bytes: int | None  # cuBLAS's workspace, kept by the allocator after a first matmul
    rows: list[CudaRow]

    @property
    def worst(self) -> CudaRow | None:
        """The step whose estimate is furthest from the allocator's peak (chapter: 1)."""
        return max(self.rows, key=lambda r: abs(r.ratio - 1), default=None)

    def summary(self) -> str:
        """Worst and median error of the estimate and of MemTracker, and how many are within 3% (chapter: 1)."""
        if not self.rows:
            return self.status
        est = [abs(r.ratio - 1) for r in self.rows]
        trk = [abs(r.tracker_ratio - 1) for r in self.rows]
        w = self.worst
        return "\n".join([
            f"{len(self.rows)} steps on {self.device_name}; cuBLAS workspace "
            f"{self.workspace_bytes / 2**20:.1f} MiB, apart",
            f"estimate / allocator peak: worst {w.ratio:.4f} ({w.model}, {w.setup}, "
            f"{w.precision}, {w.attention}, checkpointing {w.checkpointing}), median error "
            f"{statistics.median(est):.2%}; within 3%: {sum(e <= 0.03 for e in est)} of "
            f"{len(est)}",
            f"MemTracker / allocator peak: worst error {max(trk):.2%}, median {statistics.median(trk):.2%}",
        ])


def grid_steps(scale: str) -> list[tuple[str, str, object]]:
    """The grid's steps at ``scale``: ``(model, setup, StepSpec)`` each (chapter: 1)."""
    from memlab.model.config import get_config
    from memlab.model.step import StepSpec

    g = CUDA_GRIDS[scale]
    out = []
    for model, setup, precision, attention, ckpt, opt, prepare in _grid(g):
        cfg = get_config(model, attention=attention)
        out.append((model, setup, StepSpec(cfg, batch_size=g["batch_size"],
                                           seq_len=min(g["seq_len"], cfg.max_seq_len),
                                           precision=precision, optimizer=opt,
                                           checkpointing=ckpt, prepare=prepare)))
    return out


def _grid(g: dict):
    from memlab.finetune import LoraConfig, Setup

    for model in g["models"]:
        for precision in g["precisions"]:
            for attention in g["attentions"]:
                for ckpt in g["checkpointing"]:
                    yield model, "full", precision, attention, ckpt, "adamw", None
    for opt in g["optimizers"][1:]:
        yield g["models"][0], "full", "bf16-mixed", "sdpa", False, opt, None
    lora = LoraConfig(r=16, alpha=32.0, target_modules="all-linear")
    for ckpt in (False, True):
        yield (g["adapters"], "lora", "bf16", "sdpa", ckpt, "adamw",
               Setup("LoRA r=16, all linear", lora=lora))
        yield (g["adapters"], "qlora", "bf16", "sdpa", ckpt, "adamw",
               Setup("QLoRA r=16, base nf4-dq", lora=lora, quantize_base="nf4-dq"))


def cublas_workspace_bytes(device) -> int:
    """Bytes the allocator keeps after this process's first matrix products (chapter: 1).

    They are cuBLAS's workspace.
    """
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.ones(256, 256, device=device, dtype=dtype)
        bias = torch.ones(256, device=device, dtype=dtype)
        (a @ a).sum().item()
        torch.addmm(bias, a, a).sum().item()  # the cuBLASLt path, with a bias
        del a, bias
    torch.cuda.synchronize(device)
    return int(torch.cuda.memory_allocated(device) - before)


def estimator_cuda(scale: str = "full", device=None) -> CudaCheck:
    """Each step of the grid run on this GPU beside its CUDA-convention estimate (chapter: 1)."""
    from memlab.device import device_name, refuse_if_too_big
    from memlab.finetune.estimate import estimate_finetune
    from memlab.measure.step import measure_step
    from memlab.measure.timing import not_measurable

    dev = pick_device(device)
    if dev.type != "cuda":
        return CudaCheck(not_measurable(dev, "the CUDA caching allocator's peak needs a CUDA "
                                             "GPU; chapter 1 holds the estimator to traces "
                                             "with CPU conventions here"),
                         device_name(dev), None, [])
    workspace = cublas_workspace_bytes(dev)
    rows = []
    for model, setup, spec in grid_steps(scale):
        if setup == "qlora" and importlib.util.find_spec("bitsandbytes") is None:
            continue  # QLoRA needs bitsandbytes' CUDA layers; the row is left out
        est = estimate_finetune(spec, device="cuda")
        refuse_if_too_big(int(est.peak_bytes * 1.25), dev, f"a {model} step ({spec.precision})")
        m = measure_step(spec, device=dev)
        rows.append(CudaRow(model, setup, spec.precision, spec.config.attention,
                            bool(spec.checkpointing), spec.optimizer, spec.batch_size,
                            spec.seq_len, est.peak_bytes, int(m.allocator_peak_bytes),
                            m.peak_bytes, est.saved_activations_bytes, m.saved_activations_bytes))
        del m
        gc.collect()
        torch.cuda.empty_cache()
    if not rows:
        raise MemlabError("no step of the grid could run here")
    return CudaCheck("measured", device_name(dev), workspace, rows)
