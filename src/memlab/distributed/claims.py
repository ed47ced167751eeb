"""Chapter 6's claims (C28-C38).

Each ``evidence(**setting)`` computes the numbers in the claim's setting (its defaults) or in a
changed one (its moves), each ``decide(ev)`` the level by the verdict rule: the claim's stated
parts, each judged (:func:`memlab.claims.judge_parts`).

The runs are the chapter's: every strategy on 4 ranks in one launch (``distributed-memory``),
tensor and pipeline parallelism on 2 (``distributed-parallel``), both kept once per build; a
move that names another strategy or the recorded one-rank GPU run reads what is already there,
a move to another number of ranks launches again (``slow``).
"""

from __future__ import annotations

import functools

from memlab import claims
from memlab.distributed import zero
from memlab.distributed.experiments import distributed_memory_experiment, distributed_parallel
from memlab.errors import check_choice
from memlab.results import kept_on_disk, recorded
from memlab.units import to_unit

_CH6 = "chapters/06_distributed"
MEMORY_RUN = "memlab run distributed-memory --scale full --out results/"
SOURCES = ("live", "recorded")  # the chapter's run on this machine; the recorded GPU run


def _mib(n: float) -> str:
    unit = "GiB" if n >= 2**30 else "MiB"
    return f"{to_unit(n, unit):.2f} {unit}"


@functools.cache
@kept_on_disk
def _memory_on(nproc: int, strategies: tuple[str, ...]):
    """The chapter's CI model on another number of ranks: a launch, kept once per build."""
    from memlab.distributed.experiments import MEMORY_SIZES
    from memlab.distributed.sharding import distributed_memory, model_for

    size = dict(MEMORY_SIZES["ci"])
    return distributed_memory(model_for(size.pop("model")), nproc=nproc, strategies=strategies,
                              **{k: v for k, v in size.items() if k != "nproc"})


def _memory(source: str = "live", nproc: int | None = None,
            strategies: tuple[str, ...] = ("ddp", "zero3")) -> dict:
    """Each strategy's rank 0, every rank's categories, and one process; from the chosen run.

    ``source``: the chapter's run (``live``) or the recorded GPU run (``recorded``);
    ``nproc``: another number of ranks for the live run (a launch of ``strategies``).
    """
    check_choice("source", source, SOURCES)
    if source == "recorded":
        rec = recorded("distributed-memory", device="cuda")
        r, where = rec.value(), rec.label
    else:
        r = distributed_memory_experiment() if nproc is None else _memory_on(nproc, strategies)
        where = f"measured on {r.world_size} ranks ({r.backend}, {r.device})"
    runs = {}
    for run in r.runs:
        k = run.ranks[0]
        runs[run.strategy] = dict(
            parameters=k.parameters, gradients=k.gradients, optimizer_states=k.optimizer_states,
            after_forward=k.parameters_after_forward, activations=k.activations,
            peak=k.peak_bytes, model_states=[x.model_states for x in run.ranks],
            ranks=[dict(parameters=x.parameters_after_forward, gradients=x.gradients,
                        optimizer_states=x.optimizer_states) for x in run.ranks],
            formula=run.formula_bytes, formula_text=run.formula, shard_size=run.shard_size,
            mesh=list(run.mesh_shape), comm=k.comm_volume_bytes, label=run.label,
            comm_formula=run.comm_formula_bytes, collectives=sorted(k.comm),
            timeline=[[e, b] for e, b in run.gather_timeline], matches=run.matches_one_process,
            seconds=run.step_seconds, offloaded=k.offloaded_bytes)
    return dict(world=r.world_size, parameters=r.parameters, device=r.device, where=where,
                backend=r.backend, layout=r.layout, reference_activations=r.reference_activations,
                reference_peak=r.reference_peak_bytes, runs=runs)


# C28 -------------------------------------------------------------------------------------------
_CATEGORIES = ("parameters", "gradients", "optimizer_states")


def c28_evidence(strategy: str = "ddp") -> dict:
    """Every rank's measured model-state bytes under ``strategy`` against the whole model's (chapter: 6)."""
    m = _memory()
    check_choice("strategy", strategy, tuple(m["runs"]))
    n = m["parameters"]
    return dict(m, strategy=strategy, tolerance=0.01,
                full=dict(zip(_CATEGORIES, (b * n for b in zero.LAYOUTS[m["layout"]]),
                              strict=True)))


def _span(values) -> str:
    """'0.246-0.254', or one number where every rank's is the same to 3 decimals."""
    lo, hi = f"{min(values):.3f}", f"{max(values):.3f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _c28(ev: dict) -> claims.Verdict:
    run, full, tol = ev["runs"][ev["strategy"]], ev["full"], ev["tolerance"]
    ratios = {c: [k[c] / full[c] for k in run["ranks"]] for c in _CATEGORIES}
    parts = [claims.Part(
        f"every rank holds the whole model's {c.replace('_', ' ')}",
        all(abs(r - 1) <= tol for r in rs),
        f"a rank holds {_span(rs)} of them")
        for c, rs in ratios.items()]
    return claims.judge_parts(
        "", parts,
        f"{ev['where']}, {ev['strategy']}: each rank holds "
        + ", ".join(f"{c.replace('_', ' ')} {_span(rs)}x the whole model's"
                    for c, rs in ratios.items())
        + f" ({'+'.join(str(b) for b in zero.LAYOUTS[ev['layout']])} bytes per parameter, "
          "PyTorch's layout); the optimizer states' excess is Adam's step counters")


def _c28_decide(ev: dict) -> claims.Verdict:
    return claims.with_sensitivity(_c28, ev, "tolerance", (0.001, 0.01, 0.05),
                                   lambda t: f"a tolerance of {t:.1%}")


@claims.register("C28", _CH6, "DDP needs the full model, gradients and optimizer states on every "
                 "GPU.", evidence=c28_evidence,
                 moves=[claims.Move("ZeRO-1 (ZeroRedundancyOptimizer beside DDP) instead of "
                                    "plain DDP", {"strategy": "zero1"}, claims.WRONG)])
def c28(ev: dict) -> claims.Verdict:
    """Holds if every rank's parameters, gradients and optimizer states are the whole model's.

    Each within ``tolerance``; wrong if any category is split.
    """
    return _c28_decide(ev)


# C29 -------------------------------------------------------------------------------------------
def c29_evidence(strategy: str = "ddp") -> dict:
    """A data-parallel rank's measured model states and peak against one process (chapter: 6).

    The one process runs the whole batch; ``strategy`` names the data-parallel implementation.
    """
    m = _memory()
    check_choice("strategy", strategy, tuple(m["runs"]))
    return dict(m, strategy=strategy, per_parameter=sum(zero.LAYOUTS[m["layout"]]),
                tolerance=0.01)


def _c29(ev: dict) -> claims.Verdict:
    run, n, world = ev["runs"][ev["strategy"]], ev["parameters"], ev["world"]
    share = max(run["model_states"]) / (ev["per_parameter"] * n)
    peak_cut = 1 - run["peak"] / ev["reference_peak"]
    parts = [
        claims.Part("not memory: a rank keeps one process's model states",
                    abs(share - 1) <= ev["tolerance"],
                    f"a rank holds {share:.3f} of one process's model states: memory is a "
                    "benefit of this data parallelism"),
        claims.Part("its benefit is training speed", None,
                    f"training speed across GPUs is not measured here: the {world} ranks share "
                    f"one machine ({ev['device']})"),
    ]
    return claims.judge_parts(
        "", parts,
        f"{ev['where']}, {ev['strategy']}: a rank's model states are {share:.3f}x one "
        f"process's ({ev['per_parameter']} bytes per parameter); its peak is "
        f"{_mib(run['peak'])} against {_mib(ev['reference_peak'])} for one process on the whole "
        f"batch ({peak_cut:.0%} less), from the activations of its share of the batch, not from "
        "the model's states",
        command=f"{MEMORY_RUN} (on several GPUs, beside the one-GPU record)")


@claims.register("C29", _CH6, "DDP's benefit is training speed, not memory.",
                 evidence=c29_evidence,
                 moves=[claims.Move("FSDP2's fully sharded data parallelism (ZeRO-3) instead of "
                                    "DDP", {"strategy": "zero3"}, claims.WRONG)])
def c29(ev: dict) -> claims.Verdict:
    """Not judged here while a rank keeps one process's model states: the speed is not measured.

    Wrong if the states shrink (within ``tolerance``).
    """
    return claims.with_sensitivity(_c29, ev, "tolerance", (0.001, 0.01, 0.05),
                                   lambda t: f"a tolerance of {t:.1%}")


# C30 -------------------------------------------------------------------------------------------
def c30_evidence(source: str = "live") -> dict:
    """Per-rank parameters, gradients and activations of ZeRO-3 (FSDP2) against DDP's (chapter: 6).

    All are measured: on the chapter's ranks, or in the recorded GPU run (``source``).
    """
    return dict(_memory(source), tolerance=0.05)


def _c30(ev: dict) -> claims.Verdict:
    ddp, z3, world, tol = ev["runs"]["ddp"], ev["runs"]["zero3"], ev["world"], ev["tolerance"]
    share = {k: z3[k] / ddp[k] for k in ("parameters", "gradients", "activations")}
    one = "one rank: nothing is split across GPUs" if world == 1 else ""
    parts = [claims.Part(f"FSDP shards the {k} across GPUs",
                         None if world == 1 else abs(share[k] * world - 1) <= tol,
                         one or f"each rank keeps {share[k]:.3f} of DDP's, not 1/{world}"
                         + (": its own micro-batch's, as under DDP; splitting the batch divides "
                            "them, FSDP's sharding does not" if k == "activations" else ""))
             for k in share]
    return claims.judge_parts(
        "", parts,
        f"{ev['where']}, per rank, ZeRO-3 (FSDP2) / DDP: "
        + ", ".join(f"{k} {v:.3f}" for k, v in share.items())
        + "; saved activations per rank, every strategy: "
        + ", ".join(f"{s} {_mib(r['activations'])}" for s, r in ev["runs"].items()),
        command=f"{MEMORY_RUN} (on several GPUs)")


@claims.register("C30", _CH6, "FSDP shards parameters, gradients and activations across GPUs.",
                 evidence=c30_evidence,
                 moves=[claims.Move("one GPU (the recorded H100 run) instead of 4 ranks",
                                    {"source": "recorded"}, claims.NOT_JUDGED)])
def c30(ev: dict) -> claims.Verdict:
    """Holds if ZeRO-3's parameters, gradients and activations are each 1/N of DDP's.

    Each within ``tolerance``; wrong if one is not; not judged on one rank.
    """
    return claims.with_sensitivity(_c30, ev, "tolerance", (0.01, 0.05, 0.2),
                                   lambda t: f"a tolerance of {t:.0%}")


# C31 -------------------------------------------------------------------------------------------
C31_LIMITS = {1: 4.0, 2: 8.0}  # the claim's "up to" factors; stage 3: the number of GPUs
C31_GPUS = 64


def c31_evidence(layout: str = "mixed", model: str = "llama2-7b",
                 precision: str = "bf16-mixed") -> dict:
    """Model-state reductions of each ZeRO stage, by formula and measured (chapter: 6).

    The formulas are taken in ``layout`` (the paper's ``mixed``), the measurement on the chapter's
    ranks, and the whole per-GPU peak is estimated for ``model`` on 64 GPUs (one sequence of
    4,096 tokens, checkpointing).
    """
    from memlab.distributed.estimate import estimate_sharded
    from memlab.distributed.plan import zero_paper_model_states

    check_choice("layout", layout, tuple(zero.LAYOUTS))
    m = _memory()
    measured = {s: m["runs"]["ddp"]["model_states"][0] / max(m["runs"][name]["model_states"])
                for s, name in ((1, "zero1"), (3, "zero3"))}  # FSDP2's ZeRO-2 keeps its shard too
    expected = {s: zero.reduction(s, m["world"], layout=m["layout"]) for s in measured}
    big = 10**9  # "up to": the limit as N grows
    peaks = {s: estimate_sharded(model, zero_stage=s, gpus=C31_GPUS, precision=precision,
                                 batch_size=1, seq_len=4096, checkpointing=True, layout=layout
                                 ).per_gpu_peak_bytes for s in zero.STAGES}
    return dict(layout=layout, limits={s: zero.reduction(s, big, layout=layout) for s in (1, 2)},
                at64={s: zero.reduction(s, C31_GPUS, layout=layout) for s in (1, 2, 3)},
                paper_gb=zero_paper_model_states(), measured=measured, expected=expected,
                world=m["world"], run_layout=m["layout"], model=model, precision=precision,
                peak_cut={s: peaks[0] / peaks[s] for s in (1, 2, 3)}, gpus=C31_GPUS,
                tolerance=0.01, kept=0.5)


def _c31(ev: dict) -> claims.Verdict:
    lim, tol, n, layout = ev["limits"], ev["tolerance"], ev["gpus"], ev["layout"]
    runs_ok = all(abs(ev["measured"][s] / ev["expected"][s] - 1) <= 0.05 for s in ev["measured"])
    cut3 = ev["peak_cut"][3]
    parts = [claims.Part(f"stage {s} cuts memory by up to {C31_LIMITS[s]:g} times",
                         abs(lim[s] / C31_LIMITS[s] - 1) <= tol,
                         f"in the {layout} layout its model states fall by at most "
                         f"{lim[s]:.2f}x")
             for s in (1, 2)]
    parts.append(claims.Part(f"stage 3 in proportion to the number of GPUs ({n} GPUs, {n} times)",
                             abs(ev["at64"][3] / n - 1) <= tol and runs_ok,
                             f"{ev['at64'][3]:.1f}x on {n} GPUs by the formula; the runs "
                             + ("follow it" if runs_ok else "do not follow it")))
    paper = ", ".join(f"{v:.1f}" for v in ev["paper_gb"].values())
    p, g, k = zero.LAYOUTS[layout]
    return claims.judge_parts(
        "", parts,
        f"computed from the ZeRO formulas in the {layout} layout ({p}+{g}+{k} bytes per "
        f"parameter): stage 1 tends to {lim[1]:.2f}x, stage 2 to {lim[2]:.2f}x, stage 3 is "
        f"{ev['at64'][3]:.0f}x on {n} GPUs (the paper's 7.5B example: {paper} GB for stages "
        f"0-3); measured on {ev['world']} ranks ({ev['run_layout']}): "
        + ", ".join(f"stage {s} {r:.2f}x (formula {ev['expected'][s]:.2f}x)"
                    for s, r in ev["measured"].items())
        + f"; estimated per-GPU peak of {ev['model']} on {n} GPUs ({ev['precision']}, 4,096 "
          "tokens, checkpointing): "
        + ", ".join(f"stage {s} {r:.1f}x" for s, r in ev["peak_cut"].items()),
        caveat=f"these are the model's states; the activations and the block being gathered "
               f"are not divided, so {ev['model']}'s whole per-GPU peak falls by {cut3:.1f}x at "
               f"stage 3 on {n} GPUs, not {n}x",
        caveat_applies=cut3 < ev["kept"] * n)


@claims.register("C31", _CH6, "ZeRO stage 1 cuts memory by up to 4 times, stage 2 by up to 8 "
                 "times, and stage 3 in proportion to the number of GPUs (64 GPUs, 64 times).",
                 evidence=c31_evidence,
                 moves=[claims.Move("PyTorch's fp32 training (4+4+8 bytes per parameter) instead "
                                    "of the paper's mixed precision", {"layout": "fp32",
                                                                       "precision": "fp32"},
                                    claims.WRONG),
                        claims.Move("Llama-2-70B instead of 7B, whose model states dominate "
                                    "its peak", {"model": "llama2-70b"}, claims.HOLDS)])
def c31(ev: dict) -> claims.Verdict:
    """Holds if the formulas' limits are 4x, 8x and N within ``tolerance`` and the runs follow them.

    Caveat if the whole estimated peak falls by less than ``kept`` x N; wrong if a limit is off.
    """
    return claims.with_sensitivity(_c31, ev, "kept", (0.1, 0.5, 0.9),
                                   lambda k: f"a peak cut below {k:.0%} of N counted as partial")


# C32 -------------------------------------------------------------------------------------------
def c32_evidence(stages: tuple[str, ...] = ("zero1", "zero2", "zero3")) -> dict:
    """Bytes each rank communicated per step with each ZeRO stage, measured, over DDP's (chapter: 6)."""
    m = _memory()
    for s in stages:
        check_choice("stage", s, ("zero1", "zero2", "zero3"))
    return dict(m, stages=list(stages), close=1.1)


def _c32(ev: dict) -> claims.Verdict:
    runs = ev["runs"]
    over = {s: runs[s]["comm"] / runs["ddp"]["comm"] for s in ev["stages"]}
    far = {s: r for s, r in over.items() if r > ev["close"]}
    near = [s for s in over if s not in far]
    why = {"zero1": "it all-reduces the whole gradient, then broadcasts each rank's updated "
                    "parameters",
           "zero3": "it gathers every parameter twice, for forward and backward"}
    moves = [f"{runs[s]['label']} {r:.2f}x DDP's bytes" + (f" ({why[s]})" if s in why else "")
             for s, r in far.items()]
    part = claims.Part("ZeRO's communication stays close to DDP's", bool(near),
                       "every stage here moves more: " + "; ".join(moves))
    return claims.judge_parts(
        "", [part],
        f"{ev['where']}, volume per step (payloads, an all-reduce twice) over DDP's 2Ψ: "
        + ", ".join(f"{runs[s]['label']} {r:.2f}x ({', '.join(runs[s]['collectives'])})"
                    for s, r in over.items())
        + "; the ZeRO paper's: " + ", ".join(
            f"stage {s} {zero.COMM_FACTOR[s] / zero.COMM_FACTOR[0]:g}x" for s in (1, 2, 3)),
        caveat="close for " + ", ".join(runs[s]["label"] for s in near) + " only; "
               + "; ".join(moves),
        caveat_applies=bool(near) and bool(far))


@claims.register("C32", _CH6, "ZeRO's communication stays close to DDP's.", evidence=c32_evidence,
                 moves=[claims.Move("ZeRO-2 alone (FSDP2, kept after forward)",
                                    {"stages": ("zero2",)}, claims.HOLDS),
                        claims.Move("ZeRO-3 alone (FSDP2, resharded)", {"stages": ("zero3",)},
                                    claims.WRONG)])
def c32(ev: dict) -> claims.Verdict:
    """Holds if every stage moves at most ``close`` x DDP's bytes.

    Caveat if only some do; wrong if none does.
    """
    return claims.with_sensitivity(_c32, ev, "close", (1.05, 1.1, 1.6),
                                   lambda c: f"'close' taken as within {c:g}x")


# C33 -------------------------------------------------------------------------------------------
def c33_evidence(reshard_after_forward: bool = True) -> dict:
    """Bytes of parameters FSDP held gathered at each block's forward and backward (chapter: 6).

    Measured on rank 0; FSDP2's default ``reshard_after_forward=True`` is the ZeRO-3 run,
    ``False`` the ZeRO-2 one.
    """
    from memlab.model.config import ModelConfig
    from memlab.model.transformer import build_model

    r = distributed_memory_experiment()
    cfg = ModelConfig(**r.config)
    block = 4 * sum(p.numel() for p in build_model(cfg, device="meta").blocks[0].parameters())
    m = _memory()
    run = "zero3" if reshard_after_forward else "zero2"
    return dict(world=m["world"], where=m["where"], block=block, n_blocks=cfg.n_layer,
                reshard_after_forward=reshard_after_forward, timeline=m["runs"][run]["timeline"],
                prefetch=2)


def _c33(ev: dict) -> claims.Verdict:
    block, tl = ev["block"], ev["timeline"]

    def at(phase: str, edge: str) -> list[int]:
        return [b for e, b in tl if e.startswith(f"{phase} block") and e.endswith(edge)]

    starts = at("forward", "starts") + at("backward", "starts")
    ends = at("forward", "ends")
    phase = "forward"
    gathers = {"forward": 0, "backward": 0}
    for e, _ in tl:
        if e.startswith("backward "):
            phase = "backward"
        if e == "all-gather issued":
            gathers[phase] += 1
    most = max(b for _, b in tl)
    parts = [
        claims.Part("FSDP gathers the full parameters just before each forward computation",
                    bool(starts) and min(at("forward", "starts")) >= block,
                    "a block starts its forward with less than its own parameters gathered"),
        claims.Part("it gathers them just before each backward computation",
                    gathers["backward"] >= ev["n_blocks"] and min(at("backward", "starts"))
                    >= block,
                    f"it issues {gathers['backward']} all-gathers in the backward: the blocks "
                    "are still gathered from their forward"),
        claims.Part("it frees them afterwards",
                    bool(ends) and max(ends) <= block and most <= ev["prefetch"] * block,
                    f"as each block's forward ends up to {max(ends, default=0) / block:.1f} "
                    f"blocks' parameters stay gathered, {most / block:.1f} at most "
                    f"({_mib(most)})"),
    ]
    return claims.judge_parts(
        "", parts,
        f"{ev['where']}, rank 0, reshard_after_forward={ev['reshard_after_forward']}: "
        f"{gathers['forward']} all-gathers in the forward, {gathers['backward']} in the "
        f"backward; at most {most / block:.1f} blocks' parameters gathered at any mark (a block "
        f"and the next one fetched ahead), at most {max(ends, default=0) / block:.1f} as each "
        "block's forward ends")


@claims.register("C33", _CH6, "FSDP gathers the full parameters just before each forward and "
                 "backward computation and frees them afterwards.", evidence=c33_evidence,
                 moves=[claims.Move("reshard_after_forward=False (FSDP2 keeps each block "
                                    "gathered from forward to backward)",
                                    {"reshard_after_forward": False}, claims.WRONG)])
def c33(ev: dict) -> claims.Verdict:
    """Holds if each block is gathered as its forward and backward start and freed after.

    Freed: at most one block gathered as a forward ends, ``prefetch`` at any mark; wrong otherwise.
    """
    return claims.with_sensitivity(_c33, ev, "prefetch", (1, 2, 3),
                                   lambda p: f"at most {p} blocks gathered at once")


# C34 -------------------------------------------------------------------------------------------
def c34_evidence(nproc: int | None = None) -> dict:
    """FSDP2's per-rank model states, mesh and collectives at every factor, beside DDP's (chapter: 6).

    The sharding factors are 1, 2 and N on the chapter's 4 ranks (``nproc``: another number of
    ranks, launched); all are measured.
    """
    return dict(_memory(nproc=nproc, strategies=("ddp", "zero3")), tolerance=0.05)


def _c34(ev: dict) -> claims.Verdict:
    runs, world, tol = ev["runs"], ev["world"], ev["tolerance"]
    ddp = runs["ddp"]
    factors = {runs[s]["shard_size"]: runs[s] for s in ("replicate", "hsdp", "zero3") if s in runs}
    shares = {f: r["model_states"][0] / ddp["model_states"][0] for f, r in factors.items()}
    one, full = factors.get(1), factors.get(world)
    between = {f: r for f, r in factors.items() if 1 < f < world}
    no_run = f"no run at that factor on {world} ranks (a 2-D mesh needs 4)"
    parts = [
        claims.Part("a sharding factor of 1 behaves like DDP", None if one is None else (
            abs(shares[1] - 1) <= tol and one["collectives"] == ddp["collectives"]
            and abs(one["comm"] / ddp["comm"] - 1) <= tol),
            no_run if one is None else f"its states are {shares[1]:.3f}x DDP's, its "
                                       f"collectives {', '.join(one['collectives'])}"),
        claims.Part("the full GPU count gives full sharding", None if full is None else
                    abs(shares[world] * world - 1) <= tol,
                    no_run if full is None else f"its states are {shares[world]:.3f}x DDP's"),
        claims.Part("values in between give hybrid sharding", None if not between else all(
            abs(shares[f] * f - 1) <= tol and len(r["mesh"]) == 2 for f, r in between.items()),
            f"no factor lies between 1 and {world} in this run" if not between else
            "; ".join(f"factor {f}: states {shares[f]:.3f}x DDP's, mesh {r['mesh']}"
                      for f, r in between.items())),
    ]
    return claims.judge_parts(
        "", parts,
        f"{ev['where']}, model states per rank over DDP's: "
        + ", ".join(f"factor {f}: {s:.3f}" for f, s in sorted(shares.items()))
        + (f"; factor 1 issues {', '.join(one['collectives'])} ({one['comm'] / ddp['comm']:.3f}x "
           f"DDP's bytes) and peaks at {_mib(one['peak'])} against DDP's {_mib(ddp['peak'])} "
           "(FSDP and DDP lay out their gradient buffers differently)" if one else ""),
        command="memlab run distributed-memory --out results/ (on 4 or more ranks)")


@claims.register("C34", _CH6, "A sharding factor of 1 behaves like DDP, the full GPU count gives "
                 "full sharding, and values in between give hybrid sharding.",
                 evidence=c34_evidence,
                 moves=[claims.Move("2 ranks instead of 4", {"nproc": 2}, claims.NOT_JUDGED,
                                    slow=True)])
def c34(ev: dict) -> claims.Verdict:
    """Holds if factor 1 has DDP's states and collectives and every factor f has 1/f of them.

    Each within ``tolerance``; a factor the run does not have is not judged.
    """
    return claims.with_sensitivity(_c34, ev, "tolerance", (0.01, 0.05, 0.3),
                                   lambda t: f"a tolerance of {t:.0%}")


# C35 -------------------------------------------------------------------------------------------
def c35_evidence(device: str = "cuda") -> dict:
    """Peak and step time of ZeRO-3 with and without CPU offload on ``device`` (chapter: 6).

    ``cuda``: the recorded GPU run; ``cpu``: the chapter's run on this machine.
    """
    check_choice("device", device, ("cuda", "cpu"))
    if device == "cuda" and recorded("distributed-memory", device="cuda") is None:
        return dict(recorded=None, device=device)
    m = _memory("recorded" if device == "cuda" else "live")
    pick = {s: {k: m["runs"][s][k] for k in ("peak", "seconds", "offloaded", "activations")}
            for s in ("zero3", "offload")}
    return dict(recorded=dict(where=m["where"], parameters=m["parameters"], **pick),
                device=m["device"])


def _c35(ev: dict) -> claims.Verdict:
    r = ev["recorded"]
    if r is None:
        return claims.not_judged("", "no GPU run of distributed-memory is recorded",
                                 "the GPU's memory is not measured on this machine",
                                 command=MEMORY_RUN)
    z3, off = r["zero3"], r["offload"]
    saved = 1 - off["peak"] / z3["peak"]
    slower = off["seconds"] / z3["seconds"]
    on_gpu = ev["device"] == "cuda"
    same = f"on a {ev['device']} the device's memory and the host's are the same memory"
    parts = [claims.Part("offloading to the CPU reduces GPU memory",
                         saved > 0 if on_gpu else None,
                         f"the peak rose by {-saved:.0%}" if on_gpu else same),
             claims.Part("at a cost in speed", slower > 1 if on_gpu else None,
                         f"a step took {slower:.2f}x as long" if on_gpu else same)]
    return claims.judge_parts(
        "", parts,
        f"{r['where']}; {r['parameters']:,} parameters, ZeRO-3's peak {_mib(z3['peak'])}, with "
        f"CPU offload {_mib(off['peak'])} ({saved:.0%} less; {_mib(off['offloaded'])} kept in "
        f"CPU memory; the activations, {_mib(off['activations'])}, stay on the device); a step "
        f"{z3['seconds']:.2f} s against {off['seconds']:.2f} s ({slower:.1f}x)",
        command=MEMORY_RUN)


@claims.register("C35", _CH6, "Offloading to the CPU reduces GPU memory at a cost in speed.",
                 evidence=c35_evidence,
                 moves=[claims.Move("this machine's CPU instead of the recorded GPU",
                                    {"device": "cpu"}, claims.NOT_JUDGED, slow=True)])
def c35(ev: dict) -> claims.Verdict:
    """Holds if offload lowers the GPU peak and lengthens the step; wrong if either fails.

    Not judged without a GPU run.
    """
    return _c35(ev)


# C36 -------------------------------------------------------------------------------------------
# The FSDP paper's T5 sizes and results (Zhao et al. 2023, arXiv 2304.11277, sections 5.2-5.3),
# quoted: FSDP and DDP alike at 611M and 2.28B, DDP out of memory at 11B, and per-GPU TFLOPS
# 7% lower at 512 GPUs than at 8 for T5-11B.
T5_SIZES = {"T5-611M": 611_000_000, "T5-2.28B": 2_280_000_000, "T5-11B": 11_000_000_000}
QUOTED_DROP = 0.07
THROUGHPUT_INPUTS = dict(mfu=0.4, overlap=False)  # assumed, not quoted
TOKENS_PER_GPU = (2_048, 8_192, 32_768, 131_072)  # per step: the model's one free input


def c36_evidence(gpu: str = "A100-80GB") -> dict:
    """DDP's model states for the paper's T5 sizes against ``gpu``, and modelled throughput (chapter: 6).

    The communication-time model gives throughput from 8 to 512 GPUs; no speed is measured.
    """
    from memlab.distributed.commtime import throughput_model
    from memlab.gpus import get_gpu

    g = get_gpu(gpu)
    ddp = {name: zero.model_states(n, 0, 8, layout="mixed").total for name, n in T5_SIZES.items()}
    drops = {t: 1 - throughput_model(T5_SIZES["T5-11B"], t, (8, 512), stage=3,
                                     **THROUGHPUT_INPUTS)[-1].relative for t in TOKENS_PER_GPU}
    return dict(usable=g.usable_bytes, gpu=g.name, ddp=ddp, drops=drops,
                quoted_drop=QUOTED_DROP, inputs=dict(THROUGHPUT_INPUTS))


@claims.register("C36", _CH6, "FSDP and DDP run at similar speed for 0.6B and 2.3B models, DDP "
                 "runs out of memory at 11B, and per-GPU throughput drops about 7% from 8 to 512 "
                 "GPUs.", evidence=c36_evidence,
                 moves=[claims.Move("a 24 GB L4 instead of an A100 80GB", {"gpu": "L4"},
                                    claims.WRONG)])
def c36(ev: dict) -> claims.Verdict:
    """Not judged: the speeds are not measured; wrong if DDP's states fit or fail the other way."""
    fits = {k: v <= ev["usable"] for k, v in ev["ddp"].items()}
    i = ev["inputs"]
    modelled = ", ".join(f"{d:.0%} at {t:,} tokens" for t, d in ev["drops"].items())
    where = f"an {ev['gpu']}'s {_mib(ev['usable'])} usable"
    no_speed = "the speeds are the paper's; no multi-GPU run is made here"
    parts = [
        claims.Part("DDP runs the 0.6B and 2.3B models", fits["T5-611M"] and fits["T5-2.28B"],
                    "DDP's model states alone do not fit " + where + " at "
                    + " and ".join(k for k in ("T5-611M", "T5-2.28B") if not fits[k])),
        claims.Part("FSDP and DDP run at similar speed for 0.6B and 2.3B models", None, no_speed),
        claims.Part("DDP runs out of memory at 11B", not fits["T5-11B"],
                    "DDP's model states of T5-11B fit " + where),
        claims.Part("per-GPU throughput drops about 7% from 8 to 512 GPUs", None,
                    no_speed + f"; a communication-time model gives {modelled}"),
    ]
    return claims.judge_parts(
        "", parts,
        "computed: DDP's model states alone (16 bytes per parameter) are "
        + ", ".join(f"{_mib(v)} for {k}" for k, v in ev["ddp"].items())
        + f" against {where}; the communication-time model (quoted link speeds, assumed MFU "
          f"{i['mfu']:.0%}, communication not overlapped) puts ZeRO-3's per-GPU throughput on "
          f"T5-11B at 512 GPUs below 8 GPUs' by {modelled} per GPU per step; the paper measured "
          f"{ev['quoted_drop']:.0%}",
        command=f"{MEMORY_RUN} (on 8 to 512 GPUs, with the paper's T5 sizes)")


# C37 -------------------------------------------------------------------------------------------
# Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023,
# arXiv 2304.11277), section 5.1: "8 to 512 A100 80GB GPUs interconnected by a 2Tb/s RoCE network".
FSDP_PAPER = dict(gpu="A100-80GB", gpus=(8, 512), network="2 Tb/s RoCE",
                  source="Zhao et al. 2023, arXiv 2304.11277, section 5.1")
CLAIMED = dict(gpu="V100", memory_gb=80, gpus=512)


def c37_evidence(gpu: str = CLAIMED["gpu"]) -> dict:
    """The named GPU's memory sizes from the catalogue, and the FSDP paper's hardware (chapter: 6).

    ``gpu`` is the cluster's GPU as named (the claim's V100); the paper's hardware is quoted.
    """
    from memlab.gpus import GPU_NAMES, LEGACY, get_gpu

    sizes = {g.name: g.memory_label for g in LEGACY if g.name.split("-")[0] == gpu}
    sizes |= {n: get_gpu(n).memory_label for n in GPU_NAMES if n.split("-")[0] == gpu}
    return dict(claimed=dict(CLAIMED, gpu=gpu), sizes=sizes, paper=dict(FSDP_PAPER),
                paper_memory=get_gpu(FSDP_PAPER["gpu"]).memory_label)


@claims.register("C37", _CH6, "Those FSDP results were measured on 512 V100 GPUs with 80 GB each.",
                 evidence=c37_evidence,
                 moves=[claims.Move("the cluster's GPU taken as the A100 (the catalogue's A100 "
                                    "sizes)", {"gpu": "A100"}, claims.HOLDS)])
def c37(ev: dict) -> claims.Verdict:
    """Holds if the paper's GPU is the one named, with that memory, in that number; wrong if not."""
    c, paper = ev["claimed"], ev["paper"]
    gb = [int(label.split()[0]) for label in ev["sizes"].values()]
    parts = [
        claims.Part(f"{c['gpus']} GPUs", c["gpus"] == max(paper["gpus"]),
                    f"the runs went up to {max(paper['gpus'])} GPUs"),
        claims.Part(f"{c['gpu']} GPUs", paper["gpu"].split("-")[0] == c["gpu"],
                    f"the paper's GPUs were {paper['gpu']}s ({paper['source']})"),
        claims.Part(f"with {c['memory_gb']} GB each", c["memory_gb"] in gb,
                    f"the {c['gpu']} came with {' or '.join(ev['sizes'].values())}, never "
                    f"{c['memory_gb']} GB; the paper's {paper['gpu']}s had {ev['paper_memory']}"),
    ]
    return claims.judge_parts(
        "", parts,
        f"the {c['gpu']} came with {' or '.join(ev['sizes'].values()) or 'no size listed'} "
        f"(catalogue); the paper's cluster, quoted: {paper['gpus'][0]} to {paper['gpus'][1]} "
        f"{paper['gpu']} GPUs ({ev['paper_memory']}) on {paper['network']} ({paper['source']})")


# C38 -------------------------------------------------------------------------------------------
def c38_evidence(dp_source: str = "live") -> dict:
    """Tensor, pipeline and data parallelism's shares per rank (chapter: 6).

    Tensor parallelism's weight share and error per rank and the pipeline's layers per stage are
    measured on 2 ranks, data parallelism's activations per rank on the chapter's ranks or in the
    recorded GPU run (``dp_source``).
    """
    from memlab.distributed.parallel import split_stages
    from memlab.model.config import ModelConfig
    from memlab.model.transformer import build_model

    p = distributed_parallel()
    m = _memory(dp_source)
    stages = split_stages(build_model(ModelConfig(**p.pp_config), device="meta"), p.world_size)
    return dict(tp_share=[r.shard_share for r in p.tp_ranks], tp_error=p.tp_max_error,
                tp_replicated=p.tp_ranks[0].replicated_bytes,
                tp_local=p.tp_ranks[0].local_weight_bytes, tp_full=p.tp_ranks[0].full_weight_bytes,
                pp_stage_params=[sum(q.numel() for q in st.parameters()) for st in stages],
                pp_blocks=[len(s.blocks) for s in stages], pp_n_layer=p.pp_config["n_layer"],
                pp_match=all(r.matches_one_process for r in p.pp_runs),
                dp_share=m["runs"]["ddp"]["activations"] / m["reference_activations"],
                dp_world=m["world"], dp_where=m["where"], world=p.world_size, tolerance=0.05)


def _c38(ev: dict) -> claims.Verdict:
    w, tol, dw = ev["world"], ev["tolerance"], ev["dp_world"]
    stages = ev["pp_stage_params"]
    parts = [
        claims.Part("data parallelism splits the data", None if dw == 1 else
                    abs(ev["dp_share"] * dw - 1) <= tol,
                    "one rank: nothing is split" if dw == 1 else
                    f"each rank saves {ev['dp_share']:.3f} of one process's activations"),
        claims.Part("pipeline parallelism splits the layers",
                    sum(ev["pp_blocks"]) == ev["pp_n_layer"] and min(ev["pp_blocks"]) >= 1
                    and ev["pp_match"],
                    f"blocks per stage {ev['pp_blocks']} of {ev['pp_n_layer']}"),
        claims.Part("tensor parallelism splits the tensors within a layer",
                    all(abs(s * w - 1) <= tol for s in ev["tp_share"]) and ev["tp_error"] < 1e-4,
                    f"each split weight is {ev['tp_share'][0]:.2f} per rank, output error "
                    f"{ev['tp_error']:.1e}"),
    ]
    return claims.judge_parts(
        "", parts,
        f"data parallelism, {ev['dp_where']}: each rank's activations {ev['dp_share']:.3f} of "
        f"one process's; pipeline on {w} stages: blocks per stage {ev['pp_blocks']}, weights "
        f"per stage {', '.join(f'{n:,}' for n in stages)} (the first also holds the embedding, "
        f"the last the head), loss and gradients {'as' if ev['pp_match'] else 'not as'} one "
        f"process's; tensor parallelism on {w} ranks: each split weight "
        f"{ev['tp_share'][0]:.2f} per rank, the block's weights "
        f"{ev['tp_local'] / ev['tp_full']:.3f} per rank (the norms, {ev['tp_replicated']:,} "
        f"bytes, whole on every rank as Megatron-LM's scheme keeps them), output error "
        f"{ev['tp_error']:.1e}",
        command=f"{MEMORY_RUN} (on several GPUs)")


@claims.register("C38", _CH6, "Data, pipeline and tensor parallelism split the data, the layers, "
                 "and the tensors within a layer, respectively.", evidence=c38_evidence,
                 moves=[claims.Move("data parallelism on one GPU (the recorded H100 run)",
                                    {"dp_source": "recorded"}, claims.NOT_JUDGED)])
def c38(ev: dict) -> claims.Verdict:
    """Holds if each rank holds 1/N of the data's activations, whole layers and 1/N of each split weight.

    Each within ``tolerance``; wrong if one does not; not judged on one rank.
    """
    return claims.with_sensitivity(_c38, ev, "tolerance", (0.01, 0.05, 0.2),
                                   lambda t: f"a tolerance of {t:.0%}")
