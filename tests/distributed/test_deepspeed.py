"""DeepSpeed's ZeRO stages on 4 ranks: per-rank bytes against the formulas and PyTorch, losses and
weights against one process; without DeepSpeed installed, a one-line error."""

import sys
from types import SimpleNamespace

import pytest
import torch

from memlab.distributed import deepspeed_zero as dz
from memlab.errors import MemlabError


def test_without_deepspeed_the_error_is_one_line_with_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # import deepspeed raises ImportError
    for call in (dz.require_deepspeed, dz.deepspeed_version, lambda: dz.deepspeed_comparison("ci")):
        with pytest.raises(MemlabError) as err:
            call()
        msg = str(err.value)
        assert "\n" not in msg and "deepspeed" in msg and "pip install" in msg


def test_a_bad_scale_is_refused_in_one_line():
    with pytest.raises(MemlabError, match="unknown scale 'huge'; accepted: ci, full"):
        dz.deepspeed_comparison("huge")


def test_the_config_is_fp32_with_pytorch_adamw_and_the_stage():
    conf = dz.ds_config(3, micro_batch=2, lr=1e-2, persistence_threshold=0)
    assert "fp16" not in conf and "bf16" not in conf
    assert conf["optimizer"]["params"]["torch_adam"] is True
    assert conf["zero_optimization"] == {"stage": 3, "stage3_param_persistence_threshold": 0}
    with pytest.raises(MemlabError, match="ZeRO stage"):
        dz.ds_config(4, micro_batch=2, lr=1e-2)


def test_held_buffers_counts_each_storage_once_in_its_first_category():
    # a stand-in for a DeepSpeed engine at stage 2: the parameters view one flat buffer, the
    # optimizer updates a flat fp32 partition, the gradients are views of a partition buffer
    flat = torch.zeros(100)
    module = torch.nn.Linear(9, 10)  # 90 + 10 = 100 values
    module.weight.data, module.bias.data = flat[:90].view(10, 9), flat[90:]
    master = flat[:25].clone().requires_grad_(True)
    inner = torch.optim.AdamW([master])
    master.grad = torch.ones(25)
    inner.step()
    master.grad = None
    grads = torch.zeros(30)
    zopt = SimpleNamespace(optimizer=inner, bit16_groups_flat=[flat],
                           single_partition_of_fp32_groups=[master],
                           averaged_gradients={0: [grads[:20], grads[20:25]]},
                           _global_grad_norm=torch.tensor(1.0))
    engine = SimpleNamespace(module=module, optimizer=zopt)
    got = dz.held_buffers(engine)
    assert got["parameters"] == {"param.data": 400}
    assert got["master_weights"] == {"optimizer.param_groups": 100}
    assert got["gradients"] == {"averaged_gradients": 120}  # the whole storage, not the views
    assert sum(got["optimizer_states"].values()) == 2 * 100 + 4  # exp_avg, exp_avg_sq, step
    assert got["other"] == {"_global_grad_norm": 4}


@pytest.mark.slow  # one torchrun launch of 4 ranks with DeepSpeed (2-3 min the first time: it compiles an op)
def test_deepspeed_stages_on_4_ranks():
    pytest.importorskip("deepspeed")
    result = dz.deepspeed_comparison("ci")
    n, P = result.parameters, 4 * result.parameters  # fp32
    assert result.world_size == 4 and result.backend == "gloo"
    for run in result.runs:
        assert run.matches_one_process, (run.name, run.against_one_process)
        for rank in run.ranks:
            assert rank.optimizer_states == 2 * P // 4 + 4  # exp_avg, exp_avg_sq + step
            assert rank.master_weights == P // 4  # DeepSpeed's flat fp32 partition
            assert rank.gradients < P // 2  # the rank's partition, whole tensors at its edges
    for name in ("ds-zero1", "ds-zero2"):
        assert all(r.parameters == P for r in result.run(name).ranks)
        # the gradient bucket is allocated at its configured size, not the model's
        assert all(r.peak_bytes > 4 * dz.REDUCE_BUCKET_ELEMENTS for r in result.run(name).ranks)
    assert all(r.parameters == P // 4 for r in result.run("ds-zero3").ranks)
    # the default threshold keeps every parameter of this small model whole, besides its shard
    assert all(r.parameters == P + P // 4 for r in result.run("ds-zero3-default").ranks)
    table = result.table()
    assert all(r.label in table for r in result.runs) and f"{n:,} parameters" in table
