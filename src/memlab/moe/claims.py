"""Chapter 9's claims (C49-C51).

Each ``evidence()`` counts, traces or measures the numbers, each ``decide(ev)`` the level.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memlab import claims
from memlab.model.config import get_config

_CH9 = "chapters/09_mixture_of_experts"
B = 1e9


def _counted(cfg) -> int:
    """Parameters counted by PyTorch on the model built on the meta device."""
    from memlab.model.transformer import build_model, count_parameters

    return count_parameters(build_model(cfg, device="meta"))


def _dense_sibling(cfg):
    """The same blocks with one dense SwiGLU MLP of an expert's width: 'one of the 7Bs'."""
    return replace(cfg, moe=None, d_ff=cfg.moe.d_ff, name=f"{cfg.name} with one expert")


# C49 -------------------------------------------------------------------------------------------
C49_STATEMENT = "Mixtral 8x7B is a 56-billion-parameter model."
EXPERTS_HOLD = ("mlp", "block")


def c49_evidence(model: str = "mixtral-8x7b", experts_hold: str = "mlp") -> dict:
    """Mixtral's parameters counted on the model, beside eight copies of its dense sibling (chapter: 9).

    ``experts_hold="mlp"`` is Mixtral: the experts replace the MLP, and attention, norms and
    embeddings are shared. ``"block"``: each expert a whole block (attention too), embeddings
    shared, with one router per layer: what "8 x 7B" would be if the experts were eight models.
    """
    from memlab.errors import check_choice
    from memlab.model.config import param_groups

    check_choice("experts_hold", experts_hold, EXPERTS_HOLD)
    cfg = get_config(model)
    m = cfg.moe
    dense = _dense_sibling(cfg)
    embed, block, head = param_groups(dense)
    if experts_hold == "mlp":
        total, counted_by = _counted(cfg), "PyTorch, on the model built on the meta device"
    else:
        total = (sum(embed) + sum(head) + m.experts * cfg.n_layer * sum(block)
                 + cfg.n_layer * cfg.d_model * m.experts)
        counted_by = "the blocks' shapes (embeddings, E whole blocks per layer, a router)"
    stated = float(re.search(r"(\d+)-billion", C49_STATEMENT).group(1)) * B
    return dict(model=model, experts=m.experts, experts_hold=experts_hold, parameters=total,
                counted_by=counted_by, formula=cfg.num_parameters(),
                active_parameters=cfg.active_parameters(),
                dense_sibling=dense.num_parameters(), stated=stated,
                tolerance=0.5 * B / stated)  # the stated figure's own precision: half a billion


def _c49(ev: dict) -> claims.Verdict:
    n, stated = ev["parameters"], ev["stated"]
    eight = ev["experts"] * ev["dense_sibling"]
    text = (f"{ev['model']} with experts that hold {'the MLP' if ev['experts_hold'] == 'mlp' else 'a whole block'}: "
            f"{n:,} parameters ({n / B:.1f} billion, counted by {ev['counted_by']}), "
            f"{ev['active_parameters'] / B:.1f} billion active per token; {ev['experts']} copies "
            f"of the dense model with one expert's MLP would be {eight / B:.1f} billion")
    holds = abs(n - stated) <= ev["tolerance"] * stated
    parts = [claims.Part(
        "a 56-billion-parameter model", holds,
        f"it has {n / B:.1f} billion ({n:,}): the experts replace only the MLPs, so attention, "
        f"norms and embeddings are held once, not {ev['experts']} times; a token passes through "
        f"{ev['active_parameters'] / B:.1f} billion of them")]
    return claims.judge_parts("", parts, text)


@claims.register("C49", _CH9, C49_STATEMENT, evidence=c49_evidence, moves=[
    claims.Move("experts that are whole blocks, attention included (eight 7B models sharing "
                "their embeddings)", {"experts_hold": "block"}, claims.HOLDS)])
def c49(ev: dict) -> claims.Verdict:
    """Wrong unless the count is within half a billion of 56 billion, the figure's own precision."""
    return claims.with_sensitivity(_c49, ev, "tolerance", (0.05, 0.1, 0.2),
                                   lambda t: f"'56 billion' read as within {t:.0%}")


# C50 -------------------------------------------------------------------------------------------
DISPATCH = ("routed", "every expert")


def c50_evidence(model: str = "mixtral-8x7b", seq_len: int = 4096,
                 precision: str = "bf16-mixed", dispatch: str = "routed") -> dict:
    """An MoE step's states and FLOPs, traced, beside the dense model of its active size (chapter: 9).

    The MoE step is traced on fake tensors with PyTorch's memory tracker and FLOP counter, one
    sequence of ``seq_len`` tokens; the dense step's FLOPs are counted from its shapes
    (:func:`memlab.compute.flops.step_flops`, equal to the counter in the tests). The dense model has the same attention and one SwiGLU MLP as
    wide as the experts a token passes through (top-k experts and the shared one), so its
    parameters are the MoE's active ones less the router. ``dispatch="every expert"``: an
    implementation that runs every expert on every token and zeroes the weights of the experts
    not chosen (counted as the same block with top-k = E).
    """
    from memlab.compute.flops import step_flops
    from memlab.errors import check_choice
    from memlab.measure.step import trace_step
    from memlab.memory.activations import PARAM_BYTES

    check_choice("dispatch", dispatch, DISPATCH)
    cfg = get_config(model)
    m = cfg.moe
    run = cfg if dispatch == "routed" else replace(cfg, moe=replace(m, top_k=m.experts,
                                                                    capacity_factor=None))
    dense = replace(cfg, moe=None, d_ff=m.top_k * m.d_ff + m.shared_d_ff,
                    name=f"dense, {cfg.active_parameters() / B:.1f}B")
    moe_t = trace_step(run, batch_size=1, seq_len=seq_len, precision=precision, count_flops=True)
    step = dict(batch_size=1, seq_len=seq_len, precision=precision)
    states = moe_t.parameters_bytes + moe_t.gradients_bytes + moe_t.optimizer_states_bytes
    per_param = PARAM_BYTES[precision] * 4  # weights, gradients, AdamW's two moments
    return dict(model=model, precision=precision, seq_len=seq_len, dispatch=dispatch,
                parameters=cfg.num_parameters(), active_parameters=cfg.active_parameters(),
                dense_parameters=dense.num_parameters(), model_states_bytes=states,
                bytes_per_parameter=per_param, flops=moe_t.flops,
                formula_flops=step_flops(run, **step).total,
                dense_flops=step_flops(dense, **step).total,
                peak_bytes=moe_t.peak_bytes, phase_peak_bytes=moe_t.phase_peak_bytes,
                memory_tolerance=0.01, compute_tolerance=0.1)


def _c50(ev: dict) -> claims.Verdict:
    n, a = ev["parameters"], ev["active_parameters"]
    held = ev["model_states_bytes"] / ev["bytes_per_parameter"]
    ratio = ev["flops"] / ev["dense_flops"]
    text = (f"{ev['model']}, one {ev['seq_len']:,}-token sequence, {ev['precision']}, AdamW, "
            f"experts {'routed' if ev['dispatch'] == 'routed' else 'run on every token'} (traced): "
            f"weights, gradients and moments hold {ev['model_states_bytes'] / 2**30:.1f} GiB, "
            f"{held / n:.3f} x {ev['bytes_per_parameter']} bytes for each of its {n / B:.1f} "
            f"billion parameters ({held / a:.2f} x the {a / B:.1f} billion active ones); the "
            f"step counts {ev['flops'] / ev['seq_len'] / B:.0f} GFLOP per token, {ratio:.3f} x "
            f"the dense model of {ev['dense_parameters'] / B:.1f} billion parameters")
    parts = [
        claims.Part("needs the memory of all its parameters",
                    abs(held / n - 1) <= ev["memory_tolerance"],
                    f"its model states hold {held / n:.2f} x the bytes of all its parameters"),
        claims.Part("but the compute of only its active ones",
                    abs(ratio - 1) <= ev["compute_tolerance"],
                    f"the step runs {ratio:.2f} x the FLOPs of a dense model of its active size: "
                    "every expert computes every token, so compute follows all the parameters"),
    ]
    return claims.judge_parts("", parts, text)


@claims.register("C50", _CH9, "A mixture-of-experts model needs the memory of all its parameters "
                 "but the compute of only its active ones.", evidence=c50_evidence, moves=[
                     claims.Move("an implementation that runs every expert on every token and "
                                 "zeroes the weights of the experts not chosen",
                                 {"dispatch": "every expert"}, claims.WRONG, slow=True)])
def c50(ev: dict) -> claims.Verdict:
    """Wrong if the model states differ from all parameters' bytes by 1%, or the FLOPs by 10%.

    The FLOPs are held to those of the dense model whose parameters are the active ones.
    """
    return claims.with_sensitivity(_c50, ev, "compute_tolerance", (0.02, 0.05, 0.25),
                                   lambda t: f"'the compute of only its active ones' within {t:.0%}")


# C51 -------------------------------------------------------------------------------------------
def c51_evidence(model: str = "mixtral-8x7b", ranks: int = 8, tokens: int = 4096,
                 precision: str = "bf16-mixed") -> dict:
    """One rank's model states under expert parallelism, traced, beside its share (chapter: 9).

    Rank 0 of ``ranks`` is traced over a fake process group (its collectives return at once)
    with the per-rank formula beside it; the whole model's states, divided by the ranks, are
    its share. The run of expert parallelism launched over gloo on this machine (chapter 9's
    ``expert-parallel`` experiment) gives each rank's measured bytes against the formula.
    """
    from memlab.memory.activations import PARAM_BYTES
    from memlab.moe.ep_run import expert_parallel_bytes, moe_config, trace_expert_parallel
    from memlab.moe.experiments import expert_parallel_experiment

    cfg = moe_config(model)
    pb = PARAM_BYTES[precision]
    traced = trace_expert_parallel(cfg, ranks, batch_size=1, seq_len=tokens, precision=precision)
    f = expert_parallel_bytes(cfg, ranks, tokens=tokens, param_bytes=pb)
    states = traced.parameters_bytes + traced.gradients_bytes + traced.optimizer_states_bytes
    run = expert_parallel_experiment()
    measured = [dict(rank=r["rank"], measured=sum(v for k, v in r["state_bytes"].items()
                                                  if k != "offloaded"),
                     formula=sum(r["formula"].values())) for r in run.ranks]
    return dict(model=model, ranks=ranks, tokens=tokens, precision=precision,
                experts=cfg.moe.experts, experts_per_rank=f.experts_per_rank,
                parameters=cfg.num_parameters(), replicated_parameters=f.replicated_parameters,
                rank_parameters=f.replicated_parameters + f.expert_parameters,
                traced_states_bytes=states, formula_states_bytes=f.model_states_bytes,
                whole_states_bytes=4 * pb * cfg.num_parameters(),
                run=dict(world=run.world, backend=run.backend, ranks=measured),
                share_tolerance=0.1)


def _c51(ev: dict) -> claims.Verdict:
    n, N = ev["parameters"], ev["ranks"]
    share = ev["whole_states_bytes"] / N
    over = ev["traced_states_bytes"] / share
    spread = (ev["experts_per_rank"] * N == ev["experts"]
              and all(r["measured"] == r["formula"] for r in ev["run"]["ranks"])
              and abs(ev["traced_states_bytes"] / ev["formula_states_bytes"] - 1) <= 0.01)
    run = ev["run"]
    text = (f"{ev['model']} over {N} ranks, {ev['precision']}, AdamW (rank 0 traced): "
            f"{ev['experts_per_rank']} of {ev['experts']} experts per rank; its weights, "
            f"gradients and moments hold {ev['traced_states_bytes'] / 2**30:.1f} GiB (the formula "
            f"{ev['formula_states_bytes'] / 2**30:.1f}), {over:.2f} x its share "
            f"({share / 2**30:.1f} GiB = all of them over {N}); launched on {run['world']} "
            f"{run['backend']} ranks, each rank's bytes equal the formula: "
            f"{all(r['measured'] == r['formula'] for r in run['ranks'])}")
    parts = [
        claims.Part("expert parallelism spreads the experts over GPUs", spread,
                    "a rank's experts or bytes differ from E/N experts and the formula"),
        claims.Part("each GPU holds only its share of the model",
                    over <= 1 + ev["share_tolerance"],
                    f"each rank also holds everything but the routed experts (attention, "
                    f"router, norms, embeddings: {ev['replicated_parameters'] / B:.2f} billion "
                    f"parameters), so it holds {ev['rank_parameters'] / B:.2f} billion, "
                    f"{over:.2f} x its share of {n / N / B:.2f} billion; sharding that part too "
                    "(ZeRO or FSDP over the same ranks) brings it to its share"),
    ]
    return claims.judge_parts("", parts, text)


@claims.register("C51", _CH9, "Expert parallelism spreads the experts over GPUs, so each GPU "
                 "holds only its share of the model.", evidence=c51_evidence, moves=[
                     claims.Move("Mixtral 8x7B's experts over 2 ranks instead of 8",
                                 {"ranks": 2}, claims.HOLDS)])
def c51(ev: dict) -> claims.Verdict:
    """Wrong if a rank's model states exceed 1/N of the whole model's by more than 10%."""
    return claims.with_sensitivity(_c51, ev, "share_tolerance", (0.05, 0.25, 0.5),
                                   lambda t: f"'only its share' within {t:.0%}")
