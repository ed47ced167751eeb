"""What activation checkpointing buys and what it costs (chapter 7).

Bytes saved are set against FLOPs and time added.

Two views of the same plans (:mod:`memlab.model.checkpoint`):

* :func:`checkpointing_curve`: for any model, even one too large to allocate, each plan's saved
  activations and peak (estimated; the estimator is held to the trace in the tests) beside its
  FLOPs (:func:`memlab.compute.flops.step_flops`, the count PyTorch's counter makes), with and
  without the early stop of PyTorch's checkpoint; every-K and segments-K over K, Chen et al.'s
  sqrt(n) segments marked.
* :func:`checkpointing_costs`: the book's model stepped for real on this device, each plan's
  measured saved bytes and peak, its counted FLOPs and its measured time per step.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from dataclasses import asdict, dataclass

from memlab.compute.flops import step_flops
from memlab.device import get_scale, pick_device, refuse_if_too_big
from memlab.errors import MemlabError, check_positive_int
from memlab.measure.step import measure_step, trace_step
from memlab.measure.timing import time_ms
from memlab.memory.estimator import estimate
from memlab.model.checkpoint import Checkpointing, parse_checkpointing, sqrt_segments
from memlab.model.config import ModelConfig, get_config
from memlab.model.step import StepSpec

# Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", arXiv
# 2205.05198, section 4.1, equation (1): a GPT block keeps sbh(34 + 5as/h) bytes in 16 bits
# (dropout masks included): 34 B T C without the attention scores. Section 4.2: selective
# recomputation cuts GPT-3's activations by 70% for 2.7% more FLOPs.
KORTHIKANTI_SOURCE = "https://arxiv.org/abs/2205.05198"
KORTHIKANTI_BYTES_PER_BTC = 34  # quoted: a GPT block's saved bytes over B T C, scores aside
KORTHIKANTI_SELECTIVE_CUT = 0.70  # quoted: GPT-3's activation memory removed by selective
KORTHIKANTI_SELECTIVE_FLOPS = 0.027  # quoted: the FLOPs selective recomputation adds for GPT-3


def saved_bytes_per_btc(model: ModelConfig | str, *, precision: str = "bf16-mixed",
                        attention: str | None = None, seq_len: int = 512,
                        device: str = "cuda") -> float:
    """A block's saved activations over B x T x C: the bytes that grow with the tokens (chapter: 7).

    The estimator's saved tensors of one block (:func:`memlab.memory.activations.saved_tensors`,
    scope ``layer``) at batch 2 minus batch 1, over T x C: what a block keeps per token and per
    unit of width, without what does not grow with the batch (autocast's 16-bit weight copies,
    RoPE's tables). With SDPA it does not depend on ``seq_len``; eager attention adds its
    T x T tensors, which grow with it. Korthikanti et al.'s 34 (:data:`KORTHIKANTI_BYTES_PER_BTC`)
    is this number for a GPT block in 16 bits with dropout, the scores left out.
    """
    from memlab.memory.activations import saved_tensors

    cfg = get_config(model) if isinstance(model, str) else model
    if attention is not None:
        from dataclasses import replace

        cfg = replace(cfg, attention=attention)
    T = check_positive_int("seq_len", seq_len)

    def block(B: int) -> int:
        return sum(t.bytes for t in saved_tensors(cfg, batch_size=B, seq_len=T,
                                                  precision=precision, device=device)
                   if t.scope == "layer")

    return (block(2) - block(1)) / (T * cfg.d_model)


@dataclass(frozen=True)
class PlanRow:
    """One checkpointing plan: bytes it keeps and FLOPs it adds (chapter: 7)."""

    plan: str
    checkpointed_blocks: int
    saved_bytes: int  # activations saved for the backward pass, estimated
    backward_peak_bytes: int  # the backward pass's peak, where recomputed blocks live, estimated
    peak_bytes: int  # the step's peak (the optimizer step's included), estimated
    flops: int  # the step's FLOPs, PyTorch's checkpoint stopping its recomputation early
    flops_whole: int  # the same with every recomputation run to its end (early_stop=False)
    recompute_share: float  # recomputed FLOPs over the step's FLOPs without checkpointing
    recompute_share_whole: float

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class CheckpointCurve:
    """Every plan of one step: saved bytes, peak and FLOPs (chapter: 7).

    Chen et al.'s sqrt(n) plan is named.
    """

    setup: dict
    rows: tuple[PlanRow, ...]
    sqrt_plan: str  # segments of round(sqrt(L)) blocks

    def row(self, plan) -> PlanRow:
        """The row of a plan, by name or as a plan (chapter: 7)."""
        name = parse_checkpointing(plan).name
        for r in self.rows:
            if r.plan == name:
                return r
        raise MemlabError(f"no row for plan {name!r}; rows: {', '.join(r.plan for r in self.rows)}")

    def saving(self, plan) -> float:
        """The share of the saved activations a plan removes, against no checkpointing (chapter: 7)."""
        return 1 - self.row(plan).saved_bytes / self.row("none").saved_bytes

    def as_dict(self) -> dict:
        """The curve as a plain dict (chapter: 7)."""
        return dict(setup=self.setup, rows=[r.as_dict() for r in self.rows],
                    sqrt_plan=self.sqrt_plan)

    def table(self, unit: str = "GiB") -> str:
        """The rows as text: plan, saved bytes, peak, FLOPs added with and without the early stop (chapter: 7)."""
        from memlab.units import to_unit

        lines = [f"{'plan':<14}{'blocks':>7}{'saved ' + unit:>12}{'backward ' + unit:>13}"
                 f"{'peak ' + unit:>12}{'+FLOPs':>9}{'+FLOPs whole':>14}"]
        for r in self.rows:
            mark = "  <- sqrt(n)" if r.plan == self.sqrt_plan else ""
            lines.append(f"{r.plan:<14}{r.checkpointed_blocks:>7}"
                         f"{to_unit(r.saved_bytes, unit):>12.2f}"
                         f"{to_unit(r.backward_peak_bytes, unit):>13.2f}"
                         f"{to_unit(r.peak_bytes, unit):>12.2f}"
                         f"{r.recompute_share:>9.1%}{r.recompute_share_whole:>14.1%}{mark}")
        return "\n".join(lines)


def curve_plans(n_layer: int, ks=None) -> tuple[Checkpointing, ...]:
    """none, selective, full, every-K and segments-K for each K, and sqrt(n) (chapter: 7).

    K goes from 2 up to L by default; the last plan is Chen et al.'s sqrt(n) plan.
    """
    if ks is None:
        ks = sorted({k for k in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if k < n_layer}
                    | {n_layer})
    plans = [Checkpointing("none"), Checkpointing("selective"), Checkpointing("full")]
    for kind in ("every", "segments"):
        plans += [Checkpointing(kind, k) for k in ks if k >= 2]
    root = sqrt_segments(n_layer)
    if root not in plans:
        plans.append(root)
    out = []
    for p in plans:  # every-1 and segments-1 are full
        if p not in out:
            out.append(p)
    return tuple(out)


def checkpointing_curve(model: ModelConfig | str, *, batch_size: int, seq_len: int,
                        precision: str = "bf16-mixed", attention: str | None = None,
                        ks=None, device: str = "cuda", plans=None) -> CheckpointCurve:
    """Saved bytes, peak and FLOPs of every checkpointing plan of one step, estimated (chapter: 7).

    ``plans`` (names or plans) picks some instead of :func:`curve_plans`; ``none`` is always
    the first row, what the others save against.
    """
    cfg = get_config(model) if isinstance(model, str) else model
    base = StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                    attention=attention)
    none = step_flops(base)
    if plans is None:
        chosen = curve_plans(cfg.n_layer, ks)
    else:
        chosen = [Checkpointing("none")]
        for p in plans:
            q = parse_checkpointing(p)
            if q not in chosen:
                chosen.append(q)
    rows = []
    for plan in chosen:
        spec = StepSpec(cfg, batch_size=batch_size, seq_len=seq_len, precision=precision,
                        attention=attention, checkpointing=plan.label)
        est = estimate(spec, device=device)
        stop, whole = step_flops(spec), step_flops(spec, early_stop=False)
        rows.append(PlanRow(plan.name, plan.checkpointed_blocks(cfg.n_layer),
                            est.saved_activations_bytes, est.phase_peak_bytes["backward"],
                            est.peak_bytes, stop.total, whole.total,
                            stop.total / none.total - 1, whole.total / none.total - 1))
    return CheckpointCurve(setup=base.as_dict() | {"conventions": device}, rows=tuple(rows),
                           sqrt_plan=sqrt_segments(cfg.n_layer).name)


# Measured on this device ------------------------------------------------------------------
CKPT_CI = ModelConfig(name="ckpt-ci", style="llama", vocab_size=512, n_layer=8, n_head=4,
                      n_kv_head=4, d_model=128, d_ff=384, max_seq_len=256)
"""The model chapter 7 checkpoints on a CPU: 8 blocks, so every-K and segments-K differ."""

COST_SIZES = {
    "ci": dict(model=CKPT_CI, batch_size=2, seq_len=128, precision="fp32", repeats=7,
               plans=("none", "selective", "every-2", "full")),
    "full": dict(model="llama-1b", batch_size=4, seq_len=2048, precision="bf16-mixed",
                 repeats=5, plans=("none", "selective", "every-2", "segments-5", "full")),
}


@dataclass(frozen=True)
class MeasuredPlan:
    """One plan stepped for real: bytes measured and estimated, FLOPs counted, time measured (chapter: 7)."""

    plan: str
    saved_bytes: int  # measured: activations alive at the end of the forward pass
    peak_bytes: int  # measured
    estimated_saved_bytes: int
    estimated_peak_bytes: int
    flops: int  # counted by FlopCounterMode on the real step
    flops_whole: int  # with the early stop turned off (step_flops, equal to the counter's count)
    step_ms: float  # median of the timed steps
    step_ms_whole: float  # the same with the early stop turned off (timed for 'full' only)
    times_ms: tuple[float, ...]

    def as_dict(self) -> dict:
        """The fields as a plain dict (chapter: 7)."""
        return asdict(self)


@dataclass(frozen=True)
class CheckpointCosts:
    """Checkpointing plans of the book's model, measured on this device (chapter: 7)."""

    scale: str
    device: str
    setup: dict
    plans: tuple[MeasuredPlan, ...]

    def plan(self, name) -> MeasuredPlan:
        """The measured plan of a name (chapter: 7)."""
        name = parse_checkpointing(name).name
        for p in self.plans:
            if p.plan == name:
                return p
        raise MemlabError(f"no measured plan {name!r}; measured: "
                          + ", ".join(p.plan for p in self.plans))

    def time_ratio(self, name, whole: bool = False) -> float:
        """A plan's median step time over no checkpointing's, measured side by side (chapter: 7)."""
        p, none = self.plan(name), self.plan("none")
        return (p.step_ms_whole if whole else p.step_ms) / none.step_ms

    def flops_ratio(self, name, whole: bool = False) -> float:
        """A plan's counted FLOPs over no checkpointing's (chapter: 7)."""
        p, none = self.plan(name), self.plan("none")
        return (p.flops_whole if whole else p.flops) / none.flops

    def as_dict(self) -> dict:
        """The result as a plain dict (chapter: 7)."""
        return dict(scale=self.scale, device=self.device, setup=self.setup,
                    plans=[p.as_dict() for p in self.plans])

    def table_rows(self) -> list[dict]:
        """One row per plan for a page's table (chapter: 7).

        Each row has bytes measured and estimated, and FLOPs and time against none.
        """
        return [dict(plan=p.plan, saved_MiB=round(p.saved_bytes / 2**20, 2),
                     saved_estimated_over_measured=round(p.estimated_saved_bytes / p.saved_bytes, 3),
                     peak_MiB=round(p.peak_bytes / 2**20, 2),
                     peak_estimated_over_measured=round(p.estimated_peak_bytes / p.peak_bytes, 3),
                     flops_x=round(self.flops_ratio(p.plan), 3),
                     flops_x_no_early_stop=round(self.flops_ratio(p.plan, whole=True), 3),
                     time_x=round(self.time_ratio(p.plan), 2)) for p in self.plans]

    def table(self, unit: str = "MiB") -> str:
        """Measured bytes, counted FLOPs and measured time of each plan, against none (chapter: 7)."""
        from memlab.units import to_unit

        lines = [f"{'plan':<12}{'saved ' + unit:>12}{'est.':>9}{'peak ' + unit:>12}{'est.':>9}"
                 f"{'FLOPs x':>9}{'time x':>8}{'whole: FLOPs x':>16}{'time x':>8}"]
        for p in self.plans:
            lines.append(f"{p.plan:<12}{to_unit(p.saved_bytes, unit):>12.2f}"
                         f"{p.estimated_saved_bytes / p.saved_bytes:>9.3f}"
                         f"{to_unit(p.peak_bytes, unit):>12.2f}"
                         f"{p.estimated_peak_bytes / p.peak_bytes:>9.3f}"
                         f"{self.flops_ratio(p.plan):>9.3f}{self.time_ratio(p.plan):>8.2f}"
                         f"{self.flops_ratio(p.plan, True):>16.3f}"
                         f"{self.time_ratio(p.plan, True):>8.2f}")
        return "\n".join(lines)


def _early_stop(on: bool):
    from torch.utils.checkpoint import set_checkpoint_early_stop

    return contextlib.nullcontext() if on else set_checkpoint_early_stop(False)


def _stepper(spec: StepSpec, dev):
    """One model and optimizer on ``dev``, and a closure running one step under any plan of it.

    The plans share the model: ``step(plan, early_stop)`` switches the model's plan
    (:meth:`~memlab.model.transformer.Transformer.set_checkpointing`) and runs a step, so only
    one model and one set of optimizer states are ever resident.
    """
    import torch

    from memlab.measure.step import default_dtype, param_dtype, step_autocast, step_optimizer
    from memlab.model.transformer import build_model, lm_loss

    with default_dtype(param_dtype(spec.precision)):
        model = build_model(spec.config, device=dev, seed=0)
    opt = step_optimizer(spec, list(model.parameters()))
    gen = torch.Generator().manual_seed(0)
    idx, targets = torch.randint(0, spec.config.vocab_size, (2, spec.batch_size, spec.seq_len),
                                 generator=gen).to(dev)

    def step(plan: str, early_stop: bool) -> None:
        model.set_checkpointing(plan)
        with _early_stop(early_stop):
            with step_autocast(spec.precision, dev):
                loss = lm_loss(model(idx), targets)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _time_plans(spec: StepSpec, dev, keys, repeats: int) -> dict:
    """Milliseconds of each ``(plan, early_stop)`` step, round by round, on one model."""
    step = _stepper(spec, dev)
    times: dict = {key: [] for key in keys}
    for key in keys:  # warm-up: the first step allocates the optimizer's states
        step(*key)
    for _ in range(repeats):
        for key in keys:
            times[key] += time_ms(lambda key=key: step(*key), warmup=0, repeats=1, device=dev)
    return times


def checkpointing_costs(scale: str | None = None, device=None, *, plans=None) -> CheckpointCosts:
    """Each plan of the book's model stepped for real here (chapter: 7).

    It gives bytes, counted FLOPs and time per step.

    The steps are timed side by side: one model is built, then each round times one step of
    every plan (the model's plan switched between them; the checkpoint's early stop on and
    off), so a change in the machine's load touches every plan alike; each plan's time is its
    median over the rounds. The model is then let go, and each plan's bytes are measured on a
    model of its own, one at a time. On a GPU, a step without checkpointing is traced first
    and refused in one line if it would not fit.
    """
    scale = get_scale(scale)
    size = dict(COST_SIZES[scale])
    dev = pick_device(device)
    cfg = size["model"] if isinstance(size["model"], ModelConfig) else get_config(size["model"])
    names = [parse_checkpointing(p).name for p in (size["plans"] if plans is None else plans)]
    if "none" not in names:
        raise MemlabError("checkpointing_costs compares plans with 'none': include it in plans")
    conventions = "cuda" if dev.type == "cuda" else "cpu"
    specs = {name: StepSpec(cfg, batch_size=size["batch_size"], seq_len=size["seq_len"],
                            precision=size["precision"],
                            checkpointing=parse_checkpointing(name).label) for name in names}
    if dev.type != "cpu":  # the most a plan needs: no checkpointing; refuse before allocating
        need = trace_step(specs["none"]).peak_bytes
        refuse_if_too_big(need, dev, f"a {cfg.name} step without checkpointing")
    # The early stop turned off is timed for full checkpointing, where it matters most.
    keys = [(name, stop) for name in names
            for stop in ((True, False) if name == "full" else (True,))]
    times = _time_plans(specs["none"], dev, keys, size["repeats"])
    gc.collect()  # the timed model is gone: each plan's bytes are measured on their own
    if dev.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    out = []
    for name, spec in specs.items():
        m = measure_step(spec, device=dev, count_flops=True)
        est = estimate(spec, device=conventions)
        whole = step_flops(spec, early_stop=False).total
        t, t_whole = times[(name, True)], times.get((name, False), times[(name, True)])
        out.append(MeasuredPlan(name, m.saved_activations_bytes, m.peak_bytes,
                                est.saved_activations_bytes, est.peak_bytes, m.flops, whole,
                                statistics.median(t), statistics.median(t_whole), tuple(t)))
    setup = {k: v for k, v in size.items() if k not in ("model", "plans")}
    return CheckpointCosts(scale=scale, device=dev.type,
                           setup=setup | {"model": cfg.name, "parameters": cfg.num_parameters()},
                           plans=tuple(out))
