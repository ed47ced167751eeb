"""memlab.measure.allocator_gpu: what a GPU records of its allocator, and the reader of its messages."""

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.allocator import OutOfMemory, format_size
from memlab.measure.allocator_gpu import (
    CapturedOOM,
    allocator_record,
    capture_oom,
    printed_bytes,
    read_oom_message,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _composed() -> OutOfMemory:
    return OutOfMemory(gpu="H100", label="x", request_bytes=20 * 2**20, tried_bytes=20 * 2**20,
                       total_bytes=85_017_853_952, free_bytes=10_813_440,
                       process_bytes=85_000_000_000, allocated_bytes=84_180_000_000,
                       reserved_bytes=84_442_000_000)


def test_the_reader_finds_every_number_of_the_allocators_message():
    oom = _composed()
    printed = read_oom_message(oom.message())
    assert printed == {"tried": "20.00 MiB", "total": format_size(oom.total_bytes),
                       "free": format_size(oom.free_bytes),
                       "process": format_size(oom.process_bytes),
                       "allocated": format_size(oom.allocated_bytes),
                       "unallocated": format_size(oom.unallocated_bytes)}
    assert printed_bytes("20.00 MiB") == 20 * 2**20 and printed_bytes("512 bytes") == 512


def test_the_reader_refuses_text_that_is_not_such_a_message():
    with pytest.raises(MemlabError, match="not a CUDA out-of-memory message"):
        read_oom_message("RuntimeError: something else")


def test_each_printed_number_is_set_beside_its_statistic():
    oom = _composed()
    stats = {"tried": oom.tried_bytes, "total": oom.total_bytes, "free": oom.free_bytes,
             "process": oom.process_bytes, "allocated": oom.allocated_bytes,
             "unallocated": oom.unallocated_bytes + 2**20}  # one number off by a MiB
    captured = CapturedOOM(oom.message(), read_oom_message(oom.message()), 1, stats)
    agree = {key: same for key, *_, same in captured.lines()}
    assert agree == {"tried": True, "total": True, "free": True, "process": True,
                     "allocated": True, "unallocated": False}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_on_a_cpu_the_record_is_a_status():
    rec = allocator_record("ci")
    assert rec.status.startswith("not measurable on cpu") and rec.blocks == []
    with pytest.raises(MemlabError, match="capture_oom needs a CUDA GPU"):
        capture_oom("cpu")


@cuda
def test_on_a_gpu_everything_is_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_ARTIFACTS_DIR", str(tmp_path))
    rec = allocator_record("ci")
    assert rec.status == "measured" and rec.oom.printed["tried"]
    assert all(r["measured allocated"] == r["allocated"] for r in rec.blocks)
    assert (tmp_path / rec.snapshot_file).is_file()
