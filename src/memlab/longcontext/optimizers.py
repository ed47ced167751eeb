"""Optimizer states that cost less: their exact bytes, and what each does to the loss (chapter 8).

AdamW keeps two moments per parameter in the parameters' dtype (8 bytes per fp32 parameter).
Three ways to keep less, beside it:

* ``adamw-8bit``: bitsandbytes' AdamW8bit, 1-byte codes with an fp32 absmax per block of 256
  (Dettmers et al., "8-bit Optimizers via Block-wise Quantization");
* ``adamw-bf16-moments``: both moments in bf16, updated in fp32 (:mod:`memlab.model.optim`);
* ``adafactor``: torch's Adafactor (Shazeer and Stern, "Adafactor: Adaptive Learning Rates with
  Sublinear Memory Cost"): no first moment, and the second moment of a matrix factored into a row
  and a column vector.

:func:`state_bytes_table` sets the estimator's state bytes beside the bytes of the state tensors
on a real model after one step. :func:`loss_comparison` trains the book's small language model
(:mod:`memlab.model.lm`) with each one, from the same initial weights and batches for a seed,
over several seeds, and reports each one's held-out loss minus AdamW's, paired by seed, with
two standard errors.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch

from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import default_dtype, param_dtype
from memlab.memory.estimator import DEVICES, optimizer_state_bytes
from memlab.model.config import OPTIMIZERS, PRECISIONS, ModelConfig, get_config
from memlab.model.lm import SIZES, LMConfig, evaluate, measure_state, train_lm
from memlab.model.train import make_optimizer
from memlab.model.transformer import build_model
from memlab.units import to_unit

# AdamW first: every other optimizer is compared with it.
COMPARED = ("adamw", "adamw-8bit", "adamw-bf16-moments", "adafactor")


# Exact state bytes ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StateBytesRow:
    """One optimizer's state: estimated and, on real tensors after one step, measured (chapter: 8)."""

    optimizer: str
    estimated_bytes: int
    measured_bytes: int | None  # None: not measured (measure=False, or the package is missing)
    bytes_per_parameter: float  # estimated bytes / parameters
    note: str  # why nothing was measured, else ""


@dataclass(frozen=True)
class StateBytesTable:
    """Optimizer-state bytes of one model and precision, one row per optimizer (chapter: 8)."""

    model: str
    parameters: int
    precision: str
    conventions: str  # the estimate's device conventions (where Adafactor's step tensors live)
    rows: tuple[StateBytesRow, ...]

    def as_dict(self) -> dict:
        """Plain data for a record (chapter: 8)."""
        return asdict(self)

    def row(self, optimizer: str) -> StateBytesRow:
        """The row of one optimizer by its book name (chapter: 8)."""
        check_choice("optimizer", optimizer, tuple(r.optimizer for r in self.rows))
        return next(r for r in self.rows if r.optimizer == optimizer)

    def table(self, unit: str = "MiB") -> str:
        """The rows as text, bytes in ``unit`` (chapter: 8)."""
        lines = [f"optimizer states: {self.model} ({self.parameters:,} parameters), "
                 f"{self.precision}, {self.conventions} conventions",
                 f"{'optimizer':<20}{'estimated ' + unit:>16}{'measured ' + unit:>16}"
                 f"{'bytes/param':>13}"]
        for r in self.rows:
            measured = "-" if r.measured_bytes is None else f"{to_unit(r.measured_bytes, unit):.4f}"
            lines.append(f"{r.optimizer:<20}{to_unit(r.estimated_bytes, unit):>16.4f}"
                         f"{measured:>16}{r.bytes_per_parameter:>13.4f}"
                         + (f"  ({r.note})" if r.note else ""))
        return "\n".join(lines)


def measured_state_bytes(cfg: ModelConfig, precision: str, optimizer: str) -> int:
    """Bytes of an optimizer's distinct state tensors after one step on a real model (chapter: 8).

    The model is built on the CPU in the precision's parameter dtype; the step runs on zero
    gradients, which creates the same states as any first step.
    """
    with default_dtype(param_dtype(precision)):
        model = build_model(cfg, seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params, lr=1e-3, impl="foreach")
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    return measure_state(opt, model).state_bytes


def state_bytes_table(model: ModelConfig | str = "tiny", precision: str = "fp32", *,
                      measure: bool = True, device: str = "cpu",
                      optimizers: tuple[str, ...] = COMPARED) -> StateBytesTable:
    """Estimated optimizer-state bytes, and measured ones on real CPU tensors (chapter: 8).

    ``measure=False`` gives the estimate only (a 7-8B model's states are not allocated here).
    Measured states are CPU tensors, so they are held to the ``cpu`` conventions; the ``cuda``
    conventions leave out the step tensors Adam and Adafactor keep on the host.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    if not isinstance(cfg, ModelConfig):
        raise MemlabError(f"model must be a preset name or a ModelConfig, got {model!r}")
    check_choice("precision", precision, PRECISIONS)
    check_choice("device", device, DEVICES)
    if not isinstance(measure, bool):
        raise MemlabError(f"measure must be True or False, got {measure!r}")
    if measure and device != "cpu":
        raise MemlabError(f"measured states are CPU tensors, held to the cpu conventions; got "
                          f"device {device!r}: pass device='cpu' or measure=False")
    for name in optimizers:
        check_choice("optimizer", name, OPTIMIZERS)
    n = cfg.num_parameters()
    rows = []
    for name in optimizers:
        est = optimizer_state_bytes(cfg, precision, name, "foreach", device)
        measured, note = None, ""
        if measure:
            try:
                measured = measured_state_bytes(cfg, precision, name)
            except MemlabError as err:  # bitsandbytes missing: the estimate stands alone
                if name != "adamw-8bit":
                    raise
                note = f"not measured: {err}"
        rows.append(StateBytesRow(name, est, measured, est / n, note))
    return StateBytesTable(cfg.name, n, precision, device, tuple(rows))


# What each does to the loss ---------------------------------------------------------------------
# The book's small LM, cut down so that 4 optimizers x 3 seeds train in seconds on 2 CPU cores
# at ci; full trains chapter 3's ci model for longer, over more seeds.
LOSS_SIZES = {
    "ci": dict(config=replace(SIZES["ci"], d_model=32, d_ff=128, n_layer=1, n_head=2,
                              seq_len=24, batch_size=16, steps=100, lr=2e-2, warmup=10,
                              eval_sequences=64),
               seeds=3, adafactor_lr=0.1),
    "full": dict(config=replace(SIZES["ci"], steps=600, eval_sequences=512), seeds=8,
                 adafactor_lr=0.1),
}


@dataclass(frozen=True)
class OptimizerLoss:
    """One optimizer over the seeds: losses, state bytes, and its difference from AdamW (chapter: 8)."""

    optimizer: str
    lr: float  # Adafactor's is a relative step size
    held_out_losses: tuple[float, ...]  # per seed, nats
    final_train_losses: tuple[float, ...]  # per seed: mean training loss of the last tenth of steps
    excess_losses: tuple[float, ...]  # per seed: held-out loss above the task's best, nats
    state_bytes: int  # the optimizer's distinct state tensors after training, measured
    bytes_per_parameter: float
    delta: float  # mean over seeds of (held-out loss - AdamW's with the same seed), nats
    delta_se: float  # its standard error over seeds (nan with one seed)
    train_s: float  # seconds of training, all seeds

    def words(self) -> str:
        """The difference from AdamW as the book says it: ``+0.0123 ± 0.0045 nats`` (chapter: 8)."""
        return f"{self.delta:+.4f} \u00b1 {2 * self.delta_se:.4f} nats"

    def within_noise(self) -> bool:
        """Whether the difference from AdamW is inside 2 standard errors (chapter: 8)."""
        return abs(self.delta) <= 2 * self.delta_se


@dataclass(frozen=True)
class LossComparison:
    """Each optimizer trained on the same seeds, held-out loss paired by seed with AdamW (chapter: 8)."""

    scale: str
    config: LMConfig
    seeds: tuple[int, ...]
    device: str
    runs: tuple[OptimizerLoss, ...]
    seconds: float

    def as_dict(self) -> dict:
        """Plain data for a record (chapter: 8)."""
        return asdict(self)

    def run(self, optimizer: str) -> OptimizerLoss:
        """One optimizer's result by its book name (chapter: 8)."""
        check_choice("optimizer", optimizer, tuple(r.optimizer for r in self.runs))
        return next(r for r in self.runs if r.optimizer == optimizer)

    def table(self) -> str:
        """The runs as text: state bytes per parameter and the paired difference (chapter: 8)."""
        cfg = self.config
        lines = [f"{cfg.steps} steps of the book's LM (d_model {cfg.d_model}, {cfg.n_layer} "
                 f"layers) on {self.device}, {len(self.seeds)} seeds",
                 f"{'optimizer':<20}{'state B/param':>14}{'held-out loss':>15}"
                 f"{'minus AdamW ± 2 SE':>28}"]
        for r in self.runs:
            lines.append(f"{r.optimizer:<20}{r.bytes_per_parameter:>14.3f}"
                         f"{statistics.fmean(r.held_out_losses):>15.4f}"
                         f"{'(reference)' if r.optimizer == 'adamw' else r.words():>28}")
        return "\n".join(lines)


def loss_comparison(scale: str | None = None, *, seeds: int | None = None,
                    steps: int | None = None, optimizers: tuple[str, ...] = COMPARED,
                    config: LMConfig | None = None, adafactor_lr: float | None = None,
                    device=None) -> LossComparison:
    """Train the book's small LM with each optimizer over seeds; loss minus AdamW's (chapter: 8).

    Seed s builds the initial weights with seed s and draws its own batches (the steps after
    seed s-1's); every optimizer sees the same ones. The AdamW family trains at the config's learning rate; Adafactor at
    ``adafactor_lr``, a relative step size (torch's default, the paper's, learns much more slowly
    over a few hundred steps of this model). The difference is each seed's held-out loss minus
    AdamW's on the same seed, averaged, with its standard error over seeds.
    """
    start = time.perf_counter()
    scale = get_scale(scale)
    size = LOSS_SIZES[scale]
    cfg = size["config"] if config is None else config
    if not isinstance(cfg, LMConfig):
        raise MemlabError(f"config must be an LMConfig, got {type(cfg).__name__}")
    if steps is not None:
        cfg = replace(cfg, steps=check_positive_int("steps", steps))
    n_seeds = check_positive_int("seeds", size["seeds"] if seeds is None else seeds)
    a_lr = size["adafactor_lr"] if adafactor_lr is None else adafactor_lr
    if isinstance(a_lr, bool) or not isinstance(a_lr, (int, float)) or not a_lr > 0:
        raise MemlabError(f"adafactor_lr must be a positive number, got {a_lr!r}")
    optimizers = tuple(optimizers)
    for name in optimizers:
        check_choice("optimizer", name, OPTIMIZERS)
    if not optimizers or optimizers[0] != "adamw":
        raise MemlabError(f"optimizers must start with 'adamw' (the reference), got {optimizers!r}")
    dev = pick_device(device)
    window = max(1, cfg.steps // 10)
    results = {}
    for name in optimizers:
        lr = a_lr if name == "adafactor" else cfg.lr
        held, final, excess, t0 = [], [], [], time.perf_counter()
        for s in range(n_seeds):
            trained = train_lm(cfg, model=build_model(cfg.model_config(), seed=s), lr=lr,
                               optimizer=name, device=dev.type, seed_offset=s * cfg.steps)
            quality = evaluate(trained.model, cfg)
            held.append(quality.loss)
            excess.append(quality.excess)
            final.append(statistics.fmean(trained.losses[-window:]))
        results[name] = (lr, held, final, excess, trained.state, time.perf_counter() - t0)
    reference = results["adamw"][1]
    runs = []
    for name, (lr, held, final, excess, state, seconds) in results.items():
        diffs = [a - b for a, b in zip(held, reference, strict=True)]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
        runs.append(OptimizerLoss(
            optimizer=name, lr=lr, held_out_losses=tuple(held), final_train_losses=tuple(final),
            excess_losses=tuple(excess), state_bytes=state.state_bytes,
            bytes_per_parameter=state.bytes_per_param, delta=statistics.fmean(diffs),
            delta_se=se, train_s=seconds))
    return LossComparison(scale=scale, config=cfg, seeds=tuple(range(n_seeds)),
                          device=device_name(dev), runs=tuple(runs),
                          seconds=time.perf_counter() - start)
