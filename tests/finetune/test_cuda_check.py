"""memlab.finetune.cuda_check: the estimator against the CUDA allocator (its grid run here on the CPU)."""

import pytest
import torch

from memlab.finetune.cuda_check import CUDA_GRIDS, CudaCheck, CudaRow, estimator_cuda, grid_steps
from memlab.finetune.estimate import estimate_finetune
from memlab.measure.step import measure_step


def test_the_grid_covers_what_the_check_promises():
    for scale in CUDA_GRIDS:
        steps = grid_steps(scale)
        setups = {s for _, s, _ in steps}
        specs = [spec for _, _, spec in steps]
        assert setups == {"full", "lora", "qlora"}
        assert {s.precision for s in specs} >= {"fp32", "bf16-mixed", "bf16"}
        assert {s.config.attention for s in specs} == {"sdpa", "eager"}
        assert {bool(s.checkpointing) for s in specs} == {False, True}
        assert {s.optimizer for s in specs} >= {"adamw", "sgd"}


@pytest.mark.slow
def test_every_step_of_the_ci_grid_runs_and_is_estimated_here():
    """The GPU's code path, on the CPU: each step built, estimated with both conventions, run."""
    for _, setup, spec in grid_steps("ci"):
        cpu = estimate_finetune(spec, device="cpu")
        estimate_finetune(spec, device="cuda")
        m = measure_step(spec, device="cpu")
        assert m.allocator_peak_bytes is None  # the allocator is CUDA's
        assert abs(cpu.peak_bytes / m.peak_bytes - 1) < 0.03, (setup, spec)


def test_summary_names_the_worst_step():
    rows = [CudaRow("gpt2", "full", "bf16-mixed", "eager", False, "adamw", 2, 1024,
                    est, 1000, trk, 10, 10) for est, trk in ((1010, 1000), (950, 1080))]
    check = CudaCheck("measured", "GPU", 32 * 2**20, rows)
    assert check.worst is rows[1] and check.worst.ratio == 0.95
    text = check.summary()
    assert "worst 0.9500" in text and "within 3%: 1 of 2" in text and "32.0 MiB" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_on_a_cpu_it_says_why_not():
    check = estimator_cuda("ci")
    assert check.rows == [] and check.summary().startswith("not measurable on cpu")
