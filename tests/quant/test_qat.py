import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memlab.model.lm as lm
from memlab.errors import MemlabError
from memlab.quant import qat
from memlab.quant.functional import absmax_quantize, dequantize

# A smaller model than the CI one (d 64, 40 training steps), so the whole file runs in seconds.


def _linear(seed=0, out_f=24, in_f=40, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(in_f, out_f, bias=bias)


@pytest.fixture(scope="module")
def small_reference(tiny_reference):
    return tiny_reference


@pytest.fixture(scope="module")
def qat_result(small_reference):
    before = copy.deepcopy(small_reference.model.state_dict())
    r = qat.qat_vs_ptq("ci", bits=3, steps=12, device="cpu", reference=small_reference)
    after = small_reference.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "reference model was changed"
    return r


@pytest.fixture(scope="module")
def comparison():
    return qat.optimizer_comparison("ci", steps=4, device="cpu", config=lm.TINY_LM)


# FakeQuantLinear ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_fake_quant_at_init_is_per_row_absmax_rtn(bits):
    lin = _linear()
    fq = qat.FakeQuantLinear(copy.deepcopy(lin), bits)
    q, st = absmax_quantize(lin.weight.detach(), bits, granularity="row")
    torch.testing.assert_close(fq.quantized_weight().detach(), dequantize(q, st), rtol=1e-6,
                               atol=0)
    codes, step = fq.codes()
    assert torch.equal(codes, q)
    assert step.shape == (lin.out_features, 1)
    torch.testing.assert_close(step.squeeze(1), st.absmax / (2 ** (bits - 1) - 1))
    x = torch.randn(5, lin.in_features)
    torch.testing.assert_close(fq(x), F.linear(x, dequantize(q, st), lin.bias), rtol=1e-5,
                               atol=1e-6)


def test_fake_quant_shares_the_wrapped_parameters():
    lin = _linear()
    fq = qat.FakeQuantLinear(lin, 4)
    assert fq.weight is lin.weight and fq.bias is lin.bias
    assert isinstance(fq.step_size, nn.Parameter)
    names = {n for n, _ in fq.named_parameters()}
    assert names == {"weight", "bias", "step_size"}


def _grads(fq, x, gy):
    fq.zero_grad(set_to_none=True)
    (fq(x) * gy).sum().backward()
    return fq.weight.grad.clone(), fq.step_size.grad.clone()


def test_gradients_reach_step_size_and_weights_through_the_ste():
    lin = _linear(1)
    fq = qat.FakeQuantLinear(lin, 3)
    x, gy = torch.randn(7, lin.in_features), torch.randn(7, lin.out_features)
    gw, gs = _grads(fq, x, gy)
    assert (gs != 0).all() and (gw != 0).any()
    # At init only each row's largest |w| sits on the grid's end (|w/s| = qmax, clipped in
    # LSQ); the STE passes the gradient of w_q to every other weight unchanged.
    wq = fq.quantized_weight().detach().requires_grad_(True)
    (F.linear(x, wq, lin.bias) * gy).sum().backward()
    edge = lin.weight.abs() == lin.weight.abs().amax(1, keepdim=True)
    assert edge.sum() == lin.out_features
    torch.testing.assert_close(gw[~edge], wq.grad[~edge])
    assert (gw[edge] == 0).all()


def test_step_size_gradient_is_lsq():
    """LSQ eq. 3 by hand, with some weights clipped: round(v) - v inside, +-qmax outside."""
    lin = _linear(2)
    bits = 3
    fq = qat.FakeQuantLinear(lin, bits, grad_scale=False)
    with torch.no_grad():
        fq.step_size.mul_(0.6)  # a smaller step clips the largest weights of every row
    x, gy = torch.randn(6, lin.in_features), torch.randn(6, lin.out_features)
    gw, gs = _grads(fq, x, gy)
    qmax = 2 ** (bits - 1) - 1
    s = fq.step_size.detach()
    v = lin.weight.detach() / s  # (out, in)
    inside = v.abs() < qmax
    assert (~inside).any()
    dwq = gy.T @ x  # (out, in): gradient of the loss with respect to w_q
    dq_ds = torch.where(inside, torch.round(v) - v, torch.sign(v) * qmax)
    torch.testing.assert_close(gs, (dwq * dq_ds).sum(1, keepdim=True), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw, dwq * inside)  # clipped weights get no gradient


def test_step_size_gradient_matches_torch_learnable_fake_quant():
    """torch's LSQ op decides clipping after rounding, LSQ (eq. 3) before: they agree on every
    row with no |w/s| in [qmax, qmax + 1/2], which torch counts as inside and LSQ as clipped."""
    op = getattr(torch, "_fake_quantize_learnable_per_channel_affine", None)
    if op is None:
        pytest.skip("this torch has no learnable fake-quantize op")
    lin = _linear(3, out_f=64)
    bits = 4
    qmax = 2 ** (bits - 1) - 1
    fq = qat.FakeQuantLinear(lin, bits, grad_scale=False)
    with torch.no_grad():
        fq.step_size.mul_(0.8)
    x, gy = torch.randn(6, lin.in_features), torch.randn(6, lin.out_features)
    gw, gs = _grads(fq, x, gy)
    w = lin.weight.detach().clone().requires_grad_(True)
    s = fq.step_size.detach().squeeze(1).clone().requires_grad_(True)
    wq = op(w, s, torch.zeros_like(s), 0, -qmax, qmax, 1.0)
    torch.testing.assert_close(wq.detach(), fq.quantized_weight().detach())
    (F.linear(x, wq, lin.bias) * gy).sum().backward()
    v = (lin.weight / fq.step_size).detach().abs()
    band = ((v >= qmax) & (v <= qmax + 0.5)).any(1)  # (out,)
    clipped = (v > qmax + 0.5).any(1)
    assert (~band & clipped).sum() >= 5, "want rows with clipped weights to compare"
    torch.testing.assert_close(gs.squeeze(1)[~band], s.grad[~band], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(gw[~band], w.grad[~band])


def test_lsq_gradient_scale_is_applied():
    lin = _linear(4)
    bits = 3
    scaled = qat.FakeQuantLinear(copy.deepcopy(lin), bits)
    plain = qat.FakeQuantLinear(copy.deepcopy(lin), bits, grad_scale=False)
    g = 1 / (lin.in_features * (2 ** (bits - 1) - 1)) ** 0.5
    assert scaled.grad_scale == pytest.approx(g) and plain.grad_scale == 1.0
    x, gy = torch.randn(5, lin.in_features), torch.randn(5, lin.out_features)
    gw1, gs1 = _grads(scaled, x, gy)
    gw2, gs2 = _grads(plain, x, gy)
    torch.testing.assert_close(gs1, gs2 * g)
    torch.testing.assert_close(gw1, gw2)  # the weights' gradient is not scaled
    torch.testing.assert_close(scaled(x), plain(x))  # nor is the forward pass


def test_minmax_mode_has_no_learned_scale():
    lin = _linear(5)
    fq = qat.FakeQuantLinear(lin, 3, scale_mode="minmax")
    assert fq.step_size is None and {n for n, _ in fq.named_parameters()} == {"weight", "bias"}
    x, gy = torch.randn(5, lin.in_features), torch.randn(5, lin.out_features)
    (fq(x) * gy).sum().backward()
    wq = fq.quantized_weight().detach().requires_grad_(True)
    (F.linear(x, wq, lin.bias) * gy).sum().backward()
    torch.testing.assert_close(lin.weight.grad, wq.grad)  # nothing clipped: the plain STE
    with torch.no_grad():
        lin.weight.mul_(2)
    torch.testing.assert_close(fq.step(), 2 * fq.initial_step)  # follows the current weights


def test_export_equals_fake_quant_exactly():
    lin = _linear(6)
    fq = qat.FakeQuantLinear(lin, 3)
    with torch.no_grad():
        fq.step_size.mul_(torch.linspace(0.7, 1.3, lin.out_features).unsqueeze(1))
    out = fq.export()
    assert type(out) is nn.Linear
    assert torch.equal(out.weight, fq.quantized_weight().detach())
    x = torch.randn(4, lin.in_features)
    assert torch.equal(out(x), fq(x).detach())


def test_wrap_only_the_block_linears(small_reference):
    model = copy.deepcopy(small_reference.model)
    names = qat.wrap_linears(model, 4)
    assert len(names) == 7 * lm.TINY_LM.n_layer and all(n.startswith("blocks.") for n in names)
    assert type(model.lm_head) is nn.Linear
    wrapped = [m for m in model.modules() if isinstance(m, qat.FakeQuantLinear)]
    assert len(wrapped) == len(names)


# qat_vs_ptq -----------------------------------------------------------------------------------------
def test_qat_exported_model_evaluates_as_fake_quant(qat_result):
    r = qat_result
    assert r.export_matches
    assert r.qat.loss == r.qat_fake_quant.loss and r.qat.accuracy == r.qat_fake_quant.accuracy


def test_qat_result_is_complete(qat_result):
    r = qat_result
    assert r.bits == 3 and r.steps == 12
    assert r.lr == pytest.approx(lm.TINY_LM.lr * qat.FINETUNE_LR_RATIO)
    assert len(r.qat_losses) == len(r.minmax_losses) == len(r.control_losses) == 12
    assert len(r.scales) == len(r.layers) == 7 * lm.TINY_LM.n_layer
    assert r.scale_change_median > 0  # the step sizes were trained
    assert all(s.rows > 0 and s.min_ratio <= s.median_ratio <= s.max_ratio for s in r.scales)
    for q in (r.reference, r.ptq, r.qat, r.qat_minmax, r.control, r.control_fp32):
        assert q.excess > -0.05 and 0 <= q.accuracy <= 1
    assert "learned scale" in r.table()


def test_ptq_model_matches_absmax_rtn(small_reference):
    model = small_reference.model
    q_model = qat.ptq_model(model, 3)
    w = model.blocks[0].mlp.up_proj.weight.detach()
    q, st = absmax_quantize(w, 3, granularity="row")
    assert torch.equal(q_model.blocks[0].mlp.up_proj.weight.detach(), dequantize(q, st))
    assert torch.equal(q_model.lm_head.weight, model.lm_head.weight)  # the head stays fp32


def test_torch_fake_quant_facts_are_consistent():
    t = qat.torch_fake_quant_facts()
    assert t.torch_version == torch.__version__
    if t.default_qat_weight is not None:
        assert t.scale_is_parameter != t.scale_is_buffer
        assert isinstance(t.scale_gets_grad, bool) and isinstance(t.scale_follows_data, bool)
    if t.learnable is not None:
        assert isinstance(t.learnable_scale_is_parameter, bool)


def test_claim_c19_verdict_is_computed(qat_result, monkeypatch):
    """QAT as PyTorch ships it (min/max scales) is the claim's setting; LSQ is the move."""
    import memlab.quant.claims as quant_claims
    from memlab import claims

    monkeypatch.setattr(quant_claims, "qat_vs_ptq_ci", lambda bits: qat_result)
    check = claims.CHECKS["C19"]
    v = check.decide(check.evidence())  # uncached: the small run stands in for 'ci'
    assert v.verdict == claims.WRONG and "min/max" in v.note
    assert f"{qat_result.minmax_change_median:.1%}" in v.evidence
    lsq = check.decide(check.evidence(scale_mode="learned"))
    still = [s for s in qat_result.scales if s.moved_share == 0]
    if qat_result.scale_change_median <= qat.MOVED:
        assert lsq.verdict == claims.WRONG
    else:
        assert lsq.verdict == (claims.CAVEAT if still else claims.HOLDS)
    assert f"{qat_result.scale_change_median:.1%}" in lsq.evidence


# optimizer_comparison -------------------------------------------------------------------------------
def _independent_8bit_bytes(cfg):
    """AdamW8bit on a fresh model, one step; bytes per parameter of its 8-bit tensors, by hand."""
    bnb = pytest.importorskip("bitsandbytes")
    model = lm.build_model(cfg.model_config(), seed=0)
    opt = bnb.optim.AdamW8bit(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    eight = [p for p in model.parameters() if opt.state[p]["state1"].dtype == torch.uint8]
    tables = {}
    own = 0
    for p in eight:
        for k, t in opt.state[p].items():
            if not isinstance(t, torch.Tensor):
                continue
            if k.startswith("qmap"):
                tables[t.data_ptr()] = t.numel() * t.element_size()
            else:
                own += t.numel() * t.element_size()
    n = sum(p.numel() for p in eight)
    small = [p.numel() for p in model.parameters() if opt.state[p]["state1"].dtype != torch.uint8]
    return (own + sum(tables.values())) / n, n, sum(small), opt.args.min_8bit_size, model, eight


def test_optimizer_bytes_per_param(comparison):
    adamw, adamw8 = comparison.run("adamw"), comparison.run("adamw-8bit")
    assert adamw.bytes_per_param == pytest.approx(8.0, rel=1e-3)  # + 4 B of 'step' per tensor
    assert adamw.eligible_bytes_per_param == pytest.approx(8.0, rel=1e-3)
    assert 2.0 < adamw8.eligible_bytes_per_param < 2.1
    assert adamw8.small_bytes_per_param == pytest.approx(8.0)  # small tensors stay fp32
    by_hand, n, small, min_size, model, eight = _independent_8bit_bytes(lm.TINY_LM)
    assert adamw8.eligible_bytes_per_param == pytest.approx(by_hand, rel=1e-12)
    assert comparison.eligible_params == n and comparison.small_params == small
    assert comparison.min_8bit_size == min_size
    names = {id(p): k for k, p in model.named_parameters()}
    assert set(comparison.eligible_tensors) == {names[id(p)] for p in eight}
    assert all(p.numel() >= min_size for p in eight)
    assert adamw8.shared_bytes == 2 * 256 * 4  # the two code books, once
    assert adamw8.state_bytes < adamw.state_bytes / 3


def test_optimizer_runs_share_data_and_record_curves(comparison):
    a, b = comparison.run("adamw"), comparison.run("adamw-8bit")
    assert len(a.losses) == len(b.losses) == 4
    assert a.losses[0] == pytest.approx(b.losses[0], abs=1e-6)  # same init, same first batch
    assert a.trained_params == b.trained_params
    assert "adamw-8bit" in comparison.table()


# Bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 9, 0, 2.5, True])
def test_bad_bits(bits):
    with pytest.raises(MemlabError, match="bits"):
        qat.FakeQuantLinear(_linear(), bits)


def test_bad_input_to_experiments(small_reference):
    with pytest.raises(MemlabError, match="bits"):
        qat.qat_vs_ptq("ci", bits=1, reference=small_reference)
    with pytest.raises(MemlabError, match="bits"):
        qat.qat_vs_ptq("ci", bits=9, reference=small_reference)
    with pytest.raises(MemlabError, match="steps"):
        qat.qat_vs_ptq("ci", steps=0, reference=small_reference)
    with pytest.raises(MemlabError, match="lr"):
        qat.qat_vs_ptq("ci", lr=0.0, reference=small_reference)
    with pytest.raises(MemlabError, match="steps"):
        qat.optimizer_comparison("ci", steps=0, config=lm.TINY_LM)
    with pytest.raises(MemlabError, match="unknown optimizer 'lion'"):
        qat.optimizer_comparison("ci", steps=2, config=lm.TINY_LM, optimizers=("adamw", "lion"))
    with pytest.raises(MemlabError, match="adamw-8bit"):
        qat.optimizer_comparison("ci", steps=2, config=lm.TINY_LM, optimizers=("adamw",))
    with pytest.raises(MemlabError, match="scale_mode"):
        qat.FakeQuantLinear(_linear(), 4, scale_mode="ema")
    with pytest.raises(MemlabError, match="nn.Linear"):
        qat.FakeQuantLinear(nn.Conv1d(2, 2, 1), 4)
    with pytest.raises(MemlabError, match="blocks"):
        qat.wrap_linears(nn.Sequential(nn.Linear(2, 2)), 4)


def test_optimizer_frame_pairs_each_run_with_adamw(comparison):
    pytest.importorskip("pandas")
    df = comparison.frame()
    assert list(df.index) == [r.optimizer for r in comparison.runs]
    assert df.loc["adamw", "vs adamw (nats)"] == 0 and df.loc["adamw", "2 SE"] == 0
    gap = df.loc["adamw-8bit", "vs adamw (nats)"]
    assert gap == pytest.approx(comparison.loss_gap, abs=2e-6)
    assert df.loc["adamw-8bit", "2 SE"] > 0
    assert "train s" not in df.columns  # timings never go in a checked table


def test_default_reference_runs_once_for_the_chapter_and_c19(monkeypatch, small_reference):
    """qat_vs_ptq(bits=3) on the chapter's scale and device, and qat_vs_ptq_ci(3), are one run."""
    calls = []

    def fake_run(scale, bits, steps, dev, lr, ref):
        calls.append((scale, bits, steps, dev.type, lr))
        return ("result", len(calls))

    monkeypatch.setattr(qat, "_qat_vs_ptq", fake_run)
    monkeypatch.setattr(qat, "reference_model", lambda scale, device=None: small_reference)
    monkeypatch.setenv("MEMLAB_DEVICE", "cpu")
    monkeypatch.delenv("MEMLAB_CACHE_DIR", raising=False)
    qat._qat_vs_ptq_default.cache_clear()
    qat.qat_vs_ptq_ci.cache_clear()
    try:
        first = qat.qat_vs_ptq("ci", bits=3)
        assert qat.qat_vs_ptq_ci(3) is first
        assert qat.qat_vs_ptq("ci", bits=3, steps=qat.QAT_STEPS["ci"], device="cpu") is first
        assert calls == [("ci", 3, qat.QAT_STEPS["ci"], "cpu", None)]
        qat.qat_vs_ptq("ci", bits=4, device="cpu")  # other arguments: another run
        assert len(calls) == 2
        qat.qat_vs_ptq("ci", bits=3, device="cpu", reference=small_reference)  # never cached
        assert len(calls) == 3
    finally:
        qat._qat_vs_ptq_default.cache_clear()
        qat.qat_vs_ptq_ci.cache_clear()
