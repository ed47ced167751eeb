"""The book's small language model (chapters: 3, 5, 7).

Its config per scale, one training run, held-out quality.

The model is a small Llama-style transformer trained on a Markov language of order k
(:class:`memlab.model.tasks.MarkovTask`): the best possible loss and accuracy on held-out text are
known exactly. Quality is the held-out loss in nats, its excess over that optimum, perplexity and
top-1 accuracy; two models are compared on the same sequences with a paired standard error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_positive_int
from memlab.model.config import ModelConfig
from memlab.model.tasks import MarkovTask
from memlab.model.train import TrainConfig, train_loop
from memlab.model.transformer import Transformer, build_model, lm_loss
from memlab.results import kept_on_disk

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
    n_kv_head: int | None = None  # None: n_head (plain multi-head attention); chapter 4's GQA
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
        """The transformer's shape, as a :class:`memlab.model.config.ModelConfig`."""
        return ModelConfig(name=f"markov{self.order}-d{self.d_model}", style="llama",
                           vocab_size=self.vocab_size, n_layer=self.n_layer, n_head=self.n_head,
                           n_kv_head=self.n_head if self.n_kv_head is None else self.n_kv_head,
                           d_model=self.d_model, d_ff=self.d_ff,
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


TINY_LM = replace(SIZES["ci"], d_model=64, d_ff=192, steps=40, warmup=5, eval_sequences=32)
"""The smallest config worth training: trains in about a second, for tests and quick exercises."""


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


def train_lm(cfg: LMConfig | None = None, *, model: nn.Module | None = None, steps: int | None = None,
             lr: float | None = None, optimizer: str = "adamw", device=None,
             seed_offset: int = 0, keep_optimizer: bool = False) -> TrainedLM:
    """Train (or go on training ``model``) on the config's task (chapter: 3).

    It returns the loss per step, nats.

    The batches are the same for every call with the same ``seed_offset``, so two optimizers or
    two model variants see exactly the same data. ``keep_optimizer`` keeps the optimizer (and
    its state tensors) in :attr:`TrainedLM.opt`, to measure its state another way.
    """
    cfg = config_for(None, cfg)
    steps = check_positive_int("steps", steps if steps is not None else cfg.steps)
    lr = cfg.lr if lr is None else lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise MemlabError(f"lr must be a positive number, got {lr!r}")
    dev = pick_device(device)
    task = cfg.task()
    if model is None:
        model = build_model(cfg.model_config(), seed=cfg.seed)
    model = model.to(dev)
    config = TrainConfig(steps=steps, lr=lr, optimizer=optimizer, schedule="cosine",
                         warmup=cfg.warmup)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = task.sample(cfg.batch_size, cfg.seq_len, seed=cfg.seed * 7919 + seed_offset + step)
        return x.to(dev), y.to(dev)

    def step_loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return lm_loss(task.scored(m(x)), task.scored(y))  # only the positions the task scores

    log = train_loop(model, batch, config, device=dev, step_loss=step_loss)
    return TrainedLM(model, cfg, task, log.losses, optimizer, log.seconds, device_name(dev),
                     measure_state(log.optimizer, model), log.optimizer if keep_optimizer else None)


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
    task = config_for(None, cfg).task()
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
    """Held-out loss of ``quality`` minus ``reference``'s, and its standard error (chapter: 3).

    Both on the same sequences, in nats.

    Both models are scored on the same sequences, so the difference is taken sequence by
    sequence (a paired comparison): the standard error is the spread of those differences over
    sqrt(number of sequences). A change within about two standard errors is not distinguishable
    from the sampling of the held-out text.
    """
    if quality.seq_loss is None or reference.seq_loss is None:
        raise MemlabError("both qualities must come from memlab.quant.schemes.evaluate (per-sequence losses)")
    if quality.seq_loss.shape != reference.seq_loss.shape:
        raise MemlabError(f"the two were scored on different sequences: {tuple(quality.seq_loss.shape)} "
                          f"vs {tuple(reference.seq_loss.shape)}")
    d = quality.seq_loss - reference.seq_loss
    se = float(d.std() / math.sqrt(d.numel())) if d.numel() > 1 else math.nan
    return float(d.mean()), se


@functools.cache
@kept_on_disk
def trained_reference(cfg: LMConfig, device: str) -> TrainedLM:
    """The fp32 model trained on ``cfg``: once per process, and kept on disk when asked (chapter: 3)."""
    return train_lm(cfg, device=device)


def reference_model(scale: str | None = None, *, device=None, config: LMConfig | None = None) -> TrainedLM:
    """The trained fp32 model every scheme starts from; trained once per process (chapter: 3).

    ``config`` replaces the scale's :class:`LMConfig` (the tests use a smaller one).
    """
    return trained_reference(config_for(scale, config), str(pick_device(device)))


def config_for(scale: str | None, config: LMConfig | None) -> LMConfig:
    """``config`` if given (checked), else the scale's :class:`LMConfig` (chapter: 3)."""
    if config is not None and not isinstance(config, LMConfig):
        raise MemlabError(f"config must be an LMConfig, got {type(config).__name__}")
    return config or lm_config(scale)
