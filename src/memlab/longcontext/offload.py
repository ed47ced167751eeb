"""Activation offloading's bytes and seconds, for the chapter's fine-tuning set-ups (chapter: 8).

The hooks live with the model (:mod:`memlab.model.offload`, the step's
``offload_activations``); the estimator (:func:`memlab.finetune.estimate.estimate_finetune`)
knows what they move. This module asks, for a model, a fine-tuning set-up (chapter 5's:
LoRA, QLoRA, full) and a grid of batch and sequence sizes, with full checkpointing:

* the peak without and with offloading, and the fraction offloading cuts;
* the bytes on the host (the units' inputs: L x B x T x C elements, exactly) and the bytes moved
  over the host link each step (there and back);
* their seconds at a quoted host link (:data:`memlab.compute.offload.HOST_LINKS`), beside the
  step's compute seconds at a quoted GPU peak and MFU (:func:`memlab.compute.offload.compute_seconds`):
  the copies overlap the compute when they are the smaller (torchtune and TRL run them on a
  separate CUDA stream), so offloading is then nearly free;
* the largest batch that fits a GPU of a given memory, without and with offloading.

Everything here is estimated; the estimator is held to traces in the tests, and the hooks'
bytes are measured on the CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memlab.compute.offload import compute_seconds, offload_verdict, transfer_seconds
from memlab.errors import MemlabError, check_positive_int
from memlab.finetune import Setup
from memlab.finetune.estimate import estimate_finetune
from memlab.memory.estimator import largest_batch_that_fits
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec


@dataclass(frozen=True)
class OffloadCase:
    """One step's peak without and with activation offloading, and what moves (chapter: 8)."""

    setup: str
    batch_size: int
    seq_len: int
    peak_bytes: int  # full checkpointing, nothing offloaded
    offloaded_peak_bytes: int  # full checkpointing, the units' inputs on the host
    host_bytes: int  # on the host after the forward pass
    moved_bytes: int  # over the host link per step: to the host and back
    transfer_s: float  # moved_bytes at the link's one-way bandwidth
    compute_s: float  # the step's compute at the GPU's quoted peak and the MFU
    verdict: str  # memlab.compute.offload.offload_verdict of transfer_s against compute_s

    @property
    def cut(self) -> float:
        """The fraction of the peak that offloading saves."""
        return 1 - self.offloaded_peak_bytes / self.peak_bytes

    def as_dict(self) -> dict:
        return asdict(self) | {"cut": self.cut}


def _spec(cfg, setup, batch_size, seq_len, precision, offload) -> StepSpec:
    return StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                    checkpointing=True, offload_activations=offload,
                    prepare=None if setup.name == "full" else setup)


def offload_case(model: ModelConfig | str, setup: Setup, *, batch_size: int, seq_len: int,
                 precision: str = "bf16", link: str = "pcie4-x16", gpu: str = "H100",
                 mfu: float = 0.4) -> OffloadCase:
    """One set-up's step without and with activation offloading, estimated (chapter: 8)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    kept = estimate_finetune(_spec(cfg, setup, batch_size, seq_len, precision, False))
    moved = estimate_finetune(_spec(cfg, setup, batch_size, seq_len, precision, True))
    host = moved.setup["offloaded_bytes"]
    transfer = transfer_seconds(2 * host, link)
    compute = compute_seconds(cfg.num_parameters(), batch_size * seq_len, gpu=gpu, mfu=mfu,
                              checkpointing=True)
    return OffloadCase(setup.name, batch_size, seq_len, kept.peak_bytes, moved.peak_bytes, host,
                       2 * host, transfer, compute, offload_verdict(transfer, compute))


def largest_batch(model: ModelConfig | str, setup: Setup, capacity_bytes: int, *, seq_len: int,
                  precision: str = "bf16", offload: bool = False, max_batch: int = 4096) -> int:
    """The largest batch whose estimated peak fits ``capacity_bytes`` (0: none) (chapter: 8)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    check_positive_int("capacity_bytes", capacity_bytes)

    def peak(b: int) -> int:
        return estimate_finetune(_spec(cfg, setup, b, seq_len, precision, offload)).peak_bytes

    return largest_batch_that_fits(cfg, capacity_bytes, seq_len=seq_len, max_batch=max_batch,
                                   peak=peak)


@dataclass(frozen=True)
class BatchFit:
    """The largest batch on one GPU without and with offloading, at one sequence length (chapter: 8)."""

    setup: str
    seq_len: int
    capacity_bytes: int
    batch: int
    offloaded_batch: int

    @property
    def ratio(self) -> float | None:
        return self.offloaded_batch / self.batch if self.batch else None

    def as_dict(self) -> dict:
        return asdict(self) | {"ratio": self.ratio}


@dataclass(frozen=True)
class OffloadStudy:
    """Activation offloading over set-ups, batches and sequence lengths (chapter: 8)."""

    model: str
    precision: str
    link: str
    gpu: str
    cases: tuple[OffloadCase, ...]
    fits: tuple[BatchFit, ...]

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("cases", "fits")} | {
            "cases": [c.as_dict() for c in self.cases], "fits": [f.as_dict() for f in self.fits]}

    def cut_range(self) -> tuple[float, float]:
        cuts = [c.cut for c in self.cases]
        return min(cuts), max(cuts)

    def ratio_range(self) -> tuple[float, float] | None:
        ratios = [f.ratio for f in self.fits if f.ratio is not None]
        return (min(ratios), max(ratios)) if ratios else None

    def table(self, unit: float = 2**30) -> str:
        lines = [f"{'set-up':<16}{'B':>4}{'T':>7}{'peak':>9}{'offloaded':>11}{'cut':>7}"
                 f"{'host':>8}{'copy s':>8}{'compute s':>11}  verdict"]
        for c in self.cases:
            lines.append(f"{c.setup:<16}{c.batch_size:>4}{c.seq_len:>7}{c.peak_bytes / unit:>9.1f}"
                         f"{c.offloaded_peak_bytes / unit:>11.1f}{c.cut:>7.1%}"
                         f"{c.host_bytes / unit:>8.1f}{c.transfer_s:>8.2f}{c.compute_s:>11.2f}"
                         f"  {c.verdict}")
        return "\n".join(lines)


def offload_study(model: ModelConfig | str = "llama3.1-8b", *, setups: tuple[Setup, ...],
                  batch_sizes=(1, 4, 8), seq_lens=(2048, 8192, 32768), precision: str = "bf16",
                  capacity_bytes: int | None = None, link: str = "pcie4-x16", gpu: str = "H100",
                  mfu: float = 0.4) -> OffloadStudy:
    """Offloading's cut, host bytes and seconds over a grid; the batch that fits (chapter: 8).

    ``capacity_bytes`` (None: the GPU's quoted memory) is the memory whose largest batch is
    compared without and with offloading, at each sequence length.
    """
    from memlab.gpus import get_gpu

    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    if not setups:
        raise MemlabError("setups must name at least one fine-tuning set-up")
    cap = capacity_bytes if capacity_bytes is not None else get_gpu(gpu).memory_bytes
    cases = tuple(offload_case(cfg, s, batch_size=b, seq_len=t, precision=precision, link=link,
                               gpu=gpu, mfu=mfu)
                  for s in setups for t in seq_lens for b in batch_sizes)
    fits = tuple(BatchFit(s.name, t, cap,
                          largest_batch(cfg, s, cap, seq_len=t, precision=precision),
                          largest_batch(cfg, s, cap, seq_len=t, precision=precision, offload=True))
                 for s in setups for t in seq_lens)
    return OffloadStudy(cfg.name, precision, link, gpu, cases, fits)



# Measured on this device -------------------------------------------------------------------------
OFFLOAD_SIZES = {
    "ci": dict(config=dict(name="offload-ci", n_layer=4, n_head=4, d_model=128, vocab_size=2000,
                           max_seq_len=256),
               batch_size=4, seq_len=256, precision="bf16-mixed", repeats=3),
    "full": dict(config="llama-1b", batch_size=4, seq_len=4096, precision="bf16-mixed",
                 repeats=5),
}


@dataclass(frozen=True)
class OffloadRun:
    """One step measured with and without activation offloading (chapter: 8)."""

    checkpointing: bool
    saved_bytes: int
    offloaded_saved_bytes: int
    peak_bytes: int
    offloaded_peak_bytes: int
    host_bytes: int
    to_host_bytes: int
    to_device_bytes: int
    step_ms: float
    offloaded_step_ms: float
    estimated_host_bytes: int


@dataclass(frozen=True)
class OffloadMeasured:
    """Activation offloading measured on this device, with and without checkpointing (chapter: 8)."""

    scale: str
    device: str
    device_name: str
    setup: dict
    runs: tuple[OffloadRun, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def measure_offload_steps(scale: str = "ci", device=None) -> OffloadMeasured:
    """Steps measured and timed on this device with and without offloading (chapter: 8).

    On a CPU the host is the device, so the copies are real copies in the same memory: the bytes
    measured are what a GPU would keep; the time is only a GPU's on a GPU.
    """
    from memlab.compute.hardware import time_train_step
    from memlab.device import device_name, pick_device
    from memlab.measure.step import measure_step
    from memlab.memory.activations import offloaded_activation_bytes

    size = OFFLOAD_SIZES[scale]
    dev = pick_device(device)
    cfg = size["config"]
    cfg = ModelConfig(**cfg) if isinstance(cfg, dict) else get_config(cfg)
    step = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                precision=size["precision"])
    runs = []
    for ckpt in (False, True):
        kept = measure_step(cfg, device=dev, checkpointing=ckpt, **step)
        moved = measure_step(cfg, device=dev, checkpointing=ckpt, offload_activations=True,
                             **step)
        t_kept = time_train_step(cfg, device=dev, checkpointing=ckpt, repeats=size["repeats"],
                                 **step)
        t_moved = time_train_step(cfg, device=dev, checkpointing=ckpt, offload_activations=True,
                                  repeats=size["repeats"], **step)
        est = offloaded_activation_bytes(cfg, checkpointing=ckpt, device="cuda"
                                         if dev.type == "cuda" else "cpu", **step)
        o = moved.offloaded
        runs.append(OffloadRun(ckpt, kept.saved_activations_bytes,
                               moved.saved_activations_bytes, kept.peak_bytes, moved.peak_bytes,
                               o["host_bytes"], o["to_host_bytes"], o["to_device_bytes"],
                               t_kept.step_ms, t_moved.step_ms, est))
    from memlab.memory.activations import PARAM_BYTES

    setup = dict(model=cfg.name, n_layer=cfg.n_layer, d_model=cfg.d_model,
                 residual_bytes=PARAM_BYTES[step["precision"]], **step)
    return OffloadMeasured(scale, dev.type, device_name(dev), setup, tuple(runs))


def study_from_dict(d: dict) -> OffloadStudy:
    """An :class:`OffloadStudy` from its ``as_dict()`` (a claim's kept evidence) (chapter: 8)."""
    cases = tuple(OffloadCase(**{k: v for k, v in c.items() if k != "cut"}) for c in d["cases"])
    fits = tuple(BatchFit(**{k: v for k, v in f.items() if k != "ratio"}) for f in d["fits"])
    return OffloadStudy(d["model"], d["precision"], d["link"], d["gpu"], cases, fits)
