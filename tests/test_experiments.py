from dataclasses import dataclass

import pytest
import torch

import memlab.experiments as ex
import memlab.measure.experiments as mx
from memlab.errors import MemlabError


def test_registry_names_chapters_and_sizes():
    assert set(ex.experiments()) == {"step-memory", "trace-7b", "load-memory", "estimator-accuracy",
                                      "mixed-precision", "fp8-matmul", "quantization", "quant-speed",
                                      "attention-memory", "attention-flops", "attention-time",
                                      "attention-step", "gqa", "fusion-block",
                                      "finetune-compare", "finetune-lr", "finetune-fit",
                                      "finetune-context", "finetune-flops", "finetune-reference",
                                      "finetune-20b", "distributed-memory", "distributed-parallel",
                                      "distributed-traced", "distributed-deepspeed",
                                      "distributed-accelerate", "checkpointing-costs",
                                      "accumulation", "step-mfu", "offload", "scaling-grid",
                                      "allocator", "estimator-cuda", "tf32", "optimizer-8bit",
                                      "generation-memory", "step-times", "chunked-loss",
                                      "activation-offload", "memory-budget", "ring-attention",
                                      "optimizer-states", "moe-step", "expert-parallel"}
    for exp in ex.experiments().values():
        assert set(exp.sizes) == {"ci", "full"}
        assert exp.chapter.startswith("chapters/")


def test_get_experiment_rejects_unknown_name():
    names = ", ".join(sorted(ex.experiments()))
    with pytest.raises(MemlabError, match="unknown experiment 'x'; accepted: " + names):
        ex.get_experiment("x")


def test_refuse_before_allocating(monkeypatch):
    import memlab.device as dev

    monkeypatch.setattr(dev, "device_memory_bytes", lambda device: 16 * 2**30)  # a T4
    dev.refuse_if_too_big(10 * 2**30, torch.device("cuda"), "a step")  # fits: no error
    with pytest.raises(MemlabError, match=r"a step needs about 125\.5 GiB .* 16\.0 GiB"):
        dev.refuse_if_too_big(int(125.5 * 2**30), torch.device("cuda"), "a step")


def test_step_memory_refuses_on_small_gpu_without_allocating(monkeypatch):
    """On a (pretend) 1 GiB GPU the full-scale step is traced, found too big, and refused."""
    monkeypatch.setattr(mx, "pick_device", lambda: torch.device("cuda"))
    monkeypatch.setattr("memlab.device.device_memory_bytes", lambda device: 2**30)
    monkeypatch.setattr("memlab.measure.step.measure_step", lambda *a, **k: pytest.fail("allocated"))
    with pytest.raises(MemlabError, match="a gpt2 training step needs about"):
        mx.step_memory("full")


def test_step_memory_ci_scale_measures_tiny_model(monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    step = mx.step_memory("ci")
    assert step.mode == "measured" and step.setup["model"] == "tiny"
    assert step.parameters_bytes == 4 * step.setup["parameters"]


def test_run_experiment_returns_record(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    result, record, path = ex.run_experiment("step-memory", "ci", tmp_path, command="test")
    assert path.is_file() and record.result["peak_bytes"] == result.peak_bytes
    assert record.provenance["command"] == "test"


@dataclass(frozen=True)
class Counted:
    """A result that counts the runs before it (kept on disk, so defined where pickle finds it)."""

    scale: str
    calls: int


def test_register_kept_runs_once_and_keeps_under_its_name(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("MEMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MEMLAB_SCALE", "ci")
    monkeypatch.setattr(ex, "EXPERIMENTS", dict(ex.EXPERIMENTS))  # the test's entry goes with it

    @ex.register_kept("kept-test", kept_as="_kept_test", chapter="chapters/x", summary="s",
                      sizes={"ci": {}, "full": {}}, result=Counted, needs="cpu", cost_s=1,
                      priority=7, gpus=2)
    def kept_test(scale: str) -> Counted:
        """A run kept on disk (chapter: 0)."""
        calls.append(scale)
        return Counted(scale, len(calls))

    assert kept_test() is kept_test("ci") and kept_test("full").calls == 2 and calls == ["ci", "full"]
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.pt")) == ["_kept_test"] * 2
    kept_test.kept.cache_clear()  # a new process: read back from disk, not run again
    assert kept_test("ci") == Counted("ci", 1) and calls == ["ci", "full"]
    exp = ex.EXPERIMENTS["kept-test"]
    assert exp.fn is kept_test and (exp.needs, exp.cost_s, exp.priority, exp.gpus) == ("cpu", 1, 7, 2)
    assert kept_test.__name__ == "kept_test" and kept_test.__doc__.startswith("A run kept")
