"""A model of the time data parallelism spends communicating (chapter 6).

It also gives what that time does to throughput.

Parameters in, numbers out: every bandwidth is a quoted datasheet or paper figure
(:data:`LINKS`, each with its source), every efficiency an input. Nothing here is measured.

Ring collectives over N GPUs (the ZeRO paper's section 7 and NCCL's ring algorithms): in an
all-gather or a reduce-scatter of a payload of Ψ values each GPU sends (N-1)/N·Ψ of them; an
all-reduce is both, 2(N-1)/N·Ψ. Per step, DDP and ZeRO stages 1-2 all-reduce (or
reduce-scatter and all-gather) the gradients once: 2(N-1)/N·Ψ; stage 3 gathers the parameters
twice (forward and backward) and reduce-scatters the gradients: 3(N-1)/N·Ψ
(:data:`memlab.distributed.zero.COMM_FACTOR`). A GPU sends at its link's one-way bandwidth
while the N GPUs sit in one node; once they span nodes, the model assumes every GPU's ring
traffic leaves its node, so a GPU gets its share of the node's network bandwidth (the node's
bandwidth over its GPUs), if that is below its NVLink bandwidth. An optional per-hop latency
(the alpha of the alpha-beta model, an input, zero by default) adds (N-1) hops per
collective.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Real

from memlab.distributed.zero import COMM_FACTOR, check_gpus, check_stage
from memlab.errors import MemlabError, check_choice, check_positive_number


@dataclass(frozen=True)
class Link:
    """A quoted interconnect bandwidth: bytes/s one way, per GPU or per node (scope)."""

    name: str
    bytes_per_s: float  # one direction
    scope: str  # 'gpu' (each GPU's own link) or 'node' (shared by the node's GPUs)
    quoted: str  # the figure as its source states it
    source: str


LINKS: dict[str, Link] = {
    # NVIDIA A100 datasheet: third-generation NVLink, 600 GB/s per GPU, counted in both
    # directions together: 300 GB/s each way.
    "a100-nvlink3": Link("a100-nvlink3", 300e9, "gpu",
                         "NVLink 600 GB/s per GPU (both directions)",
                         "https://www.nvidia.com/en-us/data-center/a100/"),
    # NVIDIA H100 SXM datasheet: fourth-generation NVLink, 900 GB/s per GPU (both directions).
    "h100-nvlink4": Link("h100-nvlink4", 450e9, "gpu",
                         "NVLink 900 GB/s per GPU (both directions)",
                         "https://www.nvidia.com/en-us/data-center/h100/"),
    # Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel",
    # arXiv 2304.11277, section 5.1: nodes of 8 A100 80GB GPUs joined by a 2 Tb/s RoCE network
    # per node; read here as 2e12 bits/s each way per node = 250e9 bytes/s.
    "fsdp-paper-roce": Link("fsdp-paper-roce", 2e12 / 8, "node",
                            "2 Tb/s RoCE per node of 8 A100 80GB",
                            "https://arxiv.org/abs/2304.11277"),
    # GPU-host links (chapter 7's offload), each datasheet's figure for both directions halved.
    # NVIDIA A100 datasheet, interconnect row: "PCIe Gen4: 64 GB/s" (x16, both directions).
    "pcie4-x16": Link("pcie4-x16", 32e9, "gpu", "PCIe Gen4: 64 GB/s (both directions)",
                      "https://www.nvidia.com/en-us/data-center/a100/"),
    # NVIDIA H100 datasheet (SXM), interconnect row: "PCIe Gen5: 128 GB/s" (both directions).
    "pcie5-x16": Link("pcie5-x16", 64e9, "gpu", "PCIe Gen5: 128 GB/s (both directions)",
                      "https://www.nvidia.com/en-us/data-center/h100/"),
    # NVIDIA's Grace Hopper architecture article: NVLink-C2C joins the Grace CPU and the Hopper
    # GPU with 900 GB/s of total bandwidth, 450 GB/s each way.
    "nvlink-c2c": Link("nvlink-c2c", 450e9, "gpu",
                       "NVLink-C2C: 900 GB/s total, Grace CPU to Hopper GPU (both directions)",
                       "https://developer.nvidia.com/blog/"
                       "nvidia-grace-hopper-superchip-architecture-in-depth/"),
}
HOST_LINK_NAMES = ("pcie4-x16", "pcie5-x16", "nvlink-c2c")  # the links between a GPU and its host
FSDP_PAPER_GPUS_PER_NODE = 8  # Zhao et al. 2023, section 5.1 (quoted)
A100_BF16_PEAK_FLOPS = 312e12  # dense bf16 tensor-core peak, A100 datasheet (memlab.gpus)


def _link(name: str) -> Link:
    check_choice("link", name, tuple(LINKS))
    return LINKS[name]


def per_gpu_bandwidth(gpus: int, *, gpus_per_node: int = FSDP_PAPER_GPUS_PER_NODE,
                      intra: str = "a100-nvlink3", inter: str = "fsdp-paper-roce") -> float:
    """Bytes/s one GPU sends at in a ring over ``gpus`` GPUs (chapter: 6).

    NVLink within a node, its share of the node's network across nodes.
    """
    gpus, gpus_per_node = check_gpus(gpus), check_gpus(gpus_per_node)
    near, far = _link(intra), _link(inter)

    def share(link: Link) -> float:
        return link.bytes_per_s / gpus_per_node if link.scope == "node" else link.bytes_per_s

    if gpus <= gpus_per_node:
        return share(near)
    return min(share(near), share(far))


def comm_seconds(parameters: int, stage: int, gpus: int, *, bytes_per_value: int = 2,
                 gpus_per_node: int = FSDP_PAPER_GPUS_PER_NODE, intra: str = "a100-nvlink3",
                 inter: str = "fsdp-paper-roce", hop_latency_s: float = 0.0) -> float:
    """Seconds one GPU spends sending a step's collectives at ZeRO ``stage`` (chapter: 6).

    Over ``gpus`` GPUs, with ring algorithms.

    Bytes sent: COMM_FACTOR[stage] x (N-1)/N x parameters x ``bytes_per_value`` (2Ψ for
    stages 0-2, 3Ψ for stage 3), at :func:`per_gpu_bandwidth`; plus (N-1) x
    ``hop_latency_s`` per collective (2 collectives at stages 0-2, 3 at stage 3).
    """
    stage, gpus = check_stage(stage), check_gpus(gpus)
    if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 0:
        raise MemlabError(f"parameters must be a non-negative integer, got {parameters!r}")
    check_positive_number("bytes_per_value", bytes_per_value)
    if isinstance(hop_latency_s, bool) or not isinstance(hop_latency_s, Real) or hop_latency_s < 0:
        raise MemlabError(f"hop_latency_s must be a non-negative number, got {hop_latency_s!r}")
    if gpus == 1:
        return 0.0
    sent = COMM_FACTOR[stage] * (gpus - 1) / gpus * parameters * bytes_per_value
    bandwidth = per_gpu_bandwidth(gpus, gpus_per_node=gpus_per_node, intra=intra, inter=inter)
    collectives = COMM_FACTOR[stage]  # each Ψ-sized all-gather or reduce-scatter is one ring
    return sent / bandwidth + collectives * (gpus - 1) * hop_latency_s


@dataclass(frozen=True)
class ThroughputRow:
    """One number of GPUs in the throughput model: seconds per step and tokens/s per GPU."""

    gpus: int
    compute_s: float
    comm_s: float
    step_s: float
    tokens_per_s_per_gpu: float
    relative: float  # tokens/s per GPU over that of the smallest number of GPUs in the list

    def as_dict(self) -> dict:
        """The row as a plain dict (chapter: 6)."""
        return asdict(self)


def throughput_model(parameters: int, tokens_per_gpu: int, gpus_list, *, stage: int = 3,
                     mfu: float, peak_flops: float = A100_BF16_PEAK_FLOPS,
                     overlap: bool = True, bytes_per_value: int = 2,
                     gpus_per_node: int = FSDP_PAPER_GPUS_PER_NODE, intra: str = "a100-nvlink3",
                     inter: str = "fsdp-paper-roce",
                     hop_latency_s: float = 0.0) -> list[ThroughputRow]:
    """Per-GPU training throughput over numbers of GPUs, tokens/s (chapter: 6).

    It comes from compute time and ring communication time.

    Compute: 6 x parameters x ``tokens_per_gpu`` FLOPs (forward and backward, no
    recomputation) at ``peak_flops`` x ``mfu``, the assumed model FLOPs utilisation (an input).
    Communication: :func:`comm_seconds`. A step takes the larger of the two when they overlap
    (``overlap=True``), their sum when they do not. Each GPU processes ``tokens_per_gpu``
    tokens per step whatever N is (weak scaling), so compute time stays the same and only
    communication can lower the per-GPU throughput.
    """
    if isinstance(tokens_per_gpu, bool) or not isinstance(tokens_per_gpu, int) or tokens_per_gpu < 1:
        raise MemlabError(f"tokens_per_gpu must be a positive integer, got {tokens_per_gpu!r}")
    mfu = check_positive_number("mfu", mfu)
    if mfu > 1:
        raise MemlabError(f"mfu is a fraction of the peak, between 0 and 1, got {mfu!r}")
    peak_flops = check_positive_number("peak_flops", peak_flops)
    if not isinstance(overlap, bool):
        raise MemlabError(f"overlap must be True or False, got {overlap!r}")
    gpus_list = [check_gpus(n) for n in gpus_list]
    if not gpus_list:
        raise MemlabError("gpus_list needs at least one number of GPUs")
    compute_s = 6 * parameters * tokens_per_gpu / (peak_flops * mfu)
    rows = []
    for n in gpus_list:
        comm_s = comm_seconds(parameters, stage, n, bytes_per_value=bytes_per_value,
                              gpus_per_node=gpus_per_node, intra=intra, inter=inter,
                              hop_latency_s=hop_latency_s)
        step_s = max(compute_s, comm_s) if overlap else compute_s + comm_s
        rows.append((n, comm_s, step_s, tokens_per_gpu / step_s))
    first = min(rows)[3]  # the smallest number of GPUs
    return [ThroughputRow(gpus=n, compute_s=compute_s, comm_s=c, step_s=s,
                          tokens_per_s_per_gpu=t, relative=t / first) for n, c, s, t in rows]
