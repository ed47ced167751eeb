"""Multi-head, grouped-query and multi-query attention on the book's small model (chapter: 4).

Grouped-query attention (GQA, Ainslie et al. 2023, arXiv:2305.13245) lets ``n_head / n_kv_head``
query heads share one key/value head; multi-query attention (MQA, Shazeer 2019,
arXiv:1911.02150) is its end point, one key/value head for all. Plain multi-head attention (MHA)
is ``n_kv_head = n_head``. What changes, and by how much:

* parameters: the K and V projections shrink from ``C x C`` to ``C x n_kv_head * hs`` each, so a
  block loses ``2 x C x hs x (n_head - n_kv_head)`` weights (counted on the built model);
* the KV cache: ``2 x layers x n_kv_head x hs x bytes`` per token
  (:func:`memlab.attention.kv.kv_bytes_per_token`), divided by ``n_head / n_kv_head``;
* the training step's saved activations (measured with :func:`memlab.measure.step.measure_step`):
  with ``sdpa`` the model repeats K and V to ``n_head`` heads before attention, so attention
  saves full-size K and V whatever ``n_kv_head`` is; the book's ``flash`` attention reads the
  shared heads without copies and saves only the smaller K and V. Either way the rest of the
  step (MLP, norms, Q, the output projection, the logits) is untouched;
* quality: every variant is trained from the same seed on the same batches for the same number
  of steps, and its held-out loss is compared with MHA's on the same sequences
  (:func:`memlab.model.lm.paired_delta`, as in chapter 3). The paired standard error covers
  the sampling of the held-out text only, not the training run's own randomness: the variants'
  initial weights differ (their K and V projections have other shapes), and at 'ci' scale,
  where every variant trains for only :data:`GQA_STEPS` steps, the difference says as much
  about how fast each variant learns as about what it can reach.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, replace

from memlab.attention.kv import kv_bytes_per_token
from memlab.device import device_name, get_scale, pick_device
from memlab.errors import MemlabError, check_choice, check_positive_int
from memlab.measure.step import measure_step
from memlab.memory.estimator import DTYPE_BYTES
from memlab.model.lm import (
    LMConfig,
    Quality,
    config_for,
    evaluate,
    paired_delta,
    train_lm,
    trained_reference,
)
from memlab.results import kept_on_disk

KINDS = ("MHA", "GQA", "MQA")
# Training steps of every variant. At 'ci' the config's 400 steps take about 30 s per model on
# one CPU thread; the comparison trains each variant for fewer steps so that all of them fit in
# about 15 s. None: the config's own steps.
GQA_STEPS: dict[str, int | None] = {"ci": 48, "full": None}
# The attention implementations whose training step is measured: the model's own (K and V
# repeated to n_head heads) and the book's tiled kernel (shared heads read without copies).
MEASURED_ATTENTIONS = ("sdpa", "flash")


def kind_of(n_kv_head: int, n_head: int) -> str:
    """'MHA' (n_kv_head = n_head), 'MQA' (n_kv_head = 1) or 'GQA' (in between) (chapter: 4)."""
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else "GQA"


def kv_head_choices(n_head: int) -> tuple[int, ...]:
    """Every n_kv_head a model with ``n_head`` query heads accepts (chapter: 4).

    They are its divisors, largest first.
    """
    check_positive_int("n_head", n_head)
    return tuple(d for d in range(n_head, 0, -1) if n_head % d == 0)


def check_kv_heads(n_kv_head, n_head: int) -> int:
    """``n_kv_head`` if it divides ``n_head`` (chapter: 4).

    Else a one-line :class:`MemlabError` naming the accepted ones.
    """
    accepted = kv_head_choices(n_head)
    if isinstance(n_kv_head, bool) or not isinstance(n_kv_head, int) or n_kv_head not in accepted:
        raise MemlabError(f"n_kv_head {n_kv_head!r} must divide n_head {n_head}; accepted: "
                          + ", ".join(map(str, accepted)))
    return n_kv_head


@dataclass(frozen=True)
class GqaRow:
    """One attention variant of the book's model: its bytes and its held-out quality (chapter: 4)."""

    n_kv_head: int
    kind: str  # 'MHA' | 'GQA' | 'MQA'
    group_size: int  # query heads per key/value head, n_head / n_kv_head
    parameters: int  # counted on the built model
    kv_bytes_per_token: int  # estimated: 2 x layers x n_kv_head x hs x bytes per value
    kv_ratio: float  # kv_bytes_per_token / MHA's, = n_kv_head / n_head
    # Measured training step (batch_size x seq_len of the config), per attention implementation:
    saved_activations_bytes: dict[str, int]  # what the forward keeps for backward
    step_peak_bytes: dict[str, int]  # peak of the step, every category
    quality: Quality  # held-out, after training
    delta_loss: float  # held-out loss minus MHA's on the same sequences, nats (0 for MHA)
    delta_se: float  # its paired standard error, nats (nan for MHA itself)
    losses: list[float]  # training loss per step, nats
    train_s: float  # seconds of training

    @property
    def loss(self) -> float:
        """Held-out loss, nats per scored token."""
        return self.quality.loss


@dataclass(frozen=True)
class GqaComparison:
    """MHA, GQA and MQA trained alike on the book's task: bytes and quality per n_kv_head (chapter: 4)."""

    scale: str
    config: LMConfig  # the MHA config; each variant changes only n_kv_head (and steps)
    steps: int  # training steps of every variant (the config's own: config.steps)
    kv_precision: str  # format of the cached keys and values in kv_bytes_per_token
    device: str
    rows: list[GqaRow]  # n_kv_head from n_head (MHA) down
    seconds: float  # wall time of the whole comparison, training and measuring

    @property
    def n_head(self) -> int:
        """Query heads of every variant."""
        return self.config.n_head

    def row(self, n_kv_head: int) -> GqaRow:
        """The variant with ``n_kv_head`` key/value heads."""
        for r in self.rows:
            if r.n_kv_head == n_kv_head and not isinstance(n_kv_head, bool):
                return r
        raise MemlabError(f"no variant with n_kv_head {n_kv_head!r}; accepted: "
                          + ", ".join(str(r.n_kv_head) for r in self.rows))

    def best_within(self, kv_bytes_per_token: int) -> GqaRow | None:
        """The least-loss variant whose KV cache fits ``kv_bytes_per_token`` (chapter: 4).

        The variant of least held-out loss; None if none fits.
        """
        if isinstance(kv_bytes_per_token, bool) or not isinstance(kv_bytes_per_token, (int, float)) \
                or not kv_bytes_per_token >= 0:
            raise MemlabError(f"kv_bytes_per_token must be a non-negative number of bytes, got "
                              f"{kv_bytes_per_token!r}")
        fits = [r for r in self.rows if r.kv_bytes_per_token <= kv_bytes_per_token]
        return min(fits, key=lambda r: r.loss) if fits else None

    def frame(self):
        """One row per variant, as a DataFrame (chapter: 4).

        Each row has parameters, KV bytes, saved activations, and held-out loss vs MHA with 2 SE.
        """
        import pandas as pd

        rows = []
        for r in self.rows:
            row = {"n_kv_head": r.n_kv_head, "kind": r.kind, "parameters": r.parameters,
                   "KV bytes/token": r.kv_bytes_per_token, "KV vs MHA": r.kv_ratio}
            row.update({f"saved act. bytes ({a})": b for a, b in r.saved_activations_bytes.items()})
            row.update({"held-out excess (nats)": r.quality.excess, "vs MHA (nats)": r.delta_loss,
                        "2 SE": 2 * r.delta_se})
            rows.append(row)
        return pd.DataFrame(rows).set_index("n_kv_head")

    def table(self) -> str:
        """The comparison as text: bytes per variant and held-out loss against MHA's (chapter: 4)."""
        atts = list(self.rows[0].saved_activations_bytes) if self.rows else []
        lines = [f"{self.config.n_head} query heads; every variant trained {self.steps} steps "
                 f"(config: {self.config.steps}) from seed {self.config.seed} on the same batches, "
                 f"on {self.device}; KV cache in {self.kv_precision}",
                 f"{'n_kv':>4} {'kind':<4}{'parameters':>12}{'KV B/token':>12}{'vs MHA':>8}"
                 + "".join(f"{'saved (' + a + ')':>16}" for a in atts)
                 + f"{'excess':>9}{'vs MHA +- 2 SE (nats)':>24}"]
        for r in self.rows:
            delta = "reference" if r.kind == "MHA" else f"{r.delta_loss:+.4f} +- {2 * r.delta_se:.4f}"
            lines.append(f"{r.n_kv_head:>4} {r.kind:<4}{r.parameters:>12,}{r.kv_bytes_per_token:>12,}"
                         f"{r.kv_ratio:>8.3f}"
                         + "".join(f"{r.saved_activations_bytes[a]:>16,}" for a in atts)
                         + f"{r.quality.excess:>9.4f}{delta:>24}")
        return "\n".join(lines)


def gqa_comparison(scale: str | None = None, *, config: LMConfig | None = None,
                   kv_heads=None, steps: int | None = None, kv_precision: str = "fp32",
                   device=None) -> GqaComparison:
    """Train the book's model once per n_kv_head (chapter: 4).

    Each run gives parameters, KV-cache bytes, saved activations and held-out loss vs MHA.

    ``kv_heads`` (default: every divisor of ``n_head``) lists the variants; MHA
    (``n_kv_head = n_head``) is always trained, as the reference of the paired differences.
    ``config`` replaces the scale's :class:`memlab.model.lm.LMConfig` (the tests use
    :data:`memlab.model.lm.TINY_LM`); ``steps`` defaults to :data:`GQA_STEPS` at the scale, or the
    config's own steps when ``config`` is given. ``kv_precision`` is the cached format (the
    model computes in fp32). Computed once per process for the same arguments, and kept on disk
    when ``$MEMLAB_CACHE_DIR`` is set.
    """
    scale = get_scale(scale)
    cfg = config_for(scale, config)
    if cfg.n_kv_head is not None and cfg.n_kv_head != cfg.n_head:
        raise MemlabError(f"config n_kv_head must be None or n_head ({cfg.n_head}): the comparison "
                          f"starts from multi-head attention, got {cfg.n_kv_head!r}")
    cfg = replace(cfg, n_kv_head=None)
    if kv_heads is None:
        kv_heads = kv_head_choices(cfg.n_head)
    elif isinstance(kv_heads, (int, bool)) or not hasattr(kv_heads, "__iter__"):
        raise MemlabError(f"kv_heads must be a list of n_kv_head values, got {kv_heads!r}")
    chosen = {check_kv_heads(h, cfg.n_head) for h in kv_heads} | {cfg.n_head}
    if steps is None:
        steps = cfg.steps if config is not None else (GQA_STEPS[scale] or cfg.steps)
    steps = check_positive_int("steps", steps)
    check_choice("kv_precision", kv_precision, DTYPE_BYTES)
    dev = pick_device(device)
    return _gqa_comparison(scale, cfg, tuple(sorted(chosen, reverse=True)), steps, kv_precision,
                           dev.type)


@functools.cache
@kept_on_disk
def _gqa_comparison(scale: str, cfg: LMConfig, kv_heads: tuple[int, ...], steps: int,
                    kv_precision: str, device: str) -> GqaComparison:
    """:func:`gqa_comparison` with checked arguments, once per process (and kept on disk when asked)."""
    start = time.perf_counter()
    dev = pick_device(device)
    mha_kv = kv_bytes_per_token(cfg.model_config(), kv_precision)
    rows: list[GqaRow] = []
    reference: Quality | None = None
    for nkv in kv_heads:  # n_head first: MHA is the reference of every paired difference
        vcfg = replace(cfg, n_kv_head=None if nkv == cfg.n_head else nkv, steps=steps)
        if nkv == cfg.n_head and steps == cfg.steps:
            trained = trained_reference(cfg, device)  # chapter 3's model: the same run
        else:
            trained = train_lm(vcfg, device=dev)
        quality = evaluate(trained.model, vcfg)
        if reference is None:
            reference = quality
        delta, se = paired_delta(quality, reference) if nkv != cfg.n_head else (0.0, math.nan)
        mcfg = vcfg.model_config()
        saved, peak = {}, {}
        for att in MEASURED_ATTENTIONS:
            step = measure_step(mcfg, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                                attention=att, device=dev, seed=cfg.seed)
            saved[att], peak[att] = step.saved_activations_bytes, step.peak_bytes
        kv = kv_bytes_per_token(mcfg, kv_precision)
        rows.append(GqaRow(
            n_kv_head=nkv, kind=kind_of(nkv, cfg.n_head), group_size=cfg.n_head // nkv,
            parameters=sum(p.numel() for p in trained.model.parameters()),
            kv_bytes_per_token=kv, kv_ratio=kv / mha_kv, saved_activations_bytes=saved,
            step_peak_bytes=peak, quality=quality, delta_loss=delta, delta_se=se,
            losses=trained.losses, train_s=trained.train_s))
    return GqaComparison(scale=scale, config=cfg, steps=steps, kv_precision=kv_precision,
                         device=device_name(dev), rows=rows, seconds=time.perf_counter() - start)
