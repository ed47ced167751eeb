"""memlab.quant.optim8: AdamW against 8-bit AdamW stepped on this device."""

import pytest

pytest.importorskip("bitsandbytes")
from memlab.quant.optim8 import optimizer_step_memory  # noqa: E402


def test_8bit_states_are_about_a_quarter_of_adamws():
    r = optimizer_step_memory("tiny", repeats=2, device="cpu")
    by = {row.optimizer: row for row in r.rows}
    # two fp32 moments per parameter, and a step count per tensor
    assert 8 * r.parameters < by["adamw"].state_bytes < 8 * r.parameters + 4096
    # two uint8 moments, and 32-bit states for tensors below bitsandbytes' 4096 elements
    assert 2 <= by["adamw-8bit"].bytes_per_param < 3
    assert all(row.step_ms > 0 and row.step_peak_bytes >= 0 for row in r.rows)
