"""memlab.quant.weight_only: a 4-bit layer multiplies in its compute dtype; int8 multiplies int8.

bitsandbytes picks a 4-bit layer's CPU path by CPU feature (AVX512-BF16): both paths are
exercised here on any CPU, the packed one through bitsandbytes' own repacking and, where this
CPU lacks the instruction set, memlab's reference of its kernel.
"""

import pytest
import torch
from torch import nn

from memlab.errors import MemlabError

pytest.importorskip("bitsandbytes")
import bitsandbytes as bnb  # noqa: E402

from memlab.quant import cpu_paths  # noqa: E402
from memlab.quant.compare import bnb_linear  # noqa: E402
from memlab.quant.weight_only import matmul_path  # noqa: E402

OUT, IN = 48, 128  # 48 output features: a shape bitsandbytes' packed layout cannot hold
HAS_AVX512BF16 = cpu_paths.cpu_has_avx512bf16()
BF16_ROUNDOFF = 2.0**-8  # bf16's unit roundoff: the packed path rounds inputs, absmax and output


@pytest.fixture(scope="module")
def linear():
    torch.manual_seed(0)
    return nn.Linear(IN, OUT)


@pytest.mark.parametrize(("scheme", "dtype", "torch_dtype"), [
    ("nf4", "bf16", torch.bfloat16), ("fp4", "fp32", torch.float32),
    ("nf4-dq", "fp16", torch.float16)])
def test_4bit_layer_multiplies_the_dequantized_weight(linear, scheme, dtype, torch_dtype):
    p = matmul_path(linear, scheme, compute_dtype=dtype, tokens=5)
    assert p.equals_dequantize_then_linear is True
    name = str(torch_dtype).removeprefix("torch.")
    assert p.dequantized_dtype == name
    size = torch.empty((), dtype=torch_dtype).element_size()
    assert p.dequantized_bytes == OUT * IN * size  # the whole weight in the compute dtype
    assert p.stored_bytes < OUT * IN  # codes and absmax: under a byte per weight
    # the matmul's input and output are in the compute dtype, its weight in packed uint8 codes
    mm = [op for op in p.ops if "4bit" in op.op]
    assert mm and mm[-1].inputs[0] == f"{name} (5, {IN})" and mm[-1].output == f"{name} (5, {OUT})"
    assert any(i.startswith("uint8") for i in mm[-1].inputs)
    assert scheme in p.summary() and "F.linear" in p.summary()


@pytest.mark.parametrize("scheme", ["int8", "llm-int8"])
def test_int8_layer_multiplies_int8_codes(linear, scheme):
    p = matmul_path(linear, scheme, tokens=3)
    assert p.dequantized_dtype is None and p.equals_dequantize_then_linear is None
    assert p.stored_bytes == OUT * IN + 4 * OUT  # int8 codes and one fp32 absmax per row
    mm = [op for op in p.ops if "scaled_mm" in op.op]
    assert mm and sum(i.startswith("int8") for i in mm[-1].inputs) >= 2  # input and weight codes
    assert "compute dtype" not in p.summary()


def test_matmul_path_rejects_bad_input(linear):
    with pytest.raises(MemlabError, match="unknown scheme 'rtn-4'"):
        matmul_path(linear, "rtn-4")
    with pytest.raises(MemlabError, match="unknown compute_dtype 'int8'"):
        matmul_path(linear, "nf4", compute_dtype="int8")
    with pytest.raises(MemlabError, match="tokens must be a positive integer"):
        matmul_path(linear, "nf4", tokens=0)
    with pytest.raises(MemlabError, match="linear must be an nn.Linear"):
        matmul_path(nn.Conv1d(2, 2, 1), "nf4")


def test_the_layer_passed_in_is_left_alone(linear):
    before = {k: v.clone() for k, v in linear.state_dict().items()}
    matmul_path(linear, "nf4")
    assert all(torch.equal(before[k], v) for k, v in linear.state_dict().items())


# The two CPU paths -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def packable_linear():
    torch.manual_seed(1)
    return nn.Linear(IN, 64)


@pytest.fixture
def without_avx512bf16(monkeypatch):
    """This CPU as one without AVX512-BF16, as far as memlab asks (bitsandbytes' kernels are as loaded)."""
    monkeypatch.setattr(bnb.functional, "has_avx512bf16", lambda: False)


@pytest.mark.parametrize("has", [True, False])
def test_bitsandbytes_default_path_follows_the_cpu_feature(monkeypatch, has):
    monkeypatch.setattr(bnb.functional, "has_avx512bf16", lambda: has)
    assert cpu_paths.bnb_default_path() == ("packed" if has else "dequantize")


def test_bitsandbytes_own_flag_repacks_in_place_and_fails_on_48_rows(linear):
    """What a CPU with AVX512-BF16 does to a plain Linear4bit, reproduced on any CPU by its flag."""
    m = bnb.nn.Linear4bit(IN, OUT, compute_dtype=torch.float32)
    m.load_state_dict(linear.state_dict())
    m = m.to("cpu").eval()
    m.support_avx512bf16_for_cpu = True  # what bitsandbytes sets on such a CPU
    with pytest.raises(AssertionError, match="divisible by block_n"), torch.no_grad():
        m(torch.randn(2, IN))


@pytest.mark.parametrize("scheme", ["nf4", "fp4", "nf4-dq"])
def test_memlab_layers_take_the_dequantize_path_on_every_cpu(linear, scheme, monkeypatch):
    monkeypatch.setattr(bnb.functional, "has_avx512bf16", lambda: True)  # as on such a CPU
    m = bnb_linear(linear, scheme, torch.device("cpu"))
    assert m.support_avx512bf16_for_cpu is False
    with torch.no_grad():
        m(torch.randn(3, IN))
    assert not cpu_paths.is_packed(m)


@pytest.mark.parametrize("scheme", ["nf4", "fp4", "nf4-dq"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32", "fp16"])
def test_packed_path_on_a_cpu_without_avx512bf16(packable_linear, scheme, dtype,
                                                 without_avx512bf16):
    p = matmul_path(packable_linear, scheme, compute_dtype=dtype, tokens=5, cpu_path="packed")
    assert p.cpu_path == "packed" and p.kernel == "reference"
    # The same codes on both paths; the packed one rounds the input, the absmax and the output
    # to bf16: a few roundoffs of sum |x| |w| (the 4-bit weight is within 1.5 |w| of the weight).
    x = torch.randn(5, IN, generator=torch.Generator().manual_seed(0))  # matmul_path's input
    scale = float((x.abs() @ packable_linear.weight.detach().abs().t()).max())
    assert 0 < p.max_abs_diff < 4 * BF16_ROUNDOFF * 1.5 * scale
    assert "packed" in p.summary() and "reference" in p.summary()


@pytest.mark.skipif(not HAS_AVX512BF16, reason="bitsandbytes' packed kernel needs AVX512-BF16")
@pytest.mark.parametrize("scheme", ["nf4", "fp4", "nf4-dq"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("tokens", [1, 9])
def test_reference_matches_bitsandbytes_packed_kernel(scheme, dtype, tokens):
    torch.manual_seed(2)
    m = bnb_linear(nn.Linear(256, 96), scheme, torch.device("cpu"), compute_dtype=dtype,
                   cpu_path="packed")
    x = torch.randn(tokens, 256).to(dtype)
    with torch.no_grad():
        y = m(x)  # bitsandbytes repacks the weight here
    assert cpu_paths.is_packed(m)
    torch.testing.assert_close(cpu_paths.packed_reference(x, m), y, rtol=BF16_ROUNDOFF,
                               atol=BF16_ROUNDOFF * float(y.abs().max()))


@pytest.mark.skipif(not HAS_AVX512BF16, reason="bitsandbytes' packed kernel needs AVX512-BF16")
def test_packed_path_with_the_kernel(packable_linear):
    p = matmul_path(packable_linear, "nf4", tokens=5, cpu_path="packed")
    assert p.kernel == "bitsandbytes"
    assert any("gemv_4bit" in op.op for op in p.ops)


def test_unpack_codes_inverts_bitsandbytes_packing(packable_linear):
    import bitsandbytes.functional as bnbf

    m = bnb_linear(packable_linear, "nf4", torch.device("cpu"), cpu_path="packed")
    flat = m.weight.data.reshape(-1)  # two codes a byte, high nibble first
    codes = torch.stack([flat >> 4, flat & 0xF], dim=-1).reshape(64, IN)
    cpu_paths.pack(m)
    assert cpu_paths.is_packed(m)
    assert torch.equal(cpu_paths.unpack_codes(m.weight.data), codes)
    again, _ = bnbf._convert_weight_packed_for_cpu_inverse(m.weight.data.clone(),
                                                           m.weight.quant_state)
    assert torch.equal(again.reshape(-1), flat)


@pytest.mark.parametrize("path", ["dequantize", "packed"])
def test_the_layer_passed_in_is_left_alone_on_either_path(packable_linear, path):
    before = {k: v.clone() for k, v in packable_linear.state_dict().items()}
    matmul_path(packable_linear, "nf4-dq", cpu_path=path)
    assert all(torch.equal(before[k], v) for k, v in packable_linear.state_dict().items())


def test_packed_path_refusals(linear, packable_linear):
    with pytest.raises(MemlabError, match="out_features a multiple of 32.*48 x 128"):
        matmul_path(linear, "nf4", cpu_path="packed")
    with pytest.raises(MemlabError, match="unknown cpu_path 'avx'"):
        matmul_path(packable_linear, "nf4", cpu_path="avx")
    with pytest.raises(MemlabError, match="scheme 'int8' has one CPU path"):
        matmul_path(packable_linear, "int8", cpu_path="packed")
    with pytest.raises(MemlabError, match="call pack"):
        cpu_paths.packed_reference(torch.randn(1, IN),
                                   bnb_linear(packable_linear, "nf4", torch.device("cpu")))


_INT8_OUTPUT = """
import sys, torch, bitsandbytes.backends.cpu.ops as ops
from torch import nn
from memlab.quant.compare import bnb_linear
torch.manual_seed(0)
m = bnb_linear(nn.Linear(128, 48), sys.argv[1], torch.device("cpu"))
x = torch.randn(5, 128)
a, b = torch.randint(-127, 128, (5, 128), dtype=torch.int8), m.weight.data  # int8 codes
with torch.no_grad():
    torch.save(dict(y=m(x), int32=torch.ops.bitsandbytes.int8_linear_matmul(a, b)), sys.argv[2])
print(ops._has_avx512)
"""


@pytest.mark.parametrize("scheme", ["int8", "llm-int8"])
def test_int8_layer_on_either_torch_cpu_path(scheme, tmp_path):
    """bitsandbytes multiplies int8 with torch._int_mm only where torch runs its AVX-512 kernels.

    Both paths: the native one, and the fallback forced with ``ATEN_CPU_CAPABILITY=default``
    (on a CPU without AVX-512 both runs take the fallback).
    """
    import os
    import subprocess
    import sys

    def run(capability):
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        if capability:
            env["ATEN_CPU_CAPABILITY"] = capability
        path = tmp_path / f"{capability}.pt"
        out = subprocess.run([sys.executable, "-c", _INT8_OUTPUT, scheme, str(path)], env=env,
                             capture_output=True, text=True, timeout=120, check=True)
        return out.stdout.split()[-1] == "True", torch.load(path)

    (_, native), (forced_avx512, forced) = run(None), run("default")
    assert forced_avx512 is False  # the fallback path, forced
    assert torch.equal(native["int32"], forced["int32"])  # the integer products, bit for bit
    # the rescale to floating point may round differently in the last bit
    torch.testing.assert_close(native["y"], forced["y"], rtol=4 * 2.0**-24, atol=0)
