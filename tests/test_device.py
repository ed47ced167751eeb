import pytest
import torch

import memlab
from memlab.device import (
    EnvReport,
    device_memory_bytes,
    device_name,
    get_scale,
    pick_device,
    seed_all,
)
from memlab.errors import MemlabError


def test_pick_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.delenv("MEMLAB_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("memlab.device._mps_available", lambda: False)
    assert pick_device().type == "cpu"
    monkeypatch.setattr("memlab.device._mps_available", lambda: True)
    assert pick_device().type == "mps"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device().type == "cuda"


def test_pick_device_override(monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    assert pick_device().type == "cpu"
    monkeypatch.setenv("MEMLAB_DEVICE", "tpu")
    with pytest.raises(MemlabError, match="unknown device 'tpu'; accepted: cuda, mps, cpu"):
        pick_device()


def test_pick_device_refuses_missing_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(MemlabError, match="no CUDA"):
        pick_device("cuda")


def test_scale_is_automatic_and_overridable(monkeypatch):
    monkeypatch.delenv("MEMLAB_SCALE", raising=False)
    assert get_scale(device=torch.device("cpu")) == "ci"
    assert get_scale(device=torch.device("cuda")) == "full"
    monkeypatch.setenv("MEMLAB_SCALE", "full")
    assert get_scale(device=torch.device("cpu")) == "full"
    assert get_scale("ci") == "ci"
    monkeypatch.setenv("MEMLAB_SCALE", "huge")
    with pytest.raises(MemlabError, match="unknown scale 'huge'; accepted: ci, full"):
        get_scale()


def test_env_report_names_device_and_scale(capsys, monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    monkeypatch.setenv("MEMLAB_SCALE", "ci")
    rep = memlab.env_report()
    out = capsys.readouterr().out
    assert isinstance(rep, EnvReport)
    assert rep.device == "cpu" and rep.scale == "ci"
    assert rep.torch_version == torch.__version__
    assert "running on the CPU" in out and "scale" in out and torch.__version__ in out
    assert rep.as_dict()["device"] == "cpu"
    assert memlab.env_report(print_report=False) == rep
    assert capsys.readouterr().out == ""


def test_device_memory_and_name_on_cpu():
    cpu = torch.device("cpu")
    assert device_memory_bytes(cpu) > 2**30
    assert device_name(cpu).startswith("CPU")


def test_seed_all_repeats():
    seed_all(3)
    a = torch.rand(4)
    seed_all(3)
    assert torch.equal(a, torch.rand(4))
