"""Every registered experiment returns a frozen dataclass that a record can store.

The registry is walked, so an experiment cannot be registered without being covered here.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import memlab.experiments as ex
from memlab.errors import MemlabError
from memlab.results import load_record, make_record, save_record, writable_type

# Cheap at ci scale on a 2-core CPU (seconds): run end to end through the CLI.
CHEAP = ("step-memory", "trace-7b", "load-memory", "fp8-matmul", "quant-speed",
         "attention-flops", "attention-time", "finetune-fit", "finetune-context",
         "finetune-flops", "finetune-20b", "accumulation", "offload", "step-mfu",
         "allocator", "estimator-cuda", "tf32", "optimizer-8bit", "generation-memory",
         "step-times", "chunked-loss", "activation-offload", "memory-budget", "moe-step")
# Minutes or tens of seconds: run end to end too, but marked slow.
COSTLY = ("estimator-accuracy", "mixed-precision", "quantization", "attention-memory",
          "attention-step", "gqa", "fusion-block", "finetune-compare", "finetune-lr",
          "finetune-reference", "distributed-memory", "distributed-parallel",
          "distributed-traced", "distributed-accelerate", "checkpointing-costs", "scaling-grid",
          "ring-attention", "optimizer-states", "expert-parallel")
# Needs a package outside the book's requirements: run only where it is installed.
OPTIONAL = {"distributed-deepspeed": "deepspeed"}


def example(tp, depth: int = 0):
    """A tiny instance of a result type, built from its annotations alone."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return example(next(a for a in args if a is not type(None)), depth)
    if origin is list:
        return [example(args[0], depth + 1)] if args else [1]
    if origin is tuple:
        if Ellipsis in args:  # a variable-length tuple: two items, as a grid needs at least two
            return tuple(example(args[0], depth + 1) for _ in range(2))
        return tuple(example(a, depth + 1) for a in args)
    if origin is dict:
        return {"a": example(args[1], depth + 1)} if args else {"a": 1}
    if origin is typing.Literal:
        return args[0]
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: example(hints[f.name], depth + 1)
                     for f in dataclasses.fields(tp) if f.init})
    if tp is torch.Tensor:
        return torch.arange(3, dtype=torch.float32)
    return {bool: True, int: 3, float: 0.5, str: "x", dict: {"a": 1}, list: [1],
            type(None): None, torch.dtype: torch.float16, torch.device: torch.device("cpu"),
            Path: Path("x")}[tp]


def test_every_experiment_is_classified_here():
    assert set(ex.experiments()) == set(CHEAP) | set(COSTLY) | set(OPTIONAL)


@pytest.mark.parametrize("name", sorted(ex.experiments()))
def test_result_is_a_frozen_dataclass_a_record_can_store(name, tmp_path):
    exp = ex.experiments()[name]
    assert dataclasses.is_dataclass(exp.result) and exp.result.__dataclass_params__.frozen
    result = example(exp.result)
    record = make_record(name, "ci", result, command="test")
    path = save_record(record, tmp_path)
    back = load_record(path)
    assert back.result == json.loads(record.to_json())["result"]
    assert set(back.result) == {f.name for f in dataclasses.fields(exp.result)}


@pytest.mark.parametrize("name", sorted(ex.experiments()))
def test_sizes_named_for_every_scale_and_listed(name, capsys):
    from memlab.cli import main

    exp = ex.experiments()[name]
    assert set(exp.sizes) == {"ci", "full"}
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    block = out[out.index(f"{name}: "):].split("\n")
    for scale, line in zip(("ci", "full"), block[1:3], strict=True):
        assert line.split()[0] == scale and len(line.split()) > 1, line  # a size is shown


def test_a_tensor_is_written_as_a_list_and_an_object_refused():
    @dataclass(frozen=True)
    class R:
        t: torch.Tensor
        o: object = None

    rec = make_record("x", "ci", R(torch.tensor([[1.0, 2.0]])), command="t")
    assert rec.result["t"] == [[1.0, 2.0]] and json.loads(rec.to_json())
    with pytest.raises(MemlabError, match=r"^cannot write result\.o: a Linear; accepted: "):
        make_record("x", "ci", R(torch.zeros(1), torch.nn.Linear(1, 1)))
    with pytest.raises(MemlabError, match=r"cannot write R\.o: its type is object"):
        writable_type(R, "R")


def test_registering_an_unwritable_or_mutable_result_is_refused():
    @dataclass
    class Mutable:
        x: int

    @dataclass(frozen=True)
    class HoldsModule:
        m: torch.nn.Module

    with pytest.raises(MemlabError, match="result must be a frozen dataclass"):
        ex.register("bad", chapter="chapters/x", summary="", sizes={"ci": {}, "full": {}},
                    result=Mutable, **PASS)
    with pytest.raises(MemlabError, match=r"cannot write HoldsModule\.m: a Module"):
        ex.register("bad", chapter="chapters/x", summary="", sizes={"ci": {}, "full": {}},
                    result=HoldsModule, **PASS)
    with pytest.raises(MemlabError, match="sizes must name every scale"):
        ex.register("bad", chapter="chapters/x", summary="", sizes={"ci": {}},
                    result=ex.experiments()["load-memory"].result, **PASS)
    good = dict(chapter="chapters/x", summary="", sizes={"ci": {}, "full": {}},
                result=ex.experiments()["load-memory"].result)
    with pytest.raises(MemlabError, match="unknown needs of experiment 'bad' 'gpu'; accepted: "
                                          "cuda, cpu, any"):
        ex.register("bad", **good, **dict(PASS, needs="gpu"))
    with pytest.raises(MemlabError, match="cost_s must be positive seconds"):
        ex.register("bad", **good, **dict(PASS, cost_s=0))
    with pytest.raises(MemlabError, match="priority must be an integer"):
        ex.register("bad", **good, **dict(PASS, priority=1.5))
    assert "bad" not in ex.EXPERIMENTS


def test_a_result_of_the_wrong_type_is_refused(monkeypatch):
    exp = ex.experiments()["trace-7b"]
    monkeypatch.setitem(ex.EXPERIMENTS, "trace-7b", dataclasses.replace(exp, fn=lambda s: {}))
    with pytest.raises(MemlabError, match="returned a dict, not its declared StepMemory"):
        ex.run_experiment("trace-7b", "ci")


PASS = dict(needs="any", cost_s=10, priority=100)  # what a GPU pass needs to know


def _run_cli(name, tmp_path, monkeypatch, capsys):
    from memlab.cli import main

    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    if ex.experiments()[name].needs == "cuda":  # measures nothing here: a status, no record
        assert main(["run", name, "--scale", "ci"]) == 0
        assert "cpu" in capsys.readouterr().out
        assert main(["run", name, "--scale", "ci", "--out", str(tmp_path)]) == 2
        assert capsys.readouterr().err.strip() == (
            f"memlab: error: {name} measures on a CUDA GPU only and this process runs on cpu: "
            "nothing to record; run it without --out to see its status")
        return
    assert main(["run", name, "--scale", "ci", "--out", str(tmp_path)]) == 0
    files = list((tmp_path / name).glob("ci-*.json"))
    assert len(files) == 1, files
    rec = load_record(files[0])
    assert rec.experiment == name and rec.scale == "ci" and rec.result
    assert set(rec.result) == {f.name for f in dataclasses.fields(ex.experiments()[name].result)}
    assert "wrote " in capsys.readouterr().err


@pytest.mark.parametrize("name", CHEAP)
def test_memlab_run_writes_a_record(name, tmp_path, monkeypatch, capsys):
    _run_cli(name, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", COSTLY)
def test_memlab_run_writes_a_record_costly(name, tmp_path, monkeypatch, capsys):
    _run_cli(name, tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(OPTIONAL))
def test_memlab_run_writes_a_record_optional(name, tmp_path, monkeypatch, capsys):
    pytest.importorskip(OPTIONAL[name])
    _run_cli(name, tmp_path, monkeypatch, capsys)
