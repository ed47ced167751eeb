"""memlab.precision.tf32: TF32 on and off, timed on a GPU; a status elsewhere."""

import pytest
import torch

from memlab.errors import MemlabError
from memlab.precision.tf32 import tf32_matmul


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_on_a_cpu_the_status_says_why():
    r = tf32_matmul(64)
    assert r.rows == [] and r.speedup is None and "tensor cores" in r.status


def test_bad_sizes_are_one_line():
    with pytest.raises(MemlabError, match="n must be a positive integer"):
        tf32_matmul(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_tf32_is_less_exact():
    r = tf32_matmul(1024, repeats=3, warmup=1)
    by = {row.mode: row for row in r.rows}
    assert by["tf32"].max_rel_error >= by["fp32"].max_rel_error
    assert torch.get_float32_matmul_precision() == "highest"  # put back
