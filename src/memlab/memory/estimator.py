"""An analytic estimator of training and inference memory, tensor by tensor.

Every switch that changes the answer is explicit: precision (``fp32``, ``fp16-mixed``,
``bf16-mixed``, pure ``bf16``), optimizer (``adamw``, ``adam``, ``sgd``, ``sgd-momentum``,
``adamw-8bit``, ``adamw-bf16-moments``, ``adafactor``) and its implementation (``foreach``, ``fused``, ``for-loop``), attention
(``sdpa`` keeps no T x T matrix; ``eager`` keeps the softmax), full activation
checkpointing, gradient accumulation, and inference with a KV cache.

Activations are not a coefficient fitted to measurements: :func:`saved_tensors` lists each
tensor the book's model (:mod:`memlab.model.transformer`) keeps for the backward pass, with its shape
and dtype, so every term can be read, checked and taught. The peak is modelled phase by
phase, not as a sum of everything:

* forward:   P + O + A + the logits alive while the loss is computed
* backward:  P + O + A + the loss gradients at its start, or P + O + G at its end
* optimizer: P + O + G + the optimizer's scratch

where P, G, O and A are parameters, gradients, optimizer states and saved activations.
Tests hold this module to the traced step of :mod:`memlab.measure.step` (chapter 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.memory.activations import (
    PARAM_BYTES,
    SavedTensor,
    activation_bytes,
    activation_peaks,
    offloaded_activation_bytes,
    saved_tensors,
)
from memlab.memory.context import (
    check_context_parallel,
    ring_block,
    ring_peaks,
    ring_saved_tensors,
)
from memlab.model.config import ModelConfig, check_dense, get_config, kv_cache_bytes, mlp_shapes
from memlab.model.step import PHASES, StepSpec, checkpointing_words, step_bytes
from memlab.units import to_unit

DEVICES = ("cuda", "cpu")
BNB_BLOCK = 256  # bitsandbytes' 8-bit optimizer block size (one fp32 absmax per block)
BNB_MIN_NUMEL = 4096  # smaller tensors keep 32-bit state in bitsandbytes
DTYPES = ("bf16", "fp16", "fp32")  # the formats a model is run in for inference
INFERENCE_PHASES = ("prefill", "decode")
# Bytes per value of the weights and the cache for a precision name. Inference keeps no fp32
# master copy: a '*-mixed' training recipe serves its weights in 16 bits.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "bf16-mixed": 2, "fp16-mixed": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated bytes of a training step (or an inference pass), by category and phase."""

    # Names older memlab wrote for these bytes: a record carrying one is refused in one line.
    RENAMED_FIELDS: ClassVar[dict[str, str]] = {"weights_bytes": "parameters_bytes", "optimizer_bytes": "optimizer_states_bytes",
                      "activations_bytes": "saved_activations_bytes"}
    parameters: int  # number of parameters
    # The byte fields of every result of a step (memlab.model.step.STEP_BYTES, STYLE.md), as
    # memlab.measure.step.StepMemory has them: model states whole, saved activations at the end
    # of the forward pass, the rest at the peak.
    parameters_bytes: int
    gradients_bytes: int
    optimizer_states_bytes: int
    saved_activations_bytes: int
    activations_at_peak_bytes: int
    temporaries_bytes: int  # logits/loss transients, optimizer scratch
    other_bytes: int  # the batch of token ids
    peak_bytes: int
    peak_phase: str
    phase_peak_bytes: dict[str, int]
    # Bytes by category at each phase's highest point: StepMemory's categories (parameters,
    # gradients, optimizer_states, activations, temporaries, other) plus kv_cache.
    phase_breakdown: dict[str, dict[str, int]]
    setup: dict
    kv_cache_bytes: int = 0  # inference
    saved: tuple[SavedTensor, ...] = field(default=(), repr=False)

    def as_dict(self) -> dict:
        """The estimate as a plain dict, without the saved-tensor list (chapter: 1)."""
        d = asdict(self)
        d.pop("saved")
        return d

    def breakdown(self) -> dict[str, int]:
        """Bytes by category at the peak (what a stacked bar shows) (chapter: 1)."""
        return dict(self.phase_breakdown[self.peak_phase])

    def table(self, unit: str | None = None) -> str:
        """The estimate as a text table with each category's share of the peak (chapter: 1)."""
        unit = unit or ("GiB" if self.peak_bytes >= 2**30 else "MiB")
        s = self.setup
        head = (
            f"estimated {s['mode']} memory: {s['model']} ({self.parameters:,} parameters), "
            f"batch {s['batch_size']} x seq {s['seq_len']}, {s['precision']}"
        )
        if s["mode"] == "train":
            head += (f", {s['optimizer']} ({s['optimizer_impl']}), {s['attention']} attention"
                     + checkpointing_words(s["checkpointing"])
                     + (f", {s['grad_accum_steps']} accumulation steps"
                        if s["grad_accum_steps"] > 1 else ""))
            if s.get("lora"):  # a fine-tuning set-up (chapter 5)
                head += (f"; LoRA r={s['lora']['r']} on {s['lora']['target_modules']}"
                         + (f", base in {s['quantize_base']}" if s.get("quantize_base") else ""))
            elif s.get("train_last"):
                head += f"; training the last {s['train_last']} blocks only"
            if s.get("context_parallel"):
                head += (f"; one of {s['context_parallel']} context-parallel ranks "
                         f"({s['tokens_per_rank']} tokens each, ring attention)")
        rows = [("weights", self.parameters_bytes), ("gradients", self.gradients_bytes),
                ("optimizer states", self.optimizer_states_bytes),
                ("activations", self.saved_activations_bytes),
                ("KV cache", self.kv_cache_bytes), ("temporaries", self.temporaries_bytes),
                ("other", self.other_bytes)]
        at_peak = self.breakdown()
        keys = ["parameters", "gradients", "optimizer_states", "activations", "kv_cache",
                "temporaries", "other"]
        lines = [head, f"{'category':<18}{unit:>12}{'at peak':>12}"]
        for (label, total), key in zip(rows, keys, strict=True):
            if total == 0 and at_peak.get(key, 0) == 0:
                continue
            lines.append(f"{label:<18}{to_unit(total, unit):>12.3f}"
                         f"{to_unit(at_peak.get(key, 0), unit):>12.3f}")
        lines.append(f"{'peak':<18}{'':>12}{to_unit(self.peak_bytes, unit):>12.3f}"
                     f"   (in the {self.peak_phase} phase)")
        return "\n".join(lines)


# Parameters, gradients, optimizer states ---------------------------------------------------
def param_shape_groups(cfg: ModelConfig) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """Shapes of the parameter tensors: (embeddings, one block, head), in model order (chapter: 8).

    Tied ones once; the shapes of :func:`memlab.model.config.param_groups`' element counts.
    """
    C, F, V, kv = cfg.d_model, cfg.ffn_dim, cfg.vocab_size, cfg.kv_heads * cfg.head_dim
    if cfg.style == "gpt2":
        embed = [(V, C), (cfg.max_seq_len, C)]
        block = [(C,), (C,), (C, C), (C,), (kv, C), (kv,), (kv, C), (kv,), (C, C), (C,), (C,),
                 (C,), (F, C), (F,), (C, F), (C,)]
        head = [(C,), (C,)]
    else:
        embed = [(V, C)]
        qkv = ([(C, C), (C,), (kv, C), (kv,), (kv, C), (kv,)] if cfg.qkv_bias
               else [(C, C), (kv, C), (kv, C)])
        block = [(C,), *qkv, (C, C), (C,), *mlp_shapes(cfg)]
        head = [(C,)]
    if not cfg.tied:
        head.append((V, C))
    return embed, block, head


def param_shapes(cfg: ModelConfig) -> list[tuple[tuple[int, ...], int]]:
    """(shape, how many) of the model's parameters in ``model.parameters()`` order (chapter: 8)."""
    embed, block, head = param_shape_groups(cfg)
    return [(t, 1) for t in embed] + [(t, cfg.n_layer) for t in block] + [(t, 1) for t in head]


def _numel(t: int | tuple[int, ...]) -> int:
    return t if isinstance(t, int) else math.prod(t)


def optimizer_state_bytes(cfg: ModelConfig, precision: str, optimizer: str,
                          optimizer_impl: str = "foreach", device: str = "cuda") -> int:
    """Bytes of the optimizer's persistent state for a model (chapters: 1, 8)."""
    return state_bytes(param_shapes(cfg), PARAM_BYTES[precision], optimizer, optimizer_impl,
                       device)


def _shapes_for(optimizer: str, tensors) -> None:
    if optimizer == "adafactor" and any(isinstance(t, int) for t, _ in tensors):
        raise MemlabError("optimizer 'adafactor' keeps a state whose size depends on each "
                          "tensor's shape: give the tensors as (shape, how many), not "
                          "(elements, how many)")


def state_bytes(tensors: list[tuple[int | tuple[int, ...], int]], param_bytes: int,
                optimizer: str, optimizer_impl: str = "foreach", device: str = "cuda") -> int:
    """Optimizer-state bytes of trainable tensors as (elements, how many) (chapters: 1, 5, 8).

    Each element is ``param_bytes`` wide. A shape may stand for the element count; 'adafactor'
    needs shapes.
    """
    pb = param_bytes
    _shapes_for(optimizer, tensors)
    n = sum(_numel(t) * k for t, k in tensors)
    n_tensors = sum(k for _, k in tensors)
    if optimizer == "adamw-bf16-moments":  # two bf16 moments; the step count is a Python int
        return 2 * 2 * n
    if optimizer == "adafactor":
        # torch's Adafactor: an fp32 step tensor on the host (on CUDA too), and a second moment
        # in the parameters' dtype: a row and a column vector for a matrix (Shazeer and Stern,
        # "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost"), a full one for a vector.
        counters = 4 * n_tensors if device == "cpu" else 0
        return counters + sum(k * pb * (t[0] if len(t) == 1 else
                                        math.prod(t[:-2]) * (t[-2] + t[-1]))
                              for t, k in tensors)
    if optimizer in ("adamw", "adam"):
        # Two moments in the parameters' dtype, plus one fp32 step counter per tensor, which
        # lives on the host on CUDA unless the fused kernel is used.
        counters = 4 * n_tensors if (device == "cpu" or optimizer_impl == "fused") else 0
        return 2 * pb * n + counters
    if optimizer == "sgd-momentum":
        return pb * n
    if optimizer == "sgd":
        return 0
    # adamw-8bit (bitsandbytes): two uint8 states and one fp32 absmax per block of 256 for each
    # large tensor; tensors under 4096 elements keep two fp32 states.
    total = 0
    tensors = [(_numel(t), k) for t, k in tensors]
    for t, k in tensors:
        if t < BNB_MIN_NUMEL:
            total += k * 8 * t
        else:
            total += k * (2 * t + 2 * 4 * -(-t // BNB_BLOCK))
    if any(t >= BNB_MIN_NUMEL for t, _ in tensors):
        total += 2 * 256 * 4  # the two fp32 quantization maps, shared by every tensor
    return total


def optimizer_step_scratch_bytes(cfg: ModelConfig, precision: str, optimizer: str,
                                 optimizer_impl: str) -> int:
    """Bytes of temporaries while the optimizer steps (chapters: 1, 8).

    foreach Adam(W) computes its update for every parameter at once, so it holds one
    parameter-sized scratch list; the for-loop version holds two of the largest tensor;
    fused kernels, SGD and bitsandbytes' 8-bit AdamW update in place. AdamW with bf16 moments
    and Adafactor: see :func:`step_scratch_bytes`.
    """
    return step_scratch_bytes(param_shapes(cfg), PARAM_BYTES[precision], optimizer,
                              optimizer_impl)


def step_scratch_bytes(tensors: list[tuple[int | tuple[int, ...], int]], param_bytes: int,
                       optimizer: str, optimizer_impl: str) -> int:
    """The optimizer step's scratch for trainable tensors as (elements, how many) (chapters: 1, 5, 8).

    :func:`optimizer_step_scratch_bytes` for any list of trainable tensors (or their shapes,
    which 'adafactor' needs), in the order the
    optimizer visits them. AdamW with bf16 moments updates one tensor at a time in fp32: an fp32
    copy of each moment, and of the gradient and the parameter when they are 16-bit (never more
    than three at once). Adafactor: see :func:`adafactor_scratch_bytes`.
    """
    if not tensors:
        return 0
    _shapes_for(optimizer, tensors)
    if optimizer == "adafactor":
        return adafactor_scratch_bytes(tensors, param_bytes, optimizer_impl)
    if optimizer == "adamw-bf16-moments":
        return (8 if param_bytes == 4 else 12) * max(_numel(t) for t, _ in tensors)
    if optimizer not in ("adamw", "adam") or optimizer_impl == "fused":
        return 0
    if optimizer_impl == "foreach":
        return param_bytes * sum(_numel(t) * k for t, k in tensors)
    return 2 * param_bytes * max(_numel(t) for t, _ in tensors)


def adafactor_scratch_bytes(tensors: list[tuple[tuple[int, ...], int]], param_bytes: int,
                            optimizer_impl: str) -> int:
    """Bytes of temporaries while torch's Adafactor steps over (shape, how many) (chapter: 8).

    Read from torch's ``_adafactor.py``. Each matrix's variance estimate (row vector @ column
    vector) is as large as the matrix; each vector's is a copy of its variance, beside its
    squared gradient. foreach builds them for all matrices at once, then for all vectors while
    the matrices' list is still alive: one parameter-sized scratch. The for-loop keeps the
    previous tensor's estimate (and its row and column means, and the last squared gradient)
    alive until the next one replaces it, so its peak is two neighbours, simulated here.
    """
    pb = param_bytes
    order = [t for t, k in tensors for _ in range(k)]
    mats = [t for t in order if len(t) > 1]
    vecs = [t[0] for t in order if len(t) == 1]
    if optimizer_impl == "foreach":
        # groups by matrix / vector in order of first appearance; a group's estimates outlive it
        groups = [sum(math.prod(t) for t in mats), sum(vecs)]
        if order[0] and len(order[0]) == 1:
            groups.reverse()
        first, second = groups
        # the matrices' group also holds one clamped row-variance mean per matrix
        extra = len(mats) if len(order[0]) > 1 else 0
        return pb * (first + max(extra, second))
    row = col = sq = est = 0  # the last iteration's row mean, column mean, squared gradient, estimate
    peak = 0
    for t in order:
        if len(t) > 1:
            r, c = math.prod(t[:-1]), math.prod(t[:-2]) * t[-1]
            peak = max(peak, row + r + col + sq + est, r + col + c + sq + est)
            row, col = r, c
            peak = max(peak, row + col + sq + est + math.prod(t) + 1)
            est = math.prod(t)
        else:
            peak = max(peak, row + col + 2 * sq + est + t[0] if sq else row + col + est + t[0])
            sq = t[0]
            peak = max(peak, row + col + sq + est + t[0])
            est = t[0]
    return pb * peak


# The estimate ------------------------------------------------------------------------------
def activation_side(cfg: ModelConfig, saved, *, B: int, T: int, precision: str,
                    checkpointing, device: str, accumulating: bool, loss_chunks: int = 1,
                    offload: bool = False, context_parallel: int = 1) -> tuple[int, int]:
    """The activation side's forward and backward highs, a ring's included (chapters: 1, 8).

    ``T`` is the tokens of each sequence one rank holds; with ``context_parallel`` N > 1,
    ``saved`` is already the ring's (:func:`memlab.memory.context.ring_saved_tensors`) and the
    ring's own buffers are counted (:func:`memlab.memory.context.ring_peaks`).
    """
    block = ring_block(cfg, B, T, precision, device) if context_parallel > 1 else None
    fwd, bwd = activation_peaks(cfg, saved, B, T, precision, checkpointing, device, accumulating,
                                loss_chunks=loss_chunks, block=block, offload=offload)
    if context_parallel > 1:
        ring_fwd, ring_bwd = ring_peaks(
            cfg, block, B=B, n=T, ranks=context_parallel, precision=precision,
            checkpointing=checkpointing,
            model_level=sum(t.bytes for t in saved if t.scope == "model"),
            accumulating=accumulating)
        fwd, bwd = max(fwd, ring_fwd), max(bwd, ring_bwd)
    return fwd, bwd


def estimate(
    model: StepSpec | ModelConfig | str,
    *,
    batch_size: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp32",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    attention: str | None = None,
    checkpointing: bool | str = False,
    grad_accum_steps: int = 1,
    device: str = "cuda",
    loss_chunks: int = 1,
    offload_activations: bool = False,
    context_parallel: int = 1,
) -> MemoryEstimate:
    """Estimate the bytes of a training step, by category and phase (chapters: 1, 8).

    ``model`` may be a :class:`memlab.model.step.StepSpec`, whose switches are then used. ``device``
    only matters where CUDA and CPU differ: where Adam keeps its step counters, and the dtype of
    an eager softmax under autocast. ``context_parallel`` N > 1: one rank's bytes when N ranks
    each hold T/N tokens of every sequence, attention running as the book's ring
    (:mod:`memlab.memory.context`); parameters, gradients and optimizer states are replicated on
    every rank, not sharded.
    """
    check_choice("device", device, DEVICES)
    if isinstance(model, StepSpec):
        if batch_size is not None or seq_len is not None:
            raise MemlabError("a StepSpec describes a whole training step: pass no batch_size "
                              "or seq_len with it")
        if model.prepare is not None:
            raise MemlabError("memlab.memory.estimate does not model a prepare hook: "
                              "memlab.finetune.estimate_finetune takes a fine-tuning Setup; "
                              "trace_step or measure_step take any hook")
        spec = model
    else:  # every switch of a training step checked once, as trace_step and measure_step check it
        spec = StepSpec(model, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        optimizer=optimizer, optimizer_impl=optimizer_impl,
                        checkpointing=checkpointing, grad_accum_steps=grad_accum_steps,
                        attention=attention, loss_chunks=loss_chunks,
                        offload_activations=offload_activations)
    cfg, batch_size, seq_len = spec.config, spec.batch_size, spec.seq_len
    precision, optimizer, optimizer_impl = spec.precision, spec.optimizer, spec.optimizer_impl
    checkpointing, grad_accum_steps = spec.checkpointing, spec.grad_accum_steps
    cp = check_context_parallel(context_parallel, seq_len)
    if cp > 1 and spec.offload_activations:
        raise MemlabError("context parallelism with activation offloading is not modelled: "
                          "estimate one of them (context_parallel or offload_activations)")
    B, T = batch_size, seq_len // cp  # the tokens of each sequence one rank holds
    BT = B * T
    n = cfg.num_parameters()
    P = PARAM_BYTES[precision] * n
    G = P
    S = optimizer_state_bytes(cfg, precision, optimizer, optimizer_impl, device)
    saved = saved_tensors(cfg, batch_size=B, seq_len=T, precision=precision,
                          checkpointing=checkpointing, device=device, loss_chunks=spec.loss_chunks)
    A = activation_bytes(saved, cfg.n_layer)
    host = 0
    if spec.offload_activations:  # the blocks' saved tensors on the host (memlab.model.offload)
        host = offloaded_activation_bytes(cfg, batch_size=B, seq_len=T, precision=precision,
                                          checkpointing=checkpointing, device=device)
        A -= host
    tokens = 2 * BT * 8  # input ids and targets, int64
    accumulating = grad_accum_steps > 1
    block = None
    if cp > 1:  # every block's attention runs as the ring
        block = ring_block(cfg, B, T, precision, device)
        saved = ring_saved_tensors(saved, block)
        A = activation_bytes(saved, cfg.n_layer)
    fwd, bwd = activation_side(cfg, saved, B=B, T=T, precision=precision,
                               checkpointing=checkpointing, device=device,
                               accumulating=accumulating, loss_chunks=spec.loss_chunks,
                               offload=spec.offload_activations, context_parallel=cp)
    # A tied embedding gets two gradients (head and lookup); autograd holds the first until the
    # second arrives and adds them: three (V, C) tensors at the very end of the backward pass.
    # When gradients accumulate, the embedding's new gradient (V, C) is a temporary added into
    # .grad, and the tied case holds all three on top of the gradients already there.
    VC = cfg.vocab_size * cfg.d_model * PARAM_BYTES[precision]
    if accumulating:
        end = P + S + G + (3 * VC if cfg.tied else VC) + tokens
    else:
        end = P + S + G + (2 * VC if cfg.tied else 0) + tokens
    I_step = optimizer_step_scratch_bytes(cfg, precision, optimizer, optimizer_impl)
    return step_estimate(
        parameters=n, P=P, G=G, S=S, A=A, tokens=tokens, fwd=fwd, bwd=bwd, end=end,
        scratch=I_step, accumulating=accumulating, saved=saved,
        setup=dict(model=cfg.name, parameters=n, batch_size=B, seq_len=seq_len,
                   precision=precision, optimizer=optimizer, optimizer_impl=optimizer_impl, attention=cfg.attention,
                   checkpointing=checkpointing, grad_accum_steps=grad_accum_steps, mode="train",
                   new_tokens=0, device=device,
                   **({"loss_chunks": spec.loss_chunks} if spec.loss_chunks != 1 else {}),
                   **({"offload_activations": True, "offloaded_bytes": host}
                      if spec.offload_activations else {}),
                   **({"context_parallel": cp, "tokens_per_rank": T} if cp > 1 else {})))


def step_estimate(*, parameters: int, P: int, G: int, S: int, A: int, tokens: int, fwd: int,
                  bwd: int, end: int, scratch: int, accumulating: bool, saved, setup: dict
                  ) -> MemoryEstimate:
    """A training step's estimate from its parts (chapters: 1, 5).

    The three phases, their peak and the categories at each.

    P, G, S, A: bytes of parameters, gradients, optimizer states and saved activations; ``fwd``
    and ``bwd`` the activation side at the forward's and the backward's highest points; ``end``
    the bytes when the backward finishes; ``scratch`` the optimizer step's temporaries.
    """
    # With accumulation, the gradients of earlier micro-batches stay alive through the
    # forward and backward passes of the next ones.
    G_live = G if accumulating else 0
    base = P + S + G_live + tokens
    phases = {
        "forward": base + fwd,
        "backward": max(base + bwd, end),
        "optimizer": P + S + G + scratch + tokens,
    }
    peak_phase = max(PHASES, key=lambda p: phases[p])

    def cats(grads, acts, total):
        d = dict(parameters=P, gradients=grads, optimizer_states=S, activations=acts,
                 kv_cache=0, other=tokens)
        d["temporaries"] = total - sum(d.values())
        return d

    start_wins = base + bwd >= end  # the backward's high point is before the gradients grow
    breakdown = {
        "forward": cats(G_live, A, phases["forward"]),
        "backward": cats(G_live, A, phases["backward"]) if start_wins
        else cats(G, 0, phases["backward"]),
        "optimizer": cats(G, 0, phases["optimizer"]),
    }
    return MemoryEstimate(parameters=parameters, setup=setup, saved=tuple(saved),
                          **step_bytes(breakdown, phases, peak_phase, A))


# Sizing helpers --------------------------------------------------------------------------------
def batch_for_peak(model: ModelConfig | str, target_bytes: float, *, seq_len: int,
                   max_batch: int = 1 << 16, peak: Callable[[int], int] | None = None,
                   **kwargs) -> int | None:
    """Smallest batch size whose estimated peak reaches ``target_bytes``, or None (chapter: 1).

    ``peak`` maps a batch size to its peak bytes (None: :func:`estimate`'s peak at ``seq_len``
    with ``kwargs``); it must grow with the batch, which the bisection relies on.
    """
    if peak is None:
        cfg = model if isinstance(model, ModelConfig) else get_config(model)

        def peak(b):
            return estimate(cfg, batch_size=b, seq_len=seq_len, **kwargs).peak_bytes

    if peak(max_batch) < target_bytes:
        return None
    lo, hi = 1, max_batch
    if peak(lo) >= target_bytes:
        return 1
    while hi - lo > 1:  # the peak grows with the batch: bisect
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) < target_bytes else (lo, mid)
    return hi


def largest_batch_that_fits(model: ModelConfig | str, capacity_bytes: float, *, seq_len: int,
                            max_batch: int = 1 << 16, peak: Callable[[int], int] | None = None,
                            **kwargs) -> int:
    """Largest batch whose estimated peak stays within ``capacity_bytes`` (0 if none) (chapter: 1).

    ``peak`` as in :func:`batch_for_peak`; at most ``max_batch``.
    """
    first_over = batch_for_peak(model, capacity_bytes + 1, seq_len=seq_len, max_batch=max_batch,
                                peak=peak, **kwargs)
    return max_batch if first_over is None else first_over - 1


def bytes_per_param_curve(model: ModelConfig | str, *, seq_len: int, batches=(1, 2, 4, 8, 16, 32),
                          **kwargs) -> tuple[list[int], list[float]]:
    """(tokens per step, estimated peak bytes per parameter) over batch sizes (chapter: 1)."""
    cfg = model if isinstance(model, ModelConfig) else get_config(model)
    n = cfg.num_parameters()
    tokens, bpp = [], []
    for b in batches:
        tokens.append(b * seq_len)
        bpp.append(estimate(cfg, batch_size=b, seq_len=seq_len, **kwargs).peak_bytes / n)
    return tokens, bpp


# An inference pass ------------------------------------------------------------------------
def forward_stage_bytes(cfg: ModelConfig | str, *, batch_size: int, new_positions: int,
                        positions: int, bytes_per_value: int = 2) -> dict[str, int]:
    """Bytes live above weights, cache and prompt ids at each stage of a cached forward (chapter: 1).

    The pass feeds ``new_positions`` tokens (T: the prompt at prefill, 1 at decode) that
    attend over ``positions`` cached ones (S), in a model whose weights and cache hold
    ``bytes_per_value`` bytes per value, with no autograd. It follows
    :class:`memlab.model.transformer.Transformer` op by op, as the traced pass runs it: each temporary
    is freed as soon as nothing refers to it, and the input of a block stays alive in the
    caller until the block returns. Only the last position's logits are computed.
    """
    cfg = check_dense(get_config(cfg) if isinstance(cfg, str) else cfg, "the inference estimate")
    for what, value in (("batch_size", batch_size), ("new_positions", new_positions),
                        ("positions", positions)):
        check_positive_int(what, value)
    if bytes_per_value not in (2, 4):
        raise MemlabError(f"bytes_per_value must be 2 or 4, got {bytes_per_value!r}")
    if positions < new_positions:
        raise MemlabError(f"positions ({positions}) must be at least new_positions "
                          f"({new_positions}): the new ones are cached too")
    B, T, S, cb = batch_size, new_positions, positions, bytes_per_value
    C, F, V = cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    nh, hs = cfg.n_head, cfg.head_dim
    llama = cfg.style == "llama"
    BT = B * T
    X = BT * C * cb  # one (B, T, C) tensor: the residual stream, a norm's output, q, o
    K = BT * cfg.kv_heads * hs * cb  # the new keys (or values), (B, nkv, T, hs)
    KS = B * nh * S * hs * cb if cfg.kv_heads != nh else 0  # cached keys repeated to nh heads
    Fb = BT * F * cb  # one (B, T, F) MLP intermediate
    R = T * hs * 4 if llama else 0  # RoPE cos and sin, (T, hs/2) fp32 each, alive all pass
    Rc = T * hs * cb if (llama and cb != 4) else 0  # cos and sin cast to the model dtype

    def norm(rows: int) -> int:
        """Bytes a norm of (rows, C) adds above its input, at its highest point."""
        if not llama:  # LayerNorm: output, mean and 1/std (in the input dtype on CPU)
            return rows * C * cb + 2 * rows * cb
        up = rows * C * 4 if cb != 4 else 0  # x.float() copies a 16-bit input
        down = rows * C * cb if cb != 4 else 0  # .to(dtype) copies back
        # x.float() and x^2 (with its mean), or x * rsqrt, its cast and weight * it.
        return max(up + rows * C * 4 + rows * 4, rows * C * 4 + down + rows * C * cb)

    if cfg.attention == "sdpa":  # the output, then o_proj's output (or the heads-merging copy)
        core = 2 * X
    else:  # eager: the (B, nh, T, S) scores twice (scaled, masked, softmax), the causal mask
        W = B * nh * T * S * cb
        core = T * S + max(2 * W, W + 2 * X)
    stages = {
        # x0 (the block's input, kept by the caller), h (norm1's output), q, k, v, ...
        "attention norm": X + norm(BT),
        "attention": 2 * X + X + KS + KS + core,  # x0, h, q (rotated), k and v repeated (GQA)
        "MLP norm": 2 * X + norm(BT),  # x0 and x1 = x0 + attention
        "MLP": 3 * X + (3 if llama else 2) * Fb,  # x0, x1, h2; silu(gate), up, their product
        "block output": 4 * X,  # x0, x1, the MLP's output, x1 + it
        "final norm": X + norm(B),  # the last block's output, the last position normalized
        "head": X + B * C * cb + B * V * cb,  # ... and the logits of the last position
    }
    if llama:
        # q, k, v, and inside apply_rope on q (two halves' products at a time), then on k.
        stages["rotary q"] = 2 * X + X + 2 * K + Rc + 2 * X
        stages["rotary k"] = 2 * X + 2 * X + 2 * K + Rc + 2 * K
        # While the tables are made: the embedding, inv_freq, positions, their outer product.
        stages = {k: v + R for k, v in stages.items()}
        stages["rotary tables"] = X + 2 * hs + 4 * T + R // 2 + R
    else:
        stages["embedding"] = X + T * C * cb + X  # token and position embeddings, their sum
        stages["q, k, v"] = 2 * X + X + 2 * K
    stages["next token"] = B * V * cb + 8 * B  # the logits and the argmax, after the pass
    return stages


def estimate_inference(cfg: ModelConfig | str, batch_size: int, seq_len: int,
                       precision: str = "bf16", new_tokens: int = 1, *,
                       kv_precision: str | None = None):
    """Estimated bytes of generating new_tokens tokens after a prompt of seq_len, by phase (chapter: 1).

    Weights and the KV cache are held in one dtype: 4 bytes for ``fp32``, 2 for ``bf16`` and
    ``fp16``. A ``*-mixed`` precision (a training recipe) is served in its 16-bit type, with
    no fp32 master copy. ``kv_precision`` stores the cache in another of those dtypes (the
    weights' by default). The cache is preallocated for seq_len + new_tokens positions. The
    prefill peak is weights + cache + prompt ids + the largest stage of a forward pass at
    T = seq_len (:func:`forward_stage_bytes`; the MLP's intermediates for the presets);
    the decode peak is the same at T = 1 over the full cache, plus the tokens generated so
    far (counted as temporaries). Returns a :class:`MemoryEstimate` with mode
    'inference' and phases 'prefill' and 'decode'.
    """
    cfg = check_dense(get_config(cfg) if isinstance(cfg, str) else cfg, "the inference estimate")
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {cfg!r}")
    check_positive_int("batch_size", batch_size)
    check_positive_int("seq_len", seq_len)
    check_positive_int("new_tokens", new_tokens)
    check_choice("precision", precision, DTYPE_BYTES)
    kv_precision = precision if kv_precision is None else kv_precision
    check_choice("kv_precision", kv_precision, DTYPE_BYTES)
    if seq_len + new_tokens > cfg.max_seq_len:
        raise MemlabError(f"seq_len {seq_len} + new_tokens {new_tokens} exceeds max_seq_len "
                          f"{cfg.max_seq_len} of model {cfg.name!r}")
    B, T, N, cb = batch_size, seq_len, new_tokens, DTYPE_BYTES[precision]
    n = cfg.num_parameters()
    weights = n * cb
    cache = kv_cache_bytes(cfg, batch_size=B, tokens=T + N,
                           bytes_per_value=DTYPE_BYTES[kv_precision])
    ids = B * T * 8  # the prompt's token ids, int64
    prefill = max(forward_stage_bytes(cfg, batch_size=B, new_positions=T, positions=T,
                                      bytes_per_value=cb).values())
    # Decode: the last step is the largest (the longest cache); before it, N - 1 tokens are
    # kept. At the end all N are concatenated into a new (B, N) tensor.
    decode = 2 * N * 8 * B
    if N > 1:
        step = forward_stage_bytes(cfg, batch_size=B, new_positions=1, positions=T + N - 1,
                                   bytes_per_value=cb)
        decode = max(decode, (N - 1) * 8 * B + max(step.values()))
    base = weights + cache + ids
    phases = {"prefill": base + prefill, "decode": base + decode}
    peak_phase = max(INFERENCE_PHASES, key=lambda p: phases[p])  # prefill on a tie
    breakdown = {
        p: dict(parameters=weights, gradients=0, optimizer_states=0, activations=0,
                kv_cache=cache, temporaries=phases[p] - base, other=ids)
        for p in INFERENCE_PHASES
    }
    dtype = {4: "fp32"}.get(cb, "fp16" if precision.startswith("fp16") else "bf16")
    return MemoryEstimate(
        parameters=n, kv_cache_bytes=cache,
        setup=dict(model=cfg.name, parameters=n, batch_size=B, seq_len=T, precision=precision,
                   dtype=dtype, attention=cfg.attention, mode="inference", new_tokens=N,
                   kv_precision=kv_precision),
        # nothing is kept for a backward pass: no saved activations
        **step_bytes(breakdown, phases, peak_phase, 0))
