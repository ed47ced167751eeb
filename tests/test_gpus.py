"""memlab.gpus: the GPU catalogue, its units, and whether a peak fits."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.gpus import (
    CATALOGUE,
    GPU,
    GPU_NAMES,
    RESERVED_BYTES,
    catalogue_table,
    fit_table,
    fits,
    get_gpu,
)

MiB, GiB = 2**20, 2**30


def test_catalogue_holds_the_six_gpus():
    assert GPU_NAMES == ("T4", "L4", "A100-40GB", "A100-80GB", "H100", "H200")
    assert all(isinstance(g, GPU) for g in CATALOGUE)
    assert all(g.source.startswith("https://www.nvidia.com/") for g in CATALOGUE)


@pytest.mark.parametrize("gpu", CATALOGUE, ids=GPU_NAMES)
def test_nominal_bytes_read_the_label_in_its_unit(gpu):
    number = int(gpu.memory_label.split()[0])
    assert gpu.memory_label.endswith(" GB")
    assert gpu.memory_unit == "GiB"
    assert gpu.memory_bytes == number * GiB


@pytest.mark.parametrize("gpu", CATALOGUE, ids=GPU_NAMES)
def test_total_is_below_nominal_but_above_the_label_in_decimal_gb(gpu):
    """Why the label is binary: nvidia-smi reports more than the label read as 10^9 bytes."""
    number = int(gpu.memory_label.split()[0])
    assert number * 10**9 < gpu.total_bytes <= gpu.memory_bytes
    assert gpu.total_bytes % MiB == 0  # nvidia-smi reports whole MiB
    assert gpu.total_source.startswith("https://")


@pytest.mark.parametrize("gpu", CATALOGUE, ids=GPU_NAMES)
def test_usable_is_the_total_minus_the_one_stated_reserve(gpu):
    assert gpu.usable_bytes == gpu.total_bytes - RESERVED_BYTES < gpu.total_bytes


def test_recorded_nvidia_smi_totals():
    assert get_gpu("T4").total_bytes == 15_360 * MiB == 15 * GiB
    assert get_gpu("A100-80GB").total_bytes == get_gpu("A100-80GB").memory_bytes
    assert get_gpu("H100").total_bytes == 81_559 * MiB
    assert get_gpu("H200").total_bytes == 143_771 * MiB


def test_features():
    assert not get_gpu("T4").bf16_tensor_cores and not get_gpu("T4").flash_attention_2
    for name in GPU_NAMES[1:]:
        assert get_gpu(name).bf16_tensor_cores and get_gpu(name).flash_attention_2


def test_get_gpu_ignores_case_and_passes_gpus_through():
    assert get_gpu("a100-80gb") is get_gpu("A100-80GB")
    assert get_gpu(" h100 ") is get_gpu("H100")
    assert get_gpu(get_gpu("L4")) is get_gpu("L4")


@pytest.mark.parametrize("bad", ["V100", "", 80, None])
def test_unknown_gpu_is_a_one_line_error_naming_the_accepted(bad):
    with pytest.raises(MemlabError) as err:
        get_gpu(bad)
    msg = str(err.value)
    assert "\n" not in msg and repr(bad) in msg
    assert all(name in msg for name in GPU_NAMES)


def test_total_defaults_to_nominal_without_a_documented_figure():
    g = GPU("X", 8 * GiB, "8 GB", "GiB", "GDDR6", True, True, "https://example.com")
    assert g.total_bytes == g.memory_bytes and g.total_source == ""
    with pytest.raises(MemlabError, match="total_bytes"):
        GPU("X", 8 * GiB, "8 GB", "GiB", "GDDR6", True, True, "u", total_bytes=9 * GiB)
    with pytest.raises(MemlabError, match="reserve"):
        GPU("X", 8 * GiB, "8 GB", "GiB", "GDDR6", True, True, "u", total_bytes=RESERVED_BYTES)
    with pytest.raises(MemlabError, match="memory_unit"):
        GPU("X", 8 * GiB, "8 GB", "GB?", "GDDR6", True, True, "u")


def test_fits_at_the_boundary_and_with_headroom():
    t4 = get_gpu("T4")
    assert fits(t4.usable_bytes, t4)
    assert not fits(t4.usable_bytes + 1, "T4")
    assert fits(13 * GiB, "T4")
    assert not fits(13 * GiB, "T4", headroom_bytes=GiB + 1)
    assert fits(0, "H200")
    # the nvidia-smi total does not fit: the reserve is kept back
    assert not fits(t4.total_bytes, "T4") and fits(t4.total_bytes - RESERVED_BYTES, "T4")


@pytest.mark.parametrize("peak, headroom", [(-1, 0), (1.5e9, -2), ("10", 0), (True, 0),
                                            (float("nan"), 0)])
def test_fits_rejects_bad_bytes(peak, headroom):
    with pytest.raises(MemlabError) as err:
        fits(peak, "T4", headroom)
    assert "\n" not in str(err.value)


def test_fit_table_marks_each_gpu():
    table = fit_table({"small": 10 * GiB, "7B fp32 Adam": 120 * GiB, "huge": 200 * GiB})
    assert list(table.index) == ["small", "7B fp32 Adam", "huge"]
    assert list(table.columns) == ["required (GiB)"] + [g.column for g in CATALOGUE]
    assert table.loc["small", "required (GiB)"] == 10
    assert set(table.loc["small"].iloc[1:]) == {"✓"}
    assert set(table.loc["huge"].iloc[1:]) == {"✗"}
    seven = table.loc["7B fp32 Adam"]
    assert seven["H200 (141 GB)"] == "✓" and seven["H100 (80 GB)"] == "✗"


def test_fit_table_headroom_and_a_subset_of_gpus():
    table = fit_table({"a": 15 * GiB}, gpus=["T4", "L4"], headroom_bytes=GiB)
    assert list(table.columns) == ["required (GiB)", "T4 (16 GB)", "L4 (24 GB)"]
    assert table.loc["a", "required (GiB)"] == 16
    assert (table.loc["a", "T4 (16 GB)"], table.loc["a", "L4 (24 GB)"]) == ("✗", "✓")


@pytest.mark.parametrize("rows, gpus", [({}, CATALOGUE), ([1], CATALOGUE), ({"a": -5}, CATALOGUE),
                                        ({"a": 1}, ["P100"]), ({"a": 1}, [])])
def test_fit_table_bad_input(rows, gpus):
    with pytest.raises(MemlabError) as err:
        fit_table(rows, gpus=gpus)
    assert "\n" not in str(err.value)


def test_catalogue_table():
    table = catalogue_table()
    assert list(table.index) == list(GPU_NAMES)
    assert table.loc["A100-80GB", "nominal (GiB)"] == 80
    assert table.loc["A100-80GB", "nvidia-smi total (GiB)"] == 80
    assert table.loc["A100-80GB", "usable (GiB)"] == 79
    assert table.loc["T4", "usable (GiB)"] == 14
    assert table.loc["H200", "nominal (GB)"] == pytest.approx(151.4, abs=0.1)


def test_tensor_core_formats_agree_with_the_bf16_flag():
    from memlab.gpus import CATALOGUE, TENSOR_CORE_COLUMNS, tensor_core_table

    for gpu in CATALOGUE:
        assert gpu.bf16_tensor_cores == ("bf16" in gpu.tensor_core_formats)
        assert set(gpu.tensor_core_formats) <= set(TENSOR_CORE_COLUMNS)
        assert gpu.compute_capability
        # fp8 tensor cores arrive with compute capability 8.9 (Ada) and 9.0 (Hopper)
        assert ("fp8" in gpu.tensor_core_formats) == (float(gpu.compute_capability) >= 8.9)
    table = tensor_core_table()
    assert table.loc["T4", "bf16"] == "✗" and table.loc["H100", "fp8"] == "✓"
    assert (table["fp32"] == "✗").all()


def test_quoted_peaks_and_the_roofline():
    from memlab.gpus import compute_bound_from, roofline_matmul_s

    for gpu in CATALOGUE:
        peaks = dict(gpu.peak_tera_ops)
        sixteen = peaks.get("bf16", peaks.get("fp16"))
        assert peaks["int8"] == pytest.approx(2 * sixteen, rel=0.01)  # int8 at twice 16-bit's rate
        assert gpu.bandwidth_bytes_per_s > 0
    h100 = get_gpu("H100")
    # one token is bound by reading the weights: int8 weights take half bf16's time
    t16 = roofline_matmul_s(h100, 1, 8192, 8192, compute="bf16", weight_bytes=2)
    t8 = roofline_matmul_s(h100, 1, 8192, 8192, compute="bf16", weight_bytes=1)
    assert t8 / t16 == pytest.approx(0.5, abs=1e-3)
    m = compute_bound_from(h100, 8192, 8192, compute="bf16", weight_bytes=2)
    assert 2 * m * 8192 * 8192 / h100.peak_ops("bf16") >= roofline_matmul_s(
        h100, m, 8192, 8192, compute="bf16", weight_bytes=2) - 1e-15
    with pytest.raises(MemlabError, match="tensor-core format of T4"):
        get_gpu("T4").peak_ops("bf16")
    with pytest.raises(MemlabError, match="tokens must be a positive integer"):
        roofline_matmul_s(h100, 0, 8, 8, compute="bf16", weight_bytes=2)
