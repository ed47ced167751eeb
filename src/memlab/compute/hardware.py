"""Accelerators for training, quoted; and how much of a device's arithmetic a training step uses.

Two halves, one question: how fast could this step be, and how fast is it?

* :data:`ACCELERATORS` -- a table of accelerators people train on. The NVIDIA rows come from
  :data:`memlab.gpus.CATALOGUE` (and the V100s from :data:`memlab.gpus.LEGACY`), so the book
  keeps one copy of their datasheet numbers; AMD's, Google's and AWS's are quoted here from
  the vendors' own documentation, each with its source URL and the figure as the page writes
  it. Every compute figure is *dense*: a structured-sparsity figure is never used. The
  derived columns (ridge point, parameters that fit, time to read the memory once) are
  computed from the quoted ones, never typed.
* Model FLOPs utilisation (MFU): the FLOPs a step needs divided by the FLOPs the device could
  have done in the step's time. :func:`tried_peak` times a large square matmul on this device
  (what it *can* do, tried, not looked up), :func:`time_train_step` times one training step of
  the book's model as :class:`memlab.model.step.StepSpec` describes it, and
  :func:`step_mfu` puts them together, with the quoted datasheet peak beside it on a
  catalogued GPU.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from numbers import Real

import torch

from memlab.device import device_name, get_scale, pick_device, refuse_if_too_big
from memlab.distributed.zero import LAYOUTS
from memlab.dtypes import FLOAT_DTYPES, FLOAT_FORMATS
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.gpus import CATALOGUE, GPU, LEGACY
from memlab.measure.step import (
    autocast_dtype,
    default_dtype,
    param_dtype,
    step_autocast,
    step_optimizer,
)
from memlab.measure.timing import time_ms
from memlab.model.config import ModelConfig
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model, model_loss
from memlab.units import UNITS

# Bytes per parameter behind the "parameters that fit" columns, from the book's own tables:
BF16_WEIGHT_BYTES = torch.bfloat16.itemsize  # one 16-bit weight
# mixed-precision AdamW: 16-bit weights and gradients, fp32 master copy, m and v
ADAM_MIXED_BYTES = sum(LAYOUTS["mixed"])

VENDORS = ("NVIDIA", "AMD", "Google", "AWS")
MEMORY_UNITS = ("GiB", "GB")


# The table ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Accelerator:
    """One accelerator for training (chapter: 7).

    Its quoted memory, bandwidth and dense peaks, with derived columns.

    Quoted fields carry the figure as the source writes it (``*_quoted``) beside the number in
    bytes or operations per second. ``memory_unit`` says what the label's "GB" means
    (``'GiB'``: 2^30 bytes, as for the NVIDIA cards in :mod:`memlab.gpus`; ``'GB'``: 10^9,
    when nothing shows otherwise). ``dense_8bit_format`` is ``'fp8'`` where the source quotes
    an fp8 rate, else ``'int8'``, else ``None``.
    """

    name: str
    vendor: str
    memory_bytes: int  # nominal capacity, quoted
    memory_quoted: str
    memory_unit: str  # what the quoted 'GB' means: 'GiB' or 'GB'
    bandwidth_bytes_per_s: float  # memory bandwidth, quoted
    bandwidth_quoted: str
    dense_16bit_format: str  # 'bf16', or 'fp16' where the part has no bf16 rate
    dense_16bit_flops_per_s: float  # dense (not sparse) peak, quoted
    dense_16bit_quoted: str
    dense_8bit_format: str | None  # 'fp8' | 'int8' | None
    dense_8bit_ops_per_s: float | None  # dense (not sparse) peak, quoted
    dense_8bit_quoted: str | None
    source: str  # URL of the compute and bandwidth figures
    dense_note: str  # how the source shows the figures are dense, not sparse
    memory_source: str = ""  # URL of the memory figure, when another page gives it

    def __post_init__(self) -> None:
        check_choice("vendor", self.vendor, VENDORS)
        check_choice("memory_unit", self.memory_unit, MEMORY_UNITS)
        check_choice("16-bit format", self.dense_16bit_format, ("bf16", "fp16"))
        if self.dense_8bit_format is not None:
            check_choice("8-bit format", self.dense_8bit_format, ("fp8", "int8"))
        for what in ("memory_bytes", "bandwidth_bytes_per_s", "dense_16bit_flops_per_s"):
            _positive(f"{what} of {self.name}", getattr(self, what))
        if (self.dense_8bit_format is None) != (self.dense_8bit_ops_per_s is None):
            raise MemlabError(f"accelerator {self.name}: give dense_8bit_format and "
                              "dense_8bit_ops_per_s together, or neither")
        if not self.source.startswith("https://"):
            raise MemlabError(f"accelerator {self.name} needs a source URL, got {self.source!r}")

    # Derived columns: computed from the quoted ones -------------------------------------
    @property
    def ridge_flops_per_byte(self) -> float:
        """Ridge point of the roofline: dense 16-bit FLOP/s over bytes/s, FLOPs per byte (chapter: 7)."""
        return self.dense_16bit_flops_per_s / self.bandwidth_bytes_per_s

    @property
    def ridge_8bit_ops_per_byte(self) -> float | None:
        """The same for the dense 8-bit peak, operations per byte; None without one (chapter: 7)."""
        if self.dense_8bit_ops_per_s is None:
            return None
        return self.dense_8bit_ops_per_s / self.bandwidth_bytes_per_s

    @property
    def bf16_weight_parameters(self) -> int:
        """Parameters whose 16-bit weights alone fill the nominal memory (chapter: 7)."""
        return self.memory_bytes // BF16_WEIGHT_BYTES

    @property
    def adam_mixed_parameters(self) -> int:
        """Parameters whose mixed-precision AdamW model states fill the memory (chapter: 7).

        Each parameter takes ADAM_MIXED_BYTES.
        """
        return self.memory_bytes // ADAM_MIXED_BYTES

    @property
    def memory_read_s(self) -> float:
        """Seconds to read the whole nominal memory once at the quoted bandwidth (chapter: 7)."""
        return self.memory_bytes / self.bandwidth_bytes_per_s

    def as_dict(self) -> dict:
        """Quoted fields and derived columns as a plain dict, one table row (chapter: 7)."""
        row = asdict(self)
        row.update(ridge_flops_per_byte=self.ridge_flops_per_byte,
                   ridge_8bit_ops_per_byte=self.ridge_8bit_ops_per_byte,
                   bf16_weight_parameters=self.bf16_weight_parameters,
                   adam_mixed_parameters=self.adam_mixed_parameters,
                   memory_read_s=self.memory_read_s)
        return row


def _positive(what: str, value) -> float:
    if (isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value)
            or value <= 0):
        raise MemlabError(f"{what} must be a positive finite number, got {value!r}")
    return value


NVIDIA_NOTE = ("dense tensor-core peak as memlab.gpus records it: the datasheet's sparsity "
               "figure halved where the datasheet gives only that")


def _from_gpu(gpu: GPU) -> Accelerator | None:
    """A table row from a catalogue GPU, or None when it lacks a bandwidth or a 16-bit peak."""
    peaks = dict(gpu.peak_tera_ops)
    f16 = next((f for f in ("bf16", "fp16") if f in peaks), None)
    if f16 is None or not gpu.bandwidth_bytes_per_s:
        return None
    f8 = next((f for f in ("fp8", "int8") if f in peaks), None)
    return Accelerator(
        name=gpu.name, vendor="NVIDIA",
        memory_bytes=gpu.memory_bytes, memory_quoted=gpu.memory_label,
        memory_unit=gpu.memory_unit,
        bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s,
        bandwidth_quoted=f"{gpu.bandwidth_bytes_per_s / UNITS['GB']:g} GB/s (memlab.gpus)",
        dense_16bit_format=f16, dense_16bit_flops_per_s=gpu.peak_ops(f16),
        dense_16bit_quoted=f"{peaks[f16]:g} TFLOPS {f16}, dense (memlab.gpus)",
        dense_8bit_format=f8, dense_8bit_ops_per_s=gpu.peak_ops(f8) if f8 else None,
        dense_8bit_quoted=f"{peaks[f8]:g} TOPS {f8}, dense (memlab.gpus)" if f8 else None,
        source=gpu.source, dense_note=NVIDIA_NOTE,
    )


TERA = 1e12
ROCM_MI300 = "https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html"
ROCM_SPECS = "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html"
TPU_V5E = "https://cloud.google.com/tpu/docs/v5e"
TPU_V5P = "https://docs.cloud.google.com/tpu/docs/v5p-training"
# Google Cloud's launch announcement of v5p (6 December 2023): its int8 peak. The v5p page above
# quotes bf16 and "FP8" at the same 459 TFLOPs (fp8 runs at the 16-bit rate), and no int8 rate.
TPU_V5P_LAUNCH = ("https://cloud.google.com/blog/products/ai-machine-learning/"
                  "introducing-cloud-tpu-v5p-and-ai-hypercomputer")
TRN1 = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/"
        "trainium.html")
TRN1_MEMORY = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/nki/arch/"
               "trainium_inferentia2_arch.html")
TRN2 = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/"
        "neuron-hardware/trainium2.html")

# Quoted from the vendors' pages: the number in each string is the number beside it.
QUOTED: tuple[Accelerator, ...] = (
    # AMD's ROCm documentation: the peak table of the MI300X OAM and its bandwidth; the
    # capacity from AMD's GPU specifications table, whose column is headed "VRAM (GiB)".
    Accelerator(
        name="MI300X", vendor="AMD",
        memory_bytes=192 * UNITS["GiB"], memory_quoted="VRAM (GiB): 192", memory_unit="GiB",
        bandwidth_bytes_per_s=5.3 * UNITS["TB"],
        bandwidth_quoted="peak memory bandwidth of the GPU is 5.3 TB per second",
        dense_16bit_format="bf16", dense_16bit_flops_per_s=1307.4 * TERA,
        dense_16bit_quoted="Matrix BF16: 2048 FLOPS/clock/CU, 1307.4 peak TFLOPS",
        dense_8bit_format="fp8", dense_8bit_ops_per_s=2614.9 * TERA,
        dense_8bit_quoted="Matrix FP8: 4096 FLOPS/clock/CU, 2614.9 peak TFLOPS",
        source=ROCM_MI300, memory_source=ROCM_SPECS,
        dense_note="dense: each peak is FLOPS per clock per compute unit times the units and "
                   "clock, one matrix instruction a cycle, no structured sparsity",
    ),
    # Google Cloud's TPU pages. A TPU quotes no sparsity figure: its peaks are dense. The
    # v5e page writes the capacity as "16 GB" and nothing there says GiB: read as 10^9.
    Accelerator(
        name="TPU-v5e", vendor="Google",
        memory_bytes=16 * UNITS["GB"], memory_quoted="HBM2 capacity and bandwidth: 16 GB, 819 GBps",
        memory_unit="GB",
        bandwidth_bytes_per_s=819 * UNITS["GB"],
        bandwidth_quoted="HBM2 capacity and bandwidth: 16 GB, 819 GBps",
        dense_16bit_format="bf16", dense_16bit_flops_per_s=197 * TERA,
        dense_16bit_quoted="Peak compute per chip (bf16): 197 TFLOPs",
        dense_8bit_format="int8", dense_8bit_ops_per_s=393 * TERA,
        dense_8bit_quoted="Peak compute per chip (Int8): 393 TFLOPs",
        source=TPU_V5E,
        dense_note="dense: Google quotes no sparsity figure for TPUs (their MXUs have no "
                   "structured-sparsity mode)",
    ),
    Accelerator(
        name="TPU-v5p", vendor="Google",
        memory_bytes=95 * UNITS["GiB"], memory_quoted="HBM capacity per chip (GiB): 95",
        memory_unit="GiB",
        bandwidth_bytes_per_s=2765 * UNITS["GB"],
        bandwidth_quoted="HBM bandwidth per chip (GBps): 2765",
        dense_16bit_format="bf16", dense_16bit_flops_per_s=459 * TERA,
        dense_16bit_quoted="Peak compute per chip (BF16) (TFLOPs): 459",
        dense_8bit_format="int8", dense_8bit_ops_per_s=918 * TERA,
        dense_8bit_quoted=f"918 TOPs Int8 per chip ({TPU_V5P_LAUNCH})",
        source=TPU_V5P,
        dense_note="dense: Google quotes no sparsity figure for TPUs (their MXUs have no "
                   "structured-sparsity mode); the v5p page's 'Peak compute per chip (FP8) "
                   "(TFLOPs): 459' is the 16-bit rate",
    ),
    # AWS Neuron documentation. Trainium's own page writes "820 GiB/sec"; the NKI
    # architecture guide (used here) writes 820 GB/s and the Trainium2 page's comparison
    # 0.8 TB/sec for the same chip, which agrees with GB/s.
    Accelerator(
        name="Trainium", vendor="AWS",
        memory_bytes=32 * UNITS["GiB"],
        memory_quoted="a total device memory capacity of 32GiB and bandwidth of 820 GB/s",
        memory_unit="GiB",
        bandwidth_bytes_per_s=820 * UNITS["GB"],
        bandwidth_quoted="a total device memory capacity of 32GiB and bandwidth of 820 GB/s",
        dense_16bit_format="bf16", dense_16bit_flops_per_s=190 * TERA,
        dense_16bit_quoted="Two NeuronCore-v2 delivering 380 INT8 TOPS, 190 FP16/BF16/cFP8/TF32 "
                           "TFLOPS, and 47.5 FP32 TFLOP",
        dense_8bit_format="fp8", dense_8bit_ops_per_s=190 * TERA,
        dense_8bit_quoted="Two NeuronCore-v2 delivering 380 INT8 TOPS, 190 FP16/BF16/cFP8/TF32 "
                          "TFLOPS, and 47.5 FP32 TFLOP",
        source=TRN1, memory_source=TRN1_MEMORY,
        dense_note="dense: the Trainium2 page's comparison lists Trainium's sparse TFLOPS as "
                   "'Not applicable'; cFP8 runs at the 16-bit rate (int8: 380 TOPS)",
    ),
    Accelerator(
        name="Trainium2", vendor="AWS",
        memory_bytes=96 * UNITS["GiB"],
        memory_quoted="96 GiB of device memory with 2.9 TB/sec of bandwidth", memory_unit="GiB",
        bandwidth_bytes_per_s=2.9 * UNITS["TB"],
        bandwidth_quoted="96 GiB of device memory with 2.9 TB/sec of bandwidth",
        dense_16bit_format="bf16", dense_16bit_flops_per_s=667 * TERA,
        dense_16bit_quoted="667 BF16/FP16/TF32 TFLOPS",
        dense_8bit_format="fp8", dense_8bit_ops_per_s=1299 * TERA,
        dense_8bit_quoted="1,299 FP8 TFLOPS",
        source=TRN2,
        dense_note="dense: the page lists '2,563 FP8/FP16/BF16/TF32 sparse TFLOPS' on a line "
                   "of its own",
    ),
)

ACCELERATORS: tuple[Accelerator, ...] = tuple(
    a for a in (_from_gpu(g) for g in CATALOGUE + LEGACY) if a is not None
) + QUOTED
ACCELERATOR_NAMES = tuple(a.name for a in ACCELERATORS)


def get_accelerator(name: str | Accelerator) -> Accelerator:
    """The table row of an accelerator such as 'H100', 'MI300X' or 'Trainium2', any case (chapter: 7)."""
    if isinstance(name, Accelerator):
        return name
    if isinstance(name, str):
        for a in ACCELERATORS:
            if a.name.lower() == name.strip().lower():
                return a
    check_choice("accelerator", name, ACCELERATOR_NAMES)  # raises, naming the accepted ones
    raise AssertionError("unreachable")  # pragma: no cover


def accelerator_table(names: Iterable[str] | None = None, *,
                      vendor: str | None = None) -> list[dict]:
    """Rows of the accelerator table, quoted and derived columns (bytes, FLOP/s, s) (chapter: 7).

    ``names`` picks and orders rows (default: all of :data:`ACCELERATORS`); ``vendor`` keeps
    one vendor's. ``pandas.DataFrame(rows)`` makes a table of them.
    """
    if isinstance(names, str):
        names = [names]
    chosen = list(ACCELERATORS) if names is None else [get_accelerator(n) for n in names]
    if vendor is not None:
        check_choice("vendor", vendor, VENDORS)
        chosen = [a for a in chosen if a.vendor == vendor]
    return [a.as_dict() for a in chosen]


# The peak this device reaches: tried -------------------------------------------------------------
N_START = 256  # the first size tried when sizing the matmul
# Largest n per device and scale, and how long one multiply may take before n stops doubling.
N_MAX = {"ci": {"cuda": 4096, "other": 1024}, "full": {"cuda": 8192, "other": 2048}}
MATMUL_TARGET_S = {"cuda": 0.05, "other": 0.02}


@dataclass(frozen=True)
class TriedPeak:
    """FLOP/s of an n x n by n x n matmul timed on this device (chapter: 7).

    The matmul does 2 n^3 FLOPs; the result is tried, not quoted.
    """

    device: str  # 'cuda' | 'mps' | 'cpu'
    device_name: str
    dtype: str  # book format name: 'fp32', 'bf16', ...
    n: int
    sizing: str  # how n was chosen
    flops_per_matmul: int  # 2 n^3
    times_ms: tuple[float, ...]  # each timed multiply
    best_flops_per_s: float  # from the fastest multiply
    median_flops_per_s: float  # from the median multiply

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 7)."""
        return asdict(self)


def _format_of(dt) -> str:
    """The book's format name for a torch dtype or a format name."""
    if isinstance(dt, torch.dtype):
        for fmt, d in FLOAT_DTYPES.items():
            if d == dt:
                return fmt
        raise MemlabError(f"dtype {dt} is not a float format the book names; accepted: "
                          + ", ".join(FLOAT_FORMATS))
    return check_choice("dtype", dt, FLOAT_FORMATS)


def _can_multiply(fmt: str, dev: torch.device) -> bool:
    try:
        a = torch.ones(8, 8, device=dev).to(FLOAT_DTYPES[fmt])
        torch.mm(a, a)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def _default_format(dev: torch.device) -> str:
    if dev.type == "cuda":
        return "bf16" if torch.cuda.get_device_capability(dev) >= (8, 0) else "fp16"
    return "fp32"


def _operands(n: int, dt: torch.dtype, dev: torch.device):
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=dev, dtype=dt)
    b = torch.randn(n, n, generator=g).to(device=dev, dtype=dt)
    return a, b, torch.empty(n, n, device=dev, dtype=dt)


def _one_multiply_s(n: int, dt: torch.dtype, dev: torch.device) -> float:
    a, b, c = _operands(n, dt, dev)
    return time_ms(lambda: torch.mm(a, b, out=c), warmup=1, repeats=1, device=dev)[0] / 1e3


def tried_peak(device=None, dtype=None, *, n: int | None = None, repeats: int = 5,
               warmup: int = 2, scale: str | None = None) -> TriedPeak:
    """Best and median FLOP/s of a square matmul on this device, timed with time_ms (chapter: 7).

    ``dtype`` is a format name or a torch dtype (default: bf16 on a GPU with bf16 tensor
    cores, fp16 on an older one, fp32 elsewhere); a format this device cannot multiply is
    refused. ``n`` (default: sized here) starts at :data:`N_START` and doubles while one
    multiply takes less than :data:`MATMUL_TARGET_S`, up to :data:`N_MAX` for the device and
    the scale (:func:`memlab.device.get_scale`): a realistic size on a GPU at full scale, a
    fraction of a second on a CPU at ci scale. ``sizing`` in the result says which rule chose n.
    """
    dev = pick_device(device)
    fmt = _default_format(dev) if dtype is None else _format_of(dtype)
    check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    if not _can_multiply(fmt, dev):
        able = [f for f in FLOAT_FORMATS if _can_multiply(f, dev)]
        raise MemlabError(f"torch.mm cannot multiply {fmt} matrices on {dev.type}; accepted "
                          f"there: {', '.join(able)}")
    dt = FLOAT_DTYPES[fmt]
    kind = "cuda" if dev.type == "cuda" else "other"
    if n is None:
        sc = get_scale(scale, dev)
        n_max, target_s = N_MAX[sc][kind], MATMUL_TARGET_S[kind]
        n = min(N_START, n_max)
        while n < n_max and _one_multiply_s(n, dt, dev) < target_s:
            n *= 2
        sizing = (f"doubled from {N_START} while one multiply took under "
                  f"{target_s * 1e3:g} ms, at most {n_max} ({sc} scale on {dev.type})")
    else:
        check_positive_int("n", n)
        refuse_if_too_big(3 * n * n * dt.itemsize, dev, f"a {n} x {n} {fmt} matmul")
        sizing = "given"
    a, b, c = _operands(n, dt, dev)
    times = time_ms(lambda: torch.mm(a, b, out=c), warmup=warmup, repeats=repeats, device=dev)
    flops = 2 * n**3
    return TriedPeak(
        device=dev.type, device_name=device_name(dev), dtype=fmt, n=n, sizing=sizing,
        flops_per_matmul=flops, times_ms=tuple(times),
        best_flops_per_s=flops / (min(times) / 1e3),
        median_flops_per_s=flops / (statistics.median(times) / 1e3),
    )


def mfu(flops_per_step: float, step_seconds: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: FLOPs per step / (step seconds x peak FLOP/s), a fraction (chapter: 7)."""
    _positive("flops_per_step", flops_per_step)
    _positive("step_seconds", step_seconds)
    _positive("peak_flops_per_s", peak_flops_per_s)
    return flops_per_step / (step_seconds * peak_flops_per_s)


# A training step, timed ------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTime:
    """Milliseconds of a training step of the book's model on this device (chapter: 7)."""

    device: str
    device_name: str
    setup: dict  # StepSpec.as_dict(): model, parameters, batch_size, seq_len, precision, ...
    times_ms: tuple[float, ...]  # each timed step
    step_ms: float  # median
    best_ms: float
    tokens_per_s: float  # batch x sequence x micro-batches per median step

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 7)."""
        return asdict(self)


def time_train_step(config_or_spec: StepSpec | ModelConfig | str, *, device=None,
                    repeats: int = 5, warmup: int = 2, seed: int = 0, **switches) -> StepTime:
    """Milliseconds of one training step, timed with time_ms (chapter: 7).

    The step is the forward, the loss (whole or chunked), the backward and the optimizer step.

    Takes a :class:`StepSpec`, or a config (or preset name) and the spec's switches, as
    :func:`memlab.measure.step.measure_step` does: the same step chapters 0 and 1 measure,
    on a random batch of token ids. Gradient accumulation runs ``grad_accum_steps`` forward
    and backward passes per optimizer step. The first ``warmup`` steps (default 2: the first
    creates the optimizer states) are not timed.
    """
    spec = StepSpec.of(config_or_spec, **switches)
    check_positive_int("repeats", repeats)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MemlabError(f"seed must be a non-negative integer, got {seed!r}")
    dev = pick_device(device)
    cfg = spec.config
    if spec.optimizer != "adamw-8bit":
        from memlab.memory.estimator import estimate

        est = estimate(replace(spec, prepare=None), device="cuda" if dev.type == "cuda" else "cpu")
        refuse_if_too_big(est.peak_bytes, dev, f"a {cfg.name} training step (estimated)")
    with default_dtype(param_dtype(spec.precision)):
        model = build_model(cfg, device=dev, seed=seed, checkpointing=spec.checkpointing,
                            offload_activations=spec.offload_activations)
        if spec.prepare is not None:
            spec.prepare(model)
    optimizer = step_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (2, spec.batch_size, spec.seq_len),
                           generator=gen).to(dev)
    idx, targets = tokens[0], tokens[1]  # (B, T) each

    def step() -> None:
        for _ in range(spec.grad_accum_steps):
            with step_autocast(spec.precision, dev):
                loss = model_loss(model, idx, targets, spec.loss_chunks)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = time_ms(step, warmup=warmup, repeats=repeats, device=dev)
    med = statistics.median(times)
    tokens_per_step = spec.batch_size * spec.seq_len * spec.grad_accum_steps
    return StepTime(device=dev.type, device_name=device_name(dev), setup=spec.as_dict(),
                    times_ms=tuple(times), step_ms=med, best_ms=min(times),
                    tokens_per_s=tokens_per_step / (med / 1e3))


# MFU of a step -----------------------------------------------------------------------------------
# CUDA device names of the catalogued parts: the SXM H100 (PCIe and NVL parts have lower peaks),
# the H200 but not the H200 NVL, the SXM2 V100s; an A100's peak is the same in either form.
_GPU_PATTERNS = (
    ("H100", r"\bH100\b.*\b80GB HBM3\b", None),
    ("H200", r"\bH200\b", r"\bNVL\b"),
    ("A100-80GB", r"\bA100\b.*\b80GB\b", None),
    ("A100-40GB", r"\bA100\b.*\b40GB\b", None),
    ("L4", r"\bL4\b", None),
    ("T4", r"\bT4\b", None),
    ("V100-16GB", r"\bV100-SXM2-16GB\b", None),
    ("V100-32GB", r"\bV100-SXM2-32GB\b", None),
)


def quoted_gpu(name: str) -> GPU | None:
    """The memlab.gpus entry a CUDA device name denotes, else None (chapter: 7).

    A name such as 'NVIDIA H100 80GB HBM3'.
    """
    if not isinstance(name, str):
        raise MemlabError(f"a device name must be a string, got {name!r}")
    by_name = {g.name: g for g in CATALOGUE + LEGACY}
    for gpu, must, must_not in _GPU_PATTERNS:
        if re.search(must, name) and not (must_not and re.search(must_not, name)):
            return by_name[gpu]
    return None


@dataclass(frozen=True)
class StepMFU:
    """A step's FLOPs over its time, against the tried peak (chapter: 7).

    On a catalogued GPU, also against the quoted one.
    """

    device: str
    device_name: str
    setup: dict
    compute_format: str  # the format the step's matmuls run in (autocast's, else the parameters')
    step_ms: float  # median step
    flops_per_step: float  # given: counted elsewhere
    achieved_flops_per_s: float  # flops_per_step / median step
    tried_peak: TriedPeak
    mfu_tried: float  # against the tried peak's best
    quoted_peak_flops_per_s: float | None  # dense datasheet peak of the matching catalogue GPU
    mfu_quoted: float | None
    quoted_status: str  # which quoted peak, or why there is none

    def as_dict(self) -> dict:
        """The fields as a plain dict, the tried peak nested (chapter: 7)."""
        return asdict(self)


def quoted_peak(name: str, fmt: str) -> tuple[float | None, str]:
    """Quoted dense peak (FLOP/s) of the catalogued GPU a CUDA device name denotes (chapter: 7).

    It also says which GPU, or why none.
    """
    check_choice("format", fmt, FLOAT_FORMATS + ("fp8", "tf32", "int8"))
    key = "fp8" if fmt.startswith("fp8") else fmt  # memlab.gpus names both fp8 formats 'fp8'
    gpu = quoted_gpu(name)
    if gpu is None:
        return None, f"no quoted peak: {name!r} matches no memlab.gpus entry"
    peaks = dict(gpu.peak_tera_ops)
    if key not in peaks:
        return None, (f"no quoted peak: memlab.gpus quotes {gpu.name}'s tensor-core rates for "
                      f"{', '.join(peaks)}, not {fmt}")
    return gpu.peak_ops(key), f"quoted dense {key} peak of {gpu.name} (memlab.gpus, {gpu.source})"


def step_mfu(config_or_spec: StepSpec | ModelConfig | str, *, flops_per_step: float,
             device=None, peak: TriedPeak | None = None, repeats: int = 5, warmup: int = 2,
             seed: int = 0, **switches) -> StepMFU:
    """MFU of a training step: its FLOPs over its median time (chapter: 7).

    It is given against the tried and the quoted peak.

    ``flops_per_step`` is counted elsewhere (forward and backward of every micro-batch of one
    optimizer step). The tried peak is the best of :func:`tried_peak` on this device in the
    format the step's matmuls run in; pass ``peak`` to reuse one. Against it, MFU is the share
    of what this device was seen to do that the step does: small layers, attention, norms,
    the optimizer and launch overheads keep it below 1.
    """
    spec = StepSpec.of(config_or_spec, **switches)
    _positive("flops_per_step", flops_per_step)
    dev = pick_device(device)
    fmt = _format_of(autocast_dtype(spec.precision) or param_dtype(spec.precision))
    if peak is None:
        peak = tried_peak(dev, fmt)
    elif not isinstance(peak, TriedPeak):
        raise MemlabError(f"peak must be a TriedPeak (from tried_peak), got {peak!r}")
    elif (peak.device, peak.dtype) != (dev.type, fmt):
        raise MemlabError(f"peak was tried in {peak.dtype} on {peak.device}; this step computes "
                          f"in {fmt} on {dev.type}: pass tried_peak({dev.type!r}, {fmt!r})")
    timed = time_train_step(spec, device=dev, repeats=repeats, warmup=warmup, seed=seed)
    step_s = timed.step_ms / 1e3
    if dev.type == "cuda":
        quoted, status = quoted_peak(timed.device_name, fmt)
    else:
        quoted, status = None, f"no quoted peak: memlab.gpus catalogues GPUs, not {dev.type}"
    return StepMFU(
        device=dev.type, device_name=timed.device_name, setup=timed.setup, compute_format=fmt,
        step_ms=timed.step_ms, flops_per_step=flops_per_step,
        achieved_flops_per_s=flops_per_step / step_s, tried_peak=peak,
        mfu_tried=mfu(flops_per_step, step_s, peak.best_flops_per_s),
        quoted_peak_flops_per_s=quoted,
        mfu_quoted=None if quoted is None else mfu(flops_per_step, step_s, quoted),
        quoted_status=status,
    )
