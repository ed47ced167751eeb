"""memlab.quant.schemes: bytes, structure, quality and errors of every scheme on a small trained model.

Every figure is checked against a count or a computation made here, independently of the module
(stored bytes from the layer shapes, losses from ``F.cross_entropy`` and the chain's own table,
weights from :mod:`memlab.quant.functional`), or against a fact that must hold whatever the training noise.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memlab.model.lm as lm
import memlab.quant as quant
from memlab.errors import MemlabError
from memlab.model.config import ModelConfig
from memlab.model.transformer import block_linears, build_model, count_parameters
from memlab.quant.functional import (
    bits_per_parameter,
    dequantize,
    quantize_4bit,
    zeropoint_quantize,
)

# A smaller model than the CI one (d 64, 40 training steps), so the whole file runs in seconds.
BNB_SCHEMES = ("int8", "llm-int8", "nf4", "fp4", "nf4-dq")
# compare_schemes on the schemes the ordering checks need (not in SCHEMES order on purpose).
COMPARED = ("fp32", "rtn-4", "gptq-4", "rtn-3", "gptq-3", "int8", "nf4", "nf4-dq")
LINEARS_PER_BLOCK = 7  # q, k, v, o; gate, up, down
NORMED = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def _needs_bnb(scheme: str) -> None:
    if scheme in BNB_SCHEMES:
        pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def reference(tiny_reference):
    """The trained lm.TINY_LM model, and a copy of its weights taken before anything quantizes it."""
    return tiny_reference, copy.deepcopy(tiny_reference.model.state_dict())


@pytest.fixture(scope="module")
def quantize(reference):
    """quantize_model(reference, scheme), once per scheme."""
    done = {}

    def get(scheme):
        _needs_bnb(scheme)
        if scheme not in done:
            done[scheme] = quant.quantize_model(reference[0], scheme, device="cpu")
        return done[scheme]

    return get


@pytest.fixture(scope="module")
def comparison(reference):
    pytest.importorskip("bitsandbytes")
    return quant.compare_schemes(config=lm.TINY_LM, schemes=COMPARED, device="cpu")


@pytest.fixture(scope="module")
def study(reference):
    pytest.importorskip("bitsandbytes")
    return quant.outlier_study(config=lm.TINY_LM, n_channels=2, device="cpu")


def _tokens(n=4, seed=123):
    x, _ = lm.TINY_LM.task().sample(n, lm.TINY_LM.seq_len, seed=seed)
    return x


def _logits(model, x):
    with torch.no_grad():
        return model(x).float()


# Stored bytes ---------------------------------------------------------------------------------
def _expected_weight_bytes(scheme: str, out_f: int, in_f: int) -> int:
    """What a block linear's weight should take, counted from its shape alone."""
    n = out_f * in_f
    blocks = math.ceil(n / 64)  # bitsandbytes' 4-bit blocks, and RTN/GPTQ groups (GROUP_SIZE)
    if scheme == "fp32":
        return 4 * n
    if scheme == "bf16":
        return 2 * n
    if scheme in ("int8", "llm-int8"):
        return n + 4 * out_f  # int8 codes, one fp32 absmax per output row
    if scheme in ("nf4", "fp4"):
        return math.ceil(n / 2) + 4 * blocks  # two codes a byte, one fp32 absmax per block
    if scheme == "nf4-dq":  # uint8 absmax per block, an fp32 per 256 of them, and the fp32 offset
        return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256) + 4
    bits = int(scheme[-1])  # rtn-b, gptq-b: packed codes, fp16 scale and packed zero per group
    return math.ceil(n * bits / 8) + 2 * blocks + math.ceil(blocks * bits / 8)


@pytest.mark.parametrize("scheme", quant.MODEL_SCHEMES)
def test_block_linear_bytes_match_an_independent_count(reference, quantize, scheme):
    ref = reference[0].model
    qm = quantize(scheme)
    linears = block_linears(ref)
    assert list(qm.layers) == list(linears)
    for name, lin in linears.items():
        st = qm.layers[name]
        assert st.params == lin.weight.numel()
        assert st.weight_bytes == _expected_weight_bytes(scheme, *lin.weight.shape), name
        assert st.bits_per_param == pytest.approx(8 * st.weight_bytes / st.params)
        assert st.saved_bytes >= st.weight_bytes
    assert qm.linear_params == sum(lin.weight.numel() for lin in linears.values())
    assert qm.linear_params + qm.other_params == count_parameters(ref)
    assert qm.other_bytes == (4 if scheme == "fp32" else 2) * qm.other_params
    assert qm.total_bytes == qm.linear_bytes + qm.other_bytes


@pytest.mark.parametrize("scheme", BNB_SCHEMES)
def test_bitsandbytes_saved_bytes_are_the_state_dict(quantize, scheme):
    """saved_bytes counts everything the module would serialize: at least the weight bytes."""
    qm = quantize(scheme)
    for name, st in qm.layers.items():
        sd = qm.model.get_submodule(name).state_dict()
        total = sum(t.numel() * t.element_size() for t in sd.values() if isinstance(t, torch.Tensor))
        assert st.saved_bytes == total >= st.weight_bytes


def test_nf4_double_quant_bits_close_to_the_formula(quantize):
    """Per layer it is above the formula only by the partial 256-block and the fp32 offset."""
    formula = bits_per_parameter("nf4", double_quant=True)
    for st in quantize("nf4-dq").layers.values():
        assert formula < st.bits_per_param < formula + 0.02


def test_layer_bytes_of_a_plain_linear():
    lin = nn.Linear(40, 24, bias=True)
    st = quant.layer_bytes(lin, lin.weight.numel())
    assert st == quant.LayerStorage(960, 4 * 960, 4 * (960 + 24))  # weight only; + bias saved
    assert st.bits_per_param == 32


def test_layer_bytes_of_an_int8_layer_after_a_forward(quantize):
    pytest.importorskip("bitsandbytes")
    name = "blocks.0.attn.q_proj"
    m = copy.deepcopy(quantize("int8").model.get_submodule(name))
    before = quant.layer_bytes(m, 64 * 64)
    with torch.no_grad():
        m(torch.randn(3, 64))
    assert quant.layer_bytes(m, 64 * 64).weight_bytes == before.weight_bytes == 64 * 64 + 4 * 64


def test_biases_of_rtn_layers_are_counted_once(reference):
    """A GPT-2-style block has biases (the book's Llama-style one has none)."""
    cfg = ModelConfig(style="gpt2", vocab_size=16, d_model=64, n_head=4, n_layer=1, max_seq_len=32)
    model = build_model(cfg, seed=0)
    qm = quant.quantize_model(replace(reference[0], model=model), "rtn-4", device="cpu")
    linears = block_linears(model)
    codes = sum(_expected_weight_bytes("rtn-4", *m.weight.shape) for m in linears.values())
    biases = sum(m.bias.numel() for m in linears.values())
    rest = count_parameters(model) - qm.linear_params - biases
    # Each bias once: in 16-bit with the rest (2 bytes) or in fp32 with its layer (4 bytes).
    assert qm.total_bytes <= codes + 2 * rest + 4 * biases


# Structure of the quantized model ---------------------------------------------------------------
def _replacement_type(scheme):
    if scheme in ("fp32", "bf16"):
        return nn.Linear
    if scheme.startswith(("rtn", "gptq")):
        return quant.DequantizedLinear
    import bitsandbytes as bnb

    return bnb.nn.Linear8bitLt if "int8" in scheme else bnb.nn.Linear4bit


@pytest.mark.parametrize("scheme", quant.MODEL_SCHEMES)
def test_only_the_block_linears_are_replaced(reference, quantize, scheme):
    ref, qm = reference[0].model, quantize(scheme)
    linear_names = set(block_linears(ref))
    assert len(linear_names) == LINEARS_PER_BLOCK * lm.TINY_LM.n_layer
    kind = _replacement_type(scheme)
    ref_mods, q_mods = dict(ref.named_modules()), dict(qm.model.named_modules())
    for name in linear_names:
        assert type(q_mods[name]) is kind, name
    for name, m in ref_mods.items():  # everything else keeps its type (norms, embedding, head)
        if name not in linear_names and not name.startswith(tuple(n + "." for n in linear_names)):
            assert type(q_mods[name]) is type(m), name
    # Embedding, norms and LM head: unquantized, in bf16 (stored as fp32) unless the scheme is fp32.
    q_params = dict(qm.model.named_parameters())
    others = [n for n, _ in ref.named_parameters() if n.rsplit(".", 1)[0] not in linear_names]
    assert {"tok_emb.weight", "lm_head.weight", "norm_f.weight", "blocks.0.norm1.weight"} <= set(others)
    for n in others:
        want = reference[1][n]
        want = want if scheme == "fp32" else want.to(torch.bfloat16).float()
        assert q_params[n].dtype == torch.float32
        assert torch.equal(q_params[n].detach(), want), n


def test_quantize_model_leaves_the_reference_unchanged(reference, quantize):
    have_bnb = importlib.util.find_spec("bitsandbytes") is not None
    for s in quant.MODEL_SCHEMES:
        if have_bnb or s not in BNB_SCHEMES:
            quantize(s)
    ref, before = reference
    after = ref.model.state_dict()
    assert set(after) == set(before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(m) is nn.Linear for m in block_linears(ref.model).values())


def test_fp32_scheme_computes_the_reference_exactly(reference, quantize):
    x = _tokens()
    assert torch.equal(_logits(quantize("fp32").model, x), _logits(reference[0].model, x))


def test_bf16_scheme_is_the_reference_rounded_to_bf16(reference, quantize):
    ref, qm = reference[0].model, quantize("bf16")
    for name, lin in block_linears(ref).items():
        got = qm.model.get_submodule(name).weight
        assert torch.equal(got, lin.weight.to(torch.bfloat16).float())
    x = _logits(ref, _tokens())
    torch.testing.assert_close(_logits(qm.model, _tokens()), x, rtol=0, atol=2e-2 * x.abs().max())


@pytest.mark.parametrize("scheme", ["rtn-4", "rtn-3"])
def test_rtn_layers_hold_the_zeropoint_weights(reference, quantize, scheme):
    """y = x W_q^T, W_q from memlab.quant.functional's zero-point code per group of 64, fp16 scales."""
    bits = int(scheme[-1])
    ref, qm = reference[0].model, quantize(scheme)
    x = torch.randn(9, lm.TINY_LM.d_ff)
    for name, lin in block_linears(ref).items():
        q, st = zeropoint_quantize(lin.weight.detach(), bits, granularity="block", blocksize=64,
                                   scale_dtype=torch.float16)
        wq = dequantize(q, st)
        layer = qm.model.get_submodule(name)
        assert torch.equal(layer.weight.detach(), wq), name
        xin = x[:, : lin.in_features]
        with torch.no_grad():
            torch.testing.assert_close(layer(xin), xin @ wq.T, rtol=1e-5, atol=1e-6)


def test_dequantized_linear_with_bias():
    from memlab.quant.gptq import rtn_quantize

    torch.manual_seed(0)
    lin = nn.Linear(128, 24, bias=True)
    q, st = rtn_quantize(lin.weight.detach(), 3, group_size=64)
    dl = quant.DequantizedLinear(lin, q, st)
    q2, st2 = zeropoint_quantize(lin.weight.detach(), 3, granularity="block", blocksize=64,
                                 scale_dtype=torch.float16)
    x = torch.randn(5, 128)
    with torch.no_grad():
        torch.testing.assert_close(dl(x), x @ dequantize(q2, st2).T + lin.bias, rtol=1e-5,
                                   atol=1e-6)
    n, groups = 128 * 24, 128 * 24 // 64
    # the weight's codes, fp16 scales and packed zeros; the bias is counted with the other parameters
    assert dl.stored_bytes == 3 * n // 8 + 2 * groups + math.ceil(3 * groups / 8)


@pytest.mark.parametrize("bits", [4, 3])
def test_gptq_layers_are_on_a_grid_per_group(quantize, bits):
    """Every group of 64 weights of a GPTQ layer takes at most 2^bits values."""
    for name in quantize(f"gptq-{bits}").layers:
        w = quantize(f"gptq-{bits}").model.get_submodule(name).weight.detach().reshape(-1, 64)
        assert max(len(torch.unique(g)) for g in w) <= 2**bits, name


@pytest.mark.parametrize("scheme, quant_type, nested", [
    ("nf4", "nf4", False), ("fp4", "fp4", False), ("nf4-dq", "nf4", True)])
def test_bitsandbytes_4bit_layers_hold_memlab_codes(reference, scheme, quant_type, nested):
    """Freshly quantized (bitsandbytes repacks CPU weights on the first forward)."""
    bf = pytest.importorskip("bitsandbytes.functional")
    qm = quant.quantize_model(reference[0], scheme, device="cpu")
    for name, lin in block_linears(reference[0].model).items():
        if not name.startswith("blocks.0."):
            continue  # one block is enough, and quicker
        w = qm.model.get_submodule(name).weight
        qs = w.quant_state
        assert (qs.quant_type, qs.blocksize, qs.nested) == (quant_type, 64, nested)
        q, st = quantize_4bit(lin.weight.detach(), quant_type=quant_type, double_quant=nested)
        assert torch.equal(w.data.reshape(-1), q)  # the same packed 4-bit codes
        # Double quantization: bitsandbytes' native CPU kernel picks a neighbouring 8-bit code
        # for a few absmax values (see test_quant.py), so those blocks differ by a hair.
        tol = {"rtol": 1e-3, "atol": 1e-6} if nested else {"rtol": 1e-6, "atol": 1e-7}
        torch.testing.assert_close(bf.dequantize_4bit(w.data, qs).float(), dequantize(q, st),
                                   **tol)


def test_int8_schemes_differ_only_in_threshold(quantize):
    for scheme, threshold in (("int8", 0.0), ("llm-int8", quant.LLM_INT8_THRESHOLD)):
        for name in quantize(scheme).layers:
            assert quantize(scheme).model.get_submodule(name).state.threshold == threshold


# Quality ----------------------------------------------------------------------------------------
def test_evaluate_matches_an_independent_computation(reference):
    ref = reference[0]
    task = lm.TINY_LM.task()
    x, y = lm.eval_batch(lm.TINY_LM)
    assert x.shape == y.shape == (lm.TINY_LM.eval_sequences, lm.TINY_LM.seq_len)
    logits = _logits(ref.model, x)[:, 1:]  # order 2: the first position has no full context
    tgt = y[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, lm.TINY_LM.vocab_size), tgt.reshape(-1))
    acc = (logits.argmax(-1) == tgt).double().mean()
    rows = task.transition[x[:, :-1] * lm.TINY_LM.vocab_size + x[:, 1:]]  # (n, T-1, V): the chain
    best_loss = -rows.gather(-1, tgt.unsqueeze(-1)).log().mean()
    best_acc = (rows.argmax(-1) == tgt).double().mean()
    q = lm.evaluate(ref.model, lm.TINY_LM)
    assert q.loss == pytest.approx(float(loss), rel=1e-5)
    assert q.accuracy == pytest.approx(float(acc))
    assert q.best_loss == pytest.approx(float(best_loss), rel=1e-9)
    assert q.best_accuracy == pytest.approx(float(best_acc))
    assert q.perplexity == pytest.approx(math.exp(float(loss)), rel=1e-5)
    assert q.excess == pytest.approx(q.loss - q.best_loss)


def test_trained_model_beats_an_untrained_one(reference):
    trained = lm.evaluate(reference[0].model, lm.TINY_LM)
    untrained = lm.evaluate(build_model(lm.TINY_LM.model_config(), seed=lm.TINY_LM.seed).eval(), lm.TINY_LM)
    for q in (trained, untrained):
        assert q.excess > -1e-3  # no model beats the chain on its own tokens (up to noise)
        assert 0 <= q.accuracy <= q.best_accuracy + 0.05 and q.best_accuracy <= 1
    assert untrained.loss > math.log(lm.TINY_LM.vocab_size)  # worse than uniform guessing
    assert untrained.excess > trained.excess + 0.25
    assert trained.best_loss == untrained.best_loss  # the same held-out tokens


# compare_schemes --------------------------------------------------------------------------------
def test_comparison_rows_follow_the_requested_schemes(comparison, quantize, reference):
    assert [r.scheme for r in comparison.rows] == list(COMPARED)
    assert comparison.config == lm.TINY_LM
    assert comparison.reference == lm.evaluate(reference[0].model, lm.TINY_LM)
    for s in COMPARED:
        row, qm = comparison.row(s), quantize(s)
        assert row.scheme == s and row.label == quant.MODEL_LABELS[s]
        assert (row.linear_bytes, row.other_bytes, row.total_bytes, row.linear_params) == (
            qm.linear_bytes, qm.other_bytes, qm.total_bytes, qm.linear_params)
        assert row.bits_per_param == pytest.approx(8 * qm.linear_bytes / qm.linear_params)
        assert row.excess == pytest.approx(row.loss - comparison.reference.best_loss)
        assert row.perplexity == pytest.approx(math.exp(row.loss))
        errs = comparison.layer_errors[s]
        assert list(errs) == list(qm.layers)
        assert row.mean_layer_error == pytest.approx(sum(errs.values()) / len(errs))
        assert row.max_layer_error == max(errs.values())
    assert comparison.row("fp32").mean_layer_error == 0
    assert comparison.row("fp32").loss == comparison.reference.loss


def test_comparison_layer_error_recomputed(comparison, reference, quantize):
    """||y_q - y|| / ||y|| of one layer on the reference's own inputs, from a hook of our own:
    held-out sequences, as many as the calibration set, never the calibration ones GPTQ fits to."""
    name = "blocks.1.mlp.down_proj"
    ref = reference[0].model
    seen = {}
    h = ref.get_submodule(name).register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    try:
        _logits(ref, lm.eval_batch(lm.TINY_LM)[0][: lm.TINY_LM.calib_sequences])
    finally:
        h.remove()
    x = seen["x"].reshape(-1, lm.TINY_LM.d_ff)
    with torch.no_grad():
        y = x @ ref.get_submodule(name).weight.T
        yq = quantize("rtn-4").model.get_submodule(name)(x)
    expected = float((yq - y).norm() / y.norm())
    assert comparison.layer_errors["rtn-4"][name] == pytest.approx(expected, rel=1e-4)


def test_comparison_error_orderings(comparison):
    err = {r.scheme: r.mean_layer_error for r in comparison.rows}
    assert err["gptq-4"] < err["rtn-4"]  # GPTQ compensates the rounding error
    assert err["gptq-3"] < err["rtn-3"]
    assert err["rtn-3"] > err["rtn-4"]  # fewer bits, more error
    assert err["int8"] < err["nf4"]
    assert err["nf4"] == pytest.approx(err["nf4-dq"], rel=0.05)  # same codes, rounded scales
    assert all(v > 0 for k, v in err.items() if k != "fp32")


def test_comparison_bits_per_param_match_the_formula(comparison):
    assert comparison.row("rtn-4").bits_per_param == pytest.approx(
        bits_per_parameter("int4-zp", blocksize=quant.GROUP_SIZE), abs=0.02)
    assert comparison.row("rtn-3").bits_per_param == pytest.approx(
        bits_per_parameter("int3-zp", blocksize=quant.GROUP_SIZE), abs=0.02)
    assert comparison.row("nf4").bits_per_param == pytest.approx(bits_per_parameter("nf4"), abs=0.02)
    assert comparison.row("nf4-dq").bits_per_param == pytest.approx(
        bits_per_parameter("nf4", double_quant=True), abs=0.02)
    assert comparison.row("fp32").bits_per_param == 32


def test_comparison_is_computed_once(comparison):
    again = quant.compare_schemes(config=lm.TINY_LM, schemes=list(COMPARED), device="cpu")
    assert again is comparison


def test_comparison_unknown_scheme(comparison):
    with pytest.raises(MemlabError, match=r"unknown scheme 'fp16'; accepted: fp32, rtn-4, "):
        comparison.row("fp16")
    with pytest.raises(MemlabError, match=r"unknown scheme 'bf16'; accepted: fp32, rtn-4, "):
        comparison.row("bf16")  # a scheme memlab knows, but not in this comparison
    with pytest.raises(MemlabError, match=r"unknown scheme 'int4'; accepted: fp32, bf16, int8, "):
        quant.compare_schemes(config=lm.TINY_LM, schemes=("fp32", "int4"), device="cpu")


def test_comparison_table_vs_fp32_when_fp32_is_not_first(reference):
    pytest.importorskip("pandas")
    comp = quant.compare_schemes(config=lm.TINY_LM, schemes=("bf16", "fp32"), device="cpu")
    table = comp.table()
    assert table.loc["fp32", "memory / fp32's"] == 1.0
    assert table.loc["bf16", "memory / fp32's"] == pytest.approx(
        comp.row("bf16").total_bytes / comp.row("fp32").total_bytes)


def test_comparison_table_columns_name_their_units(comparison):
    pytest.importorskip("pandas")
    memory, quality, both = (comparison.table(c) for c in ("memory", "quality", "all"))
    assert list(memory.columns) == ["linear KiB", "bits per linear weight",
                                    "bits per parameter (whole model)", "total KiB",
                                    "memory / fp32's"]
    assert "loss - fp32's (nats)" in quality.columns and "2 SE (nats)" in quality.columns
    assert list(both.columns) == list(memory.columns) + list(quality.columns)
    assert len(set(both.columns)) == len(both.columns)  # no two columns share a name
    for r in comparison.rows:
        assert memory.loc[r.scheme, "bits per linear weight"] == r.bits_per_param
        assert quality.loc[r.scheme, "loss - fp32's (nats)"] == r.loss_delta
        assert quality.loc[r.scheme, "2 SE (nats)"] == 2 * r.loss_delta_se
    with pytest.raises(MemlabError, match="accepted: all, memory, quality"):
        comparison.table("bytes")


def test_whole_model_bits_per_parameter(comparison, reference):
    n_all = count_parameters(reference[0].model)
    for r in comparison.rows:
        assert r.linear_bits_per_param == r.bits_per_param
        assert r.model_bits_per_param == pytest.approx(8 * r.total_bytes / n_all)
        assert r.linear_params + r.other_params == n_all
    nf4 = comparison.row("nf4")
    # the 16-bit embedding, norms and head raise the whole model above the linear layers' bits
    assert nf4.model_bits_per_param > nf4.bits_per_param
    assert comparison.row("fp32").model_bits_per_param == 32


def test_paired_differences_use_the_same_sequences(comparison):
    for r in comparison.rows:
        d, se = comparison.paired(r.scheme, "fp32")
        assert (d, se) == pytest.approx((r.loss_delta, r.loss_delta_se), abs=1e-12)
    assert comparison.paired("nf4", "nf4") == (0.0, 0.0)
    d_ab, se_ab = comparison.paired("rtn-4", "gptq-4")
    d_ba, se_ba = comparison.paired("gptq-4", "rtn-4")
    assert d_ab == pytest.approx(-d_ba) and se_ab == pytest.approx(se_ba)
    with pytest.raises(MemlabError, match="unknown against 'int4'"):
        comparison.paired("nf4", "int4")


def test_noise_check_counts_chance_crossings(comparison):
    nc = quant.noise_check(comparison, z=2.0)
    n = len(comparison.rows) - 1
    assert nc.comparisons == n == len(nc.rows)
    assert nc.coverage == pytest.approx(0.9544997, abs=1e-6)
    assert nc.expected_by_chance == pytest.approx(n * (1 - nc.coverage))
    # Bonferroni: the per-comparison miss rate divided by n, as a two-sided normal quantile
    miss = (1 - nc.coverage) / n
    assert math.erfc(nc.z_family / math.sqrt(2)) == pytest.approx(miss, rel=1e-6)
    assert nc.z_family > 2
    for row in nc.rows:
        r = comparison.row(row.scheme)
        assert row.beyond == (abs(r.loss_delta) > 2 * r.loss_delta_se)
        assert row.beyond_corrected == (abs(r.loss_delta) > nc.z_family * r.loss_delta_se)
        assert not row.beyond_corrected or row.beyond
    assert list(nc.frame().index) == [r.scheme for r in nc.rows]
    for bad in (0, -1.0, True, "2"):
        with pytest.raises(MemlabError, match="z must be a positive number"):
            quant.noise_check(comparison, z=bad)


# GPTQ column by column on the chapter's model ----------------------------------------------
@pytest.mark.parametrize("layer", ["blocks.0.mlp.down_proj", "blocks.1.attn.q_proj"])
def test_gptq_layer_by_column_reproduces_the_schemes_codes(quantize, layer):
    lt = quant.gptq_layer_by_column(layer, 3, config=lm.TINY_LM, device="cpu")
    model_weight = quantize("gptq-3").model.get_submodule(layer).weight.detach()
    assert torch.equal(dequantize(lt.run.codes, lt.run.state), model_weight)
    path = lt.path
    assert path["columns"][0] == 0 and path["columns"][-1] == lt.run.weight.shape[1]
    assert path["gptq"][0] == 0 and path["rtn"][0] == 0
    assert path["gptq"][-1] < path["rtn"][-1]  # compensation lowers the calibration error


def test_gptq_layer_by_column_rejects_bad_arguments(reference):
    with pytest.raises(MemlabError, match="unknown layer 'blocks.0.mlp'"):
        quant.gptq_layer_by_column("blocks.0.mlp", config=lm.TINY_LM, device="cpu")
    with pytest.raises(MemlabError, match="bits must be between 2 and 8"):
        quant.gptq_layer_by_column(bits=9, config=lm.TINY_LM, device="cpu")
    with pytest.raises(MemlabError, match="group_size must be a positive integer"):
        quant.gptq_layer_by_column(group_size=0, config=lm.TINY_LM, device="cpu")


# Outlier features -------------------------------------------------------------------------------
def test_inject_outliers_keeps_the_function(reference):
    ref, before = reference[0].model, reference[1]
    channels, alpha = [3, 40], 10.0  # not a power of two: the rounding is not exact
    inj = quant.inject_outliers(ref, channels, alpha)
    assert inj is not ref
    x = _tokens()
    y, yi = _logits(ref, x), _logits(inj, x)
    assert float((yi - y).abs().max()) < 1e-3 * float(y.abs().max())
    p_ref, p_inj = ref.state_dict(), inj.state_dict()
    assert all(torch.equal(p_ref[k], before[k]) for k in before)  # the original is untouched
    mask = torch.zeros(lm.TINY_LM.d_model, dtype=torch.bool)
    mask[channels] = True
    for k, v in p_inj.items():
        parts = k.split(".")
        if parts[-2] in ("norm1", "norm2"):
            torch.testing.assert_close(v[mask], before[k][mask] * alpha)
            assert torch.equal(v[~mask], before[k][~mask])
        elif ".".join(parts[2:4]) in NORMED:
            torch.testing.assert_close(v[:, mask], before[k][:, mask] / alpha)
            assert torch.equal(v[:, ~mask], before[k][:, ~mask])
        else:  # o_proj, down_proj, the embedding, the final norm and the head
            assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("alpha", [0, -2.0, float("nan")])
def test_inject_outliers_rejects_bad_alpha(reference, alpha):
    with pytest.raises(MemlabError, match=f"alpha must be positive, got {alpha!r}"):
        quant.inject_outliers(reference[0].model, [0], alpha)


@pytest.mark.parametrize("channels", [[-1], [lm.TINY_LM.d_model], [0, 10**6]])
def test_inject_outliers_rejects_channels_out_of_range(reference, channels):
    with pytest.raises(MemlabError, match=rf"channels must lie in 0\.\.{lm.TINY_LM.d_model - 1}"):
        quant.inject_outliers(reference[0].model, channels, 8.0)


def test_activation_outliers_match_inputs_captured_here(reference):
    ref = quant.inject_outliers(reference[0].model, [5], 8.0)
    linears = block_linears(ref)
    seen = {}
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: seen.update({n: a[0]}))
             for n, m in linears.items()]
    try:
        _logits(ref, lm.eval_batch(lm.TINY_LM, calibration=True)[0])
    finally:
        for h in hooks:
            h.remove()
    for threshold in (quant.LLM_INT8_THRESHOLD, 1.0):
        stats = quant.activation_outliers(ref, lm.TINY_LM, threshold=threshold)
        assert [s.layer for s in stats] == list(linears)
        for s in stats:
            x = seen[s.layer].reshape(-1, linears[s.layer].in_features)
            big = x.abs() >= threshold
            assert s.features == linears[s.layer].in_features
            assert s.max_abs == pytest.approx(float(x.abs().max()))
            assert s.outlier_columns == int(big.any(0).sum()) <= s.features
            assert s.rows_touched == pytest.approx(float(big.any(1).double().mean()))
            assert 0 <= s.rows_touched <= 1
            assert (s.outlier_columns == 0) == (s.rows_touched == 0)
    # Feature 5 is 8x larger in every normed input: an outlier column at a low threshold.
    assert all(s.outlier_columns >= 1 for s in stats if s.layer.split(".", 2)[2] in NORMED)


def test_outlier_study_injected_outliers(study):
    assert len(study.channels) == 2 == len(set(study.channels))
    assert study.channels == sorted(study.channels)
    assert all(0 <= c < lm.TINY_LM.d_model for c in study.channels)
    assert len(study.found) == len(study.injected) == LINEARS_PER_BLOCK * lm.TINY_LM.n_layer
    for s in study.injected:
        if s.layer.split(".", 2)[2] in NORMED:
            assert s.outlier_columns >= len(study.channels), s
    assert study.injected_fp32_change < 1e-3


def test_outlier_study_llm_int8_beats_int8_on_outliers(study):
    rows = {r.scheme: r for r in study.rows}
    assert list(rows) == ["fp32", "int8", "llm-int8", "injected fp32", "injected int8",
                          "injected llm-int8"]
    assert rows["fp32"].mean_layer_error == rows["injected fp32"].mean_layer_error == 0
    assert rows["injected llm-int8"].mean_layer_error <= rows["injected int8"].mean_layer_error
    assert rows["injected int8"].mean_layer_error > rows["int8"].mean_layer_error
    assert study.scratch_vs_bnb < 1e-2


def test_outlier_study_sweep(study):
    n = len(study.sweep_alpha)
    assert n == len(study.sweep_int8) == len(study.sweep_llm_int8) > 1
    assert study.sweep_alpha == sorted(study.sweep_alpha)
    for e8, ellm in zip(study.sweep_int8, study.sweep_llm_int8, strict=True):
        assert 0 < ellm <= e8 * (1 + 1e-6)
    assert study.sweep_int8[-1] > 5 * study.sweep_int8[0]  # plain int8 suffers from big outliers
    layer = next(s for s in study.found if s.layer == study.sweep_layer)
    if layer.outlier_columns == 0 and study.sweep_alpha[0] == 1:  # no outlier: the same matmul
        assert study.sweep_int8[0] == study.sweep_llm_int8[0]


@pytest.mark.parametrize("kwargs, match", [
    ({"n_channels": lm.TINY_LM.d_model + 1}, f"n_channels must be at most d_model={lm.TINY_LM.d_model}, got 65"),
    ({"n_channels": 0}, "n_channels must be a positive integer, got 0"),
    ({"alpha": 0.0}, "alpha must be positive, got 0.0"),
    ({"alpha": -1}, "alpha must be positive, got -1"),
])
def test_outlier_study_rejects_bad_arguments(reference, kwargs, match):
    with pytest.raises(MemlabError, match=match):
        quant.outlier_study(config=lm.TINY_LM, device="cpu", **kwargs)


# Memory of a 20B model -----------------------------------------------------------------------------
def test_neox_20b_parameter_count():
    groups = quant.neox_20b_groups()
    assert set(groups) == {"linear", "embeddings", "biases+norms"}
    d, f, vocab, layers = 6144, 24576, 50432, 44
    per_layer = {  # module by module, weights + biases: qkv, attention out, MLP in, MLP out, 2 LNs
        "qkv": 3 * d * d + 3 * d, "dense": d * d + d, "h_to_4h": d * f + f, "4h_to_h": f * d + d,
        "norms": 2 * 2 * d}
    total = layers * sum(per_layer.values()) + 2 * vocab * d + 2 * d  # + embed in/out, final LN
    assert sum(groups.values()) == total
    assert groups["linear"] == layers * 12 * d * d  # qkv 3d^2, out d^2, MLP 2 x 4d^2
    assert groups["embeddings"] == 2 * vocab * d
    # The model card's "Num. parameters" is 20,556,201,984: within 0.01% of the count from the shape.
    assert abs(total - 20_556_201_984) < 1e-4 * total


def test_memory_20b():
    rows = {r.scheme: r for r in quant.memory_20b()}
    g = quant.neox_20b_groups()
    total = sum(g.values())
    for scheme, bits in (("fp32", 32), ("fp16", 16), ("int8 (per-row absmax)", 8), ("nf4", 4)):
        assert rows[scheme].claimed_gb == pytest.approx(20e9 * bits / 8 / 1e9)
    assert [round(rows[s].claimed_gb) for s in ("fp32", "fp16", "int8 (per-row absmax)", "nf4")] == [
        80, 40, 20, 10]
    assert rows["fp32"].weights_gb == pytest.approx(total * 4 / 1e9)
    assert rows["fp16"].weights_gb == pytest.approx(total * 2 / 1e9)
    # NF4: 4-bit codes + an fp32 absmax per 64 weights, the rest (embeddings, head) in 16-bit.
    nf4 = (g["linear"] * (0.5 + 4 / 64) + 2 * (total - g["linear"])) / 1e9
    assert rows["nf4"].weights_gb == pytest.approx(nf4)
    assert rows["nf4"].weights_gb > total * 0.5 / 1e9 > rows["nf4"].claimed_gb
    assert rows["nf4 + double quant"].weights_gb < rows["nf4"].weights_gb
    assert rows["nf4"].bits_per_param == 4.5
    # int8: one fp32 scale per output row of each linear (qkv 3d, out d, MLP in f, MLP out d rows)
    d, f = 6144, 24576
    rows_per_block = 3 * d + d + f + d
    assert rows["int8 (per-row absmax)"].bits_per_param == pytest.approx(
        8 + 32 * rows_per_block / (12 * d * d))
    # the whole model: the weight bytes over every parameter, above the linear layers' bits
    for r in rows.values():
        assert r.linear_bits_per_param == r.bits_per_param
        assert r.model_bits_per_param == pytest.approx(8 * r.weights_gb * 1e9 / total)
    assert rows["nf4"].model_bits_per_param > rows["nf4"].bits_per_param
    assert rows["fp16"].model_bits_per_param == pytest.approx(16)


def test_memory_20b_with_larger_blocks_and_quantized_embeddings():
    """Claim C15's move: the embeddings stored in each format and one 4-bit absmax per 4,096."""
    g = quant.neox_20b_groups()
    total = sum(g.values())
    rows = {r.scheme: r for r in quant.memory_20b(blocksize=4096, quantize_embeddings=True)}
    rest16 = g["biases+norms"] * 2
    nf4 = (g["linear"] + g["embeddings"]) * (0.5 + 4 / 4096) + rest16
    assert rows["nf4"].weights_gb == pytest.approx(nf4 / 1e9)
    assert rows["int8 (per-row absmax)"].weights_gb < quant.memory_20b()[2].weights_gb
    assert abs(rows["nf4"].weights_gb / 10 - 1) < 0.05  # the claim's 10 GB, scales and all
    assert rows["fp32"].weights_gb == pytest.approx(total * 4 / 1e9)  # unchanged
    with pytest.raises(MemlabError, match="blocksize"):
        quant.memory_20b(blocksize=0)


def test_memory_20b_frame_names_its_units():
    pytest.importorskip("pandas")
    frame = quant.memory_20b_frame()
    assert list(frame.columns) == ["claimed GB (n x bits / 8)", "weights GB (estimated)",
                                   "bits per linear weight", "bits per parameter (whole model)"]
    for r in quant.memory_20b():
        assert frame.loc[r.scheme, "bits per parameter (whole model)"] == r.model_bits_per_param


# Speed --------------------------------------------------------------------------------------------
def test_quant_speed_is_not_measured_on_cpu():
    r = quant.quant_speed(256, 128, device="cpu")
    assert not r.measured
    assert r.status.startswith("not measurable on cpu")
    assert (r.d_in, r.d_out, r.rows) == (256, 128, [])


# Bad input ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "steps must be a positive integer, got 0"),
    ({"steps": -3}, "steps must be a positive integer, got -3"),
    ({"lr": 0.0}, "lr must be a positive number, got 0.0"),
    ({"lr": -1e-3}, "lr must be a positive number, got -0.001"),
    ({"lr": "x"}, "lr must be a positive number, got 'x'"),
    ({"optimizer": "lion"}, "unknown optimizer 'lion'; accepted: adamw, adam, sgd, sgd-momentum, adamw-8bit"),
])
def test_train_lm_rejects_bad_arguments(kwargs, match):
    with pytest.raises(MemlabError, match=match):
        lm.train_lm(lm.TINY_LM, device="cpu", **kwargs)


def test_lm_config_rejects_an_unknown_field():
    with pytest.raises(MemlabError, match="unknown LMConfig field 'bogus'; accepted: vocab_size"):
        lm.lm_config("ci", bogus=1)


@pytest.mark.parametrize("kwargs, what", [({"d_in": -1}, "d_in"), ({"d_out": 0}, "d_out"),
                                          ({"tokens": (1, 0)}, "tokens")])
def test_quant_speed_checks_its_arguments_on_any_device(kwargs, what):
    with pytest.raises(MemlabError, match=f"{what} must be a positive integer"):
        quant.quant_speed(**kwargs, device="cpu")


def test_config_steps_are_checked():
    with pytest.raises(MemlabError, match="steps must be a positive integer, got 0"):
        lm.train_lm(replace(lm.TINY_LM, steps=0), device="cpu")


def test_quantize_model_rejects_unknown_scheme(reference):
    with pytest.raises(MemlabError, match=r"unknown scheme 'int4'; accepted: fp32, bf16, "):
        quant.quantize_model(reference[0], "int4", device="cpu")


@pytest.mark.parametrize("fn", [lm.reference_model, quant.compare_schemes,
                                quant.outlier_study])
@pytest.mark.parametrize("config", ["ci", {"d_model": 64}])
def test_config_must_be_an_lmconfig(fn, config):
    with pytest.raises(MemlabError, match=f"config must be an LMConfig, got {type(config).__name__}"):
        fn(config=config, device="cpu")


def test_train_lm_rejects_a_config_that_is_not_an_lmconfig():
    with pytest.raises(MemlabError, match="LMConfig"):
        lm.train_lm("ci", device="cpu")


# Training and optimizer state ----------------------------------------------------------------------
def test_keep_optimizer_and_adamw_state_bytes():
    kept = lm.train_lm(lm.TINY_LM, steps=2, device="cpu", keep_optimizer=True)
    dropped = lm.train_lm(lm.TINY_LM, steps=2, device="cpu")
    assert dropped.opt is None and isinstance(kept.opt, torch.optim.AdamW)
    assert len(kept.losses) == 2 and kept.losses == dropped.losses  # the same batches
    assert kept.state == dropped.state
    assert kept.state_bytes == lm.measure_state(kept.opt, kept.model).state_bytes
    params = list(kept.model.parameters())
    n = sum(p.numel() for p in params)
    assert kept.trained_params == n == count_parameters(kept.model)
    # torch AdamW on CPU: exp_avg and exp_avg_sq in fp32, and 'step' as a 0-d fp32 tensor.
    steps = [kept.opt.state[p]["step"] for p in params]
    assert all(s.dim() == 0 and s.dtype == torch.float32 and float(s) == 2 for s in steps)
    assert kept.state_bytes == 2 * 4 * n + 4 * len(params)
    assert kept.state.shared_bytes == 0 and kept.state.eligible_params == 0


def test_adamw8bit_state_bytes():
    """8-bit codes + an fp32 absmax per 256 for each big weight, the two code books once;
    32-bit moments for the small tensors bitsandbytes leaves out."""
    pytest.importorskip("bitsandbytes")
    r = lm.train_lm(lm.TINY_LM, steps=1, optimizer="adamw-8bit", device="cpu",
                            keep_optimizer=True)
    names = dict(r.model.named_parameters())
    eight = {n for n, p in names.items() if r.opt.state[p]["state1"].dtype == torch.uint8}
    assert eight == {n + ".weight" for n in block_linears(r.model)}
    expected = 2 * 256 * 4  # qmap1, qmap2: shared by every 8-bit parameter
    for n, p in names.items():
        k = p.numel()
        expected += 2 * k + 2 * 4 * math.ceil(k / 256) if n in eight else 2 * 4 * k
    assert r.state_bytes == expected
    assert r.state.shared_bytes == 2 * 256 * 4
    assert set(r.state.eligible_names) == eight
    assert r.state.other_bytes == 8 * r.state.other_params


def test_group_size_reaches_rtn_and_gptq(reference):
    """Groups of 32: one fp16 scale and one 4-bit zero per 32 weights, 4 + 20/32 bits."""
    comp = quant.compare_schemes(schemes=("rtn-4", "gptq-4"), device="cpu", config=lm.TINY_LM,
                                      group_size=32)
    for s in ("rtn-4", "gptq-4"):
        assert comp.row(s).bits_per_param == pytest.approx(4 + (16 + 4) / 32)
    with pytest.raises(MemlabError, match="group_size must be a positive integer, got 0"):
        quant.compare_schemes(schemes=("rtn-4",), device="cpu", config=lm.TINY_LM, group_size=0)


def test_paired_delta_is_the_mean_and_standard_error_of_sequence_differences(reference):
    trained, _ = reference
    ref_q = lm.evaluate(trained.model, lm.TINY_LM)
    assert ref_q.seq_loss.shape == (lm.TINY_LM.eval_sequences,)
    assert float(ref_q.seq_loss.mean()) == pytest.approx(ref_q.loss, rel=1e-6)  # equal lengths
    assert lm.paired_delta(ref_q, ref_q) == (0.0, 0.0)
    other = lm.evaluate(quant.quantize_model(trained, "rtn-3", device="cpu").model, lm.TINY_LM)
    delta, se = lm.paired_delta(other, ref_q)
    d = (other.seq_loss - ref_q.seq_loss).tolist()
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (len(d) - 1))
    assert delta == pytest.approx(other.loss - ref_q.loss, abs=2e-6)  # fp32 losses vs fp64 means
    assert se == pytest.approx(sd / math.sqrt(len(d)), rel=1e-9) and se > 0


def test_paired_delta_refuses_unpaired_qualities(reference):
    q = lm.evaluate(reference[0].model, lm.TINY_LM)
    bare = lm.Quality(q.loss, q.best_loss, q.accuracy, q.best_accuracy)
    with pytest.raises(MemlabError, match="per-sequence losses"):
        lm.paired_delta(bare, q)
    shorter = lm.evaluate(reference[0].model, replace(lm.TINY_LM, eval_sequences=8))
    with pytest.raises(MemlabError, match="different sequences"):
        lm.paired_delta(shorter, q)


def test_comparison_rows_carry_the_paired_delta(comparison):
    for r in comparison.rows:
        assert r.loss_delta == pytest.approx(r.loss - comparison.reference.loss, abs=1e-6)
        assert r.loss_delta_se >= 0
    assert comparison.row("fp32").loss_delta == 0 and comparison.row("fp32").loss_delta_se == 0
