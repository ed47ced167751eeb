"""A small catalogue of GPUs people train on, and whether an estimated peak fits on each.

Two capacities per GPU, both in bytes:

* ``memory_bytes``: the vendor's nominal capacity, the "16 GB" or "80GB" of the spec page,
  read in the unit named by ``memory_unit``.
* ``total_bytes``: the total that ``nvidia-smi`` (NVML) reports for the card, as tabulated
  for the cards at Modal in "Why does an NVIDIA H100 80GB card offer 85.52 GB?"
  (https://thundergolfer.com/blog/nvidia-gpu-memory-capacity).

and one derived from them, the book's single definition of what a training job can use:

* ``usable_bytes`` = ``total_bytes`` - :data:`RESERVED_BYTES`: the nvidia-smi total minus a
  stated reserve for what no tensor of the job can have (the part of the total CUDA itself
  keeps, the CUDA context with its loaded kernels, cuBLAS workspaces) and for allocator slack.

What NVIDIA's "GB" means. For every GPU here the total nvidia-smi reports is *larger* than
the label read as GB (10^9 bytes): 15,360 MiB on a "16 GB" T4 is 16.1e9 bytes, 81,559 MiB on
an "80GB" H100 is 85.5e9 bytes. A card cannot report more than it has, so the label is binary:
16 GB means 16 GiB (2^30 bytes each), as usual for DRAM capacities. The A100s report exactly
their label in GiB (40,960 and 81,920 MiB); H100 and H200 a few hundred MiB less; the GDDR6
cards (T4, L4) about 1/16 less (15,360 = 16,384 x 15/16), which is consistent with ECC, on by
default on those cards, keeping part of the memory; that last reading is ours, not NVIDIA's.

What a program can allocate is lower still: CUDA reports a few hundred MiB less than
nvidia-smi (``torch.cuda.get_device_properties(0).total_memory``): 40,441 MiB on an A100
40GB (deviceQuery in the Paderborn PC2 documentation,
https://upb-pc2.atlassian.net/wiki/spaces/PC2DOK/pages/1900609/NVIDIA+A100+40GB+with+NVLINK),
15,102 or 15,110 MiB on a T4 depending on the driver (deviceQuery outputs in
https://gist.github.com/Terminus-IMRC/5e4b7782c27106dec287050b323cd059 and
https://chiemon.github.io/2024/12/25/%E6%98%BE%E5%8D%A1%E4%BF%A1%E6%81%AF.html), and the CUDA
context takes a few hundred MiB more. The reserve is a stated allowance, not a measurement:
:data:`RESERVED_BYTES` is 1 GiB, which covers the documented gaps above (519 MiB between
nvidia-smi and CUDA on the A100 40GB, plus a context of a few hundred MiB). On a GPU, measure
your own with ``torch.cuda.mem_get_info()`` after the first CUDA call. :func:`fits` compares
with ``usable_bytes``; its ``headroom_bytes`` argument adds a margin of your own on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from memlab.errors import MemlabError, check_choice, require
from memlab.units import UNITS, to_unit

TOTAL_SOURCE = "https://thundergolfer.com/blog/nvidia-gpu-memory-capacity"
FA2_SOURCE = "https://github.com/Dao-AILab/flash-attention"  # FlashAttention-2 needs sm80+
CUDA_SOURCE = "https://developer.nvidia.com/cuda-gpus"  # compute capability of each GPU
# Tensor-core input formats as each datasheet (the GPU's ``source``) lists its peak rates:
# Turing (T4) fp16/int8/int4; Ampere (A100) adds tf32 and bf16; Ada (L4) and Hopper (H100,
# H200) add fp8 (e4m3 and e5m2), and Hopper lists no int4.
MiB = 2**20
RESERVED_BYTES = 2**30  # stated reserve: CUDA's own share, the context, allocator slack (bytes)


@dataclass(frozen=True)
class GPU:
    """One GPU model: nominal, total and usable memory in bytes, and the features training needs.

    ``bf16_tensor_cores``: tensor cores that multiply bfloat16 (Ampere and later; Turing's
    do fp16 only). ``flash_attention_2``: supported by the flash-attn package (compute
    capability 8.0 or later; FlashAttention-2 does not run on Turing). ``total_bytes``
    defaults to the nominal capacity when no documented figure exists, and
    ``total_source`` then stays empty. ``usable_bytes`` is ``total_bytes`` minus
    :data:`RESERVED_BYTES`.
    """

    name: str
    memory_bytes: int  # nominal capacity: the vendor's number in memory_unit
    memory_label: str  # as the vendor writes it, e.g. '16 GB'
    memory_unit: str  # what the label's 'GB' means for this GPU: 'GiB' or 'GB'
    memory_type: str  # 'GDDR6', 'HBM2', 'HBM2e', 'HBM3', 'HBM3e'
    bf16_tensor_cores: bool
    flash_attention_2: bool
    source: str  # URL of the vendor's spec page
    total_bytes: int | None = None  # total reported by nvidia-smi; None: the nominal value
    total_source: str = ""  # where total_bytes comes from ('' when it is the nominal value)
    compute_capability: str = ""  # CUDA compute capability, e.g. '8.0' (CUDA_SOURCE)
    tensor_core_formats: tuple[str, ...] = ()  # input formats its tensor cores multiply (datasheet)
    # Dense tensor-core peaks, 10^12 operations/s, as the datasheet lists them (its sparsity
    # figures halved), and the memory bandwidth in bytes/s: quoted, never measured here.
    peak_tera_ops: tuple[tuple[str, float], ...] = ()
    bandwidth_bytes_per_s: float = 0.0

    def peak_ops(self, fmt: str) -> float:
        """Dense tensor-core peak for a format, operations/s, quoted from the datasheet (chapter: 3)."""
        table = dict(self.peak_tera_ops)
        check_choice(f"tensor-core format of {self.name}", fmt, tuple(table))
        return table[fmt] * 1e12

    def __post_init__(self) -> None:
        check_choice("memory_unit", self.memory_unit, ("GiB", "GB"))
        if self.total_bytes is None:
            object.__setattr__(self, "total_bytes", self.memory_bytes)
        if not RESERVED_BYTES < self.total_bytes <= self.memory_bytes:
            raise MemlabError(f"total_bytes of GPU {self.name!r} must be above the reserve "
                              f"({RESERVED_BYTES}) and at most its memory_bytes "
                              f"({self.memory_bytes}), got {self.total_bytes}")

    @property
    def usable_bytes(self) -> int:
        """What a job's tensors can use: the nvidia-smi total minus RESERVED_BYTES, bytes (chapter: 1)."""
        return self.total_bytes - RESERVED_BYTES

    @property
    def column(self) -> str:
        """Column header for tables, e.g. 'T4 (16 GB)' (chapter: 1)."""
        return f"{self.name} ({self.memory_label})"


def _gib(n: int) -> int:
    return n * UNITS["GiB"]


CATALOGUE: tuple[GPU, ...] = (
    GPU("T4", _gib(16), "16 GB", "GiB", "GDDR6", bf16_tensor_cores=False,
        flash_attention_2=False, source="https://www.nvidia.com/en-us/data-center/tesla-t4/",
        total_bytes=15_360 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="7.5", tensor_core_formats=("fp16", "int8", "int4"),
        peak_tera_ops=(("fp16", 65.0), ("int8", 130.0)), bandwidth_bytes_per_s=320e9),
    GPU("L4", _gib(24), "24 GB", "GiB", "GDDR6", bf16_tensor_cores=True,
        flash_attention_2=True, source="https://www.nvidia.com/en-us/data-center/l4/",
        total_bytes=23_034 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="8.9", tensor_core_formats=("tf32", "bf16", "fp16", "fp8", "int8", "int4"),
        peak_tera_ops=(("bf16", 121.0), ("fp16", 121.0), ("int8", 242.5)),
        bandwidth_bytes_per_s=300e9),
    GPU("A100-40GB", _gib(40), "40 GB", "GiB", "HBM2", bf16_tensor_cores=True,
        flash_attention_2=True, source="https://www.nvidia.com/en-us/data-center/a100/",
        total_bytes=40_960 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="8.0", tensor_core_formats=("tf32", "bf16", "fp16", "int8", "int4"),
        peak_tera_ops=(("bf16", 312.0), ("fp16", 312.0), ("int8", 624.0)),
        bandwidth_bytes_per_s=1_555e9),
    GPU("A100-80GB", _gib(80), "80 GB", "GiB", "HBM2e", bf16_tensor_cores=True,
        flash_attention_2=True, source="https://www.nvidia.com/en-us/data-center/a100/",
        total_bytes=81_920 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="8.0", tensor_core_formats=("tf32", "bf16", "fp16", "int8", "int4"),
        peak_tera_ops=(("bf16", 312.0), ("fp16", 312.0), ("int8", 624.0)),
        bandwidth_bytes_per_s=2_039e9),
    # The SXM part; the H100 NVL has 94 GB.
    GPU("H100", _gib(80), "80 GB", "GiB", "HBM3", bf16_tensor_cores=True,
        flash_attention_2=True, source="https://www.nvidia.com/en-us/data-center/h100/",
        total_bytes=81_559 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="9.0", tensor_core_formats=("tf32", "bf16", "fp16", "fp8", "int8"),
        peak_tera_ops=(("bf16", 989.5), ("fp16", 989.5), ("fp8", 1979.0), ("int8", 1979.0)),
        bandwidth_bytes_per_s=3.35e12),
    GPU("H200", _gib(141), "141 GB", "GiB", "HBM3e", bf16_tensor_cores=True,
        flash_attention_2=True, source="https://www.nvidia.com/en-us/data-center/h200/",
        total_bytes=143_771 * MiB, total_source=TOTAL_SOURCE,
        compute_capability="9.0", tensor_core_formats=("tf32", "bf16", "fp16", "fp8", "int8"),
        peak_tera_ops=(("bf16", 989.5), ("fp16", 989.5), ("fp8", 1979.0), ("int8", 1979.0)),
        bandwidth_bytes_per_s=4.8e12),
)

GPU_NAMES = tuple(g.name for g in CATALOGUE)

# Older GPUs that claims and papers name, kept out of the fit tables: the V100 (Volta, 2017)
# came with 16 or 32 GB of HBM2 and has fp16 tensor cores only (datasheet, quoted).
LEGACY: tuple[GPU, ...] = (
    GPU("V100-16GB", _gib(16), "16 GB", "GiB", "HBM2", bf16_tensor_cores=False,
        flash_attention_2=False, source="https://www.nvidia.com/en-us/data-center/v100/",
        compute_capability="7.0", tensor_core_formats=("fp16",),
        peak_tera_ops=(("fp16", 125.0),), bandwidth_bytes_per_s=900e9),
    GPU("V100-32GB", _gib(32), "32 GB", "GiB", "HBM2", bf16_tensor_cores=False,
        flash_attention_2=False, source="https://www.nvidia.com/en-us/data-center/v100/",
        compute_capability="7.0", tensor_core_formats=("fp16",),
        peak_tera_ops=(("fp16", 125.0),), bandwidth_bytes_per_s=900e9),
)

# Consumer (GeForce) cards with 24 GB, kept out of the fit tables, which hold data-centre cards:
# a claim about "a 24 GB consumer GPU" is judged on them. Totals as nvidia-smi reports them, read
# from published nvidia-smi outputs: 24,576 MiB on an RTX 3090 (CONSUMER_TOTAL_SOURCES) and
# 24,564 MiB on an RTX 4090.
CONSUMER_TOTAL_SOURCES = {
    "RTX-3090": "https://github.com/noonghunna/club-3090/issues/1128",
    "RTX-4090": "https://github.com/RLinf/RLinf/issues/255",
}
CONSUMER: tuple[GPU, ...] = (
    GPU("RTX-3090", _gib(24), "24 GB", "GiB", "GDDR6X", bf16_tensor_cores=True,
        flash_attention_2=True,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/30-series/rtx-3090-3090ti/",
        total_bytes=24_576 * MiB, total_source=CONSUMER_TOTAL_SOURCES["RTX-3090"],
        compute_capability="8.6", tensor_core_formats=("tf32", "bf16", "fp16", "int8", "int4")),
    GPU("RTX-4090", _gib(24), "24 GB", "GiB", "GDDR6X", bf16_tensor_cores=True,
        flash_attention_2=True,
        source="https://www.nvidia.com/en-us/geforce/graphics-cards/40-series/rtx-4090/",
        total_bytes=24_564 * MiB, total_source=CONSUMER_TOTAL_SOURCES["RTX-4090"],
        compute_capability="8.9",
        tensor_core_formats=("tf32", "bf16", "fp16", "fp8", "int8", "int4")),
)


def get_gpu(name: str | GPU) -> GPU:
    """The catalogue entry for a GPU name such as 'T4', 'A100-80GB' or 'RTX-4090', any case (chapter: 1)."""
    if isinstance(name, GPU):
        return name
    if isinstance(name, str):
        for gpu in CATALOGUE + CONSUMER:
            if gpu.name.lower() == name.strip().lower():
                return gpu
    # raises: names the bad value and the accepted ones
    check_choice("GPU", name, GPU_NAMES + tuple(g.name for g in CONSUMER))
    raise AssertionError("unreachable")  # pragma: no cover


def _check_bytes(what: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or value != value or value < 0:
        raise MemlabError(f"{what} must be a non-negative number of bytes, got {value!r}")
    return value


def fits(estimate_peak_bytes: int, gpu: str | GPU, headroom_bytes: int = 0) -> bool:
    """Whether a peak plus ``headroom_bytes`` (bytes) is at most the GPU's usable bytes (chapter: 1)."""
    _check_bytes("estimate_peak_bytes", estimate_peak_bytes)
    _check_bytes("headroom_bytes", headroom_bytes)
    return estimate_peak_bytes + headroom_bytes <= get_gpu(gpu).usable_bytes


def fit_table(rows: dict[str, int], gpus=CATALOGUE, headroom_bytes: int = 0):
    """A pandas DataFrame: each row's required GiB and ✓/✗ for each GPU's usable bytes (chapter: 1)."""
    _check_bytes("headroom_bytes", headroom_bytes)
    if not isinstance(rows, dict) or not rows:
        raise MemlabError(f"rows must be a non-empty dict of label -> peak bytes, got {rows!r}")
    required = {label: _check_bytes(f"peak bytes of row {label!r}", peak) + headroom_bytes
                for label, peak in rows.items()}
    table = usage_table(required, gpus).map(lambda r: "✓" if r <= 1 else "✗")
    table.insert(0, "required (GiB)", [to_unit(b, "GiB") for b in required.values()])
    return table


def catalogue_table(gpus=CATALOGUE):
    """A pandas DataFrame of the catalogue (chapter: 1).

    Label, nominal, nvidia-smi total and usable memory, features.
    """
    pd = require("pandas", "catalogue_table", extra="notebook")
    rows = {}
    for gpu in (get_gpu(g) for g in gpus):
        rows[gpu.name] = {
            "label": gpu.memory_label,
            "type": gpu.memory_type,
            "label means": gpu.memory_unit,
            "nominal (GiB)": to_unit(gpu.memory_bytes, "GiB"),
            "nominal (GB)": to_unit(gpu.memory_bytes, "GB"),
            "nvidia-smi total (GiB)": to_unit(gpu.total_bytes, "GiB"),
            "usable (GiB)": to_unit(gpu.usable_bytes, "GiB"),
            "usable (GB)": to_unit(gpu.usable_bytes, "GB"),
            "bf16 tensor cores": gpu.bf16_tensor_cores,
            "FlashAttention-2": gpu.flash_attention_2,
        }
    return pd.DataFrame.from_dict(rows, orient="index")


TENSOR_CORE_COLUMNS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")


def tensor_core_table(gpus=CATALOGUE):
    """A pandas DataFrame of compute capability and tensor-core formats (chapter: 2).

    Per format, whether tensor cores multiply it.

    Every format can be *stored* on every GPU (it is bytes); this table is about arithmetic
    at tensor-core rates, from the vendors' datasheets. fp32 is never a tensor-core input: an
    fp32 matmul runs on the CUDA cores, or on tensor cores after rounding to tf32.
    """
    pd = require("pandas", "tensor_core_table", extra="notebook")
    rows = {}
    for gpu in (get_gpu(g) for g in gpus):
        row = {"compute capability": gpu.compute_capability}
        row.update({f: ("✓" if f in gpu.tensor_core_formats else "✗") for f in TENSOR_CORE_COLUMNS})
        rows[gpu.name] = row
    return pd.DataFrame.from_dict(rows, orient="index")


def roofline_matmul_s(gpu: str | GPU, tokens: int, d_in: int, d_out: int, *, compute: str,
                      weight_bytes: float, activation_bytes: float = 2.0,
                      out_bytes: float = 2.0) -> float:
    """Roofline time of y = x W for one layer, seconds (chapter: 3).

    The larger of its FLOPs at the dense peak and its bytes at the bandwidth.

    ``compute`` is the tensor-core format the multiply runs in; ``weight_bytes`` per weight
    (2 for bf16, 1 for int8, 0.5 for 4-bit codes), ``activation_bytes`` per input value and
    ``out_bytes`` per output value. An estimate from quoted peaks: real kernels reach less.
    """
    g = get_gpu(gpu)
    for name, v in (("tokens", tokens), ("d_in", d_in), ("d_out", d_out)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MemlabError(f"{name} must be a positive integer, got {v!r}")
    if not g.bandwidth_bytes_per_s:
        raise MemlabError(f"GPU {g.name} has no quoted bandwidth; accepted: "
                          + ", ".join(x.name for x in CATALOGUE if x.bandwidth_bytes_per_s))
    flops = 2 * tokens * d_in * d_out
    moved = d_in * d_out * weight_bytes + tokens * (d_in * activation_bytes + d_out * out_bytes)
    return max(flops / g.peak_ops(compute), moved / g.bandwidth_bytes_per_s)


def compute_bound_from(gpu: str | GPU, d_in: int, d_out: int, *, compute: str,
                       weight_bytes: float) -> int:
    """Fewest tokens at which y = x W becomes compute-bound on the roofline (chapter: 3)."""
    lo, hi = 1, 1 << 20
    if not _compute_bound(gpu, hi, d_in, d_out, compute, weight_bytes):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if _compute_bound(gpu, mid, d_in, d_out, compute, weight_bytes):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _compute_bound(gpu, tokens, d_in, d_out, compute, weight_bytes) -> bool:
    g = get_gpu(gpu)
    flops_s = 2 * tokens * d_in * d_out / g.peak_ops(compute)
    return flops_s >= roofline_matmul_s(g, tokens, d_in, d_out, compute=compute,
                                        weight_bytes=weight_bytes)


def usage_table(rows: dict[str, int], gpus=CATALOGUE):
    """A pandas DataFrame: each row's peak over each GPU's usable bytes (chapter: 1).

    Above 1 does not fit.
    """
    pd = require("pandas", "usage_table", extra="notebook")
    if not isinstance(rows, dict) or not rows:
        raise MemlabError(f"rows must be a non-empty dict of label -> peak bytes, got {rows!r}")
    gpu_list = [get_gpu(g) for g in gpus]
    if not gpu_list:
        raise MemlabError(f"gpus must name at least one GPU; accepted: {', '.join(GPU_NAMES)}")
    for label, peak in rows.items():
        _check_bytes(f"peak bytes of row {label!r}", peak)
    return pd.DataFrame({gpu.column: {label: peak / gpu.usable_bytes for label, peak in rows.items()}
                         for gpu in gpu_list})
