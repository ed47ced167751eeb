"""Quantizing a model the book trains itself: memory, quality and per-layer error (chapter: 3).

The model is a small Llama-style transformer trained on a second-order Markov language
(:class:`memlab.tasks.MarkovTask` with ``order=2``): every token depends on the two before it, so
attention and MLP weights all matter, and the best possible loss and accuracy on held-out text
are known exactly. Quality is reported as the held-out loss in nats, its excess over that
optimum, perplexity and top-1 accuracy.

Every quantization scheme replaces the ``nn.Linear`` layers inside the transformer blocks (the
attention projections and the MLP) and keeps the embedding, the norms and the LM head in 16-bit,
as ``bitsandbytes`` and ``transformers`` do by default. The int8, LLM.int8(), NF4 and FP4 schemes
use bitsandbytes' own modules (``Linear8bitLt``, ``Linear4bit``); round-to-nearest and GPTQ use
:mod:`memlab.quant` and :mod:`memlab.gptq`. Weight bytes are counted from the tensors each
quantized layer really stores (:func:`layer_bytes`).
"""

from __future__ import annotations

import copy
import functools
import math
import time
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int, require
from memlab.models import ModelConfig, Transformer, build_model, lm_loss
from memlab.tasks import MarkovTask

OPTIMIZERS = ("adamw", "adamw8bit")


EVAL_SEED = 10**6  # held-out sequences are sampled with seeds from here on
CALIB_SEED = 2 * 10**6  # calibration sequences (GPTQ, outlier statistics)


@dataclass(frozen=True)
class LMConfig:
    """The book's small language model and how it is trained (chapter: 3)."""

    vocab_size: int = 16
    order: int = 2
    d_model: int = 128
    n_layer: int = 2
    n_head: int = 4
    d_ff: int = 384
    seq_len: int = 32
    batch_size: int = 32
    steps: int = 400
    lr: float = 5e-3
    warmup: int = 20
    seed: int = 0
    eval_sequences: int = 128
    calib_sequences: int = 32

    def model_config(self) -> ModelConfig:
        """The transformer's shape, as a :class:`memlab.models.ModelConfig`."""
        return ModelConfig(name=f"markov{self.order}-d{self.d_model}", style="llama",
                           vocab_size=self.vocab_size, n_layer=self.n_layer, n_head=self.n_head,
                           n_kv_head=self.n_head, d_model=self.d_model, d_ff=self.d_ff,
                           max_seq_len=self.seq_len)

    def task(self) -> MarkovTask:
        """The language the model learns."""
        return MarkovTask(self.vocab_size, order=self.order, seed=self.seed)


SIZES = {
    "ci": LMConfig(),
    "full": LMConfig(vocab_size=48, d_model=512, n_layer=4, n_head=8, d_ff=1536, seq_len=128,
                     batch_size=64, steps=3000, lr=1e-3, warmup=100, eval_sequences=512,
                     calib_sequences=128),
}


def lm_config(scale: str | None = None, **overrides) -> LMConfig:
    """The model and run for a scale (``ci`` fits 2 CPU cores in seconds) (chapter: 3)."""
    cfg = SIZES[get_scale(scale)]
    unknown = sorted(set(overrides) - {f.name for f in fields(LMConfig)})
    if unknown:
        raise MemlabError(f"unknown LMConfig field {unknown[0]!r}; accepted: "
                          + ", ".join(f.name for f in fields(LMConfig)))
    return replace(cfg, **overrides) if overrides else cfg


# Training and evaluation -------------------------------------------------------------------------
@dataclass
class TrainedLM:
    """A trained model, its task and its training curve (chapter: 3)."""

    model: Transformer
    config: LMConfig
    task: MarkovTask
    losses: list[float]  # training loss per step, nats
    optimizer: str
    train_s: float
    device: str
    state: StateBytes  # the optimizer's state tensors after the last step, measured
    opt: torch.optim.Optimizer | None = field(default=None, repr=False, compare=False)  # kept on request

    @property
    def state_bytes(self) -> int:
        """Bytes of the optimizer's distinct state tensors after the last step."""
        return self.state.state_bytes

    @property
    def trained_params(self) -> int:
        """Parameters the optimizer updated."""
        return self.state.trained_params


def _lr_at(step: int, cfg: LMConfig, lr: float, steps: int) -> float:
    """Linear warm-up, then cosine decay to zero."""
    warm = min(1.0, (step + 1) / max(1, cfg.warmup))
    return lr * warm * 0.5 * (1 + math.cos(math.pi * step / steps))


def make_optimizer(name: str, params, lr: float):
    """torch AdamW or bitsandbytes' 8-bit AdamW, with the same hyper-parameters (chapter: 3)."""
    check_choice("optimizer", name, OPTIMIZERS)
    params = list(params)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    bnb = require("bitsandbytes", "8-bit AdamW", extra="quant")
    return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=0.0)


def train_lm(cfg: LMConfig | None = None, *, model: nn.Module | None = None, steps: int | None = None,
             lr: float | None = None, optimizer: str = "adamw", device=None,
             seed_offset: int = 0, keep_optimizer: bool = False) -> TrainedLM:
    """Train (or go on training ``model``) on the config's task; returns the loss per step, nats (chapter: 3).

    The batches are the same for every call with the same ``seed_offset``, so two optimizers or
    two model variants see exactly the same data. ``keep_optimizer`` keeps the optimizer (and
    its state tensors) in :attr:`TrainedLM.opt`, to measure its state another way.
    """
    cfg = _config(None, cfg)
    steps = check_positive_int("steps", steps if steps is not None else cfg.steps)
    lr = cfg.lr if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise MemlabError(f"lr must be a positive number, got {lr!r}")
    dev = pick_device(device)
    task = cfg.task()
    if model is None:
        model = build_model(cfg.model_config(), seed=cfg.seed)
    model = model.to(dev).train()
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, cfg, lr, steps)
        x, y = task.sample(cfg.batch_size, cfg.seq_len, seed=cfg.seed * 7919 + seed_offset + step)
        x, y = x.to(dev), y.to(dev)
        loss = lm_loss(task.scored(model(x)), task.scored(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return TrainedLM(model, cfg, task, losses, optimizer, time.perf_counter() - start,
                     device_name(dev), measure_state(opt, model), opt if keep_optimizer else None)


def _state_tensors(opt: torch.optim.Optimizer, p: torch.Tensor) -> list[torch.Tensor]:
    return [t for t in opt.state.get(p, {}).values() if isinstance(t, torch.Tensor)]


def _key(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.numel() * t.element_size()


@dataclass(frozen=True)
class StateBytes:
    """An optimizer's state, measured tensor by tensor, split into two sets of parameters (chapter: 3)."""

    state_bytes: int  # every distinct state tensor, a tensor shared by many parameters once
    trained_params: int
    eligible_params: int  # parameters in the first set (by default: state holds 1-byte codes)
    eligible_bytes: int  # their own state tensors, plus the shared tensors they use, once
    other_params: int
    other_bytes: int  # the rest, with shared tensors only the rest uses
    shared_bytes: int  # tensors in the state of more than one parameter (8-bit code books)
    eligible_names: tuple[str, ...]
    other_names: tuple[str, ...]

    @property
    def bytes_per_param(self) -> float:
        return self.state_bytes / self.trained_params

    @property
    def eligible_bytes_per_param(self) -> float | None:
        return self.eligible_bytes / self.eligible_params if self.eligible_params else None

    @property
    def other_bytes_per_param(self) -> float | None:
        return self.other_bytes / self.other_params if self.other_params else None


def measure_state(opt: torch.optim.Optimizer, model: nn.Module,
                eligible: set[str] | None = None) -> StateBytes:
    """Bytes of an optimizer's state tensors, per parameter, over two sets of parameters (chapter: 3).

    ``eligible`` names the first set; by default it is every parameter whose state holds a
    tensor of 1-byte elements (the 8-bit codes). A tensor found in the state of several
    parameters (bitsandbytes' code books) is counted once.
    """
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for g in opt.param_groups for p in g["params"]]
    seen: dict[tuple[int, int], int] = {}
    for p in params:
        for t in _state_tensors(opt, p):
            seen[_key(t)] = seen.get(_key(t), 0) + 1
    shared = {k for k, n in seen.items() if n > 1}
    if eligible is None:
        eligible = {names.get(id(p), "?") for p in params
                    if any(t.element_size() == 1 for t in _state_tensors(opt, p))}
    sets = {True: [0, 0, set(), []], False: [0, 0, set(), []]}  # params, own bytes, shared, names
    for p in params:
        keys = {_key(t) for t in _state_tensors(opt, p)}
        acc = sets[names.get(id(p), "?") in eligible]
        acc[0] += p.numel()
        acc[1] += sum(k[1] for k in keys - shared)
        acc[2] |= keys & shared
        acc[3].append(names.get(id(p), "?"))
    (n_in, own_in, sh_in, names_in), (n_out, own_out, sh_out, names_out) = sets[True], sets[False]
    return StateBytes(
        state_bytes=sum(k[1] for k in seen), trained_params=n_in + n_out,
        eligible_params=n_in, eligible_bytes=own_in + sum(k[1] for k in sh_in),
        other_params=n_out, other_bytes=own_out + sum(k[1] for k in sh_out - sh_in),
        shared_bytes=sum(k[1] for k in shared), eligible_names=tuple(names_in),
        other_names=tuple(names_out))


@dataclass(frozen=True)
class Quality:
    """Held-out quality of a model on the task, next to the exact optimum (chapter: 3)."""

    loss: float  # nats per scored token
    best_loss: float  # the chain's own loss on the same tokens
    accuracy: float  # top-1
    best_accuracy: float
    seq_loss: torch.Tensor | None = field(default=None, repr=False, compare=False)  # (n,) per sequence

    @property
    def excess(self) -> float:
        """Loss above the best possible, nats: 0 is a perfect model."""
        return self.loss - self.best_loss

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def eval_batch(cfg: LMConfig, *, calibration: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed held-out (or calibration) sequences: inputs and targets, (n, seq_len) each."""
    n = cfg.calib_sequences if calibration else cfg.eval_sequences
    return cfg.task().sample(n, cfg.seq_len, seed=CALIB_SEED if calibration else EVAL_SEED)


@torch.no_grad()
def evaluate(model: nn.Module, cfg: LMConfig, *, device=None) -> Quality:
    """Loss, accuracy and the optimum on the held-out sequences (chapter: 3)."""
    task = _config(None, cfg).task()
    x, y = eval_batch(cfg)
    dev = next(model.parameters()).device if device is None else pick_device(device)
    logits = task.scored(model(x.to(dev))).float().cpu()  # (n, T', V)
    tgt = task.scored(y)
    loss = float(lm_loss(logits, tgt))
    n, t, v = logits.shape
    per_token = F.cross_entropy(logits.reshape(n * t, v), tgt.reshape(n * t), reduction="none")
    acc = float((logits.argmax(-1) == tgt).double().mean())
    best_loss, best_acc = task.optimal(x, y)
    return Quality(loss, best_loss, acc, best_acc, per_token.reshape(n, t).double().mean(dim=1))


def paired_delta(quality: Quality, reference: Quality) -> tuple[float, float]:
    """Held-out loss of ``quality`` minus ``reference``'s on the same sequences, and its standard error, nats (chapter: 3).

    Both models are scored on the same sequences, so the difference is taken sequence by
    sequence (a paired comparison): the standard error is the spread of those differences over
    sqrt(number of sequences). A change within about two standard errors is not distinguishable
    from the sampling of the held-out text.
    """
    if quality.seq_loss is None or reference.seq_loss is None:
        raise MemlabError("both qualities must come from memlab.quantmodel.evaluate (per-sequence losses)")
    if quality.seq_loss.shape != reference.seq_loss.shape:
        raise MemlabError(f"the two were scored on different sequences: {tuple(quality.seq_loss.shape)} "
                          f"vs {tuple(reference.seq_loss.shape)}")
    d = quality.seq_loss - reference.seq_loss
    se = float(d.std() / math.sqrt(d.numel())) if d.numel() > 1 else math.nan
    return float(d.mean()), se


@functools.cache
def _reference(cfg: LMConfig, device: str) -> TrainedLM:
    return train_lm(cfg, device=device)


def reference_model(scale: str | None = None, *, device=None, config: LMConfig | None = None) -> TrainedLM:
    """The trained fp32 model every scheme starts from; trained once per process (chapter: 3).

    ``config`` replaces the scale's :class:`LMConfig` (the tests use a smaller one).
    """
    return _reference(_config(scale, config), str(pick_device(device)))


def _config(scale: str | None, config: LMConfig | None) -> LMConfig:
    if config is not None and not isinstance(config, LMConfig):
        raise MemlabError(f"config must be an LMConfig, got {type(config).__name__}")
    return config or lm_config(scale)


# Schemes -------------------------------------------------------------------------------------------
SCHEMES = ("fp32", "bf16", "int8", "llm-int8", "nf4", "fp4", "nf4-dq", "rtn-4", "rtn-3",
           "gptq-4", "gptq-3")
SCHEME_LABELS = {
    "fp32": "fp32 (reference)",
    "bf16": "bf16",
    "int8": "int8 absmax per-row, weights and inputs (bitsandbytes, threshold 0)",
    "llm-int8": "LLM.int8(): int8 + 16-bit outlier columns (bitsandbytes, threshold 6)",
    "nf4": "NF4, blocks of 64 (bitsandbytes)",
    "fp4": "FP4, blocks of 64 (bitsandbytes)",
    "nf4-dq": "NF4 + double quantization (bitsandbytes)",
    "rtn-4": "4-bit round-to-nearest, zero-point per group of 64",
    "rtn-3": "3-bit round-to-nearest, zero-point per group of 64",
    "gptq-4": "GPTQ 4-bit, zero-point per group of 64",
    "gptq-3": "GPTQ 3-bit, zero-point per group of 64",
}
GROUP_SIZE = 64  # RTN and GPTQ: one fp16 scale and one zero per 64 weights, like NF4's blocks
LLM_INT8_THRESHOLD = 6.0  # bitsandbytes' and the paper's default


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers inside the transformer blocks, by name: what every scheme quantizes (chapter: 3)."""
    return {f"blocks.{name}": m for name, m in model.blocks.named_modules() if isinstance(m, nn.Linear)}


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _tensor_bytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


@dataclass(frozen=True)
class LayerStorage:
    """What one quantized layer stores: codes and scales, and everything bitsandbytes would save."""

    params: int
    weight_bytes: int  # codes + scales (+ zeros): the weight as stored in memory
    saved_bytes: int  # the module's state_dict: also code books and serialized metadata

    @property
    def bits_per_param(self) -> float:
        return 8 * self.weight_bytes / self.params


def layer_bytes(module: nn.Module, params: int) -> LayerStorage:
    """Bytes a (quantized) linear layer stores, counted from its own tensors (chapter: 3)."""
    saved = _tensor_bytes(*module.state_dict().values())
    w = module.weight
    qs = getattr(w, "quant_state", None)
    if qs is not None:  # bitsandbytes Params4bit: packed codes, absmax (and its own absmax)
        extra = [qs.absmax] + ([qs.state2.absmax, qs.offset] if qs.nested else [])
        weight = _tensor_bytes(w.data, *extra)
    elif _int8_scales(module) is not None:  # Int8Params: int8 codes and one fp32 absmax per row
        weight = _tensor_bytes(w.data, _int8_scales(module))
    elif hasattr(module, "stored_bytes"):
        weight = module.stored_bytes
    else:
        weight = _tensor_bytes(w)
    return LayerStorage(params, weight, saved)


def _int8_scales(module: nn.Module) -> torch.Tensor | None:
    """Linear8bitLt's per-row absmax: on the weight until the first forward, then on ``module.state``."""
    scb = getattr(module.weight, "SCB", None)
    if scb is None:
        scb = getattr(getattr(module, "state", None), "SCB", None)
    return scb if isinstance(scb, torch.Tensor) else None


class DequantizedLinear(nn.Linear):
    """A linear layer whose weight is the dequantized value of stored codes (RTN, GPTQ) (chapter: 3).

    It computes with the dequantized fp32 weight (what a dequantize-then-matmul kernel does) and
    reports the bytes of the codes, scales and zeros it stands for in ``stored_bytes`` (the
    weight only: a bias is counted with the model's other parameters, as for every scheme).
    """

    def __init__(self, linear: nn.Linear, q: torch.Tensor, state):
        from memlab.quant import dequantize, stored_bytes

        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         device=linear.weight.device)
        with torch.no_grad():
            self.weight.copy_(dequantize(q.cpu(), state).to(linear.weight.device))
            if linear.bias is not None:
                self.bias.copy_(linear.bias)
        self.stored_bytes = stored_bytes(q.cpu(), state)


def _bnb_linear(linear: nn.Linear, scheme: str, device: torch.device) -> nn.Module:
    bnb = require("bitsandbytes", f"the {scheme} scheme", extra="quant")
    has_bias = linear.bias is not None
    if scheme in ("int8", "llm-int8"):
        m = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias,
                                has_fp16_weights=False,
                                threshold=LLM_INT8_THRESHOLD if scheme == "llm-int8" else 0.0)
    else:
        m = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias,
                              compute_dtype=torch.float32, compress_statistics=scheme == "nf4-dq",
                              quant_type="fp4" if scheme == "fp4" else "nf4")
    m.load_state_dict(linear.state_dict())
    return m.to(device).eval()  # moving it to the device quantizes the weight


@dataclass
class QuantizedLM:
    """A copy of the reference model with its block linears quantized by one scheme (chapter: 3)."""

    scheme: str
    model: nn.Module
    layers: dict[str, LayerStorage]
    other_params: int  # embedding, norms, LM head: kept in 16-bit (fp32 in the fp32 reference)
    other_bytes: int
    quantize_s: float

    @property
    def linear_bytes(self) -> int:
        return sum(s.weight_bytes for s in self.layers.values())

    @property
    def linear_params(self) -> int:
        return sum(s.params for s in self.layers.values())

    @property
    def total_bytes(self) -> int:
        return self.linear_bytes + self.other_bytes


def _round_params(module_params, dtype: torch.dtype) -> int:
    """Round parameters to ``dtype`` in place (computed in fp32 after); their bytes in ``dtype``."""
    n = 0
    with torch.no_grad():
        for p in module_params:
            p.copy_(p.to(dtype).float())
            n += p.numel() * torch.empty((), dtype=dtype).element_size()
    return n


def quantize_model(trained: TrainedLM, scheme: str, *, device=None,
                   group_size: int = GROUP_SIZE) -> QuantizedLM:
    """Quantize a copy of ``trained.model``'s block linears with ``scheme`` (chapter: 3).

    ``group_size`` is the number of weights per scale for RTN and GPTQ (bitsandbytes' 4-bit
    layers use blocks of 64).
    """
    check_choice("scheme", scheme, SCHEMES)
    check_positive_int("group_size", group_size)
    dev = pick_device(device)
    start = time.perf_counter()
    model = copy.deepcopy(trained.model).to(dev).eval()
    linears = block_linears(model)
    linear_ids = {id(m.weight) for m in linears.values()}
    others = [p for p in model.parameters() if id(p) not in linear_ids]
    other_params = sum(p.numel() for p in others)
    if scheme == "fp32":
        layers = {n: layer_bytes(m, m.weight.numel()) for n, m in linears.items()}
        return QuantizedLM(scheme, model, layers, other_params, _tensor_bytes(*others),
                           time.perf_counter() - start)
    other_bytes = _round_params(others, torch.bfloat16)  # embedding, norms, head: 16-bit
    if scheme == "bf16":
        _round_params([m.weight for m in linears.values()], torch.bfloat16)
        layers = {n: LayerStorage(m.weight.numel(), m.weight.numel() * 2, m.weight.numel() * 2)
                  for n, m in linears.items()}
    elif scheme.startswith("gptq"):
        layers = _gptq_model(model, trained.config, int(scheme[-1]), dev, group_size)
    else:
        layers = {}
        for name, lin in linears.items():
            if scheme.startswith("rtn"):
                from memlab.gptq import rtn_quantize

                q, st = rtn_quantize(lin.weight.detach().float().cpu(), int(scheme[-1]),
                                     group_size=group_size)
                new = DequantizedLinear(lin, q, st)
            else:
                new = _bnb_linear(lin, scheme, dev)
            _set_module(model, name, new)
            layers[name] = layer_bytes(new, lin.weight.numel())
    return QuantizedLM(scheme, model, layers, other_params, other_bytes, time.perf_counter() - start)


@torch.no_grad()
def _capture_inputs(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs every named module receives when the model runs on ``x``, as (N, in) fp32."""
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for name in names:
        def hook(_m, args, name=name):
            seen[name] = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _gptq_model(model: nn.Module, cfg: LMConfig, bits: int, dev: torch.device,
                group_size: int) -> dict[str, LayerStorage]:
    """GPTQ block by block, as in the paper: each block's Hessians come from the inputs it gets
    from the blocks before it, already quantized."""
    from memlab.gptq import gptq_quantize, hessian

    x, _ = eval_batch(cfg, calibration=True)
    x = x.to(dev)
    layers: dict[str, LayerStorage] = {}
    for i in range(len(model.blocks)):
        names = [n for n in block_linears(model) if n.startswith(f"blocks.{i}.")]
        inputs = _capture_inputs(model, names, x)
        for name in names:
            lin = model.get_submodule(name)
            H = hessian(inputs[name].cpu())
            q, st = gptq_quantize(lin.weight.detach().float().cpu(), H, bits, group_size=group_size)
            new = DequantizedLinear(lin, q, st)
            _set_module(model, name, new)
            layers[name] = layer_bytes(new, lin.weight.numel())
    return layers


@torch.no_grad()
def layer_errors(reference: nn.Module, quantized: nn.Module, cfg: LMConfig) -> dict[str, float]:
    """Relative output error of each quantized block linear, ||y_q - y|| / ||y||, on the reference's own inputs (chapter: 3).

    The inputs come from held-out sequences (as many as the calibration set), never from the
    calibration sequences GPTQ fits its updates to: the error is measured out of sample.
    """
    x, _ = eval_batch(cfg)
    x = x[: cfg.calib_sequences]
    dev = next(reference.parameters()).device
    names = list(block_linears(reference))
    inputs = _capture_inputs(reference, names, x.to(dev))
    out = {}
    for name in names:
        xin = inputs[name]
        y = reference.get_submodule(name)(xin).float()
        yq = quantized.get_submodule(name)(xin).float()
        out[name] = float((yq - y).norm() / y.norm())
    return out


@dataclass(frozen=True)
class SchemeRow:
    """One scheme on the reference model: bytes, quality and per-layer error (chapter: 3)."""

    scheme: str
    label: str
    linear_params: int
    linear_bytes: int  # codes + scales of the quantized block linears
    saved_bytes: int  # what the quantized layers' state_dicts hold (code books, metadata too)
    other_bytes: int  # embedding, norms, LM head
    total_bytes: int
    bits_per_param: float  # of the block linears, scales included
    loss: float  # held-out, nats
    excess: float  # loss above the chain's own, nats
    perplexity: float
    accuracy: float
    mean_layer_error: float  # mean relative output error of the block linears
    max_layer_error: float
    quantize_s: float
    other_params: int  # parameters of the embedding, norms and LM head
    loss_delta: float  # held-out loss minus the fp32 reference's, same sequences, nats
    loss_delta_se: float  # its standard error over the held-out sequences (paired), nats


@dataclass(frozen=True)
class QuantComparison:
    """Every scheme on one trained model (chapter: 3)."""

    rows: list[SchemeRow]
    layer_errors: dict[str, dict[str, float]]  # scheme -> layer -> relative output error
    reference: Quality
    config: LMConfig
    train_s: float
    device: str

    @property
    def fp32_bytes(self) -> int:
        """Bytes of the whole model in fp32: 4 per parameter, whichever schemes were compared."""
        r = self.rows[0]
        return 4 * (r.linear_params + r.other_params)

    def row(self, scheme: str) -> SchemeRow:
        check_choice("scheme", scheme, [r.scheme for r in self.rows])
        return next(r for r in self.rows if r.scheme == scheme)

    def table(self):
        """Bytes, quality and error per scheme, as a DataFrame."""
        import pandas as pd

        return pd.DataFrame([{
            "scheme": r.scheme, "linear KiB": r.linear_bytes / 1024,
            "bits/param": r.bits_per_param, "total KiB": r.total_bytes / 1024,
            "vs fp32": r.total_bytes / self.fp32_bytes,
            "loss (nats)": r.loss, "excess (nats)": r.excess,
            "vs fp32 (nats)": r.loss_delta, "2 SE": 2 * r.loss_delta_se, "accuracy": r.accuracy,
            "mean layer error": r.mean_layer_error, "max layer error": r.max_layer_error,
        } for r in self.rows]).set_index("scheme")


def compare_schemes(scale: str | None = None, schemes=SCHEMES, *, device=None,
                    config: LMConfig | None = None, group_size: int = GROUP_SIZE) -> QuantComparison:
    """Quantize the reference model with every scheme; measure bytes, held-out quality, per-layer error (chapter: 3).

    Computed once per process for the same config, schemes, device and ``group_size`` (weights
    per scale for RTN and GPTQ); ``config`` replaces the scale's :class:`LMConfig`.
    """
    schemes = tuple(check_choice("scheme", s, SCHEMES) for s in schemes)
    check_positive_int("group_size", group_size)
    return _compare(_config(scale, config), schemes, str(pick_device(device)), group_size)


@functools.cache
def _compare(cfg: LMConfig, schemes: tuple[str, ...], device: str, group_size: int) -> QuantComparison:
    trained = _reference(cfg, device)
    cfg = trained.config
    reference = evaluate(trained.model, cfg)
    rows, errors = [], {}
    for s in schemes:
        qm = quantize_model(trained, s, device=device, group_size=group_size)
        quality = evaluate(qm.model, cfg)
        errs = layer_errors(trained.model, qm.model, cfg)
        errors[s] = errs
        saved = sum(st.saved_bytes for st in qm.layers.values())
        rows.append(SchemeRow(
            s, SCHEME_LABELS[s], qm.linear_params, qm.linear_bytes, saved, qm.other_bytes,
            qm.total_bytes, 8 * qm.linear_bytes / qm.linear_params, quality.loss, quality.excess,
            quality.perplexity, quality.accuracy, sum(errs.values()) / len(errs), max(errs.values()),
            qm.quantize_s, qm.other_params, *paired_delta(quality, reference)))
    return QuantComparison(rows, errors, reference, cfg, trained.train_s,
                           trained.device)


# Outlier features and LLM.int8() -------------------------------------------------------------------
_NORMED = {"norm1": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
           "norm2": ("mlp.gate_proj", "mlp.up_proj")}  # each norm feeds these linears


@dataclass(frozen=True)
class OutlierStats:
    """How large one linear layer's inputs get, on the calibration sequences (chapter: 3)."""

    layer: str
    max_abs: float
    outlier_columns: int  # features with any |x| >= threshold
    features: int
    rows_touched: float  # share of tokens with at least one outlier value


@torch.no_grad()
def activation_outliers(model: nn.Module, cfg: LMConfig, *, threshold: float = LLM_INT8_THRESHOLD) -> list[OutlierStats]:
    """Largest input magnitude and outlier columns of every block linear (chapter: 3)."""
    from memlab.quant import outlier_columns

    x, _ = eval_batch(cfg, calibration=True)
    names = list(block_linears(model))
    inputs = _capture_inputs(model, names, x.to(next(model.parameters()).device))
    out = []
    for name in names:
        xin = inputs[name]
        cols = outlier_columns(xin, threshold)
        touched = float((xin.abs() >= threshold).any(dim=1).double().mean())
        out.append(OutlierStats(name, float(xin.abs().max()), int(cols.numel()), xin.shape[1], touched))
    return out


@torch.no_grad()
def inject_outliers(model: nn.Module, channels, alpha: float) -> nn.Module:
    """A copy of ``model`` whose normed inputs have outlier features, computing the same function (chapter: 3).

    Each block's norm weights are multiplied by ``alpha`` on ``channels``, and the matching input
    columns of the linears the norms feed are divided by ``alpha``: in exact arithmetic nothing
    changes, but the inputs of q/k/v and of the MLP's first layers now have a few features
    ``alpha`` times larger than the rest, as the systematic outlier features of large models do.
    """
    if not alpha > 0:
        raise MemlabError(f"alpha must be positive, got {alpha!r}")
    d = model.blocks[0].norm1.weight.numel()
    ch = torch.as_tensor(list(channels), dtype=torch.long)
    if ch.numel() and (int(ch.min()) < 0 or int(ch.max()) >= d):
        raise MemlabError(f"channels must lie in 0..{d - 1} (d_model={d}), got {ch.tolist()}")
    m = copy.deepcopy(model)
    for block in m.blocks:
        for norm, targets in _NORMED.items():
            getattr(block, norm).weight[ch] *= alpha
            for t in targets:
                block.get_submodule(t).weight[:, ch] /= alpha
    return m


@dataclass(frozen=True)
class OutlierRow:
    """One scheme on the model with injected outliers."""

    scheme: str
    excess: float  # nats above the optimum
    accuracy: float
    mean_layer_error: float


@dataclass(frozen=True)
class OutlierStudy:
    """Outlier features: found in the trained model, injected, and what int8 and LLM.int8() do with them (chapter: 3)."""

    threshold: float
    alpha: float
    channels: list[int]
    found: list[OutlierStats]  # the trained model as it is
    injected: list[OutlierStats]  # after injection
    injected_fp32_change: float  # max |logit change| the injection causes in fp32 (rounding only)
    rows: list[OutlierRow]  # fp32 / int8 / llm-int8 on the original and the injected model
    sweep_alpha: list[float]  # one layer, outlier size swept
    sweep_int8: list[float]  # relative output error, plain int8 (threshold 0)
    sweep_llm_int8: list[float]  # relative output error, LLM.int8() (threshold 6)
    sweep_layer: str
    scratch_vs_bnb: float  # max |from-scratch LLM.int8() - bitsandbytes| on that layer, relative to max |y|


def outlier_study(scale: str | None = None, *, alpha: float = 32.0, n_channels: int = 4,
                  device=None, config: LMConfig | None = None) -> OutlierStudy:
    """Find outlier features, inject some, and measure plain int8 against LLM.int8() (chapter: 3).

    Computed once per process for the same arguments; ``config`` replaces the scale's :class:`LMConfig`.
    """
    check_positive_int("n_channels", n_channels)
    if not alpha > 0:
        raise MemlabError(f"alpha must be positive, got {alpha!r}")
    cfg = _config(scale, config)
    if n_channels > cfg.d_model:
        raise MemlabError(f"n_channels must be at most d_model={cfg.d_model}, got {n_channels}")
    return _outliers(cfg, float(alpha), n_channels, str(pick_device(device)))


@functools.cache
def _outliers(cfg: LMConfig, alpha: float, n_channels: int, device: str) -> OutlierStudy:
    from memlab.quant import llm_int8_matmul

    trained = _reference(cfg, device)
    g = torch.Generator().manual_seed(cfg.seed)
    channels = sorted(torch.randperm(cfg.d_model, generator=g)[:n_channels].tolist())
    injected = inject_outliers(trained.model, channels, alpha)
    x, _ = eval_batch(cfg)
    dev = next(trained.model.parameters()).device
    with torch.no_grad():
        change = float((injected(x.to(dev)) - trained.model(x.to(dev))).abs().max())
    rows = []
    for tag, model in (("", trained.model), ("injected ", injected)):
        variant = replace(trained, model=model)
        for s in ("fp32", "int8", "llm-int8"):
            qm = quantize_model(variant, s, device=device)
            q = evaluate(qm.model, cfg)
            errs = layer_errors(model, qm.model, cfg)
            rows.append(OutlierRow(tag + s, q.excess, q.accuracy, sum(errs.values()) / len(errs)))
    # One layer, outliers of growing size: the same injection applied to its input and weight.
    layer = "blocks.0.attn.q_proj"
    xin = _capture_inputs(trained.model, [layer], x[: cfg.calib_sequences].to(dev))[layer].cpu()
    w = trained.model.get_submodule(layer).weight.detach().float().cpu()
    alphas = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    e8, ellm = [], []
    for a in alphas:
        xa, wa = xin.clone(), w.clone()
        xa[:, channels] *= a
        wa[:, channels] /= a
        y = xa @ wa.t()
        for thr, acc in ((0.0, e8), (LLM_INT8_THRESHOLD, ellm)):
            yq = llm_int8_matmul(xa, wa, threshold=thr).float()
            acc.append(float((yq - y).norm() / y.norm()))
    xa, wa = xin.clone(), w.clone()
    xa[:, channels] *= alpha
    wa[:, channels] /= alpha
    vs = _bnb_vs_scratch(xa, wa)
    return OutlierStudy(LLM_INT8_THRESHOLD, alpha, channels, activation_outliers(trained.model, cfg),
                        activation_outliers(injected, cfg), change, rows, alphas, e8, ellm, layer, vs)


def _bnb_vs_scratch(x: torch.Tensor, w: torch.Tensor) -> float:
    """Largest difference between memlab's LLM.int8() and bitsandbytes' Linear8bitLt, relative to max |y|."""
    from memlab.quant import llm_int8_matmul

    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    m = _bnb_linear(lin, "llm-int8", torch.device("cpu"))
    with torch.no_grad():
        y_bnb = m(x.half()).float()
    y = llm_int8_matmul(x.half(), w, threshold=LLM_INT8_THRESHOLD).float()
    return float((y - y_bnb).abs().max() / y_bnb.abs().max())


# Speed: GPU only ---------------------------------------------------------------------------------
SPEED_KINDS = ("bf16", "int8", "llm-int8", "nf4")


@dataclass(frozen=True)
class SpeedRow:
    kind: str
    tokens: int  # rows of the input: 1 is a decode step, more is a prefill or a batch
    ms: float  # median forward time of one linear layer
    vs_bf16: float  # ms / bf16's ms at the same shape


@dataclass(frozen=True)
class QuantSpeed:
    """bitsandbytes int8, LLM.int8() and NF4 linear layers against bf16, timed with CUDA events (chapter: 3)."""

    status: str  # "measured", or "not measurable on <device>: why"
    device: str
    d_in: int
    d_out: int
    rows: list[SpeedRow] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.status == "measured"


def quant_speed(d_in: int = 8192, d_out: int = 8192, tokens=(1, 16, 2048), *, repeats: int = 50,
                warmup: int = 10, device=None) -> QuantSpeed:
    """Forward time of one linear layer per scheme against bf16, ms (CUDA only) (chapter: 3)."""
    from memlab.mixed import _cuda_ms

    check_positive_int("d_in", d_in)
    check_positive_int("d_out", d_out)
    for n in tokens:
        check_positive_int("tokens", n)
    dev = pick_device(device)
    if dev.type != "cuda":
        return QuantSpeed(f"not measurable on {dev.type}: the timings are of bitsandbytes' CUDA "
                          "kernels", device_name(dev), d_in, d_out, [])
    bnb = require("bitsandbytes", "quantized-layer timings", extra="quant")  # noqa: F841
    lin = nn.Linear(d_in, d_out, bias=False)
    mods = {"bf16": copy.deepcopy(lin).to(dev, torch.bfloat16).eval()}
    for k in ("int8", "llm-int8", "nf4"):
        m = _bnb_linear(lin, k, dev)
        if k == "nf4":
            m.compute_dtype = torch.bfloat16
        mods[k] = m
    rows = []
    for n in tokens:
        x = torch.randn(n, d_in, device=dev)
        base = None
        for k in SPEED_KINDS:
            xin = x.to(torch.float16 if k in ("int8", "llm-int8") else torch.bfloat16)
            with torch.no_grad():
                ms = float(torch.tensor(_cuda_ms(lambda m=mods[k], xin=xin: m(xin), warmup, repeats, dev)).median())
            base = ms if k == "bf16" else base
            rows.append(SpeedRow(k, n, ms, ms / base))
    return QuantSpeed("measured", device_name(dev), d_in, d_out, rows)


# Memory of a 20B model -----------------------------------------------------------------------------
# GPT-NeoX-20B's published shape (EleutherAI config.json): the model popular material's "20B" is.
NEOX_20B = dict(d_model=6144, n_layer=44, vocab_size=50432, d_ff=24576)
CLAIMED_PARAMS = 20 * 10**9  # the claim's round "20B"


def _neox_20b_linears() -> list[tuple[int, int]]:
    """(out_features, in_features) of one block's linears: fused qkv, attention out, MLP in and out."""
    d, f = NEOX_20B["d_model"], NEOX_20B["d_ff"]
    return [(3 * d, d), (d, d), (f, d), (d, f)]


def neox_20b_groups() -> dict[str, int]:
    """Parameters of GPT-NeoX-20B by kind: block linear weights, embeddings + head, biases and norms (chapter: 3)."""
    d, L, V, f = (NEOX_20B[k] for k in ("d_model", "n_layer", "vocab_size", "d_ff"))
    linear = L * sum(o * i for o, i in _neox_20b_linears())
    biases_norms = L * (3 * d + d + f + d + 4 * d) + 2 * d  # linear biases, 2 LayerNorms per block, final
    return {"linear": linear, "embeddings": 2 * V * d, "biases+norms": biases_norms}


@dataclass(frozen=True)
class MemoryRow:
    scheme: str
    claimed_gb: float | None  # n * bits / 8, as popular material computes it
    weights_gb: float  # block linears with their scales, the rest in 16-bit (fp32 for fp32)
    bits_per_param: float  # of the block linears


def memory_20b() -> list[MemoryRow]:
    """The 20B weight-memory table, naive against what the stored tensors take, in GB (10^9 bytes) (chapter: 3)."""
    from memlab.quant import bits_per_parameter

    g = neox_20b_groups()
    rest = g["embeddings"] + g["biases+norms"]
    shapes = _neox_20b_linears()
    rows_per_param = sum(o for o, _ in shapes) / sum(o * i for o, i in shapes)  # one scale per row
    plan = [  # scheme, naive bits, linear bits (scales included), bytes of the rest per param
        ("fp32", 32, 32.0, 4),
        ("fp16", 16, 16.0, 2),
        ("int8 (per-row absmax)", 8, 8 + 32 * rows_per_param, 2),
        ("nf4", 4, bits_per_parameter("nf4"), 2),
        ("nf4 + double quant", 4, bits_per_parameter("nf4", double_quant=True), 2),
        ("int4 GPTQ, groups of 128", 4, bits_per_parameter("int4-zp", blocksize=128), 2),
    ]
    return [MemoryRow(s, CLAIMED_PARAMS * nb / 8 / 1e9, (g["linear"] * lb / 8 + rest * rb) / 1e9, lb)
            for s, nb, lb, rb in plan]


# Claims this chapter checks (collected by memlab.claims) -------------------------------------------
_CH3 = "chapters/03_quantization"


def _claims():
    from memlab import claims

    @claims.register("C15", _CH3, "A 20B-parameter model needs 80 GB in fp32, 40 GB in fp16, "
                     "20 GB in int8 and 10 GB in 4-bit.")
    @functools.cache
    def c15():
        rows = {r.scheme: r for r in memory_20b()}
        naive = [rows[k].claimed_gb for k in ("fp32", "fp16", "int8 (per-row absmax)", "nf4")]
        arithmetic = [round(x) for x in naive] == [80, 40, 20, 10]
        four = rows["nf4"]
        dq = rows["nf4 + double quant"]
        evidence = (
            "computed for GPT-NeoX-20B's shape (" + f"{sum(neox_20b_groups().values()):,}"
            + " parameters): n x bits / 8 gives " + " / ".join(f"{x:.0f}" for x in naive)
            + " GB; with the stored scales and the embeddings, head and norms in 16-bit: "
            + ", ".join(f"{k} {r.weights_gb:.1f} GB" for k, r in rows.items()))
        return claims.judge(
            "", arithmetic, evidence,
            caveat=(f"right as n x bits / 8 for the weights alone; a real 4-bit model stores "
                    f"{four.weights_gb:.1f} GB in NF4 ({dq.weights_gb:.1f} GB with double "
                    f"quantization): scales add {four.bits_per_param - 4:.2f} bit per weight and "
                    "the embeddings stay 16-bit; training or generating adds activations, the "
                    "KV cache and the CUDA context on top"),
            correction="the arithmetic n x bits / 8 does not give the claimed figures")

    @claims.register("C16", _CH3, "A 4-bit model costs exactly half a byte per parameter.")
    @functools.cache
    def c16():
        comp = compare_schemes(None, device="cpu")  # the full comparison, cached for C17
        nf4, dq, rtn = comp.row("nf4"), comp.row("nf4-dq"), comp.row("rtn-4")
        n_all = comp.fp32_bytes / 4
        exact = abs(nf4.total_bytes / n_all - 0.5) < 1e-9
        block = round(32 / (nf4.bits_per_param - 4))  # one fp32 absmax per block: 4 + 32 / block bits
        evidence = (
            f"measured from the stored tensors of the book's model: block linears "
            f"{nf4.bits_per_param:.3f} bits/param in NF4, {dq.bits_per_param:.3f} with double "
            f"quantization, {rtn.bits_per_param:.3f} for 4-bit zero-point in groups of "
            f"{GROUP_SIZE}; whole model in NF4 {8 * nf4.total_bytes / n_all:.2f} bits/param "
            "(embedding, norms and head in bf16)")
        return claims.judge(
            "", exact, evidence,
            correction=(f"4-bit codes cost half a byte, but each block of {block} weights also stores "
                        f"an fp32 absmax: {nf4.bits_per_param:.2f} bits ({nf4.bits_per_param / 8:.4f} "
                        f"bytes) per weight, {dq.bits_per_param:.3f} with double quantization, and "
                        "the layers left in 16-bit raise the whole model's average further"))

    @claims.register("C17", _CH3, "Quantization degrades model quality. (How much, for which "
                     "scheme and bit width?)")
    @functools.cache
    def c17():
        comp = compare_schemes(None, device="cpu")
        ref = comp.row("fp32").excess
        rows = {r.scheme: r for r in comp.rows}
        delta = {k: r.loss_delta for k, r in rows.items()}
        # a change counts only beyond two paired standard errors over the held-out sequences
        seen = {k: abs(r.loss_delta) > 2 * r.loss_delta_se for k, r in rows.items() if k != "fp32"}
        eight_ok = not any(seen[k] and delta[k] > 0 for k in ("bf16", "int8", "llm-int8"))
        low_hurts = seen["rtn-3"] and delta["rtn-3"] > 0

        def pm(k: str) -> str:
            return f"{delta[k]:+.4f} +- {2 * rows[k].loss_delta_se:.4f}"

        evidence = ("measured on the book's model, held-out loss minus fp32's on the same "
                    f"{comp.config.eval_sequences} sequences, nats (+- 2 paired standard errors): "
                    + ", ".join(f"{k} {pm(k)}" for k in rows if k != "fp32")
                    + f"; fp32 is {ref:.4f} above the optimum")
        within = [k for k, v in seen.items() if not v]
        return claims.judge(
            "", low_hurts, evidence,
            caveat=("it depends on bits and method: 16- and 8-bit schemes do not raise the loss "
                    f"beyond the noise{'' if eight_ok else ' (not all of them here)'}, 4-bit "
                    f"costs {pm('nf4')} (NF4) and {pm('rtn-4')} (RTN), 3-bit RTN {pm('rtn-3')}; "
                    f"GPTQ cuts the 3-bit cost to {pm('gptq-3')}; within two standard errors of "
                    f"fp32: {', '.join(within) or 'none'}"),
            correction="3-bit round-to-nearest did not raise the held-out loss beyond the noise here")

    @claims.register("C18", _CH3, "LLM.int8() keeps outlier features in 16-bit and the rest in "
                     "int8, and so preserves quality where plain int8 fails.")
    @functools.cache
    def c18():
        st = outlier_study(None, device="cpu")
        rows = {r.scheme: r for r in st.rows}
        i8, llm = rows["injected int8"], rows["injected llm-int8"]
        found = max(f.outlier_columns for f in st.found)
        busiest = max(st.found, key=lambda f: f.outlier_columns / f.features)
        normed = max(f.outlier_columns for f in st.found if f.layer.split(".")[-1] in
                     {t.split(".")[-1] for ts in _NORMED.values() for t in ts})
        ratio = i8.mean_layer_error / llm.mean_layer_error
        k = st.sweep_alpha.index(max(st.sweep_alpha))
        evidence = (
            f"measured: the trained model's largest layer has {found} input columns at "
            f"|x| >= {st.threshold:g} (inputs from a norm: {normed}); with "
            f"{len(st.channels)} outlier features injected (x{st.alpha:g}), mean layer output error "
            f"int8 {i8.mean_layer_error:.4f} vs LLM.int8() {llm.mean_layer_error:.4f}, held-out loss "
            f"above optimum {i8.excess:.4f} vs {llm.excess:.4f} nats; at x{st.sweep_alpha[k]:g} one "
            f"layer's error is {st.sweep_int8[k]:.3f} vs {st.sweep_llm_int8[k]:.3f}")
        return claims.judge(
            "", ratio > 2, evidence,
            caveat=("outliers must be present: in this small model the inputs that come from a norm "
                    "have none of their own (they were injected, as Dettmers et al. 2022 find them "
                    "from about 6.7B parameters), and at this size even plain int8 loses little "
                    "held-out loss, so the gain shows in the layer error (the mechanism) more than "
                    "in quality; where outliers are many rather than few (this model's "
                    f"{busiest.layer.split('.', 2)[-1]}: {busiest.outlier_columns} of "
                    f"{busiest.features} input columns) LLM.int8() multiplies most of the layer "
                    "in 16-bit; and the outlier columns still use int8 weights in bitsandbytes, so "
                    "LLM.int8()'s error grows with the outlier size too"),
            correction="LLM.int8() did not reduce the layer error by more than half here")

    @claims.register("C43", _CH3, "Integer (int8) arithmetic makes inference faster.")
    @functools.cache
    def c43():
        from memlab.gpus import CATALOGUE
        from memlab.results import recorded

        rec = recorded("quant-speed")
        with_int8 = [g.name for g in CATALOGUE if "int8" in g.tensor_core_formats]
        if rec is not None and rec.result.get("rows"):
            rows = [r for r in rec.result["rows"] if r["kind"] == "llm-int8"]
            faster = all(r["vs_bf16"] < 1 for r in rows)
            evidence = (f"{rec.label}: LLM.int8() layer time / bf16 = "
                        + ", ".join(f"{r['vs_bf16']:.2f} at {r['tokens']} tokens" for r in rows))
        else:
            faster = len(with_int8) == len(CATALOGUE)
            evidence = ("not timed here (no GPU record stored); int8 tensor cores (datasheets) on: "
                        + ", ".join(with_int8) + f" of {len(CATALOGUE)} GPUs in the catalogue")
        return claims.judge(
            "", faster, evidence,
            caveat=("int8 tensor cores give twice fp16's peak, but LLM.int8() spends time "
                    "quantizing inputs, dequantizing outputs and handling outlier columns; it is "
                    "reported slower than fp16 at small and medium sizes (Dettmers et al. 2022, "
                    "arXiv:2208.07339, timing int8 against fp16 matrix multiplication), and weight-only 4/8-bit speed-ups at batch 1 come from "
                    "reading fewer weight bytes, not from integer arithmetic"),
            correction=("LLM.int8() ran slower than bf16 at every measured shape: it saves memory, "
                        "not time"))

    return claims


_claims()
