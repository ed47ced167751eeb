"""The scaling grid: the book's models trained for several run lengths (chapter 7).

The runs are fitted by :mod:`memlab.compute.scaling`.

The book's task has what natural text lacks: its best possible loss is known exactly (the
entropy of :class:`memlab.model.tasks.MarkovTask`). :func:`scaling_grid` trains a grid of the
book's models for several token counts, each run with its own cosine schedule to its own
length, and fits L(N, D) twice: with ``E`` free, and with ``E`` fixed to the entropy (see
:mod:`memlab.compute.scaling` for the fit, the grids' choice of chain and the parameter count).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from memlab.compute.scaling import (
    FLOPS_PER_TOKEN_PER_PARAM,
    BootstrapFit,
    ComputeOptimal,
    ScalingFit,
    bootstrap_fit,
    compute_optimal,
    fit_scaling_law,
)
from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_positive_int, check_positive_number
from memlab.model.lm import LMConfig, evaluate, lm_config, train_lm
from memlab.model.transformer import count_parameters


# The grid experiment ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GridModel:
    """One model shape of a scaling grid and the peak learning rate it trains at (chapter: 7)."""

    d_model: int
    n_layer: int
    n_head: int
    d_ff: int
    lr: float

    def __post_init__(self) -> None:
        for f in ("d_model", "n_layer", "n_head", "d_ff"):
            check_positive_int(f"grid model {f}", getattr(self, f))
        check_positive_number("grid model lr", self.lr)


@dataclass(frozen=True)
class GridSpec:
    """The models, run lengths and task a scaling grid trains, and how it fits them (chapter: 7).

    Every model trains for every entry of ``steps``, each run from scratch with its own warm-up
    (``warmup_fraction`` of its steps) and cosine decay to zero. Tokens seen = steps x
    batch_size x seq_len.
    """

    vocab_size: int
    order: int
    models: tuple[GridModel, ...]
    steps: tuple[int, ...]
    batch_size: int
    seq_len: int
    warmup_fraction: float = 0.1
    eval_sequences: int = 1024
    resamples: int = 200
    n_budgets: int = 3
    n_starts: int = 4

    def __post_init__(self) -> None:
        for f in ("vocab_size", "order", "batch_size", "seq_len", "eval_sequences", "resamples",
                  "n_budgets", "n_starts"):
            check_positive_int(f"grid {f}", getattr(self, f))
        if len(self.models) < 2 or len(self.steps) < 2:
            raise MemlabError(f"a scaling grid needs at least 2 models and 2 run lengths, got "
                              f"{len(self.models)} and {len(self.steps)}")
        for m in self.models:
            if not isinstance(m, GridModel):
                raise MemlabError(f"grid models must be GridModel, got {type(m).__name__}")
        for st in self.steps:
            check_positive_int("grid steps", st)
        if isinstance(self.warmup_fraction, bool) or not 0 <= self.warmup_fraction < 1:
            raise MemlabError(f"grid warmup_fraction must be in [0, 1), got "
                              f"{self.warmup_fraction!r}")

    def config(self, model: GridModel, steps: int, seed: int = 0) -> LMConfig:
        """The :class:`memlab.model.lm.LMConfig` of one run of the grid (chapter: 7)."""
        return lm_config("ci", vocab_size=self.vocab_size, order=self.order,
                         d_model=model.d_model, n_layer=model.n_layer, n_head=model.n_head,
                         d_ff=model.d_ff, steps=steps,
                         warmup=max(1, round(self.warmup_fraction * steps)),
                         batch_size=self.batch_size, seq_len=self.seq_len, lr=model.lr, seed=seed,
                         eval_sequences=self.eval_sequences)


GRIDS: dict[str, GridSpec] = {
    # Four widths of one-block models x four run lengths (8k to 66k tokens) on an order-1 chain
    # over 32 tokens: a model reads the answer off the current token, so width (the rank of the
    # token-to-logits map) is what limits it, and every run learns within 16 steps. Narrower
    # models train at larger learning rates (lr x width held at 0.48) so that each learns in
    # runs this short. The grid, both fits and both bootstraps take seconds on 2 CPU cores.
    "ci": GridSpec(vocab_size=32, order=1,
                   models=(GridModel(4, 1, 1, 12, 0.12), GridModel(8, 1, 1, 24, 0.06),
                           GridModel(16, 1, 2, 48, 0.03), GridModel(32, 1, 2, 96, 0.015)),
                   steps=(16, 32, 64, 128), batch_size=32, seq_len=16),
    # Widths and depths on a 2048-token chain, five run lengths (0.5M to 8M tokens), the same
    # rule for the learning rate. A wider vocabulary keeps width the limit for larger models
    # (on 512 tokens a 256-wide model is near the floor within 128 steps). Sized for a GPU.
    "full": GridSpec(vocab_size=2048, order=1,
                     models=(GridModel(16, 1, 1, 48, 0.03), GridModel(32, 1, 2, 96, 0.015),
                             GridModel(64, 2, 4, 192, 0.0075), GridModel(128, 2, 4, 384, 0.00375),
                             GridModel(256, 4, 8, 768, 0.001875)),
                     steps=(128, 256, 512, 1024, 2048), batch_size=64, seq_len=64,
                     eval_sequences=2048, resamples=1000, n_starts=8),
}
"""The grid each scale trains (chapter: 7)."""


@dataclass(frozen=True)
class GridRun:
    """One trained run of the grid: its size, tokens, FLOPs and held-out loss (chapter: 7)."""

    d_model: int
    n_layer: int
    n_head: int
    d_ff: int
    lr: float
    steps: int
    n_params: int  # every parameter, embedding and head included (the fits use this)
    n_params_non_embedding: int  # without the token embedding and the untied output head
    tokens: int  # steps x batch x seq_len: tokens seen in training
    flops: float  # 6 x n_params x tokens, estimated
    loss: float  # held-out loss, nats, measured
    best_loss: float  # the chain's own loss on the same held-out tokens, nats
    train_s: float  # measured, training and evaluation


@dataclass(frozen=True)
class ScalingGrid:
    """Trained runs, two fits of L(N, D), their bootstraps and compute-optimal splits (chapter: 7).

    ``fit_free`` fits all five constants; ``fit_fixed`` fixes E to the task's entropy.
    ``entropy_in_e_interval``: whether the entropy lies inside the bootstrap interval of the free
    fit's E. Every run is scored on the same held-out tokens, whose own best loss
    (``heldout_floor_nats``, the chain's loss on them) differs from the entropy by the sampling
    of those tokens; ``floor_in_e_interval`` asks the same of it. ``falls_with_n`` /
    ``falls_with_d``: whether the held-out loss falls at every step up in N at each run length,
    and at every step up in D for each model. ``max_rel_error_*`` / ``rms_rel_error_*``: the
    largest and the root-mean-square |predicted - measured| / measured of a fit over the grid.
    """

    scale: str
    device: str
    seed: int
    spec: GridSpec
    entropy_nats: float  # exact, of the task
    heldout_floor_nats: float  # the chain's own loss on the held-out tokens, measured
    runs: tuple[GridRun, ...]
    fit_free: ScalingFit
    fit_fixed: ScalingFit
    boot_free: BootstrapFit
    boot_fixed: BootstrapFit
    budgets: tuple[float, ...]  # FLOPs, inside the grid's range
    optimal_free: tuple[ComputeOptimal, ...]  # empty where the fit has no optimum
    optimal_fixed: tuple[ComputeOptimal, ...]
    entropy_in_e_interval: bool
    floor_in_e_interval: bool
    falls_with_n: bool
    falls_with_d: bool
    max_rel_error_free: float
    max_rel_error_fixed: float
    rms_rel_error_free: float
    rms_rel_error_fixed: float
    train_s: float  # measured: every run's training and evaluation
    fit_s: float  # measured: both fits
    bootstrap_s: float  # measured: both bootstraps
    total_s: float

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """N (parameters), D (tokens) and the held-out loss (nats) of every run (chapter: 7)."""
        return (np.array([r.n_params for r in self.runs], dtype=np.float64),
                np.array([r.tokens for r in self.runs], dtype=np.float64),
                np.array([r.loss for r in self.runs], dtype=np.float64))

    def as_dict(self) -> dict:
        """Every number of the grid as a plain dict (chapter: 7)."""
        out = {k: getattr(self, k) for k in (
            "scale", "device", "seed", "entropy_nats", "heldout_floor_nats", "budgets",
            "entropy_in_e_interval", "floor_in_e_interval", "falls_with_n", "falls_with_d",
            "max_rel_error_free", "max_rel_error_fixed", "rms_rel_error_free",
            "rms_rel_error_fixed", "train_s", "fit_s", "bootstrap_s", "total_s")}
        out["spec"] = asdict(self.spec)
        out["runs"] = [asdict(r) for r in self.runs]
        out["fit_free"], out["fit_fixed"] = self.fit_free.as_dict(), self.fit_fixed.as_dict()
        out["boot_free"], out["boot_fixed"] = self.boot_free.as_dict(), self.boot_fixed.as_dict()
        out["optimal_free"] = [o.as_dict() for o in self.optimal_free]
        out["optimal_fixed"] = [o.as_dict() for o in self.optimal_fixed]
        return out


def non_embedding_parameters(model, vocab_size: int) -> int:
    """Parameters outside the token embedding and untied head: Kaplan et al.'s N (chapter: 7)."""
    skip = {id(p) for name, p in model.named_parameters()
            if name.split(".")[0] in ("tok_emb", "lm_head") and vocab_size in p.shape}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def _falls(runs: Sequence[GridRun], key: str, along: str) -> bool:
    """Whether the loss falls at every step up in ``along`` with ``key`` held fixed."""
    groups: dict = {}
    for r in runs:
        groups.setdefault(getattr(r, key), []).append(r)
    for rs in groups.values():
        losses = [r.loss for r in sorted(rs, key=lambda r: getattr(r, along))]
        if any(b >= a for a, b in zip(losses, losses[1:], strict=False)):
            return False
    return True


def grid_budgets(flops: Sequence[float], n: int) -> tuple[float, ...]:
    """``n`` budgets in FLOPs, log-spaced strictly inside [min(flops), max(flops)] (chapter: 7)."""
    check_positive_int("n", n)
    flops = [check_positive_number("flops", float(c)) for c in flops]
    if not flops:
        raise MemlabError("grid_budgets needs at least one FLOP count")
    lo, hi = math.log(min(flops)), math.log(max(flops))
    return tuple(math.exp(lo + (hi - lo) * (i + 1) / (n + 1)) for i in range(n))


def scaling_grid(scale: str | None = None, *, device=None, seed: int = 0,
                 spec: GridSpec | None = None) -> ScalingGrid:
    """Train a grid of models x run lengths; fit L(N, D), E free and fixed; bootstrap (chapter: 7).

    Every run trains from scratch with its own warm-up and cosine schedule to its own length
    (:func:`memlab.model.lm.train_lm`) and is scored on the task's held-out sequences
    (:func:`memlab.model.lm.evaluate`). ``spec`` replaces the scale's :class:`GridSpec`;
    ``seed`` picks the chain, the initial weights, the batches and the bootstrap's draws.
    """
    start = time.perf_counter()
    scale = get_scale(scale)
    spec = GRIDS[scale] if spec is None else spec
    if not isinstance(spec, GridSpec):
        raise MemlabError(f"spec must be a GridSpec, got {type(spec).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise MemlabError(f"seed must be a non-negative integer, got {seed!r}")
    dev = pick_device(device)
    runs = []
    for model in spec.models:
        for steps in spec.steps:
            cfg = spec.config(model, steps, seed)
            t0 = time.perf_counter()
            trained = train_lm(cfg, device=dev)
            q = evaluate(trained.model, cfg)
            n_params = count_parameters(trained.model)
            tokens = steps * cfg.batch_size * cfg.seq_len
            runs.append(GridRun(
                model.d_model, model.n_layer, model.n_head, model.d_ff, model.lr, steps, n_params,
                non_embedding_parameters(trained.model, cfg.vocab_size), tokens,
                float(FLOPS_PER_TOKEN_PER_PARAM * n_params * tokens), q.loss, q.best_loss,
                time.perf_counter() - t0))
    entropy = spec.config(spec.models[0], spec.steps[0], seed).task().entropy_nats
    train_s = time.perf_counter() - start
    N = np.array([r.n_params for r in runs], dtype=np.float64)
    D = np.array([r.tokens for r in runs], dtype=np.float64)
    L = np.array([r.loss for r in runs], dtype=np.float64)
    t0 = time.perf_counter()
    fit_free = fit_scaling_law(N, D, L, n_starts=spec.n_starts)
    fit_fixed = fit_scaling_law(N, D, L, E=entropy, n_starts=spec.n_starts)
    fit_s = time.perf_counter() - t0
    budgets = grid_budgets([r.flops for r in runs], spec.n_budgets)
    t0 = time.perf_counter()
    boot_free = bootstrap_fit(N, D, L, resamples=spec.resamples, seed=seed, budgets=budgets,
                              fit=fit_free)
    boot_fixed = bootstrap_fit(N, D, L, E=entropy, resamples=spec.resamples, seed=seed,
                               budgets=budgets, fit=fit_fixed)
    bootstrap_s = time.perf_counter() - t0

    def optimal(fit: ScalingFit) -> tuple[ComputeOptimal, ...]:
        try:
            return tuple(compute_optimal(fit, c) for c in budgets)
        except MemlabError:  # a fitted exponent or constant <= 0: no optimum to report
            return ()

    def rel(fit: ScalingFit) -> np.ndarray:
        return np.abs(fit.predict(N, D) - L) / L

    floor = runs[0].best_loss  # the same held-out tokens for every run
    return ScalingGrid(
        scale=scale, device=device_name(dev), seed=seed, spec=spec, entropy_nats=entropy,
        heldout_floor_nats=floor, runs=tuple(runs), fit_free=fit_free, fit_fixed=fit_fixed,
        boot_free=boot_free, boot_fixed=boot_fixed, budgets=budgets,
        optimal_free=optimal(fit_free), optimal_fixed=optimal(fit_fixed),
        entropy_in_e_interval=boot_free.contains("E", entropy),
        floor_in_e_interval=boot_free.contains("E", floor),
        falls_with_n=_falls(runs, "steps", "n_params"),
        falls_with_d=_falls(runs, "n_params", "tokens"),
        max_rel_error_free=float(rel(fit_free).max()),
        max_rel_error_fixed=float(rel(fit_fixed).max()),
        rms_rel_error_free=float(np.sqrt(np.mean(rel(fit_free) ** 2))),
        rms_rel_error_fixed=float(np.sqrt(np.mean(rel(fit_fixed) ** 2))),
        train_s=train_s, fit_s=fit_s, bootstrap_s=bootstrap_s,
        total_s=time.perf_counter() - start)
