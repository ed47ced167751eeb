"""The registry of experiments: each a function ``(scale) -> result dataclass``.

An experiment sizes itself from the scale (``ci`` or ``full``), runs the same code on
any device, and never plots. ``python -m memlab run <name> --scale full --out results/``
runs one without Jupyter and stores the result with its provenance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memlab.device import get_scale, pick_device, refuse_if_too_big
from memlab.errors import MemlabError, check_choice
from memlab.measure import StepMemory
from memlab.mixed import Fp8Matmul, MixedPrecisionResult
from memlab.quantmodel import SIZES as QM_SIZES
from memlab.quantmodel import OutlierStudy, QuantComparison, QuantSpeed


@dataclass(frozen=True)
class Experiment:
    """A named experiment: what it measures, which chapter shows it, its sizes per scale and result type."""

    name: str
    chapter: str
    summary: str
    fn: Callable[[str], object]
    sizes: dict  # scale -> keyword arguments (or a config dataclass)
    result: type  # the frozen dataclass the experiment returns


EXPERIMENTS: dict[str, Experiment] = {}


def _is_frozen_dataclass(tp) -> bool:
    return (isinstance(tp, type) and dataclasses.is_dataclass(tp)
            and tp.__dataclass_params__.frozen)


def register(name: str, *, chapter: str, summary: str, sizes: dict, result: type):
    """Decorator adding an experiment function to the registry (chapter: all).

    ``result`` is the frozen dataclass the function returns; a record must be able to store
    every field of it, which is checked here, at import, not after a long run.
    """
    from memlab.device import SCALES
    from memlab.results import writable_type

    if not _is_frozen_dataclass(result):
        raise MemlabError(f"experiment {name!r}: result must be a frozen dataclass, got {result!r}")
    writable_type(result, result.__name__)
    if set(sizes) != set(SCALES):
        raise MemlabError(f"experiment {name!r}: sizes must name every scale ({', '.join(SCALES)}), "
                          f"got {', '.join(sizes)}")

    def wrap(fn):
        EXPERIMENTS[name] = Experiment(name=name, chapter=chapter, summary=summary, fn=fn,
                                       sizes=sizes, result=result)
        return fn

    return wrap


def get_experiment(name: str) -> Experiment:
    """Look an experiment up by name; an unknown one is a one-line error (chapter: all)."""
    check_choice("experiment", name, sorted(EXPERIMENTS))
    return EXPERIMENTS[name]


def describe_sizes(size) -> str:
    """One line for an experiment's size at a scale: ``key=value`` pairs (chapter: all)."""
    if dataclasses.is_dataclass(size) and not isinstance(size, type):
        size = {f.name: getattr(size, f.name) for f in dataclasses.fields(size)}
    if isinstance(size, dict):
        return ", ".join(f"{k}={{{describe_sizes(v)}}}" if isinstance(v, dict) else f"{k}={v}"
                         for k, v in size.items())
    return str(size)


# Experiments -------------------------------------------------------------------------------
STEP_SIZES = {
    "ci": dict(model="tiny", batch_size=4, seq_len=64),
    "full": dict(model="gpt2", batch_size=8, seq_len=1024),
}


@register(
    "step-memory",
    chapter="chapters/00_toolkit",
    summary="peak memory of one AdamW training step, by category, measured on this device",
    sizes=STEP_SIZES,
    result=StepMemory,
)
def step_memory(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """A real training step's bytes by category, measured on this device, as ``StepMemory`` (chapter: 0)."""
    from memlab.measure import measure_step, trace_step

    scale = get_scale(scale)
    size = STEP_SIZES[scale]
    device = pick_device()
    kwargs = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                  precision=precision, optimizer=optimizer)
    if scale == "full" or device.type != "cpu":  # trace first: refuse before allocating
        traced = trace_step(size["model"], **kwargs)
        refuse_if_too_big(traced.peak_bytes, device, f"a {size['model']} training step")
    return measure_step(size["model"], device=device, **kwargs)


TRACE_SIZES = {
    "ci": dict(model="llama2-7b", batch_size=1, seq_len=256),
    "full": dict(model="llama2-7b", batch_size=1, seq_len=2048),
}


@register(
    "trace-7b",
    chapter="chapters/00_toolkit",
    summary="a Llama-2-7B AdamW training step traced under FakeTensorMode, nothing allocated",
    sizes=TRACE_SIZES,
    result=StepMemory,
)
def trace_7b(scale: str | None = None, *, precision: str = "fp32", optimizer: str = "adamw"):
    """A Llama-2-7B training step's bytes by category, traced without allocating, as ``StepMemory`` (chapter: 0)."""
    from memlab.measure import trace_step

    size = TRACE_SIZES[get_scale(scale)]
    return trace_step(size["model"], batch_size=size["batch_size"], seq_len=size["seq_len"],
                      precision=precision, optimizer=optimizer)


def run_experiment(name: str, scale: str | None = None, out: str | Path | None = None,
                   command: str | None = None):
    """Run an experiment, optionally store its record under ``out``; returns ``(result, record, path)`` (chapter: all)."""
    from memlab.results import make_record, save_record

    exp = get_experiment(name)
    scale = get_scale(scale)
    result = exp.fn(scale)
    if not isinstance(result, exp.result):
        raise MemlabError(f"experiment {name!r} returned a {type(result).__name__}, "
                          f"not its declared {exp.result.__name__}")
    record = make_record(name, scale, result, command=command)
    path = save_record(record, out) if out is not None else None
    return result, record, path


# The estimator against the trace ------------------------------------------------------------
@dataclass(frozen=True)
class AccuracyRow:
    """One configuration: the estimate, the trace (or real CPU step), and their relative errors."""

    model: str
    precision: str
    optimizer: str
    optimizer_impl: str
    attention: str
    checkpointing: bool
    grad_accum_steps: int
    batch_size: int
    seq_len: int
    exact_states: bool  # parameters, gradients and optimizer states equal to the byte
    activations_error: float  # estimate / trace - 1
    peak_error: float
    estimated_peak_bytes: int
    traced_peak_bytes: int


@dataclass(frozen=True)
class AccuracyResult:
    """The estimator's error against the trace over a grid of configurations."""

    rows: list[AccuracyRow]
    worst_activations_error: float  # largest |estimate / trace - 1|
    worst_peak_error: float
    median_peak_error: float
    all_states_exact: bool


def _accuracy_grid(scale: str):
    from dataclasses import replace

    from memlab.models import get_config

    small = get_config("tiny", n_layer=2, d_model=128, n_head=8, n_kv_head=2, d_ff=352,
                       vocab_size=1024, max_seq_len=1024, name="small-gqa")
    models = [small, get_config("tiny-gpt2", max_seq_len=1024)]
    sizes = [(2, 64), (1, 256)]
    optimizers = [("adamw", "foreach"), ("adam", "fused"), ("sgd-momentum", "foreach"),
                  ("adamw", "for-loop"), ("sgd", "foreach")]
    grid, i = [], 0
    for cfg in models:
        for precision in ("fp32", "fp16-mixed", "bf16-mixed", "bf16"):
            for attention in ("sdpa", "eager"):
                for ckpt in (False, True):
                    for B, T in sizes:
                        opt, impl = optimizers[i % len(optimizers)]
                        accum = 2 if i % 7 == 3 else 1
                        i += 1
                        grid.append((replace(cfg, attention=attention), precision, opt, impl,
                                     ckpt, accum, B, T))
    if scale == "full":  # a few 7B-class points (a few seconds each to trace on a CPU)
        for name, precision, ckpt in (("llama2-7b", "bf16-mixed", False),
                                      ("llama2-7b", "fp32", True),
                                      ("llama3-8b", "bf16", False)):
            grid.append((get_config(name), precision, "adamw", "foreach", ckpt, 1, 1, 2048))
    return grid


@register(
    "estimator-accuracy",
    chapter="chapters/01_where_the_memory_goes",
    summary="memlab.memory.estimate against the traced step over a grid of configurations",
    sizes={"ci": dict(grid="small models, 64 configurations"),
           "full": dict(grid="adds Llama-2-7B and Llama-3-8B at seq 2048")},
    result=AccuracyResult,
)
def estimator_accuracy(scale: str | None = None, *, measured: bool = False) -> AccuracyResult:
    """Estimate vs trace over precisions, optimizers, attention, checkpointing, GQA and sizes (chapter: 1).

    ``measured=True`` runs every configuration for real on the CPU instead of tracing it.
    """
    import statistics

    from memlab.measure import measure_step, trace_step
    from memlab.memory import estimate

    rows = []
    for cfg, precision, opt, impl, ckpt, accum, B, T in _accuracy_grid(get_scale(scale)):
        kw = dict(batch_size=B, seq_len=T, precision=precision, optimizer=opt,
                  optimizer_impl=impl, checkpointing=ckpt, grad_accum_steps=accum)
        if measured and cfg.num_parameters() > 50_000_000:
            continue  # the 7B-class points are traced only
        traced = measure_step(cfg, device="cpu", **kw) if measured else trace_step(cfg, **kw)
        est = estimate(cfg, device="cpu", **kw)  # the trace follows CPU conventions
        steady = traced.phase_breakdown["optimizer"]
        rows.append(AccuracyRow(
            model=cfg.name, precision=precision, optimizer=opt, optimizer_impl=impl,
            attention=cfg.attention, checkpointing=ckpt, grad_accum_steps=accum,
            batch_size=B, seq_len=T,
            exact_states=(steady["parameters"], steady["gradients"], steady["optimizer_states"])
            == (est.weights_bytes, est.gradients_bytes, est.optimizer_bytes),
            activations_error=est.activations_bytes / traced.saved_activations_bytes - 1,
            peak_error=est.peak_bytes / traced.peak_bytes - 1,
            estimated_peak_bytes=est.peak_bytes, traced_peak_bytes=traced.peak_bytes,
        ))
    return AccuracyResult(
        rows=rows,
        worst_activations_error=max(abs(r.activations_error) for r in rows),
        worst_peak_error=max(abs(r.peak_error) for r in rows),
        median_peak_error=statistics.median(abs(r.peak_error) for r in rows),
        all_states_exact=all(r.exact_states for r in rows),
    )


# Loading a model ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadRow:
    """One model loaded in one dtype: what the formula says and what the process holds."""

    model: str
    dtype: str
    parameters: int
    formula_bytes: int  # parameters x bytes per value
    allocated_bytes: int  # tensor bytes the allocator holds for the weights
    reserved_bytes: int | None  # CUDA: what the caching allocator reserved from the driver
    process_bytes: int | None  # CUDA: memory in use on the device; CPU: the process's resident set


@dataclass(frozen=True)
class LoadResult:
    """Loading models: weights vs what the process really holds on the device."""

    device: str
    baseline_process_bytes: int | None  # before any weights: CUDA context, or the bare process
    rows: list[LoadRow]


LOAD_SIZES = {
    "ci": dict(models=("tiny", "gpt2"), dtypes=("fp32", "bf16")),
    "full": dict(models=("gpt2", "llama-1b", "llama2-7b"), dtypes=("fp32", "bf16")),
}
_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _process_bytes(device) -> int | None:
    """Device memory in use by everything (CUDA), or this process's resident set (CPU)."""
    import torch

    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(total - free)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@register(
    "load-memory",
    chapter="chapters/01_where_the_memory_goes",
    summary="bytes of loaded weights vs parameters x bytes/value, and what the process adds",
    sizes=LOAD_SIZES,
    result=LoadResult,
)
def load_memory(scale: str | None = None) -> LoadResult:
    """Load models in fp32 and bf16; compare the allocator and the process with the formula (chapter: 1)."""
    import gc

    import torch

    from memlab.measure import measure_peak
    from memlab.models import build_model, get_config

    scale = get_scale(scale)
    device = pick_device()
    if device.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=device)  # create the CUDA context before the baseline
    baseline = _process_bytes(device)
    rows = []
    for name in LOAD_SIZES[scale]["models"]:
        cfg = get_config(name)
        for dt in LOAD_SIZES[scale]["dtypes"]:
            dtype = getattr(torch, _TORCH_DTYPES[dt])
            formula = cfg.num_parameters() * torch.finfo(dtype).bits // 8
            refuse_if_too_big(formula, device, f"loading {name} in {dt}")
            old = torch.get_default_dtype()
            torch.set_default_dtype(dtype)  # build in the final dtype: no fp32 copy first
            try:
                model, peak = measure_peak(build_model, cfg, device=device)
            finally:
                torch.set_default_dtype(old)
            reserved = torch.cuda.memory_reserved(device) if device.type == "cuda" else None
            rows.append(LoadRow(model=name, dtype=dt, parameters=cfg.num_parameters(),
                                formula_bytes=formula, allocated_bytes=peak.end_allocated_bytes,
                                reserved_bytes=reserved, process_bytes=_process_bytes(device)))
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return LoadResult(device=device.type, baseline_process_bytes=baseline, rows=rows)


# Mixed-precision training (chapter 2) ----------------------------------------------------------
MIXED_SIZES = {
    "ci": dict(model="tiny", model_overrides=dict(vocab_size=128, name="tiny-v128"), steps=50,
               batch_size=8, seq_len=32, lr=1e-2, accumulation=4096,
               large=dict(model="llama2-7b", batch_sizes=(1,), seq_len=2048), times=None),
    "full": dict(model="tiny", model_overrides=dict(vocab_size=1024, n_layer=4, n_head=8,
                                                    n_kv_head=4, d_model=256, d_ff=704,
                                                    max_seq_len=256, name="small-v1024"),
                 steps=400, batch_size=32, seq_len=128, lr=3e-3, accumulation=256,
                 large=dict(model="llama2-7b", batch_sizes=(1, 8), seq_len=2048),
                 times=dict(model="gpt2", batch_size=8, seq_len=1024, steps=20, warmup=5)),
}


@register(
    "mixed-precision",
    chapter="chapters/02_number_formats",
    summary="fp32, fp16 with and without loss scaling, bf16 autocast and pure bf16: "
            "loss, gradient underflow, memory by mode",
    sizes=MIXED_SIZES,
    result=MixedPrecisionResult,
)
def mixed_precision(scale: str | None = None):
    """Five precision modes trained on the same data: curves, underflow, memory, step times (chapter: 2)."""
    from memlab.mixed import mixed_precision_run

    return mixed_precision_run(**MIXED_SIZES[get_scale(scale)])


FP8_SIZES = {
    "ci": dict(m=1024, n=1024, k=1024, repeats=10, warmup=3),
    "full": dict(m=8192, n=8192, k=8192, repeats=50, warmup=10),
}


@register(
    "fp8-matmul",
    chapter="chapters/02_number_formats",
    summary="an fp8 (e4m3) matmul through torch._scaled_mm against bf16: TFLOP/s and error",
    sizes=FP8_SIZES,
    result=Fp8Matmul,
)
def fp8_matmul(scale: str | None = None):
    """fp8 against bf16 matmul speed and error on this GPU, or a 'not measurable' status (chapter: 2)."""
    from memlab.mixed import fp8_matmul as run

    return run(**FP8_SIZES[get_scale(scale)])


@dataclass(frozen=True)
class QuantizationResult:
    """The schemes compared on the book's model, and the outlier study (chapter: 3)."""

    schemes: QuantComparison
    outliers: OutlierStudy


@register(
    "quantization",
    chapter="chapters/03_quantization",
    summary="every quantization scheme on the book's trained model: bytes, quality, per-layer "
            "error; outlier features and LLM.int8()",
    sizes=QM_SIZES,
    result=QuantizationResult,
)
def quantization(scale: str | None = None) -> QuantizationResult:
    """Schemes compared on the trained model, and the outlier study (chapter: 3)."""
    from memlab.quantmodel import compare_schemes, outlier_study

    return QuantizationResult(compare_schemes(scale), outlier_study(scale))


QUANT_SPEED_SIZES = {
    "ci": dict(d_in=1024, d_out=1024, tokens=(1, 64), repeats=10, warmup=3),
    "full": dict(d_in=8192, d_out=8192, tokens=(1, 16, 2048), repeats=50, warmup=10),
}


@register(
    "quant-speed",
    chapter="chapters/03_quantization",
    summary="bitsandbytes int8, LLM.int8() and NF4 linear layers against bf16: forward time",
    sizes=QUANT_SPEED_SIZES,
    result=QuantSpeed,
)
def quant_speed(scale: str | None = None):
    """Quantized linear-layer speed against bf16 on this GPU, or a 'not measurable' status (chapter: 3)."""
    from memlab.quantmodel import quant_speed as run

    return run(**QUANT_SPEED_SIZES[get_scale(scale)])
