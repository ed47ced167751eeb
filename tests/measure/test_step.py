"""memlab.measure.step: peak bytes of a callable, and a training step split by category."""

from __future__ import annotations

import resource
import sys
import tracemalloc

import pytest
import torch

import memlab.measure.step as measure
from memlab.errors import MemlabError
from memlab.measure.peak import PeakMemory, measure_peak
from memlab.measure.step import StepMemory, measure_step, trace_step
from memlab.model.config import get_config
from memlab.model.transformer import build_model, lm_loss

TINY_N = get_config("tiny").num_parameters()
TINY_PARAM_TENSORS = len(list(build_model("tiny", device="meta").parameters()))
LLAMA2_7B_N = 6_738_415_616


# measure_peak: CPU profiler --------------------------------------------------------------------
def test_cpu_profiler_counts_an_aten_allocation_exactly():
    empty, peak = measure_peak(lambda: torch.empty(1_000_000, dtype=torch.float32), device="cpu")
    assert isinstance(peak, PeakMemory)
    assert (peak.device, peak.method) == ("cpu", "cpu-profiler")
    assert peak.peak_allocated_bytes == 4_000_000  # 10^6 float32 values
    assert peak.end_allocated_bytes == 4_000_000  # the result is still alive
    assert peak.peak_reserved_bytes is None
    assert empty.shape == (1_000_000,)  # the callable's result comes back first


def test_cpu_profiler_sees_what_tracemalloc_misses():
    tracemalloc.start()
    try:
        ones, peak = measure_peak(torch.ones, 256, 1024, dtype=torch.float64, device="cpu")
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ones.dtype == torch.float64  # args and kwargs reach the callable
    assert peak.peak_allocated_bytes == 2 * 2**20  # 256 * 1024 * 8 bytes = 2 MiB exactly
    # The 2 MiB are allocated by the aten kernel in C++; Python's allocator sees almost nothing.
    assert python_peak < 0.1 * peak.peak_allocated_bytes


def test_cpu_profiler_counts_a_temporary_freed_before_return():
    x = torch.randn(1000, 1000)  # allocated before the call: not counted
    total, peak = measure_peak(lambda: (x * 2).sum(), device="cpu")
    assert total.numel() == 1
    assert peak.peak_allocated_bytes >= 4_000_000  # the (x * 2) temporary
    assert peak.peak_allocated_bytes < 4_000_000 + 1024  # plus a few scalars
    assert 0 <= peak.end_allocated_bytes < 1024  # only the 0-d result survives


def test_cpu_profiler_sees_scratch_allocated_inside_one_kernel():
    """median() returns one value, but its CPU kernel first copies the whole input.

    The copy never leaves the kernel, so a dispatch-level tracker (what MemTracker is)
    sees only the 4-byte output; the profiler's allocator events see the copy too.
    """
    x = torch.randn(1_000_000)
    _, peak = measure_peak(x.median, device="cpu", method="cpu-profiler")
    _, seen_by_dispatch = measure_peak(x.median, device="cpu", method="dispatch")
    assert peak.peak_allocated_bytes == 4_000_000 + 4  # the kernel's copy of x + the result
    assert seen_by_dispatch.peak_allocated_bytes == 4  # only the op's output
    assert peak.end_allocated_bytes == 4


def test_cpu_profiler_counts_nothing_for_an_empty_call():
    _, peak = measure_peak(lambda: None, device="cpu")
    assert peak.peak_allocated_bytes == 0  # the profiler's own set-up is not counted
    assert peak.end_allocated_bytes == 0


def test_cpu_profiler_refuses_to_nest_in_another_profiler():
    with torch.profiler.profile(), pytest.raises(MemlabError, match="another torch profiler session"):
        measure_peak(lambda: None, device="cpu")
    _, peak = measure_peak(lambda: None, device="cpu", method="dispatch")  # the way out
    assert peak.peak_allocated_bytes == 0


def test_auto_method_is_the_profiler_on_cpu():
    _, peak = measure_peak(lambda: torch.zeros(10), device=torch.device("cpu"))
    assert peak.method == "cpu-profiler"


# measure_peak: dispatch fallback ---------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda x: (lambda: torch.empty(1_000_000, dtype=torch.float32)),
        lambda x: (lambda: torch.ones(256, 1024, dtype=torch.float64)),
        lambda x: (lambda: x @ x),
        lambda x: (lambda: torch.softmax(x, dim=-1)),
        lambda x: (lambda: x.view(-1)),  # a view of an existing storage: 0 bytes
    ],
)
def test_dispatch_equals_cpu_profiler_on_simple_ops(make):
    x = torch.randn(500, 500)
    fn = make(x)
    _, prof = measure_peak(fn, device="cpu", method="cpu-profiler")
    _, disp = measure_peak(fn, device="cpu", method="dispatch")
    assert disp.method == "dispatch"
    assert disp.peak_allocated_bytes == prof.peak_allocated_bytes
    assert disp.end_allocated_bytes == prof.end_allocated_bytes


def test_dispatch_counts_a_freed_temporary_and_ignores_in_place_ops():
    x = torch.randn(1000, 1000)
    _, peak = measure_peak(lambda: (x * 2).sum(), device="cpu", method="dispatch")
    assert peak.peak_allocated_bytes == 4_000_000 + 4  # the temporary, then the 0-d sum
    assert peak.end_allocated_bytes == 4
    _, in_place = measure_peak(lambda: x.mul_(1.0), device="cpu", method="dispatch")
    assert in_place.peak_allocated_bytes == 0


# measure_peak: CUDA allocator (without a GPU: torch.cuda's counters are simulated) -------------
class _FakeAllocator:
    """Stands in for the CUDA caching allocator's counters."""

    def __init__(self, allocated: int, reserved: int):
        self.allocated, self.reserved = allocated, reserved
        self.peak, self.peak_reserved = allocated + 123, reserved  # stale peaks from earlier
        self.synced = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        while self.reserved < self.allocated:
            self.reserved += 2**21
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def reset_peak(self, device=None) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved


def test_cuda_allocator_path_with_simulated_counters(monkeypatch):
    fake = _FakeAllocator(allocated=10_000, reserved=2**21)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: setattr(fake, "synced", fake.synced + 1))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.allocated)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: fake.reserved)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: fake.peak_reserved)

    def step():
        fake.alloc(3 * 2**20)
        fake.free(2 * 2**20)
        # The default device that torch.empty(n) would allocate on, inside the call.
        from torch.utils._device import DeviceContext

        modes = torch.overrides._get_current_function_mode_stack()
        return [m.device for m in modes if isinstance(m, DeviceContext)][-1]

    result, peak = measure_peak(step, device="cuda")
    assert result.type == "cuda"  # fn runs with the measured device as its default
    assert (peak.device, peak.method) == ("cuda", "cuda-allocator")
    assert peak.peak_allocated_bytes == 3 * 2**20  # the stale peak before the call is reset
    assert peak.end_allocated_bytes == 2**20
    assert peak.peak_reserved_bytes == 2**21  # one new 2 MiB segment
    assert fake.synced == 2  # before the baseline and after the call


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_allocator_on_a_real_gpu():
    _, peak = measure_peak(lambda: torch.empty(1_000_000, device="cuda"), device="cuda")
    assert 4_000_000 <= peak.peak_allocated_bytes < 4_000_000 + 512  # 512-byte rounding
    assert peak.peak_reserved_bytes is not None


# measure_peak: bad input -----------------------------------------------------------------------
def test_measure_peak_rejects_bad_input():
    with pytest.raises(MemlabError, match=r"'magic'.*auto, cuda-allocator, cpu-profiler, dispatch"):
        measure_peak(lambda: None, device="cpu", method="magic")
    with pytest.raises(MemlabError, match="'cuda-allocator' needs device 'cuda', got 'cpu'"):
        measure_peak(lambda: None, device="cpu", method="cuda-allocator")
    with pytest.raises(MemlabError, match="'tpu'"):
        measure_peak(lambda: None, device="tpu")
    with pytest.raises(MemlabError, match="callable, got 42"):
        measure_peak(42, device="cpu")


# measure_step / trace_step on the tiny preset --------------------------------------------------
_CACHE: dict = {}


def _step(traced: bool = False, model="tiny", batch_size=1, seq_len=16, **kw) -> StepMemory:
    key = (traced, str(model), batch_size, seq_len, tuple(sorted(kw.items())))
    if key not in _CACHE:
        if traced:
            _CACHE[key] = trace_step(model, batch_size=batch_size, seq_len=seq_len, **kw)
        else:
            _CACHE[key] = measure_step(model, batch_size=batch_size, seq_len=seq_len,
                                       device="cpu", **kw)
    return _CACHE[key]


def test_fp32_adamw_step_categories_are_exact():
    s = _step()
    assert (s.mode, s.device) == ("measured", "cpu")
    assert s.parameters_bytes == 4 * TINY_N
    opt = s.phase_breakdown["optimizer"]  # grads are alive during the optimizer step
    assert opt["gradients"] == s.parameters_bytes
    # m and v (2 x 4 bytes per parameter) plus one 4-byte fp32 step counter per tensor.
    assert s.optimizer_states_bytes == 2 * s.parameters_bytes + 4 * TINY_PARAM_TENSORS
    # foreach AdamW holds one parameter-sized scratch during step(); MemTracker files it
    # under its optimizer category, measure reports it as temporaries.
    assert opt["temporaries"] == s.parameters_bytes
    assert s.peak_phase == "optimizer"  # 5 copies of the parameters beat 16 tokens' activations
    assert s.peak_bytes == s.phase_peak_bytes["optimizer"] == max(s.phase_peak_bytes.values())
    assert s.peak_bytes == sum(s.breakdown()[c] for c in measure.CATEGORIES)
    assert s.other_bytes == 2 * 1 * 16 * 8  # input and target token ids, int64
    assert s.allocator_peak_bytes is None and s.allocator_reserved_bytes is None


def test_gradients_and_states_are_the_same_in_every_phase_they_exist():
    s = _step()
    for phase in ("forward", "backward", "optimizer"):
        cats = s.phase_breakdown[phase]
        assert cats["parameters"] == s.parameters_bytes
        assert cats["optimizer_states"] == s.optimizer_states_bytes
    assert s.phase_breakdown["forward"]["gradients"] == 0  # zero_grad(set_to_none=True)
    assert s.phase_breakdown["forward"]["activations"] > 0


def test_optimizer_impls_differ_only_in_step_scratch():
    scratch = {
        impl: _step(optimizer_impl=impl).phase_breakdown["optimizer"]["temporaries"]
        for impl in ("foreach", "for-loop", "fused")
    }
    assert scratch["foreach"] == 4 * TINY_N
    assert 0 < scratch["for-loop"] < scratch["foreach"]  # about 2x the largest tensor
    assert scratch["fused"] == 0
    assert _step(optimizer_impl="fused").optimizer_states_bytes == _step().optimizer_states_bytes


def test_sgd_states():
    assert _step(optimizer="sgd").optimizer_states_bytes == 0
    assert _step(optimizer="sgd-momentum").optimizer_states_bytes == 4 * TINY_N
    assert _step(optimizer="adam").optimizer_states_bytes == _step().optimizer_states_bytes


def test_precisions():
    bf16 = _step(precision="bf16")
    assert bf16.parameters_bytes == 2 * TINY_N == _step().parameters_bytes // 2
    assert bf16.phase_breakdown["optimizer"]["gradients"] == 2 * TINY_N
    assert bf16.optimizer_states_bytes == 2 * 2 * TINY_N + 4 * TINY_PARAM_TENSORS
    for precision in ("bf16-mixed", "fp16-mixed"):  # fp32 weights, 16-bit forward
        mixed = _step(precision=precision)
        assert mixed.parameters_bytes == 4 * TINY_N
        assert mixed.setup["precision"] == precision
    assert torch.get_default_dtype() == torch.float32  # restored after building in bf16


def test_checkpointing_reduces_activations():
    full = _step(batch_size=2, seq_len=128)
    ckpt = _step(batch_size=2, seq_len=128, checkpointing=True)
    assert ckpt.phase_breakdown["forward"]["activations"] < 0.5 * full.phase_breakdown["forward"]["activations"]
    assert ckpt.peak_bytes < full.peak_bytes
    assert ckpt.setup["checkpointing"] is True


def test_eager_attention_stores_more_than_sdpa():
    sdpa = _step(batch_size=2, seq_len=128)
    eager = _step(model=get_config("tiny", attention="eager"), batch_size=2, seq_len=128)
    assert eager.setup["attention"] == "eager"
    extra = eager.phase_breakdown["forward"]["activations"] - sdpa.phase_breakdown["forward"]["activations"]
    # Eager keeps each layer's fp32 softmax (B, nh, T, T) for backward; SDPA keeps (B, nh, T).
    softmax_bytes = 2 * get_config("tiny").n_head * 128 * 128 * 4
    assert extra > softmax_bytes
    assert eager.peak_bytes > sdpa.peak_bytes


@pytest.mark.parametrize("kw", [{}, {"batch_size": 2, "seq_len": 128, "checkpointing": True}])
def test_measured_and_traced_agree(kw):
    measured, traced = _step(**kw), _step(traced=True, **kw)
    assert traced.mode == "traced"
    for name in ("parameters_bytes", "optimizer_states_bytes"):
        assert getattr(traced, name) == getattr(measured, name)
    assert traced.phase_breakdown["optimizer"]["gradients"] == measured.phase_breakdown["optimizer"]["gradients"]
    assert traced.peak_bytes == pytest.approx(measured.peak_bytes, rel=0.03)


def test_step_peak_equals_the_cpu_allocator_peak_of_the_same_step():
    # The same steady-state step written by hand, measured from the CPU allocator's events.
    s = _step(batch_size=2, seq_len=128)
    model = build_model("tiny")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, 512, (2, 2, 128))

    def iteration():
        loss = lm_loss(model(tokens[0]), tokens[1])
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    iteration()  # creates the optimizer states
    _, peak = measure_peak(iteration, device="cpu", method="cpu-profiler")
    live_before = s.parameters_bytes + s.optimizer_states_bytes + s.other_bytes
    assert live_before + peak.peak_allocated_bytes == s.peak_bytes


def test_table_and_as_dict():
    s = _step()
    text = s.table()
    for word in ("parameters", "gradients", "optimizer states", "activations", "temporaries",
                 "peak", "MiB", "share of peak", "tiny", "optimizer phase"):
        assert word in text
    assert "GiB" in s.table(unit="GiB")
    d = s.as_dict()
    assert d["parameters_bytes"] == 4 * TINY_N
    assert d["setup"]["parameters"] == TINY_N
    assert set(d["phase_peak_bytes"]) == {"forward", "backward", "optimizer"}


# A 7B step, traced on this CPU ----------------------------------------------------------------
def _peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


@pytest.mark.slow  # about 7-11 s on 2 CPU cores: ~50,000 operations on fake tensors
def test_trace_llama2_7b_without_allocating_it():
    before = _peak_rss_bytes()
    s = trace_step("llama2-7b", batch_size=1, seq_len=256)
    grown = _peak_rss_bytes() - before
    assert s.parameters_bytes == 4 * LLAMA2_7B_N  # 25.1 GiB of fp32 weights, counted
    assert s.peak_bytes > 16 * LLAMA2_7B_N  # weights + grads + Adam states at least
    assert grown < 2**30  # ... while this process grew by less than 1 GiB
    assert s.setup["parameters"] == LLAMA2_7B_N


# Bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"seq_len": -3}, "seq_len must be a positive integer, got -3"),
        ({"seq_len": 129}, "seq_len 129 exceeds max_seq_len 128"),
        ({"precision": "fp8"}, "unknown precision 'fp8'; accepted: fp32, fp16-mixed, bf16-mixed, bf16"),
        ({"optimizer": "lion"}, "unknown optimizer 'lion'; accepted: adamw"),
        ({"optimizer_impl": "apex"}, "unknown optimizer_impl 'apex'; accepted: foreach, fused, for-loop"),
        ({"checkpointing": "yes"}, "checkpointing 'yes' is not a plan; accepted: none, full, selective"),
        ({"model": "gpt5"}, "unknown model 'gpt5'"),
        ({"model": 7}, "model must be a preset name or a ModelConfig, got 7"),
    ],
)
def test_step_rejects_bad_input(kw, message):
    args = {"batch_size": 1, "seq_len": 16, **kw}
    model = args.pop("model", "tiny")
    with pytest.raises(MemlabError) as exc:
        trace_step(model, **args)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
    with pytest.raises(MemlabError):
        measure_step(model, device="cpu", **args)


def test_measure_step_rejects_bad_device_and_seed():
    with pytest.raises(MemlabError, match="'tpu'"):
        measure_step("tiny", batch_size=1, seq_len=8, device="tpu")
    with pytest.raises(MemlabError, match="seed must be a non-negative integer, got -1"):
        measure_step("tiny", batch_size=1, seq_len=8, device="cpu", seed=-1)


def test_unsupported_autocast_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda *a: False)
    with pytest.raises(MemlabError, match="precision 'fp16-mixed' needs autocast to torch.float16"):
        trace_step("tiny", batch_size=1, seq_len=8, precision="fp16-mixed")
    assert torch.get_default_dtype() == torch.float32


def test_unavailable_optimizer_impl_is_a_clear_error(monkeypatch):
    def no_fused(*args, **kwargs):
        raise RuntimeError("`fused=True` requires all the params to be on a supported device")

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    with pytest.raises(MemlabError, match="optimizer 'adamw' with optimizer_impl 'fused' is not available"):
        measure_step("tiny", batch_size=1, seq_len=8, device="cpu", optimizer_impl="fused")


def test_default_dtype_is_restored_when_building_fails(monkeypatch):
    def boom(*args, **kwargs):
        assert torch.get_default_dtype() == torch.bfloat16  # built in its final dtype
        raise MemlabError("build failed")

    monkeypatch.setattr(measure, "build_model", boom)
    with pytest.raises(MemlabError, match="build failed"):
        trace_step("tiny", batch_size=1, seq_len=8, precision="bf16")
    assert torch.get_default_dtype() == torch.float32


# On a GPU: the tracked step against the caching allocator ------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_measured_step_matches_the_cuda_allocator():
    s = measure_step("gpt2", batch_size=2, seq_len=256, device="cuda")
    assert s.device == "cuda"
    assert s.allocator_peak_bytes is not None and s.allocator_reserved_bytes is not None
    # Upstream's MemTracker test allows 10% against the allocator's peak.
    assert s.allocator_peak_bytes == pytest.approx(s.peak_bytes, rel=0.10)
    n = get_config("gpt2").num_parameters()
    assert 4 * n <= s.parameters_bytes < 4 * n + 512 * 200  # 512-byte rounding per tensor


# One description of a step ---------------------------------------------------------------------
def test_one_step_spec_serves_trace_measure_and_estimate():
    from memlab.memory.estimator import estimate
    from memlab.model.step import StepSpec

    spec = StepSpec("tiny", batch_size=2, seq_len=32, precision="bf16-mixed", attention="eager")
    kw = dict(batch_size=2, seq_len=32, precision="bf16-mixed")
    eager = get_config("tiny", attention="eager")
    assert trace_step(spec) == trace_step(eager, **kw)
    assert estimate(spec, device="cpu") == estimate("tiny", attention="eager", device="cpu", **kw)
    assert measure_step(spec, device="cpu").peak_bytes == measure_step(eager, device="cpu", **kw).peak_bytes
    assert spec.attention == "eager" and spec.config.attention == "eager"


def test_a_spec_and_switches_together_are_refused():
    from memlab.memory.estimator import estimate
    from memlab.model.step import StepSpec

    spec = StepSpec("tiny", batch_size=2, seq_len=32)
    with pytest.raises(MemlabError, match="either a StepSpec or switches"):
        trace_step(spec, batch_size=4)
    with pytest.raises(MemlabError, match="pass no batch_size or seq_len"):
        estimate(spec, batch_size=4)


def test_eight_bit_adamw_is_a_step_the_estimator_takes_but_trace_refuses():
    from memlab.memory.estimator import estimate
    from memlab.model.step import StepSpec

    spec = StepSpec("tiny", batch_size=2, seq_len=32, optimizer="adamw-8bit")
    assert estimate(spec).optimizer_states_bytes > 0
    with pytest.raises(MemlabError, match="'adamw-8bit' runs in bitsandbytes kernels"):
        trace_step(spec)
