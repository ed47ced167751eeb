"""memlab.measure.allocator and memlab.measure.timeline: the CUDA allocator's rules, a composed out-of-memory error, and a
step's memory over time."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from memlab.errors import MemlabError
from memlab.gpus import RESERVED_BYTES, get_gpu
from memlab.measure.allocator import (
    OutOfMemory,
    cuda_allocated_size,
    cuda_block_size,
    cuda_pool,
    cuda_segment_size,
    first_oom,
    format_size,
    fragmentation,
    measure_cuda_blocks,
    model_state_requests,
)
from memlab.measure.step import measure_step
from memlab.measure.timeline import (
    measure_timeline,
    profiler_export_categories,
)
from memlab.model.config import get_config
from memlab.model.step import CATEGORIES, PHASES
from memlab.model.transformer import build_model

KiB, MiB = 2**10, 2**20
TINY = dict(batch_size=2, seq_len=16)


def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


# The allocator's rules -------------------------------------------------------------------
@pytest.mark.parametrize(("request_bytes", "block", "pool", "segment", "allocated"), [
    (0, 0, "small", 0, 0),  # nothing is allocated for an empty tensor
    (1, 512, "small", 2 * MiB, 512),  # at least 512 bytes
    (512, 512, "small", 2 * MiB, 512),
    (513, 1024, "small", 2 * MiB, 1024),  # rounded up to a multiple of 512
    (MiB, MiB, "small", 2 * MiB, MiB),  # the small pool ends at 1 MiB
    (MiB + 1, MiB + 512, "large", 20 * MiB, MiB + 512),  # a shared 20 MiB segment
    (10 * MiB - 1, 10 * MiB, "large", 10 * MiB, 10 * MiB),  # rounded to 10 MiB: its own segment
    (10 * MiB + 1, 10 * MiB + 512, "large", 12 * MiB, 10 * MiB + 512),  # rest > 1 MiB: split
    (11 * MiB, 11 * MiB, "large", 12 * MiB, 12 * MiB),  # rest of 1 MiB: not split, all allocated
    (64 * MiB, 64 * MiB, "large", 64 * MiB, 64 * MiB),  # exact: segment = block
])
def test_cuda_rules_at_every_boundary(request_bytes, block, pool, segment, allocated):
    assert cuda_block_size(request_bytes) == block
    assert cuda_pool(request_bytes) == pool
    assert cuda_segment_size(request_bytes) == segment
    assert cuda_allocated_size(request_bytes) == allocated


@pytest.mark.parametrize("bad", [-1, 1.5, True, "512", None])
def test_cuda_rules_refuse_bad_requests_in_one_line(bad):
    with pytest.raises(MemlabError, match="request_bytes must be a non-negative integer"):
        cuda_block_size(bad)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 bytes"), (1024, "1024 bytes"), (1025, "1.00 KiB"), (MiB, "1024.00 KiB"),
    (2 * MiB, "2.00 MiB"), (2**30, "1024.00 MiB"), (2**30 + 2**29, "1.50 GiB"),
])
def test_format_size_prints_as_the_allocator_does(n, text):
    assert format_size(n) == text


# A composed out-of-memory error ------------------------------------------------------------
def test_first_oom_is_none_when_everything_fits():
    assert first_oom([("a", MiB), ("b", 64 * MiB)], "T4") is None


def test_first_oom_numbers_add_up_and_fill_the_message():
    t4 = get_gpu("T4")
    n = 1024 * MiB
    requests = [(f"w{i}", n) for i in range(40)]  # 40 GiB asked of a 15 GiB card
    oom = first_oom(requests, t4)
    assert isinstance(oom, OutOfMemory)
    assert oom.requests_served == t4.usable_bytes // n  # 1 GiB segments, no slack
    assert oom.label == f"w{oom.requests_served}"
    assert oom.allocated_bytes == oom.reserved_bytes == oom.requests_served * n
    assert oom.tried_bytes == cuda_segment_size(n)
    assert oom.reserved_bytes + oom.tried_bytes > t4.usable_bytes
    assert oom.process_bytes == oom.reserved_bytes + RESERVED_BYTES
    assert oom.free_bytes == t4.total_bytes - oom.process_bytes
    text = oom.message()
    assert text.startswith(f"CUDA out of memory. Tried to allocate {format_size(n)}. GPU 0 has "
                           f"a total capacity of {format_size(t4.total_bytes)}")
    assert "0 bytes is reserved by PyTorch but unallocated" in text
    assert "try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid" in text
    numbers = {words: b for words, b, _ in oom.anatomy()}
    assert numbers["allocated by PyTorch"] == oom.allocated_bytes
    assert numbers["reserved by PyTorch but unallocated"] == 0


def test_first_oom_packs_small_requests_and_keeps_large_rests():
    # Three 1 MiB requests: two share a 2 MiB small segment, the third opens another.
    oom = first_oom([("s", MiB)] * 3 + [("huge", 10**12)], "T4")
    assert (oom.allocated_bytes, oom.reserved_bytes) == (3 * MiB, 4 * MiB)
    # An 11 MiB request takes its whole 12 MiB segment (a 1 MiB rest is not split).
    oom = first_oom([("a", 11 * MiB), ("huge", 10**12)], "T4")
    assert (oom.allocated_bytes, oom.reserved_bytes) == (12 * MiB, 12 * MiB)
    # A 5 MiB request opens a shared 20 MiB segment; a second one fits in its rest.
    oom = first_oom([("a", 5 * MiB), ("b", 5 * MiB), ("huge", 10**12)], "T4")
    assert (oom.allocated_bytes, oom.reserved_bytes) == (10 * MiB, 20 * MiB)
    assert oom.unallocated_bytes == 10 * MiB


def test_expandable_segments_map_pages_of_the_pool():
    oom = first_oom([("a", 30 * MiB), ("b", 30 * MiB), ("huge", 10**12)], "T4",
                    expandable_segments=True)
    assert oom.allocated_bytes == 60 * MiB
    assert oom.reserved_bytes == 60 * MiB  # three 20 MiB pages
    oom = first_oom([("a", 25 * MiB), ("huge", 10**12)], "T4", expandable_segments=True)
    assert oom.reserved_bytes == 40 * MiB and oom.expandable_segments


def test_first_oom_refuses_bad_input_in_one_line():
    with pytest.raises(MemlabError, match="unknown GPU 'V100'"):
        first_oom([], "V100")
    with pytest.raises(MemlabError, match="non_pytorch_bytes must be an integer"):
        first_oom([], "T4", non_pytorch_bytes=-1)
    with pytest.raises(MemlabError, match="expandable_segments must be True or False"):
        first_oom([], "T4", expandable_segments="yes")


def test_model_state_requests_are_16_bytes_per_fp32_adamw_parameter():
    n = get_config("tiny").num_parameters()
    tensors = len(list(build_model("tiny", device="meta").parameters()))
    req = model_state_requests("tiny", **TINY)
    assert len(req) == 4 * tensors
    assert sum(b for _, b in req) == 16 * n
    assert req[0][0].startswith("parameter ") and req[-1][0].startswith("exp_avg_sq of ")
    fused = model_state_requests("tiny", optimizer_impl="fused", **TINY)
    assert sum(b for _, b in fused) == 16 * n + 4 * tensors  # step counters on the device
    assert sum(b for _, b in model_state_requests("tiny", optimizer="sgd", **TINY)) == 8 * n
    assert sum(b for _, b in model_state_requests("tiny", precision="bf16", **TINY)) == 8 * n
    with pytest.raises(MemlabError, match="adamw-8bit"):
        model_state_requests("tiny", optimizer="adamw-8bit", **TINY)


def test_a_7b_fp32_adamw_step_runs_out_in_the_first_optimizer_step_on_an_h100():
    req = model_state_requests("llama2-7b", batch_size=1, seq_len=256)
    oom = first_oom(req, "H100")
    assert oom.label.startswith(("exp_avg of", "exp_avg_sq of"))  # parameters and gradients fit
    assert oom.allocated_bytes <= oom.reserved_bytes <= get_gpu("H100").usable_bytes
    assert first_oom(req, "H200") is None


# Fragmentation -----------------------------------------------------------------------------
def test_fragmentation_from_the_rules():
    frag = fragmentation(segments=4, keep_bytes=2 * MiB, device="cpu")
    assert not frag.measured
    assert (frag.allocated_bytes, frag.reserved_bytes) == (8 * MiB, 80 * MiB)
    assert frag.unallocated_bytes == 72 * MiB
    assert frag.largest_free_bytes == 18 * MiB < frag.next_request_bytes == 20 * MiB
    assert frag.next_new_segment_bytes == 20 * MiB
    with pytest.raises(MemlabError, match="keep_bytes must be above"):
        fragmentation(keep_bytes=512, device="cpu")
    with pytest.raises(MemlabError, match="segments must be a positive integer"):
        fragmentation(segments=0, device="cpu")


# A memory timeline -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_timeline(tmp_path_factory):
    path = tmp_path_factory.mktemp("timeline") / "step.json"
    return measure_timeline("tiny", device="cpu", path=path, **TINY), path


def test_profiler_timeline_has_the_book_categories_and_three_ordered_phases(cpu_timeline):
    tl, _ = cpu_timeline
    assert (tl.method, tl.device) == ("profiler", "cpu")
    assert set(tl.category_bytes) <= set(CATEGORIES)
    assert all(len(v) == len(tl.times_us) for v in tl.category_bytes.values())
    assert list(tl.times_us) == sorted(tl.times_us)
    spans = [tl.phase_spans_us[p] for p in PHASES]
    assert spans[0][0] == 0.0
    assert all(a < b for a, b in spans)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False))
    n = get_config("tiny").num_parameters()
    assert tl.category_bytes["parameters"][0] == 4 * n  # alive from the start
    last = {c: v[-1] for c, v in tl.category_bytes.items()}
    assert last["gradients"] == 0  # zero_grad(set_to_none=True) freed them
    assert max(tl.category_bytes["gradients"]) == 4 * n


def test_profiler_timeline_peak_matches_measure_step(cpu_timeline):
    tl, _ = cpu_timeline
    step = measure_step("tiny", device="cpu", **TINY)
    assert abs(tl.peak_bytes / step.peak_bytes - 1) < 0.01
    assert tl.peak_phase == step.peak_phase
    assert max(tl.phase_peak_bytes().values()) == tl.peak_bytes
    assert sum(tl.profiler_bytes_at_peak.values()) == tl.peak_bytes
    assert f"in the {tl.peak_phase} phase" in tl.table()


def test_profiler_timeline_exports_torch_format(cpu_timeline):
    tl, path = cpu_timeline
    times, sizes = json.loads(path.read_text())
    assert tl.file == str(path)
    assert len(times) == len(tl.times_us)
    assert all(len(row) == 1 + len(profiler_export_categories()) for row in sizes)
    assert max(sum(row) for row in sizes) == tl.peak_bytes


def test_measure_timeline_refuses_bad_input_in_one_line():
    with pytest.raises(MemlabError, match="method 'cuda-snapshot' needs device 'cuda'"):
        measure_timeline("tiny", device="cpu", method="cuda-snapshot", **TINY)
    with pytest.raises(MemlabError, match="unknown timeline method 'dispatch'"):
        measure_timeline("tiny", device="cpu", method="dispatch", **TINY)
    with pytest.raises(MemlabError, match="grad_accum_steps must be 1"):
        measure_timeline("tiny", device="cpu", grad_accum_steps=2, **TINY)
    with pytest.raises(MemlabError, match="adamw-8bit"):
        measure_timeline("tiny", device="cpu", optimizer="adamw-8bit", **TINY)
    with pytest.raises(MemlabError, match="max_entries must be a positive integer"):
        measure_timeline("tiny", device="cpu", max_entries=0, **TINY)


def test_measure_cuda_blocks_needs_cuda():
    with pytest.raises(MemlabError, match="needs device 'cuda'"):
        measure_cuda_blocks([512], device="cpu")


# On a GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
def test_measured_blocks_follow_the_rules_on_cuda():
    _cuda()
    sizes = [1, 513, MiB + 1, 5 * MiB, 10 * MiB + 1, 11 * MiB, 64 * MiB]
    for row in measure_cuda_blocks(sizes, device="cuda"):
        assert row["measured allocated"] == row["allocated"], row
        assert row["measured reserved"] == row["segment"], row


@pytest.mark.gpu
def test_fragmentation_measured_on_cuda_matches_the_rules():
    _cuda()
    measured = fragmentation(segments=4, device="cuda")
    rules = fragmentation(segments=4, device="cpu")
    assert measured.measured
    for key in ("allocated_bytes", "reserved_bytes", "largest_free_bytes",
                "next_new_segment_bytes"):
        assert getattr(measured, key) == getattr(rules, key), key


@pytest.mark.gpu
def test_cuda_snapshot_timeline_writes_a_pickle_for_memory_viz(tmp_path):
    _cuda()
    path = tmp_path / "snapshot.pickle"
    tl = measure_timeline("tiny", device="cuda", path=path, **TINY)
    assert tl.method == "cuda-snapshot" and tl.file == str(path)
    snapshot = pickle.loads(path.read_bytes())
    assert "segments" in snapshot and "device_traces" in snapshot
    assert set(tl.category_bytes) == {"allocated"}
    assert len(tl.reserved_bytes) == len(tl.times_us)
    assert tl.peak_bytes <= tl.allocator_peak_bytes  # requested bytes <= rounded blocks
    assert tl.peak_bytes > 0.9 * tl.allocator_peak_bytes
    assert set(tl.phase_spans_us) == set(PHASES)
