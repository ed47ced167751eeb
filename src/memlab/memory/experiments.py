"""Chapter 1's experiments: the estimator held to the trace, and loading a model."""

from __future__ import annotations

from dataclasses import dataclass

from memlab.device import get_scale, pick_device, refuse_if_too_big
from memlab.dtypes import dtype as to_dtype
from memlab.experiments import register
from memlab.memory.inference import InferenceMemory


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

    def summary(self) -> str:
        """The errors in words: exact states, worst and median errors, the worst set-up (chapter: 1)."""
        rows = self.rows
        exact = sum(abs(r.peak_error) < 1e-6 for r in rows)
        worst = max(rows, key=lambda r: abs(r.peak_error))
        return "\n".join([
            f"{len(rows)} configurations; parameters, gradients and optimizer states exact in all: "
            f"{self.all_states_exact}",
            f"activations: worst error {self.worst_activations_error:.4%}",
            f"peak: worst error {self.worst_peak_error:.2%}, median {self.median_peak_error:.4%}",
            f"peak equal to within one part in a million in {exact} of {len(rows)}; "
            f"optimizer set-ups: {len({(r.optimizer, r.optimizer_impl) for r in rows})}; "
            f"batch x sequence shapes: {sorted({(r.batch_size, r.seq_len) for r in rows})}",
            f"worst case: {worst.model}, {worst.precision}, {worst.attention} attention, "
            f"checkpointing {worst.checkpointing}, batch {worst.batch_size} x {worst.seq_len}",
        ])


def _accuracy_grid(scale: str):
    from dataclasses import replace

    from memlab.model.config import get_config

    small = get_config("tiny", n_layer=2, d_model=128, n_head=8, n_kv_head=2, d_ff=352,
                       vocab_size=1024, max_seq_len=1024, name="small-gqa")
    models = [small, get_config("tiny-gpt2", max_seq_len=1024)]
    sizes = [(2, 64), (1, 256)]
    optimizers = [("adamw", "foreach"), ("adam", "fused"), ("sgd-momentum", "foreach"),
                  ("adamw", "for-loop"), ("sgd", "foreach"), ("adafactor", "foreach"),
                  ("adamw-bf16-moments", "for-loop")]
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
    needs="cpu", cost_s=90, priority=210,
)
def estimator_accuracy(scale: str | None = None, *, measured: bool = False) -> AccuracyResult:
    """Estimate vs trace over precisions, optimizers, attention, checkpointing, GQA and sizes (chapter: 1).

    ``measured=True`` runs every configuration for real on the CPU instead of tracing it.
    """
    import statistics

    from memlab.measure.step import measure_step, trace_step
    from memlab.memory.estimator import estimate

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
            == (est.parameters_bytes, est.gradients_bytes, est.optimizer_states_bytes),
            activations_error=est.saved_activations_bytes / traced.saved_activations_bytes - 1,
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
    needs="any", cost_s=45, priority=12,
)
def load_memory(scale: str | None = None) -> LoadResult:
    """Load models in fp32 and bf16; compare the allocator and the process with the formula (chapter: 1)."""
    import gc

    import torch

    from memlab.measure.peak import measure_peak
    from memlab.model.config import get_config
    from memlab.model.transformer import build_model

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
            dtype = to_dtype(dt)
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


# Generation with a KV cache -------------------------------------------------------------------
GENERATION_SIZES = {  # (model, batch, prompt tokens, new tokens, dtype)
    "ci": dict(cases=(("tiny", 2, 48, 16, "fp32"), ("tiny-gpt2", 4, 32, 32, "bf16"))),
    "full": dict(cases=(("llama-1b", 8, 1536, 256, "bf16"), ("llama2-7b", 1, 3968, 128, "bf16"),
                        ("llama2-7b", 16, 896, 128, "bf16"))),
}


@dataclass(frozen=True)
class GenerationRow:
    """One generation measured on this device beside its estimate (chapter: 4)."""

    measured: InferenceMemory
    estimated_peak_bytes: int
    estimated_kv_cache_bytes: int


@dataclass(frozen=True)
class GenerationMemory:
    """Generations with a KV cache, measured on this device and estimated (chapter: 4)."""

    device: str
    rows: list[GenerationRow]

    def table_rows(self) -> list[dict]:
        """One row per generation for a page's table (chapter: 4).

        Each row has the cache, the peak and its phase, and the estimate over measured.
        """
        out = []
        for r in self.rows:
            m, s = r.measured, r.measured.setup
            out.append(dict(model=s["model"], batch=s["batch_size"], prompt=s["prompt_len"],
                            new=s["new_tokens"], dtype=s["dtype"],
                            kv_cache_MiB=round(m.kv_cache_bytes / 2**20, 4),
                            measured_peak_MiB=round(m.peak_bytes / 2**20, 4),
                            peak_phase="prefill" if m.prefill_peak_bytes >= m.decode_peak_bytes
                            else "decode",
                            estimate_over_measured=round(r.estimated_peak_bytes / m.peak_bytes, 4)))
        return out


@register(
    "generation-memory",
    chapter="chapters/04_attention",
    summary="generation with a KV cache measured on this device (prefill and decode peaks, "
            "the cache's bytes) beside memlab.memory.estimate_inference",
    sizes=GENERATION_SIZES,
    result=GenerationMemory,
    needs="any", cost_s=60, priority=28,
)
def generation_memory(scale: str | None = None) -> GenerationMemory:
    """Prefill and decode peaks of real generations here, and their estimates (chapter: 4)."""
    from memlab.memory.estimator import estimate_inference
    from memlab.memory.inference import measure_inference
    from memlab.model.config import get_config

    device = pick_device()
    rows = []
    for model, B, T, N, dtype in GENERATION_SIZES[get_scale(scale)]["cases"]:
        est = estimate_inference(get_config(model), B, T, dtype, N)
        refuse_if_too_big(est.peak_bytes, device, f"generating with {model}")
        m = measure_inference(model, batch_size=B, prompt_len=T, new_tokens=N, dtype=dtype,
                              device=device)
        rows.append(GenerationRow(m, est.peak_bytes, est.kv_cache_bytes))
    return GenerationMemory(device.type, rows)
