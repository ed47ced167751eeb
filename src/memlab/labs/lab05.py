"""Lab 5, "Fine-tuning with less memory": LoRA's trainable parameters counted from a config, its
forward pass written for one linear layer, the bytes of a QLoRA set-up's weights, and the peak of
a LoRA step predicted from the full fine-tuning step's.

Every expected value is computed at check time, never typed in: parameter counts by PyTorch on
each model built on the meta device with its adapters injected (the slips from
:func:`memlab.finetune.lora_parameters`' terms); the LoRA forward against the merged weight,
x (W + (alpha / r) B A)^T + b, and :func:`memlab.finetune.lora_forward`; the weights' bytes with
:func:`memlab.finetune.estimate.base_weight_bytes` plus the adapters in fp32; the LoRA step's peak
traced by :func:`memlab.measure.trace_step`. Each hint names one mistake and fires only on the
answer that mistake gives, computed from the same numbers the check compares with; a wrong answer
no slip explains is told how far off it is, never the recipe. The notebook imports none of the
functions a check compares with.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.errors import check_choice, check_positive_int
from memlab.finetune.compare import Setup
from memlab.finetune.counts import block_linear_shapes, lora_parameters
from memlab.finetune.estimate import (
    ADAPTER_BYTES,
    DQ_BLOCK,
    NF4_BLOCK,
    base_weight_bytes,
    estimate_finetune,
    quantized_weight_bytes,
)
from memlab.finetune.freeze import count_trainable
from memlab.finetune.lora import ALL_LINEAR, LoraConfig, LoraLinear, inject_lora, lora_forward
from memlab.labs.grader import (
    answer_tensor,
    check_each_key,
    close_to,
    define_lab,
    merged_slips,
    number_problem,
    one_line,
)
from memlab.measure.step import StepMemory, trace_step
from memlab.memory.activations import PARAM_BYTES
from memlab.memory.estimator import MemoryEstimate
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec
from memlab.model.transformer import build_model

# Exercise 5.1: LoRA set-ups whose trainable parameters are counted from the config alone. A
# grouped-query model (mistral-7b, llama3-8b: n_kv_head < n_head) makes k_proj and v_proj
# narrower than q_proj, so counting them at full width is a slip of its own size.
LORA_CASES = {
    "llama2-7b, r=8, q_proj,v_proj": dict(model="llama2-7b", r=8, alpha=16,
                                          target_modules=("q_proj", "v_proj")),
    "mistral-7b, r=16, q_proj,v_proj": dict(model="mistral-7b", r=16, alpha=32,
                                            target_modules=("q_proj", "v_proj")),
    "llama3-8b, r=16, all-linear": dict(model="llama3-8b", r=16, alpha=32,
                                        target_modules=ALL_LINEAR),
}

# Exercise 5.2: one linear layer with an adapter, its B as it might be after some training (at
# initialization B is zero and the update vanishes). in, out and r all differ, so that a matrix
# used in the wrong place is a shape error; alpha / r is neither 1, alpha, r / alpha nor
# alpha / sqrt(r), so that each scaling slip gives an output of its own.
LAYER = dict(batch_size=2, tokens=5, in_features=24, out_features=16, r=4, alpha=8.0, seed=0)
FORWARD_RTOL = 1e-5  # relative (Frobenius) error against the merged weight's output, fp32

# Exercise 5.3: a QLoRA set-up (Dettmers et al. 2023): the blocks' linear layers in NF4 with
# double quantization, everything else (embeddings, LM head, norms) in bf16, adapters in fp32.
QLORA_SETUP = dict(model="llama3-8b", r=16, alpha=32, target_modules=ALL_LINEAR,
                   quantize_base="nf4-dq", precision="bf16")
WEIGHTS_RTOL = 1e-4  # the per-tensor fp32 offsets of double quantization may be left out

# Exercise 5.4: a LoRA step on GPT-2, its peak predicted from the traced full fine-tuning step of
# the same batch, then traced (memlab.measure.trace_step, on fake tensors: nothing is allocated).
# fp32 throughout, so that the base's weights, the adapters and the activations share one format.
PEAK_JOB = dict(model="gpt2", batch_size=8, seq_len=128, precision="fp32")
PEAK_LORA = LoraConfig(r=8, alpha=16, target_modules=("q_proj", "v_proj"))
PEAK_RTOL = 0.05  # the prediction, against the traced peak
PEAK_SLIP_RTOL = 0.02  # a slip's answer, reckoned another way, still names it


def _config(model: ModelConfig | str) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else get_config(model)


# ------------------------------------------------------- 5.1 LoRA's trainable parameters


def lora_config(case: Mapping) -> LoraConfig:
    """The :class:`~memlab.finetune.LoraConfig` of one case of :data:`LORA_CASES` (chapter: 5)."""
    return LoraConfig(r=case["r"], alpha=case["alpha"], target_modules=case["target_modules"])


def lora_count(key: str) -> int:
    """Adapter parameters of one case of :data:`LORA_CASES` (chapter: 5).

    From :func:`memlab.finetune.lora_parameters`, the count from the config.
    """
    check_choice("LoRA case", key, LORA_CASES)
    case = LORA_CASES[key]
    return lora_parameters(_config(case["model"]), lora_config(case))


@functools.cache
def counted_lora_parameters(key: str) -> int:
    """Parameters that require a gradient once LoRA is injected into a case's model (chapter: 5).

    The model is built on the meta device (shapes, no storage) and
    :func:`memlab.finetune.inject_lora` freezes it and adds the adapters; PyTorch counts the rest.
    """
    check_choice("LoRA case", key, LORA_CASES)
    case = LORA_CASES[key]
    with torch.device("meta"):
        model = build_model(case["model"], device="meta")
        inject_lora(model, lora_config(case))
    return count_trainable(model)


def lora_count_slips(key: str) -> list[tuple[float, str]]:
    """Typical wrong counts of one case of :data:`LORA_CASES`, each with its hint (chapter: 5)."""
    check_choice("LoRA case", key, LORA_CASES)
    case = LORA_CASES[key]
    cfg, lora = _config(case["model"]), lora_config(case)
    shapes = block_linear_shapes(cfg)
    targets = {n: (i, o) for n, (i, o, _) in shapes.items() if lora.selects(n)}
    L, r, C = cfg.n_layer, lora.r, cfg.d_model
    expected = lora_parameters(cfg, lora)

    def count(linears: Mapping[str, tuple[int, int]], per=lambda i, o: r * (i + o)) -> int:
        return L * sum(per(i, o) for i, o in linears.values())

    one_matrix = "an adapter has two matrices, A (r x in) and B (out x r): r x (in + out)"
    slips = [
        (expected / L, "every block has its own adapters: multiply by n_layer"),
        (count(targets, lambda i, o: i * o), "in x out is the frozen weight's size; the adapter "
                                             "is A (r x in) and B (out x r): r x (in + out)"),
        (count(targets, lambda i, o: r * i), one_matrix),
        (count(targets, lambda i, o: r * o), one_matrix),
        (expected * lora.alpha / r, "alpha sets the update's scale, not its size: the adapter's "
                                    "parameters depend on r only"),
    ]
    gqa = [n for n in targets if n in ("k_proj", "v_proj")]
    if cfg.kv_heads != cfg.n_head and gqa:
        kv = cfg.kv_heads * cfg.head_dim
        wide = {n: (i, cfg.n_head * cfg.head_dim if n in gqa else o) for n, (i, o) in targets.items()}
        slips.append((count(wide), f"{cfg.name} has {cfg.kv_heads} KV heads for {cfg.n_head} "
                                   f"query heads: k_proj and v_proj have n_kv_head x head_dim = "
                                   f"{kv} outputs, not {C}"))
    if lora.target_modules == ALL_LINEAR:
        attention = {n: s for n, s in targets.items() if n in ("q_proj", "k_proj", "v_proj",
                                                              "o_proj")}
        mlp = ", ".join(n for n in targets if n not in attention)
        slips += [
            (count(attention), f"all-linear adapts every linear layer of the blocks, the MLP's "
                               f"({mlp}) too"),
            (expected + r * (C + cfg.vocab_size), "all-linear means the linear layers of the "
                                                  "blocks: peft leaves the output layer (the LM "
                                                  "head) out"),
        ]
    return merged_slips([(v, h) for v, h in slips if not close_to(v, expected, 1e-12)])


def check_lora_counts(answer):
    """Check the adapter parameters predicted for every case of :data:`LORA_CASES` (chapter: 5)."""
    return check_each_key(answer, LORA_CASES, "LORA_CASES", lambda key, value: number_problem(
        value, counted_lora_parameters(key), slips=lambda: lora_count_slips(key), slip_rtol=1e-9,
        ask="a number of parameters"))


# --------------------------------------------------------------- 5.2 the LoRA forward


def lora_inputs(batch_size: int = LAYER["batch_size"], tokens: int = LAYER["tokens"],
                in_features: int = LAYER["in_features"], out_features: int = LAYER["out_features"],
                r: int = LAYER["r"], seed: int = LAYER["seed"]) -> dict[str, torch.Tensor]:
    """fp32 x (batch, tokens, in), weight (out, in), bias (out,), A (r, in) and B (out, r) (chapter: 5).

    B is drawn, not zero: an adapter as it might be after some training.
    """
    for name, value in (("batch_size", batch_size), ("tokens", tokens), ("in_features", in_features),
                        ("out_features", out_features), ("r", r)):
        check_positive_int(name, value)
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(batch_size, tokens, in_features, generator=g),
        "weight": torch.randn(out_features, in_features, generator=g) / in_features ** 0.5,
        "bias": torch.randn(out_features, generator=g),
        "A": torch.randn(r, in_features, generator=g) / in_features ** 0.5,
        "B": torch.randn(out_features, r, generator=g) / r ** 0.5,
    }


def merged_output(t: Mapping[str, torch.Tensor], alpha: float = LAYER["alpha"],
                  r: int = LAYER["r"]) -> torch.Tensor:
    """x (W + (alpha / r) B A)^T + b, fp32 (chapter: 5).

    The layer's output with the update merged into its weight.
    """
    merged = t["weight"] + (alpha / r) * t["B"] @ t["A"]  # (out, in)
    return F.linear(t["x"], merged, t["bias"])


def lora_layer(alpha: float = LAYER["alpha"], r: int = LAYER["r"]) -> LoraLinear:
    """memlab's :class:`~memlab.finetune.LoraLinear` on :func:`lora_inputs`' tensors (chapter: 5).

    It holds their weight, bias, A and B.
    """
    t = lora_inputs(r=r)
    base = nn.Linear(LAYER["in_features"], LAYER["out_features"])
    layer = LoraLinear(base, r, alpha)
    with torch.no_grad():
        base.weight.copy_(t["weight"])
        base.bias.copy_(t["bias"])
        layer.lora_A.weight.copy_(t["A"])
        layer.lora_B.weight.copy_(t["B"])
    return layer


def relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    """||y - reference|| / ||reference||, Frobenius norms, in fp64 (chapter: 5)."""
    y, reference = y.double(), reference.double()
    return ((y - reference).norm() / reference.norm()).item()


def forward_slips(t: Mapping[str, torch.Tensor], alpha: float = LAYER["alpha"],
                  r: int = LAYER["r"]) -> list[tuple[torch.Tensor, str]]:
    """Outputs of typical wrong LoRA forwards on the inputs ``t``, each with its hint (chapter: 5)."""
    x, W, b, A, B = (t[k] for k in ("x", "weight", "bias", "A", "B"))
    base = F.linear(x, W, b)
    update = F.linear(F.linear(x, A), B)  # x A^T B^T, unscaled

    def scaled(s: float) -> torch.Tensor:
        return base + s * update

    return [
        (scaled(1.0), "scale the update by alpha / r: y = x W^T + b + (alpha / r) x A^T B^T"),
        (scaled(alpha), "the scaling is alpha / r, not alpha: alpha is divided by the rank"),
        (scaled(r / alpha), "the scaling is alpha / r, not r / alpha"),
        (scaled(alpha / r ** 0.5), "alpha / sqrt(r) is rsLoRA's scaling; LoRA (and peft's "
                                   "default) scales by alpha / r"),
        (base - b + (alpha / r) * update, "add the frozen layer's bias b: the adapter changes "
                                          "the weight, not the bias"),
        (base, "add the low-rank update: that is the frozen layer alone"),
        ((alpha / r) * update, "add the frozen layer's output x W^T + b: the adapter adds to "
                               "it, it does not replace it"),
    ]


def check_lora_forward(answer, rtol: float = FORWARD_RTOL):
    """Check a lora_linear(x, weight, bias, A, B, alpha, r) function (chapter: 5).

    It is held to the merged weight's output.
    """
    if not callable(answer):
        return False, f"answer the function lora_linear itself, got {type(answer).__name__}"
    t = lora_inputs()
    alpha, r = LAYER["alpha"], LAYER["r"]

    def call(A: torch.Tensor, B: torch.Tensor):
        return answer(t["x"].clone(), t["weight"].clone(), t["bias"].clone(), A.clone(),
                      B.clone(), alpha, r)

    expected = merged_output(t)
    try:
        out = call(t["A"], t["B"])
    except Exception as exc:
        raised = (f"lora_linear(x, weight, bias, A, B, alpha, r) raised {type(exc).__name__}: "
                  f"{one_line(exc)}")
        try:  # the same function with A and B passed in each other's place
            swapped = answer_tensor(call(t["B"], t["A"]))
        except Exception:
            swapped = None
        if (swapped is not None and swapped.shape == expected.shape
                and relative_error(swapped, expected) <= rtol):
            return False, (f"{raised}; A and B are used in each other's place: A is (r, in) and "
                           "acts first, x A^T is (..., r); then B is (out, r), (x A^T) B^T is "
                           "(..., out)")
        return False, raised
    if out is None:
        return None
    y = answer_tensor(out)
    if y is None or y.is_complex() or y.dtype == torch.bool:
        return False, f"return a real tensor, got {type(out).__name__}"
    if y.shape != expected.shape:
        return False, (f"the output has shape {tuple(y.shape)}, not {tuple(expected.shape)}: "
                       "(batch, tokens, out_features), one output per token")
    if relative_error(y, expected) <= rtol and relative_error(y, lora_forward(
            t["x"], t["weight"], t["bias"], t["A"], t["B"], alpha / r)) <= rtol:
        return True
    for value, hint in forward_slips(t, alpha, r):
        if relative_error(y, value) <= rtol:
            return False, hint
    return False, f"relative error {relative_error(y, expected):.1e} against the merged layer's output"


# ------------------------------------------------------ 5.3 a QLoRA set-up's weight bytes


def qlora_lora() -> LoraConfig:
    """The adapters of :data:`QLORA_SETUP` (chapter: 5)."""
    return LoraConfig(r=QLORA_SETUP["r"], alpha=QLORA_SETUP["alpha"],
                      target_modules=QLORA_SETUP["target_modules"])


def linear_parameters(cfg: ModelConfig) -> int:
    """Weights of the blocks' linear layers, every block: what QLoRA quantizes (chapter: 5)."""
    return cfg.n_layer * sum(i * o for i, o, _ in block_linear_shapes(cfg).values())


def qlora_weight_parts() -> dict[str, int]:
    """Bytes of :data:`QLORA_SETUP`'s weights by part (chapter: 5).

    The parts are quantized block linears, the rest, and adapters.
    """
    cfg = _config(QLORA_SETUP["model"])
    precision, scheme = QLORA_SETUP["precision"], QLORA_SETUP["quantize_base"]
    quant = cfg.n_layer * sum(quantized_weight_bytes(i, o, scheme)
                              for i, o, _ in block_linear_shapes(cfg).values())
    rest = PARAM_BYTES[precision] * (cfg.num_parameters() - linear_parameters(cfg))
    return {f"block linears, {scheme}": quant,
            f"embeddings, LM head and norms, {precision}": rest,
            f"adapters, fp{8 * ADAPTER_BYTES}": ADAPTER_BYTES * lora_parameters(cfg, qlora_lora())}


def qlora_weight_bytes() -> int:
    """Bytes of :data:`QLORA_SETUP`'s weights: the frozen base as stored plus fp32 adapters (chapter: 5)."""
    cfg = _config(QLORA_SETUP["model"])
    base = base_weight_bytes(cfg, QLORA_SETUP["precision"], QLORA_SETUP["quantize_base"])
    return base + ADAPTER_BYTES * lora_parameters(cfg, qlora_lora())


def qlora_estimate(batch_size: int = 1, seq_len: int = 512) -> MemoryEstimate:
    """memlab's estimate of a training step with :data:`QLORA_SETUP` (CUDA) (chapter: 5)."""
    return estimate_finetune(QLORA_SETUP["model"], batch_size=batch_size, seq_len=seq_len,
                             precision=QLORA_SETUP["precision"], lora=qlora_lora(),
                             quantize_base=QLORA_SETUP["quantize_base"])


def weight_bytes_slips(expected: float) -> list[tuple[float, str]]:
    """Typical wrong predictions of :data:`QLORA_SETUP`'s weight bytes, each with its hint (chapter: 5)."""
    cfg = _config(QLORA_SETUP["model"])
    precision, scheme = QLORA_SETUP["precision"], QLORA_SETUP["quantize_base"]
    pb = PARAM_BYTES[precision]
    n, n_lin = cfg.num_parameters(), linear_parameters(cfg)
    adapters = lora_parameters(cfg, qlora_lora())
    parts = qlora_weight_parts()
    quant, rest, ad = parts.values()
    blocks = n_lin / NF4_BLOCK
    return merged_slips([
        (rest + n_lin / 2 + ad, f"4-bit codes are half a byte per weight, but every block of "
                                f"{NF4_BLOCK} weights also stores its absmax: count the scales"),
        (base_weight_bytes(cfg, precision, "nf4") + ad,
         f"with double quantization each block's absmax is stored in 8 bits (one byte per "
         f"{NF4_BLOCK} weights), not fp32, plus one fp32 scale per {DQ_BLOCK} of them"),
        (rest + n_lin / 2 + blocks + ad, f"the 8-bit absmax values have scales of their own: "
                                         f"one fp32 value per {DQ_BLOCK} blocks"),
        (expected - ad + 2 * adapters, f"peft keeps the adapters in fp{8 * ADAPTER_BYTES} "
                                       f"whatever the base's format: {ADAPTER_BYTES} bytes per "
                                       "adapter parameter"),
        (expected - ad, "add the adapters: r x (in + out) per adapted linear of every block, "
                        f"{ADAPTER_BYTES} bytes each"),
        (expected - rest + PARAM_BYTES["fp32"] * (n - n_lin), f"the layers left unquantized (embeddings, LM head, "
                                            f"norms) are {precision}: {pb} bytes per parameter"),
        (quant * n / n_lin + ad, "only the blocks' linear layers are quantized: the "
                                 f"embeddings, the LM head and the norms stay {precision}"),
        (pb * n + ad, f"the blocks' linear layers are stored in {scheme}, not {precision}"),
        (expected * 8, "bits and bytes are different units: answer bytes"),
        (expected / 2**30, "answer bytes, not GiB"),
        (expected / 1e9, "answer bytes, not GB"),
    ])


def check_weight_bytes(answer, rtol: float = WEIGHTS_RTOL):
    """Check the predicted bytes of :data:`QLORA_SETUP`'s weights, within ``rtol`` (chapter: 5)."""
    expected = qlora_weight_bytes()
    return number_problem(answer, expected, ask="a number of bytes", rtol=rtol,
                          slips=lambda: weight_bytes_slips(expected))


# ------------------------------------------------------------ 5.4 the peak of a LoRA step


def peak_spec(lora: LoraConfig | None = None) -> StepSpec:
    """The step of exercise 5.4: :data:`PEAK_JOB`, full fine-tuning or with ``lora`` (chapter: 5)."""
    job = dict(PEAK_JOB)
    setup = None if lora is None else Setup("LoRA", lora=lora)
    return StepSpec(job.pop("model"), prepare=setup, **job)


@functools.cache
def traced_full_step() -> StepMemory:
    """:data:`PEAK_JOB`'s full fine-tuning step, traced on fake tensors (chapter: 5)."""
    return trace_step(peak_spec())


@functools.cache
def traced_lora_step() -> StepMemory:
    """:data:`PEAK_JOB`'s step with :data:`PEAK_LORA`'s adapters, traced on fake tensors (chapter: 5)."""
    return trace_step(peak_spec(PEAK_LORA))


def lora_peak_slips(full: StepMemory, lora: StepMemory) -> list[tuple[float, str]]:
    """Typical wrong predictions of the LoRA step's peak, each with its hint (chapter: 5).

    Each is computed from the two traced steps: the LoRA peak moved by the bytes the mistake
    adds or drops.
    """
    at_full = full.phase_breakdown["backward"]
    at_lora = lora.phase_breakdown[lora.peak_phase]
    peak = lora.peak_bytes
    return merged_slips([
        (full.peak_bytes, "that is full fine-tuning's peak: with LoRA the base's weights are "
                          "frozen, so they get no gradients and no AdamW states; only the "
                          "adapters do"),
        (peak + full.saved_activations_bytes - lora.saved_activations_bytes,
         "a Linear layer whose weight is frozen needs no copy of its input for the backward pass "
         "(its input's gradient needs only the weight): a LoRA step saves fewer activations than "
         "full fine-tuning"),
        (peak + at_full["optimizer_states"], "AdamW keeps its moments only for what trains: the "
                                             "base's states are gone too"),
        (sum(lora.phase_breakdown["optimizer"].values()),
         "the activations and the backward pass's temporaries come on top of the weights: a LoRA "
         "step peaks in the backward pass"),
        (peak - at_lora["temporaries"], "add the backward pass's temporaries at the peak (the "
                                        "gradient of the logits): they do not depend on what "
                                        "trains"),
        (peak * 8, "bits and bytes are different units: answer bytes"),
        (peak / 2**30, "answer bytes, not GiB"),
        (peak / 2**20, "answer bytes, not MiB"),
        (peak / 1e9, "answer bytes, not GB"),
    ])


def check_lora_peak(answer, rtol: float = PEAK_RTOL):
    """Check a predicted peak of :data:`PEAK_JOB`'s LoRA step against its trace (chapter: 5)."""
    lora = traced_lora_step()
    expected = lora.peak_bytes
    return number_problem(
        answer, expected, ask="a number of bytes", rtol=rtol, slip_rtol=PEAK_SLIP_RTOL,
        slips=lambda: [(v, h) for v, h in lora_peak_slips(traced_full_step(), lora)
                       if not close_to(v, expected, rtol)])


lab = define_lab("lab05", "Fine-tuning with less memory")

lab.exercise(
    "5.1",
    "LoRA's trainable parameters for each case of LORA_CASES, from the configs alone, against "
    "the parameters that require a gradient once adapters are injected",
    check=check_lora_counts,
)
lab.exercise(
    "5.2",
    "a lora_linear(x, weight, bias, A, B, alpha, r) function that gives the merged weight's "
    "output, x (W + (alpha / r) B A)^T + b",
    check=check_lora_forward,
    rtol=FORWARD_RTOL,
)
lab.exercise(
    "5.3",
    f"bytes of QLORA_SETUP's weights: the base's block linears in nf4-dq, the rest in bf16, the "
    f"adapters in fp32 (within {WEIGHTS_RTOL:.2%})",
    check=check_weight_bytes,
    rtol=WEIGHTS_RTOL,
)
lab.exercise(
    "5.4",
    f"peak bytes of PEAK_JOB's LoRA step, predicted from the traced full fine-tuning step, "
    f"against its trace (within {PEAK_RTOL:.0%})",
    check=check_lora_peak,
    rtol=PEAK_RTOL,
)
