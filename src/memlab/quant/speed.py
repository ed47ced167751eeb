"""Quantized linear layers against bf16, timed on a GPU with CUDA events (chapter: 3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from memlab.device import device_name, pick_device
from memlab.errors import check_positive_int, require
from memlab.measure.timing import not_measurable, time_ms
from memlab.quant.compare import bnb_linear

# Speed: GPU only ---------------------------------------------------------------------------------
SPEED_KINDS = ("bf16", "int8", "llm-int8", "nf4")


@dataclass(frozen=True)
class SpeedRow:
    kind: str
    tokens: int  # rows of the input: 1 is a decode step, more is a prefill or a batch
    ms: float  # median forward time of one linear layer
    vs_bf16: float  # ms / bf16's ms at the same shape


@dataclass(frozen=True)
class QuantSpeed:
    """bitsandbytes int8, LLM.int8() and NF4 linear layers against bf16 (chapter: 3).

    Timed with CUDA events.
    """

    status: str  # "measured", or "not measurable on <device>: why"
    device: str
    d_in: int
    d_out: int
    rows: list[SpeedRow] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.status == "measured"


def quant_speed(d_in: int = 8192, d_out: int = 8192, tokens=(1, 16, 2048), *, repeats: int = 50,
                warmup: int = 10, device=None) -> QuantSpeed:
    """Forward time of one linear layer per scheme against bf16, ms (CUDA only) (chapter: 3)."""
    check_positive_int("d_in", d_in)
    check_positive_int("d_out", d_out)
    for n in tokens:
        check_positive_int("tokens", n)
    dev = pick_device(device)
    if dev.type != "cuda":
        return QuantSpeed(not_measurable(dev, "the timings are of bitsandbytes' CUDA kernels"),
                          device_name(dev), d_in, d_out, [])
    bnb = require("bitsandbytes", "quantized-layer timings", extra="quant")  # noqa: F841
    lin = nn.Linear(d_in, d_out, bias=False)
    mods = {"bf16": copy.deepcopy(lin).to(dev, torch.bfloat16).eval()}
    for k in ("int8", "llm-int8", "nf4"):
        m = bnb_linear(lin, k, dev)
        if k == "nf4":
            m.compute_dtype = torch.bfloat16
        mods[k] = m
    rows = []
    for n in tokens:
        x = torch.randn(n, d_in, device=dev)
        base = None
        for k in SPEED_KINDS:
            xin = x.to(torch.float16 if k in ("int8", "llm-int8") else torch.bfloat16)
            with torch.no_grad():
                ms = float(torch.tensor(time_ms(lambda m=mods[k], xin=xin: m(xin), warmup=warmup, repeats=repeats, device=dev)).median())
            base = ms if k == "bf16" else base
            rows.append(SpeedRow(k, n, ms, ms / base))
    return QuantSpeed("measured", device_name(dev), d_in, d_out, rows)


# Int8 arithmetic on a CPU --------------------------------------------------------------------------
CPU_INT8 = "int8 x int8 (torch.ao dynamic Linear, fbgemm)"


def cpu_int8_speed(d: int = 2048, tokens=(1, 16, 256), *, repeats: int = 20,
                   warmup: int = 3) -> dict:
    """Forward time of one d x d linear layer on this CPU: int8 arithmetic against fp32 (chapter: 3).

    The int8 layer is PyTorch's dynamic quantized ``Linear`` (fbgemm): int8 weights, inputs
    quantized to 8 bits at each call, products summed in int32. One thread; each time is the
    fastest of ``repeats`` (the least disturbed by other processes). Returns the quantized
    engine, the CPU's vector capability and ``{tokens: (fp32 ms, int8 ms)}``.
    """
    import warnings

    check_positive_int("d", d)
    for n in tokens:
        check_positive_int("tokens", n)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        lin = nn.Linear(d, d, bias=False).eval()
        with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
            warnings.simplefilter("ignore")
            q = torch.ao.quantization.quantize_dynamic(nn.Sequential(lin), {nn.Linear},
                                                       dtype=torch.qint8)
            rows = {}
            for n in tokens:
                x = torch.randn(n, d)
                with torch.no_grad():
                    rows[n] = tuple(min(time_ms(lambda m=m, x=x: m(x), warmup=warmup,
                                                repeats=repeats, device="cpu"))
                                    for m in (lin, q))
    finally:
        torch.set_num_threads(threads)
    return dict(engine=torch.backends.quantized.engine,
                capability=torch.backends.cpu.get_cpu_capability(), d=d, rows=rows)
