"""Lab 5's checks: a right answer passes, a wrong one gets the right hint, a stub is not attempted."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from memlab.errors import MemlabError
from memlab.finetune import LoraConfig, count_trainable, inject_lora, lora_forward
from memlab.finetune.estimate import (
    ADAPTER_BYTES,
    DQ_BLOCK,
    NF4_BLOCK,
    base_weight_bytes,
    estimate_finetune,
)
from memlab.labs.grader import get_lab
from memlab.labs.lab05 import (
    FORWARD_RTOL,
    LAYER,
    LORA_CASES,
    PEAK_JOB,
    PEAK_LORA,
    PEAK_RTOL,
    PEAK_SLIP_RTOL,
    QLORA_SETUP,
    WEIGHTS_RTOL,
    counted_lora_parameters,
    forward_slips,
    lora_config,
    lora_count,
    lora_count_slips,
    lora_inputs,
    lora_layer,
    lora_peak_slips,
    merged_output,
    peak_spec,
    qlora_estimate,
    qlora_weight_bytes,
    qlora_weight_parts,
    relative_error,
    traced_full_step,
    traced_lora_step,
    weight_bytes_slips,
)
from memlab.model.config import get_config
from memlab.model.transformer import build_model


def test_the_lab_has_its_exercises():
    assert get_lab("lab05").ids == ("5.1", "5.2", "5.3", "5.4")


# ------------------------------------------------------------- 5.1 LoRA's parameters


def _linears(cfg, kv_width=None) -> dict[str, tuple[int, int]]:
    """(in, out) of one Llama block's linear layers, from the config's fields."""
    C, F_, q = cfg.d_model, cfg.ffn_dim, cfg.n_head * cfg.head_dim
    kv = cfg.kv_heads * cfg.head_dim if kv_width is None else kv_width
    return {"q_proj": (C, q), "k_proj": (C, kv), "v_proj": (C, kv), "o_proj": (q, C),
            "gate_proj": (C, F_), "up_proj": (C, F_), "down_proj": (F_, C)}


def _count(key, *, per=None, layers=None, kv_width=None, targets=None, extra=0) -> int:
    case = LORA_CASES[key]
    cfg = get_config(case["model"])
    r = case["r"]
    per = per or (lambda i, o: r * (i + o))
    linears = _linears(cfg, kv_width)
    names = targets or (linears if case["target_modules"] == "all-linear"
                        else case["target_modules"])
    return (cfg.n_layer if layers is None else layers) * sum(per(*linears[n]) for n in names) + extra


def test_lora_cases_are_built_for_the_slips():
    """One case without grouped-query attention, two with it; one all-linear case."""
    gqa = [key for key, c in LORA_CASES.items()
           if get_config(c["model"]).kv_heads < get_config(c["model"]).n_head]
    assert len(gqa) == 2 and len(LORA_CASES) == 3
    assert any(c["target_modules"] == "all-linear" for c in LORA_CASES.values())


def test_lora_counts_are_right(lab, capsys):
    answer = {key: _count(key) for key in LORA_CASES}
    assert answer == {key: lora_count(key) for key in LORA_CASES}
    assert answer == {key: counted_lora_parameters(key) for key in LORA_CASES}  # PyTorch's count
    assert lab.check("5.1", answer).ok
    assert lab.check("5.1", {k: float(v) for k, v in answer.items()}).ok
    assert lab.check("5.1", {k: torch.tensor(v) for k, v in answer.items()}).ok
    capsys.readouterr()


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), "all-linear"])
def test_the_count_is_what_injected_modules_train(targets):
    tiny = get_config("tiny")
    lora = LoraConfig(r=4, alpha=8, target_modules=targets)
    model = build_model(tiny)
    inject_lora(model, lora)
    from memlab.finetune import lora_parameters

    assert count_trainable(model) == lora_parameters(tiny, lora)


@pytest.mark.parametrize(("key", "kw", "words"), [
    ("llama2-7b, r=8, q_proj,v_proj", dict(layers=1), "every block has its own adapters"),
    ("llama3-8b, r=16, all-linear", dict(layers=1), "every block has its own adapters"),
    ("mistral-7b, r=16, q_proj,v_proj", dict(per=lambda i, o: i * o),
     "in x out is the frozen weight's size"),
    ("llama2-7b, r=8, q_proj,v_proj", dict(per=lambda i, o: 8 * i), "an adapter has two matrices"),
    ("mistral-7b, r=16, q_proj,v_proj", dict(per=lambda i, o: 16 * i),
     "an adapter has two matrices"),
    ("mistral-7b, r=16, q_proj,v_proj", dict(per=lambda i, o: 16 * o),
     "an adapter has two matrices"),
    ("llama3-8b, r=16, all-linear", dict(per=lambda i, o: 32 * (i + o)),
     "alpha sets the update's scale"),
    ("mistral-7b, r=16, q_proj,v_proj", dict(kv_width=4096),
     "mistral-7b has 8 KV heads for 32 query heads: k_proj and v_proj have n_kv_head x head_dim "
     "= 1024 outputs, not 4096"),
    ("llama3-8b, r=16, all-linear", dict(kv_width=4096), "llama3-8b has 8 KV heads"),
    ("llama3-8b, r=16, all-linear", dict(targets=("q_proj", "k_proj", "v_proj", "o_proj")),
     "the MLP's (gate_proj, up_proj, down_proj) too"),
    ("llama3-8b, r=16, all-linear", dict(extra=16 * (4096 + 128256)),
     "peft leaves the output layer (the LM head) out"),
    ("llama2-7b, r=8, q_proj,v_proj", dict(per=lambda i, o: 3 * (i + o)),
     "2.7x too small"),  # no slip explains it: how far off, never the recipe
])
def test_lora_count_mistakes_get_their_hint(lab, printed, key, kw, words):
    answer = {k: _count(k) for k in LORA_CASES}
    answer[key] = _count(key, **kw)
    assert answer[key] != lora_count(key)
    assert lab.check("5.1", answer).status == "not yet"
    line = printed()
    assert f"1 of {len(LORA_CASES)} not right: {key!r}" in line and words in line


def test_lora_count_slips_never_name_the_right_answer():
    for key in LORA_CASES:
        values = [v for v, _ in lora_count_slips(key)]
        assert lora_count(key) not in values
        assert len(values) == len(set(values))  # coinciding slips are merged into one hint


def test_lora_count_stub_and_bad_answers(lab, capsys, printed):
    assert lab.check("5.1", None).status == "not attempted"
    assert lab.check("5.1", dict.fromkeys(LORA_CASES)).status == "not attempted"
    capsys.readouterr()
    assert lab.check("5.1", [1, 2, 3]).status == "not yet"
    assert "answer a dict with the keys of LORA_CASES" in printed()
    assert lab.check("5.1", {"llama2-7b, r=8, q_proj,v_proj": 1}).status == "not yet"
    assert "missing keys" in printed()
    answer = {k: _count(k) for k in LORA_CASES}
    answer["llama3-8b, r=16, all-linear"] = "42M"
    assert lab.check("5.1", answer).status == "not yet"
    assert "answer a number of parameters" in printed()


# ----------------------------------------------------------------- 5.2 LoRA's forward


def lora_linear(x, weight, bias, A, B, alpha, r):  # the lab's reference solution
    return x @ weight.T + bias + (alpha / r) * ((x @ A.T) @ B.T)


def test_layer_is_built_for_the_slips():
    """in, out and r differ (a matrix in the wrong place is a shape error), B is not zero, and
    every scaling slip gives another factor."""
    i, o, r, alpha = LAYER["in_features"], LAYER["out_features"], LAYER["r"], LAYER["alpha"]
    assert len({i, o, r}) == 3
    t = lora_inputs()
    assert t["B"].abs().min() > 0 and all(v.dtype == torch.float32 for v in t.values())
    s = alpha / r
    assert s not in (1.0, alpha, r / alpha, alpha / r ** 0.5)


def test_merged_output_is_lora_forward_and_lora_linear():
    t = lora_inputs()
    s = LAYER["alpha"] / LAYER["r"]
    expected = merged_output(t)
    assert relative_error(lora_forward(t["x"], t["weight"], t["bias"], t["A"], t["B"], s),
                          expected) < 1e-6
    layer = lora_layer()
    with torch.no_grad():
        assert relative_error(layer(t["x"]), expected) < 1e-6
        layer.merge()
        assert relative_error(layer(t["x"]), expected) < 1e-6


def test_forward_slips_are_far_apart():
    t = lora_inputs()
    outputs = [merged_output(t)] + [y for y, _ in forward_slips(t)]
    for a, b in itertools.combinations(outputs, 2):
        assert relative_error(a, b) > 1e3 * FORWARD_RTOL


def test_forward_correct(lab, capsys, printed):
    assert lab.check("5.2", lora_linear).ok
    assert printed() == "✅ 5.2 correct"

    def merged(x, weight, bias, A, B, alpha, r):
        return F.linear(x, weight + alpha / r * B @ A, bias)

    def in_fp64(x, weight, bias, A, B, alpha, r):
        x, weight, bias, A, B = (v.double() for v in (x, weight, bias, A, B))
        return torch.einsum("bti,oi->bto", x, weight) + bias + alpha / r * (x @ A.T @ B.T)

    assert lab.check("5.2", merged).ok and lab.check("5.2", in_fp64).ok
    capsys.readouterr()


def _forward_variant(kind):
    def f(x, weight, bias, A, B, alpha, r):
        scaling = {"no-scaling": 1.0, "alpha": alpha, "inverted": r / alpha,
                   "sqrt": alpha / r ** 0.5}.get(kind, alpha / r)
        base = x @ weight.T + (0 if kind == "no-bias" else bias)
        if kind == "swapped":
            update = (x @ B.T) @ A.T
        elif kind == "no-transpose":
            return x @ weight + bias
        else:
            update = (x @ A.T) @ B.T
        if kind == "base-only":
            return base
        if kind == "update-only":
            return scaling * update
        if kind == "half-out":
            return (base + scaling * update)[..., :8]
        if kind == "off":
            return base + 1.01 * scaling * update
        return base + scaling * update

    return f


@pytest.mark.parametrize(("kind", "words"), [
    ("no-scaling", "scale the update by alpha / r"),
    ("alpha", "the scaling is alpha / r, not alpha"),
    ("inverted", "not r / alpha"),
    ("sqrt", "alpha / sqrt(r) is rsLoRA's scaling"),
    ("no-bias", "add the frozen layer's bias b"),
    ("base-only", "add the low-rank update"),
    ("update-only", "add the frozen layer's output"),
    ("swapped", "A and B are used in each other's place"),
    ("no-transpose", "raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    ("half-out", "the output has shape (2, 5, 8), not (2, 5, 16)"),
    ("off", "against the merged layer's output"),
])
def test_forward_mistakes_get_their_hint(lab, printed, kind, words):
    assert lab.check("5.2", _forward_variant(kind)).status == "not yet"
    line = printed()
    assert words in line
    if kind == "no-transpose":
        assert "each other's place" not in line


def test_forward_stub_and_bad_answers(lab, capsys, printed):
    def stub(x, weight, bias, A, B, alpha, r):
        """Not written yet."""

    assert lab.check("5.2", stub).status == "not attempted"
    assert lab.check("5.2", None).status == "not attempted"
    capsys.readouterr()
    assert lab.check("5.2", 3.0).status == "not yet"
    assert "answer the function lora_linear itself, got float" in printed()
    assert lab.check("5.2", lambda *args: "y").status == "not yet"
    assert "return a real tensor, got str" in printed()

    def broken(x, weight, bias, A, B, alpha, r):
        raise ValueError("two\nlines")

    assert lab.check("5.2", broken).status == "not yet"
    assert "raised ValueError: two lines" in printed()


# -------------------------------------------------------- 5.3 a QLoRA set-up's weights


def _qlora_by_hand(*, scales="dq", second_level=True, offsets=True, adapter_bytes=ADAPTER_BYTES,
                   rest_bytes=2, adapters=True) -> float:
    cfg = get_config(QLORA_SETUP["model"])
    linears = _linears(cfg).values()
    n_linear = cfg.n_layer * sum(i * o for i, o in linears)
    blocks = n_linear / NF4_BLOCK
    quantized = n_linear / 2 + {"dq": blocks, "fp32": 4 * blocks, "none": 0}[scales]
    if scales == "dq" and second_level:
        quantized += 4 * blocks / DQ_BLOCK
    if scales == "dq" and offsets:
        quantized += 4 * cfg.n_layer * len(linears)  # one fp32 offset per weight tensor
    rest = rest_bytes * (cfg.num_parameters() - n_linear)
    n_adapters = cfg.n_layer * QLORA_SETUP["r"] * sum(i + o for i, o in linears)
    return quantized + rest + (adapter_bytes * n_adapters if adapters else 0)


def test_weight_bytes_are_the_estimates():
    expected = qlora_weight_bytes()
    assert expected == _qlora_by_hand() == sum(qlora_weight_parts().values())
    assert expected == qlora_estimate().parameters_bytes
    cfg = get_config(QLORA_SETUP["model"])
    assert expected - ADAPTER_BYTES * lora_count("llama3-8b, r=16, all-linear") == \
        base_weight_bytes(cfg, "bf16", "nf4-dq")


def test_weight_bytes_correct(lab, capsys):
    assert lab.check("5.3", qlora_weight_bytes()).ok
    assert lab.check("5.3", _qlora_by_hand(offsets=False)).ok  # within the tolerance
    assert lab.check("5.3", torch.tensor(float(qlora_weight_bytes()))).ok
    assert lab.check("5.3", qlora_weight_bytes() * (1 + 0.9 * WEIGHTS_RTOL)).ok
    capsys.readouterr()
    assert lab.check("5.3", qlora_weight_bytes() * (1 + 1.1 * WEIGHTS_RTOL)).status == "not yet"
    capsys.readouterr()


def test_weight_slips_are_apart_from_the_answer_and_each_other():
    expected = qlora_weight_bytes()
    values = [v for v, _ in weight_bytes_slips(expected)] + [expected]
    for a, b in itertools.combinations(values, 2):
        assert abs(a - b) > 2 * WEIGHTS_RTOL * max(abs(a), abs(b))


@pytest.mark.parametrize(("kw", "words"), [
    (dict(scales="none"), "every block of 64 weights also stores its absmax"),
    (dict(scales="fp32"), "each block's absmax is stored in 8 bits"),
    (dict(second_level=False), "the 8-bit absmax values have scales of their own"),
    (dict(adapter_bytes=2), "peft keeps the adapters in fp32"),
    (dict(adapters=False), "add the adapters"),
    (dict(rest_bytes=4), "(embeddings, LM head, norms) are bf16: 2 bytes"),
])
def test_weight_bytes_mistakes_get_their_hint(lab, printed, kw, words):
    assert lab.check("5.3", _qlora_by_hand(**kw)).status == "not yet"
    assert words in printed()


def test_weight_bytes_other_mistakes(lab, capsys, printed):
    cfg = get_config(QLORA_SETUP["model"])
    expected = qlora_weight_bytes()
    n_adapters = lora_count("llama3-8b, r=16, all-linear")
    n_linear = cfg.n_layer * sum(i * o for i, o in _linears(cfg).values())
    # bytes per quantized weight, applied to every parameter (the embeddings and head too)
    rate = (_qlora_by_hand(adapters=False) - 2 * (cfg.num_parameters() - n_linear)) / n_linear
    for answer, words in [
        (rate * cfg.num_parameters() + 4 * n_adapters, "only the blocks' linear layers are quantized"),
        (2 * cfg.num_parameters() + 4 * n_adapters, "stored in nf4-dq, not bf16"),
        (8 * expected, "bits and bytes"),
        (expected / 2**30, "answer bytes, not GiB"),
        (expected / 1e9, "answer bytes, not GB"),
        (0.9 * expected, "10% too small"),  # no slip: how far off, never the recipe
    ]:
        assert lab.check("5.3", answer).status == "not yet"
        assert words in printed()
    assert lab.check("5.3", "5.9 GB").status == "not yet"
    assert "answer a number of bytes, got str" in printed()
    assert lab.check("5.3", None).status == "not attempted"
    capsys.readouterr()


# ------------------------------------------------------------ 5.4 the peak of a LoRA step


@pytest.fixture(scope="module")
def steps():
    return traced_full_step(), traced_lora_step()


def _lora_peak_by_hand(full, *, keep_inputs=False, states=True, activations=True,
                       temporaries=True) -> float:
    """The notebook's reasoning: the full step at its peak, less what LoRA drops."""
    cfg = get_config(PEAK_JOB["model"])
    B, T = PEAK_JOB["batch_size"], PEAK_JOB["seq_len"]
    C, F_, L = cfg.d_model, cfg.ffn_dim, cfg.n_layer
    at = full.phase_breakdown["backward"]
    adapters = L * PEAK_LORA.r * 2 * (C + C)
    BTC = B * T * C * 4
    dropped = 0 if keep_inputs else L * (BTC + BTC * F_ // C) + BTC
    return (at["parameters"] + 4 * adapters + (8 * adapters if states else 0)
            + (at["activations"] - dropped if activations else 0)
            + (at["temporaries"] if temporaries else 0) + at["other"])


def test_the_lora_step_is_traced_and_its_estimate_agrees(steps):
    full, lora = steps
    assert full.mode == lora.mode == "traced"
    assert lora.setup["model"] == full.setup["model"] == PEAK_JOB["model"]
    assert full.peak_phase == lora.peak_phase == "backward"
    assert lora.peak_bytes < full.peak_bytes
    est = estimate_finetune(peak_spec(PEAK_LORA), device="cpu")
    assert est.peak_bytes == pytest.approx(lora.peak_bytes, rel=1e-6)


def test_lora_peak_correct(lab, capsys, printed, steps):
    full, lora = steps
    by_hand = _lora_peak_by_hand(full)
    assert by_hand == pytest.approx(lora.peak_bytes, rel=0.01)  # the reasoning, not a formula
    assert lab.check("5.4", by_hand).ok
    assert lab.check("5.4", lora.peak_bytes).ok
    assert lab.check("5.4", torch.tensor(float(lora.peak_bytes))).ok
    assert lab.check("5.4", lora.peak_bytes * (1 - 0.9 * PEAK_RTOL)).ok
    capsys.readouterr()
    assert lab.check("5.4", lora.peak_bytes * (1 + 1.1 * PEAK_RTOL)).status == "not yet"
    assert printed().endswith("% too large")  # no slip: how far off, never the recipe


@pytest.mark.parametrize(("kw", "words"), [
    (dict(keep_inputs=True), "a Linear layer whose weight is frozen needs no copy of its input"),
    (dict(activations=False, temporaries=False), "a LoRA step peaks in the backward pass"),
    (dict(temporaries=False), "add the backward pass's temporaries"),
])
def test_lora_peak_mistakes_get_their_hint(lab, printed, steps, kw, words):
    answer = _lora_peak_by_hand(steps[0], **kw)
    assert lab.check("5.4", answer).status == "not yet"
    assert words in printed()


def test_lora_peak_other_mistakes(lab, capsys, printed, steps):
    full, lora = steps
    at = full.phase_breakdown["backward"]
    for answer, words in [
        (full.peak_bytes, "that is full fine-tuning's peak"),
        (_lora_peak_by_hand(full) + at["optimizer_states"], "the base's states are gone too"),
        (8 * lora.peak_bytes, "bits and bytes"),
        (lora.peak_bytes / 2**30, "answer bytes, not GiB"),
        (lora.peak_bytes / 1e9, "answer bytes, not GB"),
    ]:
        assert lab.check("5.4", answer).status == "not yet"
        assert words in printed()
    assert lab.check("5.4", "1.5 GB").status == "not yet"
    assert "answer a number of bytes, got str" in printed()
    assert lab.check("5.4", None).status == "not attempted"
    capsys.readouterr()


def test_lora_peak_slips_are_apart_from_the_answer_and_each_other(steps):
    full, lora = steps
    values = [v for v, _ in lora_peak_slips(full, lora)] + [lora.peak_bytes]
    for a, b in itertools.combinations(values, 2):
        assert abs(a - b) > 2 * PEAK_SLIP_RTOL * max(abs(a), abs(b))
    for v, _ in lora_peak_slips(full, lora):
        assert abs(v - lora.peak_bytes) > PEAK_RTOL * lora.peak_bytes


def test_the_mark_schemes_claims(steps):
    """The base's gradients and states vanish, the weights stay, the activations shrink and the
    temporaries do not change; the widest tensors a frozen Linear no longer keeps are the GELU
    outputs."""
    full, lora = steps
    f, g = full.phase_breakdown["backward"], lora.phase_breakdown["backward"]
    assert g["gradients"] == 0 and g["optimizer_states"] < f["optimizer_states"] / 100
    assert f["parameters"] < g["parameters"] < 1.01 * f["parameters"]
    assert g["activations"] < f["activations"] and g["temporaries"] == f["temporaries"]
    assert sum(lora.phase_breakdown["optimizer"].values()) < lora.peak_bytes / 2


def test_helpers_refuse_bad_input():
    with pytest.raises(MemlabError, match="unknown LoRA case 'gpt2'"):
        counted_lora_parameters("gpt2")
    with pytest.raises(MemlabError, match="r must be a positive integer, got 0"):
        lora_inputs(r=0)
    with pytest.raises(MemlabError, match="unknown LoRA case 'gpt2'"):
        lora_count("gpt2")
    assert lora_config(LORA_CASES["llama3-8b, r=16, all-linear"]).target_modules == "all-linear"
