"""Chapter 9's measured MoE step: each router's step beside its estimate, and the figure."""

from __future__ import annotations

import pytest

from memlab.errors import MemlabError
from memlab.model.config import get_config
from memlab.moe.measured import MOE_STEP_SIZES, HotExpert, measure_moe_steps, size_config


def test_each_router_is_measured_within_one_percent_of_its_estimate():
    r = measure_moe_steps("ci", device="cpu")
    k = get_config("tiny-moe").moe.top_k
    assert [s.router for s in r.steps] == ["as initialized", "hot expert"]
    for s in r.steps:
        assert abs(s.peak_ratio - 1) < 0.01
        assert abs(s.measured_saved_bytes / s.estimated_saved_bytes - 1) < 0.001
        assert sum(s.rows) == MOE_STEP_SIZES["ci"]["batch_size"] * MOE_STEP_SIZES["ci"]["seq_len"] * k
    assert r.steps[1].busiest_share == 1 / k  # every token picks expert 0
    assert r.parameters > r.active_parameters
    assert r.steps[0].model_states_bytes == r.steps[1].model_states_bytes


def test_the_full_size_is_mixtral_with_fewer_blocks():
    cfg = size_config(MOE_STEP_SIZES["full"]["config"])
    mixtral = get_config("mixtral-8x7b")
    assert cfg.n_layer == 2 and cfg.moe == mixtral.moe and cfg.d_model == mixtral.d_model
    assert size_config({"preset": "tiny-moe"}) == get_config("tiny-moe")


def test_a_hook_without_bias_changes_nothing():
    from memlab.model.transformer import build_model

    hook = HotExpert(0.0)
    model = build_model(get_config("tiny-moe"), seed=0)
    hook(model)
    assert len(hook.layers) == get_config("tiny-moe").n_layer
    assert all(not layer.router._forward_hooks for layer in hook.layers)


def test_a_bad_scale_is_one_line():
    with pytest.raises(MemlabError, match="scale"):
        measure_moe_steps("huge")


def test_the_expert_parallel_figure():
    import matplotlib

    matplotlib.use("Agg")
    import memlab.plot as mplot
    from memlab.moe.ep_run import expert_parallel_table

    rows = expert_parallel_table(("mixtral-8x7b",))
    with pytest.raises(MemlabError, match="whole_states_bytes"):
        mplot.expert_parallel_share(rows)
    for r in rows:
        r["whole_states_bytes"] = 16 * get_config(r["model"]).num_parameters()
    fig = mplot.expert_parallel_share(rows)
    assert len(fig.axes) == 1
