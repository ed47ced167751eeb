"""Attention's memory against T: naive grows as T^2, the tiled and fused ones as T."""

from __future__ import annotations

import pytest

from memlab.attention import attention_memory, fit_exponent
from memlab.errors import MemlabError

TS = (256, 512, 1024)


@pytest.mark.parametrize("impl, exponent", [("naive", 2), ("sdpa-math", 2), ("flash", 1),
                                            ("sdpa-flash", 1)])
def test_saved_bytes_grow_with_the_expected_power_of_T(impl, exponent):
    rows = [attention_memory(impl, T, n_head=2, head_size=16, device="cpu") for T in TS]
    assert all(r.status == "measured" for r in rows)
    fitted = fit_exponent(TS, [r.saved_bytes for r in rows])
    assert fitted == pytest.approx(exponent, abs=0.15)
    assert all(r.peak_bytes >= r.saved_bytes * 0.5 for r in rows)


def test_a_backend_this_device_lacks_gets_a_status():
    r = attention_memory("sdpa-cudnn", 128, n_head=2, head_size=16, device="cpu")
    assert r.status.startswith("not measurable on cpu") and r.saved_bytes is None


def test_fit_exponent_and_bad_input():
    assert fit_exponent([1, 2, 4], [3, 12, 48]) == pytest.approx(2)
    with pytest.raises(MemlabError, match="at least two"):
        fit_exponent([1], [1])
    with pytest.raises(MemlabError, match="attention implementation"):
        attention_memory("xformers", 128)
    with pytest.raises(MemlabError, match="multiple of n_kv_head"):
        attention_memory("naive", 128, n_head=4, n_kv_head=3)
