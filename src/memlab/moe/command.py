"""``memlab estimate`` and ``memlab trace`` on a mixture of experts, with ``--expert-parallel N``
(chapter: 9).

The command line (:mod:`memlab.cli`) hands a step here when its model has experts or
``--expert-parallel`` is given. The estimate is :func:`memlab.moe.estimate.estimate_moe`, the
trace :func:`memlab.measure.trace_step` (one process) or
:func:`memlab.moe.ep_run.trace_expert_parallel` (one rank of N). The levers these do not model
with experts are refused in one line each.
"""

from __future__ import annotations

import json
import math

from memlab.errors import MemlabError
from memlab.model.config import ModelConfig, get_config

# flag -> (argparse attribute, its value when not given): what an MoE step does not model
NOT_MODELLED = {
    "--lora-rank": ("lora_rank", None), "--lora-alpha": ("lora_alpha", None),
    "--lora-targets": ("lora_targets", None), "--freeze": ("freeze", None),
    "--quantize-base": ("quantize_base", None), "--zero-stage": ("zero_stage", None),
    "--gpus": ("gpus", None), "--offload": ("offload", None), "--layout": ("layout", None),
    "--context-parallel": ("context_parallel", 1), "--inference": ("inference", False),
    "--new-tokens": ("new_tokens", None), "--kv-precision": ("kv_precision", None),
    "--loss-chunks": ("loss_chunks", 1), "--offload-activations": ("offload_activations", False),
}
ACCEPTED = ("--batch-size, --seq-len, --precision, --optimizer, --optimizer-impl, "
            "--attention, --checkpointing (full), --grad-accum, --expert-parallel, --device, "
            "--json")


def check_moe_flags(args, cfg: ModelConfig) -> int:
    """The expert-parallel degree of a step's flags; one line for a lever not modelled (chapter: 9)."""
    from memlab.moe.expert_parallel import check_expert_parallel

    ranks = getattr(args, "expert_parallel", None)
    if cfg.moe is None:
        raise MemlabError(f"--expert-parallel needs a model with experts; {cfg.name!r} is dense "
                          f"(accepted: an MoE preset such as mixtral-8x7b, or a mixtral or "
                          f"qwen2_moe config.json)")
    for flag, (attr, unset) in NOT_MODELLED.items():
        if getattr(args, attr, unset) != unset:
            raise MemlabError(f"{flag} is not modelled for a mixture of experts ({cfg.name!r}); "
                              f"accepted with experts: {ACCEPTED}")
    if args.checkpointing not in (False, True, "full"):
        raise MemlabError(f"--checkpointing of a mixture of experts is modelled for full "
                          f"checkpointing only (--checkpointing or --checkpointing full), got "
                          f"{args.checkpointing!r}")
    ranks = 1 if ranks is None else ranks
    check_expert_parallel(cfg.moe.experts, ranks)
    return ranks


def step_json(result, mode: str, spec, args) -> dict:
    """An MoE step's estimate or trace as JSON: its fields, conventions and FLOPs (chapter: 9).

    The FLOPs count the rows the experts run (the active ones): counted on the trace, or
    :func:`memlab.compute.flops.step_flops` from the shapes, balanced routing.
    """
    d = result.as_dict()
    if mode == "estimate":
        from memlab.compute.flops import ATTENTION_BACKWARD, step_flops

        if spec.attention not in ATTENTION_BACKWARD:  # the book's FlashAttention: a trace counts
            return {"mode": "estimated", "conventions": args.device} | d
        f = step_flops(spec)
        return {"mode": "estimated", "conventions": args.device} | d | dict(
            flops=f.total, flops_by_phase=dict(forward=f.forward, backward=f.backward,
                                               optimizer=0),
            flops_source="estimated from the shapes (memlab.compute.flops.step_flops)")
    return d | dict(conventions="cpu", flops=result.flops, flops_by_phase=result.flops_by_phase,
                    flops_source="counted (torch.utils.flop_counter.FlopCounterMode)")


def moe_step(args, mode: str) -> int | None:
    """Run ``memlab estimate``/``trace`` for an MoE model, or None for a dense one (chapter: 9)."""
    from memlab.model.step import StepSpec

    ranks = getattr(args, "expert_parallel", None)
    cfg = get_config(args.model)
    if cfg.moe is None and ranks is None:
        return None
    ranks = check_moe_flags(args, cfg)
    if args.attention is not None:
        cfg = get_config(args.model, attention=args.attention)
    spec = StepSpec(cfg, batch_size=args.batch_size, seq_len=args.seq_len,
                    precision=args.precision or "fp32", optimizer=args.optimizer or "adamw",
                    optimizer_impl=args.optimizer_impl or "foreach",
                    checkpointing=args.checkpointing, grad_accum_steps=args.grad_accum)
    switches = {k: v for k, v in spec.as_dict().items() if k in (
        "precision", "optimizer", "optimizer_impl", "checkpointing", "grad_accum_steps")}
    if mode == "trace":
        from memlab.measure.step import trace_step
        from memlab.moe.ep_run import trace_expert_parallel

        result = (trace_step(spec, count_flops=True) if ranks == 1 else trace_expert_parallel(
            cfg, ranks, batch_size=spec.batch_size, seq_len=spec.seq_len, count_flops=True,
            attention=args.attention, **switches))
    else:
        from memlab.moe.estimate import estimate_moe

        result = estimate_moe(cfg, batch_size=spec.batch_size, seq_len=spec.seq_len,
                              device=args.device, expert_parallel=ranks, **switches)
    from memlab.moe.ep_run import all_to_all_step_bytes

    sent = all_to_all_step_bytes(cfg, ranks, tokens=spec.batch_size * spec.seq_len,
                                 precision=spec.precision, checkpointing=bool(spec.checkpointing),
                                 grad_accum_steps=spec.grad_accum_steps)
    from memlab.moe.estimate import rank_shapes

    rank_parameters = sum(math.prod(t) * k for t, k in rank_shapes(cfg, ranks))
    extra = dict(parameters=rank_parameters, total_parameters=cfg.num_parameters(), active_parameters=cfg.active_parameters(),
                 rank_parameters=rank_parameters, expert_parallel=ranks,
                 experts_per_rank=cfg.moe.experts // ranks, all_to_all_bytes_per_step=sent)
    if args.json:
        print(json.dumps(step_json(result, mode, spec, args) | extra))
        return 0
    from memlab.units import fmt_bytes

    print(result.table())
    print(f"parameters: {cfg.num_parameters():,} in all, {cfg.active_parameters():,} active per "
          f"token ({cfg.moe.top_k} of {cfg.moe.experts} experts)")
    if ranks > 1:
        local = cfg.moe.experts // ranks
        print(f"expert parallelism over {ranks} ranks: {local} expert{'s' if local > 1 else ''} "
              f"per block on this rank ({rank_parameters:,} parameters); all-to-all per step: "
              f"{fmt_bytes(sent)} ({sent:,} bytes) sent to the other ranks")
    return 0


def moe_plan(args, int_list) -> int | None:
    """Run ``memlab plan`` for an MoE model, or None for a dense one (chapter: 9).

    Full training only: LoRA and QLoRA of experts are not modelled, so the default
    ``--trains`` drops them with a line saying so, and asking for them alone is refused.
    """
    from memlab.compute.plan import GPU_COUNTS
    from memlab.moe.plan import plan_moe

    cfg = get_config(args.model)
    if cfg.moe is None:
        return None
    trains = [t.strip() for t in args.trains.split(",") if t.strip()]
    if "full" not in trains:
        raise MemlabError(f"--trains {args.trains!r}: a mixture of experts is planned for full "
                          f"training only (LoRA and QLoRA of experts are not modelled); "
                          f"accepted: full")
    others = [t for t in trains if t != "full"]
    dropped = (f"left out: {', '.join(others)} (adapters on experts are not modelled); full "
               f"training only, ZeRO stage 0, expert parallelism" if others else "")
    if isinstance(args.limit, int) and args.limit < 0:
        raise MemlabError(f"--limit must be 0 (all) or a positive number of rows, got {args.limit}")
    plan = plan_moe(cfg, args.gpu, global_batch=args.global_batch, seq_len=args.seq_len,
                    gpu_counts=GPU_COUNTS if args.gpus is None else int_list("--gpus", args.gpus),
                    mfu=args.mfu, dropped=dropped,
                    optimizers=tuple(o.strip() for o in args.optimizers.split(",") if o.strip()))
    if args.json:
        print(json.dumps(plan.as_dict()))
    else:
        print(plan.table(limit=args.limit or None))
        print(plan.reading())
    return 0
