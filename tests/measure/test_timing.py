"""memlab.measure.timing: one timing helper and one 'not measurable' status."""

import pytest
import torch

from memlab.errors import MemlabError
from memlab.measure.timing import not_measurable, time_ms


def test_time_ms_runs_warmup_then_times_each_repeat():
    calls = []
    times = time_ms(lambda: calls.append(1), warmup=2, repeats=5, device="cpu")
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)


def test_time_ms_bad_input_is_one_line():
    with pytest.raises(MemlabError, match="repeats must be a positive integer, got 0"):
        time_ms(lambda: None, repeats=0, device="cpu")
    with pytest.raises(MemlabError, match="warmup must be a non-negative integer, got -1"):
        time_ms(lambda: None, warmup=-1, device="cpu")


def test_not_measurable_names_the_device_and_why():
    assert not_measurable(torch.device("cpu"), "CUDA events only") == (
        "not measurable on cpu: CUDA events only")


@pytest.mark.gpu
def test_time_ms_on_cuda_uses_events():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    a = torch.randn(1024, 1024, device="cuda")
    times = time_ms(lambda: a @ a, warmup=2, repeats=3, device="cuda")
    assert len(times) == 3 and all(t > 0 for t in times)
