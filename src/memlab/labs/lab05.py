"""Lab 5, "Fine-tuning with less memory": LoRA's trainable parameters counted from a config, its
forward pass written for one linear layer, the bytes of a QLoRA set-up's weights, and the
set-up a GPU holds for a fine-tuning job.

Every expected value is computed at check time, never typed in: parameter counts with
:func:`memlab.finetune.lora_parameters`; the LoRA forward against the merged weight,
x (W + (alpha / r) B A)^T + b, and :func:`memlab.finetune.lora_forward`; the weights' bytes with
:func:`memlab.finetune.estimate.base_weight_bytes` plus the adapters in fp32; each set-up's peak
with :func:`memlab.finetune.estimate.estimate_finetune` against the catalogue's usable memory.
Each hint names one mistake and fires only on the answer that mistake gives, computed from the
same numbers the check compares with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.errors import check_choice, check_positive_int
from memlab.finetune.counts import block_linear_shapes, lora_parameters, trainable_parameters
from memlab.finetune.estimate import (
    ADAPTER_BYTES,
    DQ_BLOCK,
    NF4_BLOCK,
    base_weight_bytes,
    estimate_finetune,
    quantized_weight_bytes,
)
from memlab.finetune.lora import ALL_LINEAR, LoraConfig, LoraLinear, lora_forward
from memlab.gpus import get_gpu
from memlab.labs.grader import (
    answer_number,
    answer_tensor,
    check_each_key,
    close_to,
    define_lab,
    merged_slips,
    named_slip,
    number_problem,
    one_line,
)
from memlab.memory.activations import PARAM_BYTES
from memlab.memory.estimator import MemoryEstimate
from memlab.model.config import ModelConfig, get_config

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

# Exercise 5.4: one fine-tuning job and a menu of set-ups in order of preference: the most
# trainable parameters first; at equal count a 16-bit base before a 4-bit one; then without
# activation checkpointing before with it (:func:`preference_key`). The answer is the first
# set-up whose estimated peak fits the GPU's usable memory.
JOB = dict(model="mistral-7b", gpu="A100-80GB", batch_size=8, seq_len=1024)
_ALL = LoraConfig(r=16, alpha=32, target_modules=ALL_LINEAR)
_QV = LoraConfig(r=16, alpha=32, target_modules=("q_proj", "v_proj"))
_SETUPS = (
    ("full, bf16-mixed", dict(precision="bf16-mixed")),
    ("LoRA all-linear", dict(precision="bf16", lora=_ALL)),
    ("QLoRA all-linear", dict(precision="bf16", lora=_ALL, quantize_base="nf4-dq")),
    ("LoRA q,v", dict(precision="bf16", lora=_QV)),
)
MENU = {f"{name}{suffix}": {**setup, "checkpointing": ckpt}
        for name, setup in _SETUPS
        for suffix, ckpt in (("", False), (", checkpointing", True))}
NONE = "none"  # the answer when no set-up of the menu fits
PRECISION_BASE = {"bf16-mixed": "fp32", "bf16": "bf16"}  # how each precision stores the weights


def _config(model: ModelConfig | str) -> ModelConfig:
    return model if isinstance(model, ModelConfig) else get_config(model)


# ------------------------------------------------------- 5.1 LoRA's trainable parameters


def lora_config(case: Mapping) -> LoraConfig:
    """The :class:`~memlab.finetune.LoraConfig` of one case of :data:`LORA_CASES` (chapter: 5)."""
    return LoraConfig(r=case["r"], alpha=case["alpha"], target_modules=case["target_modules"])


def lora_count(key: str) -> int:
    """Adapter parameters of one case of :data:`LORA_CASES` (chapter: 5).

    From :func:`memlab.finetune.lora_parameters`.
    """
    check_choice("LoRA case", key, LORA_CASES)
    case = LORA_CASES[key]
    return lora_parameters(_config(case["model"]), lora_config(case))


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
        value, lora_count(key), slips=lambda: lora_count_slips(key), slip_rtol=1e-9,
        ask="a number of parameters",
        fallback="r x (in + out) for each adapted linear of a block, times n_layer"))


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
    return False, (f"relative error {relative_error(y, expected):.1e} against "
                   "x (W + (alpha / r) B A)^T + b, the merged weight's output")


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
    got = answer_number(answer)
    if got is None:
        return False, f"answer a number of bytes, got {type(answer).__name__}"
    expected = qlora_weight_bytes()
    if close_to(got, expected, rtol):
        return True
    return False, named_slip(got, weight_bytes_slips(expected), rtol) or (
        "block linears: codes + 8-bit absmax + their fp32 scales; the rest in "
        f"{QLORA_SETUP['precision']}; the adapters in fp{8 * ADAPTER_BYTES}")


# ------------------------------------------------------------ 5.4 the set-up that fits


def preference_key(name: str) -> tuple[int, bool, bool]:
    """The menu's order (chapter: 5).

    The most trainable parameters first, then a 16-bit base, then no checkpointing.
    """
    check_choice("set-up", name, MENU)
    s = MENU[name]
    trained = trainable_parameters(JOB["model"], lora=s.get("lora"))
    return (-trained, s.get("quantize_base") is not None, bool(s.get("checkpointing")))


def describe_setup(name: str) -> dict[str, object]:
    """One set-up of :data:`MENU` in words (chapter: 5).

    Precision, adapters, base, checkpointing, trainable parameters.
    """
    check_choice("set-up", name, MENU)
    s = MENU[name]
    lora = s.get("lora")
    targets = None if lora is None else (lora.target_modules if isinstance(lora.target_modules, str)
                                         else ",".join(lora.target_modules))
    return {"precision": s["precision"],
            "adapters": "none" if lora is None else f"r={lora.r} {targets}",
            "base": s.get("quantize_base") or PRECISION_BASE[s["precision"]],
            "checkpointing": bool(s.get("checkpointing")),
            "trainable": -preference_key(name)[0]}


def setup_estimate(name: str, batch_size: int = JOB["batch_size"],
                   seq_len: int = JOB["seq_len"], checkpointing: bool | None = None) -> MemoryEstimate:
    """The estimate of one set-up of :data:`MENU` for :data:`JOB`'s model (CUDA) (chapter: 5).

    ``checkpointing`` overrides the set-up's (None: the set-up's own).
    """
    check_choice("set-up", name, MENU)
    s = dict(MENU[name])
    if checkpointing is not None:
        s["checkpointing"] = checkpointing
    return estimate_finetune(JOB["model"], batch_size=batch_size, seq_len=seq_len, **s)


def first_fitting(limit_bytes: int, measure: Callable[[str], int]) -> str:
    """The first set-up of :data:`MENU` with ``measure(name)`` <= ``limit_bytes`` (chapter: 5).

    'none' if no set-up is that small.
    """
    return next((name for name in MENU if measure(name) <= limit_bytes), NONE)


def best_setup(gpu: str = JOB["gpu"], batch_size: int = JOB["batch_size"],
               seq_len: int = JOB["seq_len"]) -> str:
    """The first set-up of :data:`MENU` whose estimated peak fits the GPU (chapter: 5).

    The peak is held to the GPU's usable memory; 'none' if no set-up fits.
    """
    return first_fitting(get_gpu(gpu).usable_bytes,
                         lambda name: setup_estimate(name, batch_size, seq_len).peak_bytes)


def setup_slips() -> dict[str, str]:
    """The wrong set-up each typical mistake leads to for :data:`JOB`, with its hint (chapter: 5).

    Each mistake is run through the same menu: the answer it gives is the set-up it picks. A
    mistake that picks the right set-up here names nothing.
    """
    gpu = get_gpu(JOB["gpu"])
    usable = gpu.usable_bytes

    def peak(name: str) -> int:
        return setup_estimate(name).peak_bytes

    fitting = [name for name in MENU if peak(name) <= usable]
    picks = [
        (first_fitting(usable, lambda n: setup_estimate(n).parameters_bytes),
         "compare the estimated peak (peak_bytes), not the weights: gradients, optimizer states, "
         "activations and temporaries come on top of them"),
        (first_fitting(usable, lambda n: setup_estimate(n, checkpointing=False).peak_bytes),
         "estimate the set-ups with checkpointing with checkpointing=True: it is what makes them "
         "smaller"),
        (first_fitting(usable, lambda n: setup_estimate(n, batch_size=1).peak_bytes),
         f"estimate at JOB's batch size ({JOB['batch_size']} sequences), not one sequence: "
         "activations grow with the batch"),
        (first_fitting(gpu.memory_bytes, peak), f"compare with {gpu.name}'s usable memory "
                                                "(usable_bytes), not the label"),
        (first_fitting(gpu.total_bytes, peak), f"compare with {gpu.name}'s usable memory "
                                               "(usable_bytes), not the nvidia-smi total"),
        (min(fitting, key=peak) if fitting else NONE,
         "that is the set-up with the smallest estimated peak; the criterion is the menu's "
         "order: the first set-up that fits"),
    ]
    expected = best_setup()
    out: dict[str, str] = {}
    for name, hint in picks:
        if name != expected and hint not in out.get(name, ""):
            out[name] = f"{out[name]}; or {hint}" if name in out else hint
    return out


def check_setup(answer):
    """Check the first set-up of :data:`MENU` whose estimated peak fits :data:`JOB`'s GPU (chapter: 5)."""
    accepted = (*MENU, NONE)
    if not isinstance(answer, str):
        return False, f"answer a set-up name (a string), got {type(answer).__name__}"
    name = answer.strip()
    if name not in accepted:
        return False, f"unknown set-up {answer!r}; accepted: {', '.join(accepted)}"
    expected = best_setup()
    if name == expected:
        return True
    gpu = get_gpu(JOB["gpu"])
    slip = setup_slips().get(name, "")
    if name == NONE:
        why = f"a set-up of the menu fits {gpu.name}'s usable memory"
    else:
        peak = setup_estimate(name).peak_bytes
        if peak > gpu.usable_bytes:
            why = (f"{name}'s estimated peak, {peak:,} bytes, is more than the "
                   f"{gpu.usable_bytes:,} bytes usable on {gpu.name}")
        else:
            why = (f"{name} fits, but a set-up earlier in the menu fits too: the menu is in "
                   "order of preference, take the first that fits")
    return False, why + (f": {slip}" if slip else "")


lab = define_lab("lab05", "Fine-tuning with less memory")

lab.exercise(
    "5.1",
    "LoRA's trainable parameters for each case of LORA_CASES, from the configs alone",
    check=check_lora_counts,
    hint="answer a dict with the keys of LORA_CASES, in parameters",
)
lab.exercise(
    "5.2",
    "a lora_linear(x, weight, bias, A, B, alpha, r) function that gives the merged weight's "
    "output, x (W + (alpha / r) B A)^T + b",
    check=check_lora_forward,
    rtol=FORWARD_RTOL,
    hint="y = x W^T + b + (alpha / r) (x A^T) B^T",
)
lab.exercise(
    "5.3",
    f"bytes of QLORA_SETUP's weights: the base's block linears in nf4-dq, the rest in bf16, the "
    f"adapters in fp32 (within {WEIGHTS_RTOL:.2%})",
    check=check_weight_bytes,
    rtol=WEIGHTS_RTOL,
    hint="count the blocks' linear weights from cfg; the rest is cfg.num_parameters() minus those",
)
lab.exercise(
    "5.4",
    "the first set-up of MENU whose estimated peak fits the GPU's usable memory",
    check=check_setup,
    dimensionless=True,
    hint="a set-up fits when its estimate's peak_bytes is at most the GPU's usable_bytes; take "
    "the first in the menu's order",
)
