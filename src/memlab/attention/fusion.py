"""Fused kernels: ``torch.compile`` of one transformer block against eager on this device.

Eager PyTorch runs one operator at a time: each reads its inputs from memory and writes its
output back, and each costs a dispatch (a kernel launch on a GPU). ``torch.compile`` hands the
block's graph to Inductor, which fuses chains of elementwise and reduction operators (a norm,
the attention scale, mask and softmax, SiLU times the up projection, the residual adds) into
one generated kernel each, and leaves the matrix products to the vendor library (``mm``,
``bmm``). :func:`fusion_comparison` measures, for the same block, the same input and the same
parameters, eager and compiled side by side: operators or kernels run per forward + backward
step, bytes saved for backward, peak bytes, time per step, and the time compilation took.

Inductor generates C++ on a CPU, so it needs a C++ compiler there, and Triton on a CUDA GPU.
Where compilation is impossible the result carries a status and no compiled numbers.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from memlab.attention.memory import saved_storage_bytes
from memlab.device import pick_device
from memlab.dtypes import dtype as to_dtype
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.peak import measure_peak, quiet_stderr
from memlab.measure.timing import time_ms
from memlab.model.config import ModelConfig, get_config
from memlab.model.transformer import Block, rope_cache
from memlab.units import to_unit

FUSION_ATTENTION = ("eager", "sdpa")  # the block's attention; both compile without a graph break
MEASURED = "measured"

# Sizes of the comparison per scale. ci: a block of the tiny model, compiled in about a minute
# on 2 CPU cores (the chapter shows the stored record). full: a block of the 1B-class model.
FUSION_SIZES = {
    "ci": dict(config="tiny", attention="eager", batch_size=4, seq_len=128, dtype="fp32",
               repeats=51, warmup=5),
    "full": dict(config="llama-1b", attention="eager", batch_size=4, seq_len=2048,
                 dtype="bf16", repeats=21, warmup=5),
}

# Operators that hand out memory without writing values: not a kernel of their own.
ALLOCATION_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                            "new_empty_strided", "resize_", "_unsafe_view", "lift_fresh"})


@dataclass(frozen=True)
class FusionComparison:
    """One transformer block, eager against ``torch.compile``: kernels, bytes, time (chapter: 4).

    Compiled fields are ``None`` unless ``status == "measured"``.
    """

    model: str  # the config the block is built from
    attention: str  # "eager" (scores and softmax materialised) or "sdpa"
    batch_size: int
    seq_len: int
    dtype: str  # the block's parameter and activation format
    device: str
    threads: int  # torch's intra-op threads during the timing
    status: str  # "measured", or why nothing was compiled
    compiler: str | None  # what Inductor generates code with: a C++ compiler's path, or "triton"
    counted: str  # what a kernel is in the counts below, on this device
    eager_kernels: int  # kernels run in one forward + backward step, eager
    compiled_kernels: int | None
    generated_kernels: int | None  # of compiled_kernels: the ones Inductor generated (fused)
    eager_kernel_names: dict[str, int]  # kernel name -> calls in one step
    compiled_kernel_names: dict[str, int] | None
    eager_saved_bytes: int  # intermediates saved for backward (parameters and inputs excluded)
    compiled_saved_bytes: int | None
    eager_peak_bytes: int  # peak of one forward + backward above what lived before it
    compiled_peak_bytes: int | None
    eager_step_ms: float  # median over the repeats
    compiled_step_ms: float | None
    eager_times_ms: list[float]  # every repeat, in the order they ran (interleaved)
    compiled_times_ms: list[float] | None
    compile_s: float | None  # first compiled step with empty compile caches, seconds
    max_abs_diff: float | None  # largest |compiled - eager| over the output and every gradient

    @property
    def compiled(self) -> bool:
        """Whether the compiled block was measured (chapter: 4)."""
        return self.status == MEASURED

    def _ratio(self, eager: float, compiled: float | None) -> float | None:
        """eager / compiled, or None where nothing compiled was measured."""
        return eager / compiled if self.compiled and compiled else None

    @property
    def speedup(self) -> float | None:
        """Eager time per step / compiled time per step; above 1 means compiled is faster (chapter: 4)."""
        return self._ratio(self.eager_step_ms, self.compiled_step_ms)

    @property
    def kernel_ratio(self) -> float | None:
        """Eager kernels / compiled kernels per step (chapter: 4).

        How many launches fusion removed, as a factor.
        """
        return self._ratio(self.eager_kernels, self.compiled_kernels)

    @property
    def saved_ratio(self) -> float | None:
        """Eager / compiled bytes saved for backward (chapter: 4)."""
        return self._ratio(self.eager_saved_bytes, self.compiled_saved_bytes)

    @property
    def peak_ratio(self) -> float | None:
        """Eager / compiled peak bytes of one step (chapter: 4)."""
        return self._ratio(self.eager_peak_bytes, self.compiled_peak_bytes)

    def table(self) -> str:
        """Eager and compiled side by side, one row per quantity, as text (chapter: 4)."""
        def cell(v, fmt):
            return "-" if v is None else format(v, fmt)

        def kib(n):
            return None if n is None else to_unit(n, "KiB")

        rows = [
            ("kernels per step", self.eager_kernels, self.compiled_kernels, "d"),
            ("saved for backward (KiB)", kib(self.eager_saved_bytes),
             kib(self.compiled_saved_bytes), ".1f"),
            ("peak of a step (KiB)", kib(self.eager_peak_bytes), kib(self.compiled_peak_bytes),
             ".1f"),
            ("time per step (ms, median)", self.eager_step_ms, self.compiled_step_ms, ".2f"),
        ]
        lines = [f"one {self.model} block, {self.attention} attention, B={self.batch_size}, "
                 f"T={self.seq_len}, {self.dtype}, {self.device}, {self.threads} threads: "
                 f"{self.status}",
                 f"{'':28}{'eager':>12}{'compiled':>12}"]
        lines += [f"{name:28}{cell(e, f):>12}{cell(c, f):>12}" for name, e, c, f in rows]
        if self.compiled:
            lines.append(f"compile time {self.compile_s:.1f} s; {self.generated_kernels} of the "
                         f"compiled kernels generated by Inductor; largest difference "
                         f"{self.max_abs_diff:.2e}")
        return "\n".join(lines)


# What can compile here ------------------------------------------------------------------------
def cpp_compiler() -> str | None:
    """Path of the C++ compiler Inductor would use on a CPU (its ``config.cpp.cxx``), or None (chapter: 4)."""
    from torch._inductor import config

    names = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
    for name in names:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def compile_backend(device: torch.device) -> tuple[str | None, str]:
    """What Inductor compiles with on ``device`` and ``"measured"`` (chapter: 4).

    None and why where it cannot compile.
    """
    if device.type == "cpu":
        cxx = cpp_compiler()
        if cxx is None:
            from torch._inductor import config

            names = [n for n in (config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple))
                                 else (config.cpp.cxx,)) if n]
            return None, (f"not compiled: Inductor needs a C++ compiler on the CPU and found none "
                          f"of {', '.join(names)} on PATH (set CXX to one)")
        return cxx, MEASURED
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return None, "not compiled: Inductor needs Triton on a CUDA GPU, which is not installed"
        return "triton", MEASURED
    return device.type, MEASURED  # let torch.compile try; a failure becomes a status


# Counting kernels -------------------------------------------------------------------------------
def _aten_packet(name: str):
    return getattr(torch.ops.aten, name[len("aten::"):], None) if name.startswith("aten::") else None


@functools.cache
def writes_values(name: str) -> bool:
    """Whether a profiler event named ``name`` can run a kernel (chapter: 4).

    That is an Inductor kernel, or an aten operator that writes a tensor.

    An aten operator writes values when some overload returns a tensor that is new or written
    in place; views, aliases (``t``, ``view``, ``resolve_conj``), allocations (``empty``,
    ``resize_``) and operators returning no tensor (``result_type``) do not.
    """
    if not name.startswith("aten::"):
        return "cpp_fused" in name  # Inductor's generated CPU kernels (with kernel profiling on)
    if name[len("aten::"):] in ALLOCATION_OPS:
        return False
    packet = _aten_packet(name)
    if packet is None:
        return True
    for overload in packet.overloads():
        for ret in getattr(packet, overload)._schema.returns:
            if isinstance(ret.type, torch.TensorType) and (
                ret.alias_info is None or ret.alias_info.is_write
            ):
                return True
    return False


@functools.cache
def has_cpu_kernel(name: str) -> bool:
    """Whether some overload of the aten operator ``name`` has a CPU kernel of its own (chapter: 4).

    A kernel of its own, not only a composition of other operators.
    """
    packet = _aten_packet(name)
    if packet is None:
        return False
    for overload in packet.overloads():
        qualified = name if overload == "default" else f"{name}.{overload}"
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"):
                return True
        except RuntimeError:  # an overload the dispatcher does not know (TorchScript's)
            continue
    return False


def _profile(fn: Callable[[], object], device: torch.device):
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    prof = profile(activities=activities)
    with quiet_stderr():
        prof.start()
    try:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        with quiet_stderr():
            prof.stop()
    return prof.events()


def counted_kernels(device: torch.device) -> str:
    """What :func:`count_kernels` counts as a kernel on ``device``, in one sentence (chapter: 4)."""
    if device.type == "cuda":
        return "CUDA kernels, memcpys and memsets the profiler saw run on the GPU"
    return ("CPU operators that write values and have a CPU kernel of their own or call no such "
            "operator (views and allocations left out), plus Inductor's generated C++ kernels")


def count_kernels(fn: Callable[[], object], device=None) -> dict[str, int]:
    """Kernels one call of ``fn`` runs, by name, from ``torch.profiler`` (chapter: 4).

    On CUDA: every event the profiler places on the GPU (kernels, memcpys, memsets). A CPU
    launches nothing, so operators are counted instead: an operator event counts when it
    writes values (:func:`writes_values`) and either has a CPU kernel of its own
    (:func:`has_cpu_kernel`: ``aten::mm``, ``aten::sum``) or runs no value-writing operator
    inside it (``aten::copy_``). ``aten::linear`` and ``aten::clone`` only call other
    operators, so the ``aten::mm`` and ``aten::copy_`` inside them are counted instead.
    Inductor's generated kernels count when it compiled them with kernel profiling on, as
    :func:`fusion_comparison` does. The same rule counts eager and compiled code.
    """
    dev = pick_device(device)
    events = _profile(fn, dev)
    if dev.type == "cuda":
        gpu = torch.autograd.DeviceType.CUDA
        return dict(Counter(e.name for e in events if e.device_type == gpu))
    index = {id(e): i for i, e in enumerate(events)}

    @functools.cache
    def calls_writer(i: int) -> bool:  # some operator inside event i writes values
        return any(writes_values(c.name) or calls_writer(index[id(c)])
                   for c in events[i].cpu_children)

    return dict(Counter(e.name for i, e in enumerate(events) if writes_values(e.name) and (
        has_cpu_kernel(e.name) or not calls_writer(i))))


def is_generated(name: str) -> bool:
    """Whether a kernel name is one Inductor generated (chapter: 4).

    That is a fused kernel rather than a library call.
    """
    return "cpp_fused" in name or name.startswith("triton_")


# Bytes saved for backward ---------------------------------------------------------------------------
# The comparison -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _fresh_compile_caches():
    """Empty Inductor's on-disk and in-memory caches, so compile_s is a cold compile."""
    from torch._inductor import utils

    fresh = getattr(utils, "fresh_cache", None) or getattr(utils, "fresh_inductor_cache", None)
    torch._dynamo.reset()
    with fresh() if fresh is not None else contextlib.nullcontext():
        yield
    torch._dynamo.reset()


def fusion_comparison(
    config: ModelConfig | str = "tiny",
    *,
    attention: str = "eager",
    batch_size: int = 4,
    seq_len: int = 128,
    dtype: str = "fp32",
    repeats: int = 21,
    warmup: int = 3,
    device=None,
    seed: int = 0,
    compile_block: bool = True,
) -> FusionComparison:
    """One block of ``config``, eager against ``torch.compile``, per forward + backward step (chapter: 4).

    Measured for the same parameters and input (B, T, C):

    * kernels: :func:`count_kernels` over one step (what counts is in ``counted``);
    * bytes saved for backward, without the parameters, the input and the RoPE tables, and the
      peak of one step (:func:`memlab.measure.measure_peak`), gradients set to None before it;
    * time per step: the median of ``repeats`` samples after ``warmup`` calls, eager and
      compiled taking turns so that both see the same machine;
    * compile time: the first compiled step with empty compile caches, Inductor's code
      generation and the C++ (or Triton) build included.

    On a CPU the block is compiled with Inductor's kernel profiling on, so that the profiler
    sees its generated kernels; without a profiler running, that costs one check per kernel call.

    Where the device cannot compile (no C++ compiler for Inductor on the CPU, no Triton on
    CUDA), or compilation fails, the compiled fields are None and ``status`` says why;
    ``compile_block=False`` measures only eager.
    """
    cfg = get_config(config) if isinstance(config, str) else config
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"config must be a preset name or a ModelConfig, got {config!r}")
    check_choice("attention", attention, FUSION_ATTENTION)
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_positive_int("repeats", repeats)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise MemlabError(f"warmup must be a non-negative integer, got {warmup!r}")
    if seq_len > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} exceeds max_seq_len {cfg.max_seq_len} of model "
                          f"{cfg.name!r}")
    dt = to_dtype(dtype, among=("fp32", "fp16", "bf16"))
    dev = pick_device(device)
    cfg = replace(cfg, attention=attention)

    torch.manual_seed(seed)
    block = Block(cfg).to(dev, dt)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, seq_len, cfg.d_model, generator=g).to(dev, dt)  # (B, T, C)
    x.requires_grad_()
    dy = torch.randn(batch_size, seq_len, cfg.d_model, generator=g).to(dev, dt)  # (B, T, C)
    rope = None if cfg.style == "gpt2" else rope_cache(seq_len, cfg.head_dim, cfg.rope_theta,
                                                       device=dev)
    fixed = [*block.parameters(), x, *(rope or ())]  # not intermediates

    def step(module) -> Callable[[], torch.Tensor]:
        def run():
            block.zero_grad(set_to_none=True)  # every step allocates its gradients afresh
            x.grad = None
            y = module(x, rope)  # (B, T, C)
            y.backward(dy)  # a fixed output gradient: no loss kernels in the counts
            return y
        return run

    def forward(module) -> Callable[[], torch.Tensor]:
        return lambda: module(x, rope)

    eager = step(block)
    for _ in range(warmup):
        eager()
    eager_names = count_kernels(eager, dev)
    eager_saved = saved_storage_bytes(forward(block), fixed)
    _, eager_peak = measure_peak(eager, device=dev)

    compiler, status = compile_backend(dev) if compile_block else (
        None, "not compiled: compile_block=False")
    compiled_names = compiled_saved = compiled_peak = compile_s = diff = None
    pairs: list[tuple[float, float | None]] = []
    if status == MEASURED:
        from torch._inductor import config as inductor_config

        # On a CPU, Inductor's kernels show in the profiler only when built with kernel profiling.
        profiling = {"cpp.enable_kernel_profile": True} if dev.type == "cpu" else {}
        try:
            with _fresh_compile_caches(), inductor_config.patch(profiling):
                y_ref = eager().detach().clone()
                grads_ref = [t.grad.detach().clone() for t in (*block.parameters(), x)]
                compiled_block = torch.compile(block)
                compiled = step(compiled_block)
                start = time.perf_counter()
                y = compiled()  # traces, generates and builds the forward and the backward
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                compile_s = time.perf_counter() - start
                diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(
                    (y.detach(), *(t.grad for t in (*block.parameters(), x))),
                    (y_ref, *grads_ref), strict=True))
                for _ in range(warmup):
                    compiled()
                compiled_names = count_kernels(compiled, dev)
                compiled_saved = saved_storage_bytes(forward(compiled_block), fixed)
                # measure_peak runs fn under torch.device(dev), a function mode that dynamo
                # guards on: the first call compiles the block once more (from the caches
                # filled above), the second one is measured.
                measure_peak(compiled, device=dev)
                _, compiled_peak = measure_peak(compiled, device=dev)
                for _ in range(repeats):
                    e = time_ms(eager, warmup=0, repeats=1, device=dev)[0]
                    c = time_ms(compiled, warmup=0, repeats=1, device=dev)[0]
                    pairs.append((e, c))
        except Exception as exc:  # noqa: BLE001 - any compile failure becomes the status
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            status = f"not compiled: {type(exc).__name__}: {first}"
            compiled_names = compiled_saved = compiled_peak = compile_s = diff = None
            pairs = []
    if not pairs:
        pairs = [(t, None) for t in time_ms(eager, warmup=0, repeats=repeats, device=dev)]
    ok = status == MEASURED
    eager_ms = [e for e, _ in pairs]
    compiled_ms = [c for _, c in pairs] if ok else None
    return FusionComparison(
        model=cfg.name,
        attention=attention,
        batch_size=batch_size,
        seq_len=seq_len,
        dtype=dtype,
        device=dev.type,
        threads=torch.get_num_threads(),
        status=status,
        compiler=compiler if ok else None,
        counted=counted_kernels(dev),
        eager_kernels=sum(eager_names.values()),
        compiled_kernels=sum(compiled_names.values()) if ok else None,
        generated_kernels=sum(n for k, n in compiled_names.items() if is_generated(k))
        if ok else None,
        eager_kernel_names=eager_names,
        compiled_kernel_names=compiled_names if ok else None,
        eager_saved_bytes=eager_saved,
        compiled_saved_bytes=compiled_saved if ok else None,
        eager_peak_bytes=eager_peak.peak_allocated_bytes,
        compiled_peak_bytes=compiled_peak.peak_allocated_bytes if ok else None,
        eager_step_ms=statistics.median(eager_ms),
        compiled_step_ms=statistics.median(compiled_ms) if ok else None,
        eager_times_ms=eager_ms,
        compiled_times_ms=compiled_ms,
        compile_s=compile_s if ok else None,
        max_abs_diff=diff if ok else None,
    )
