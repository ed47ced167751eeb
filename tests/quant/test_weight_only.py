"""memlab.quant.weight_only: a 4-bit layer multiplies in its compute dtype; int8 multiplies int8."""

import pytest
import torch
from torch import nn

from memlab.errors import MemlabError

pytest.importorskip("bitsandbytes")
from memlab.quant.weight_only import matmul_path  # noqa: E402

OUT, IN = 48, 128


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
