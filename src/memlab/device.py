"""Where experiments run, and at what size.

One notion of scale for the whole book:

* ``ci``   fits a 2-core CPU in seconds. It is what the book build and the tests use.
* ``full`` is meant for a real GPU. Experiments size themselves up and refuse clearly
  when what they would allocate does not fit.

The scale is chosen automatically (``full`` on CUDA, ``ci`` elsewhere) and can be
overridden with the environment variable ``MEMLAB_SCALE``. The device can be forced
with ``MEMLAB_DEVICE`` (``cuda``, ``mps`` or ``cpu``).
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from memlab.errors import MemlabError, check_choice

SCALES = ("ci", "full")
DEVICES = ("cuda", "mps", "cpu")
SCALE_ENV = "MEMLAB_SCALE"
DEVICE_ENV = "MEMLAB_DEVICE"


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """Return the device experiments run on: CUDA, then MPS, then CPU (chapter: all).

    ``prefer`` (a name or a ``torch.device``; else ``$MEMLAB_DEVICE``) forces one; asking for
    one that is not present raises a one-line :class:`MemlabError`.
    """
    if isinstance(prefer, torch.device):
        check_choice("device", prefer.type, DEVICES)
        pick_device(prefer.type)  # present?
        return prefer
    want = prefer or os.environ.get(DEVICE_ENV) or None
    if want is not None:
        if not isinstance(want, str):
            raise MemlabError(f"device must be a name or a torch.device, got {want!r}; "
                              f"accepted: {', '.join(DEVICES)}")
        want = want.strip().lower()
        kind, _, index = want.partition(":")
        check_choice("device", kind if index.isdigit() else want, DEVICES)
        if kind == "cuda" and not torch.cuda.is_available():
            raise MemlabError(f"device {want!r} was asked for but torch sees no CUDA GPU")
        if kind == "mps" and not _mps_available():
            raise MemlabError(f"device {want!r} was asked for but torch sees no MPS device")
        return torch.device(want)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


@contextlib.contextmanager
def env_set(key: str, value: str) -> Iterator[None]:
    """Within the block, the environment variable ``key`` is ``value``; as it was after (chapter: all)."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def forced_device(kind: str):
    """Within the block, :func:`pick_device` answers ``kind`` (as ``$MEMLAB_DEVICE`` would) (chapter: all)."""
    check_choice("device", kind, DEVICES)
    return env_set(DEVICE_ENV, kind)


def get_scale(scale: str | None = None, device: torch.device | None = None) -> str:
    """Return ``'ci'`` or ``'full'``: the argument, else ``$MEMLAB_SCALE``, else by device (chapter: all)."""
    chosen = scale or os.environ.get(SCALE_ENV) or None
    if chosen is not None:
        return check_choice("scale", chosen.strip().lower(), SCALES)
    device = device or pick_device()
    return "full" if device.type == "cuda" else "ci"


def device_memory_bytes(device: torch.device | None = None) -> int | None:
    """Total memory of the device in bytes; host RAM for CPU, ``None`` where unknown (chapter: all)."""
    device = device or pick_device()
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    if device.type == "mps":
        rec = getattr(torch.mps, "recommended_max_memory", None)
        return int(rec()) if rec else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def refuse_if_too_big(needed_bytes: int, device: torch.device, what: str,
                      headroom: float = 0.9) -> None:
    """Raise a one-line error *before* allocating when ``needed_bytes`` exceeds the device (chapter: all)."""
    total = device_memory_bytes(device)
    if total is None:
        return
    if needed_bytes > headroom * total:
        raise MemlabError(
            f"{what} needs about {needed_bytes / 2**30:.1f} GiB (traced), more than "
            f"{headroom:.0%} of this {device.type} device's {total / 2**30:.1f} GiB; "
            f"use --scale ci or a larger device"
        )


def device_name(device: torch.device | None = None) -> str:
    """Human name of the device, e.g. ``'NVIDIA H100 80GB HBM3'`` or the CPU model (chapter: all)."""
    device = device or pick_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({platform.machine()})"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU: {name}"


@dataclass(frozen=True)
class EnvReport:
    """What this process runs on: versions, device, memory and scale."""

    device: str
    device_name: str
    device_memory_bytes: int | None
    scale: str
    torch_version: str
    cuda_version: str | None
    python_version: str
    platform: str
    cpu_count: int
    on_colab: bool
    bf16_supported: bool

    def as_dict(self) -> dict:
        """The report as a plain dict, as stored in a record's provenance (chapter: all)."""
        return asdict(self)

    def __str__(self) -> str:
        gib = (
            f"{self.device_memory_bytes / 2**30:.1f} GiB"
            if self.device_memory_bytes
            else "unknown"
        )
        where = {"cuda": "GPU", "mps": "Apple GPU", "cpu": "CPU"}[self.device]
        rows = [
            ("device", f"{self.device} ({self.device_name})"),
            ("memory", f"{gib}" + (" (host RAM)" if self.device == "cpu" else "")),
            ("scale", f"{self.scale}  (set MEMLAB_SCALE=ci|full to change)"),
            ("torch", self.torch_version),
            ("CUDA", self.cuda_version or "none"),
            ("python", f"{self.python_version} on {self.platform}, {self.cpu_count} CPU cores"),
            ("bf16 matmul", "yes" if self.bf16_supported else "no (emulated or slow)"),
        ]
        if self.on_colab:
            rows.append(("notebook", "Google Colab"))
        width = max(len(k) for k, _ in rows)
        lines = [f"memlab is running on the {where}: measurements below are from this machine."]
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        return "\n".join(lines)


def _bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":  # bf16 tensor cores from Ampere (compute capability 8.0) on
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type in ("cpu", "mps")


def env_report(*, print_report: bool = True, scale: str | None = None) -> EnvReport:
    """Print and return the environment (chapter: every notebook's first cell).

    It gives the torch and CUDA versions, the device, its memory and the scale.
    """
    device = pick_device()
    report = EnvReport(
        device=device.type,
        device_name=device_name(device),
        device_memory_bytes=device_memory_bytes(device),
        scale=get_scale(scale, device),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda if device.type == "cuda" else None,
        python_version=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        cpu_count=os.cpu_count() or 1,
        on_colab="google.colab" in sys.modules,
        bf16_supported=_bf16_supported(device),
    )
    if print_report:
        print(report)
    return report


def seed_all(seed: int = 0) -> None:
    """Seed Python, NumPy and torch so a run is repeatable (chapter: all)."""
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    torch.manual_seed(seed)
