"""Command line: ``python -m memlab`` (or ``memlab``).

    memlab env                                   print the environment report
    memlab list                                  list the experiments
    memlab run <experiment> [--scale ci|full] [--out results/] [--json]
    memlab estimate --model <preset|config.json> --batch-size B --seq-len S [options] [--json]
    memlab estimate --inference --model M --batch-size B --seq-len S [--new-tokens N]
                    [--precision P] [--kv-precision P] [--json]   generation with a KV cache
    memlab estimate ... --gpus N [--zero-stage 0-3] [--offload none|optimizer|params]
                                                 one of N data-parallel GPUs (ZeRO, FSDP)
    memlab estimate --model <MoE> ... [--expert-parallel N]   one of N expert-parallel ranks
    memlab estimate --from-config <axolotl.yml|training_args.json> [flags that override it]
    memlab trace    (the same options)           measure under FakeTensorMode instead
    memlab bits <value> [--format <fmt>] [--json] how a value is stored (all formats by default)
    memlab record --budget S --out DIR [--device cuda|cpu] [--scale full|ci] [--only A,B]
                  [--skip-recorded] [--archive FILE] [--dry-run] [--json]
                                                 one pass over every experiment this device
                                                 measures, a process each, within S seconds
    memlab check-records [DIR] [--label]         every record held to the registry and its code
    memlab unpack-records ARCHIVE [--results DIR] a pass's records copied into results/

Bad input prints one line, ``memlab: error: …`` naming the accepted values, and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from pathlib import Path

from memlab.errors import MemlabError, check_choice


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the accepted values, exit code 2."""

    def error(self, message: str):  # pragma: no cover - exercised through main()
        raise MemlabError(message)


def _build_parser() -> argparse.ArgumentParser:
    from memlab.device import SCALES

    p = _Parser(prog="memlab", description="Measure the memory of LLM training steps.")
    sub = p.add_subparsers(dest="command", metavar="{env,list,run,estimate,trace,plan,bits,"
                                                    "record,check-records,unpack-records}",
                           parser_class=_Parser)
    env = sub.add_parser("env", help="print the device, versions and scale")
    env.add_argument("--packages", action="store_true",
                     help="also the versions a record stores, bitsandbytes' native library, "
                          "and the code's commit and source hash")
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run an experiment and store its record")
    run.add_argument("experiment", nargs="?", help="an experiment's name (memlab list names them)")
    run.add_argument("--scale", default=None, help=f"one of: {', '.join(SCALES)} (default: by device)")
    run.add_argument("--out", default=None, help="folder to write the JSON record to (e.g. results/)")
    run.add_argument("--json", action="store_true", help="print the record as JSON")
    for name, helptext in (("estimate", "estimate a step's memory from formulas"),
                           ("trace", "count a step's memory under FakeTensorMode")):
        _step_options(sub.add_parser(name, help=helptext), estimate=name == "estimate")
    _plan_options(sub.add_parser("plan", help="list the training set-ups that fit a GPU, "
                                              "cheapest first"))
    _bits_options(sub.add_parser("bits", help="show the bits and stored value of a number"))
    _record_options(sub.add_parser("record", help="record every experiment this device "
                                                  "measures, one process each, within a budget"))
    check = sub.add_parser("check-records", help="check stored records against the registry, "
                                                 "their hashes and the code they name")
    check.add_argument("folder", nargs="?", default=None, help="a folder of records (default: "
                                                               "results/)")
    check.add_argument("--label", action="store_true",
                       help="write into each record what it lacks, so its page says so")
    unpack = sub.add_parser("unpack-records", help="copy the records of a pass's archive into "
                                                   "results/")
    unpack.add_argument("archive", help="the archive a pass wrote (record-pass.tar.gz)")
    unpack.add_argument("--results", default=None, help="where to (default: results/)")
    return p


def _print_packages() -> None:
    """``memlab env --packages``: what a record's provenance will say.

    It also says whether bitsandbytes can run here.
    """
    from memlab.results import code_provenance

    prov = code_provenance()
    for name, version in prov["packages"].items():
        print(f"  {name:<13} {version or ('none' if name == 'cuda' else 'not installed')}")
    print(f"  {'bitsandbytes':<13} native library: {_bnb_library()}")
    print(f"  {'memlab':<13} {prov['memlab_version']}, commit {prov['git_commit'] or 'unknown'}"
          f"{' (dirty)' if prov['git_dirty'] else ''}, source {prov['source_sha256'][:16]}")


def _bnb_library() -> str:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return "none (bitsandbytes is not installed)"
    try:
        from bitsandbytes import cextension
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
        return f"fails to import: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    lib = getattr(cextension, "lib", None)
    if lib is None or type(lib).__name__ == "ErrorHandlerMockBNBNativeLibrary":
        return "not loaded (its kernels will fail)"
    return str(getattr(lib, "_name", None) or getattr(getattr(lib, "compiled_with_cuda", None),
                                                       "__name__", "loaded"))


def _record_options(p: argparse.ArgumentParser) -> None:
    from memlab.device import SCALES
    from memlab.record import PASS_DEVICES

    p.add_argument("--budget", type=float, required=True,
                   help="seconds the whole pass may take; it stops itself there")
    p.add_argument("--out", default=None, help="folder for the records, logs, summary and "
                                               "archive (needed unless --dry-run)")
    p.add_argument("--device", default=None,
                   help=f"one of: {', '.join(PASS_DEVICES)} (default: cuda where torch sees "
                        "a GPU, else cpu)")
    p.add_argument("--scale", default="full", help=f"one of: {', '.join(SCALES)} (default full)")
    p.add_argument("--only", default=None, help="comma-separated experiments (default: all "
                                                "this device measures)")
    p.add_argument("--skip-recorded", action="store_true",
                   help="leave out experiments with a record on this kind of device at this "
                        "scale (in --out or results/)")
    p.add_argument("--archive", default=None, help="the archive's path (default: "
                                                   "OUT/record-pass.tar.gz)")
    p.add_argument("--archive-limit", type=int, default=None, metavar="BYTES",
                   help="keep the archive under this size, leaving out snapshots, then logs")
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")


def _cmd_record(args, argv: list[str]) -> int:
    """``memlab record``: plan a pass, print it, and run it unless --dry-run."""
    from memlab.record import PASS_DEVICES, check_cuda_pass, plan_pass, run_pass, summary_table

    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_choice("device", device, PASS_DEVICES)
    if not args.dry_run and args.out is None:
        raise MemlabError("record needs --out DIR (or --dry-run to print the plan)")
    if not args.dry_run and device == "cuda":
        check_cuda_pass()
    if args.out is not None:
        _writable_folder(args.out)
    plan = plan_pass(device=device, budget_s=args.budget, scale=args.scale.strip().lower(),
                     only=args.only, skip_recorded=args.skip_recorded, out=args.out)
    if args.dry_run:
        print(json.dumps(plan.as_dict()) if args.json else plan.table())
        return 0
    print(plan.table(), flush=True)
    command = "python -m memlab " + " ".join(shlex.quote(a) for a in argv)
    if args.archive_limit is not None and args.archive_limit <= 0:
        raise MemlabError(f"--archive-limit must be a positive number of bytes, got "
                          f"{args.archive_limit}")
    rows = run_pass(plan, args.out, archive=args.archive, command=command,
                    archive_limit=args.archive_limit)
    print(summary_table(rows))
    return 0


def _cmd_check_records(args) -> int:
    """``memlab check-records``: one line per record with a problem; exit 1 if any."""
    from memlab.record_check import check_records, label_record
    from memlab.results import results_dir

    folder = Path(args.folder) if args.folder else results_dir()
    checks = check_records(folder)
    if args.label:
        checks = [label_record(folder / c.path) if not c.ok else c for c in checks]
    bad = [c for c in checks if not c.ok]
    for c in bad:
        print(c.line(), file=sys.stderr)
    labelled = sum(bool(c.labelled) for c in checks if c.ok)
    print(f"{len(checks) - len(bad)} of {len(checks)} records in {folder} check out"
          + (f" ({labelled} labelled with what they lack)" if labelled else ""))
    return 1 if bad else 0


def _cmd_unpack(args) -> int:
    from memlab.record import unpack_archive
    from memlab.results import results_dir

    written = unpack_archive(args.archive, args.results or results_dir())
    for path in written:
        print(f"wrote {path}")
    if not written:
        print(f"{args.archive} holds no records")
    return 0


_FROM_CONFIG = ("an axolotl YAML or a TrainingArguments JSON to read the settings from (flags "
                "override it; memlab.fromconfig)")


def _plan_options(p: argparse.ArgumentParser) -> None:
    from memlab.gpus import GPU_NAMES

    p.add_argument("--model", help="a preset or a path to a Hugging Face config.json")
    p.add_argument("--gpu", required=True, help=f"one of: {', '.join(GPU_NAMES)} (any case)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step, over all GPUs "
                   "(with --from-config: micro-batch x accumulation x --gpus N by default)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--from-config", metavar="FILE", help=_FROM_CONFIG)
    p.add_argument("--trains", default="full,lora,qlora",
                   help="comma-separated: full, lora, qlora (default: all three)")
    p.add_argument("--gpus", default=None,
                   help="comma-separated GPU counts to try (default: powers of two up to 1024)")
    p.add_argument("--optimizers", default="adamw",
                   help="comma-separated optimizers full training may use: adamw (default), "
                        "adam, adamw-8bit, adamw-bf16-moments, adafactor")
    p.add_argument("--mfu", type=float, default=0.4,
                   help="assumed model FLOPs utilisation for the time estimate (default 0.4)")
    p.add_argument("--host-link", default="pcie4-x16",
                   help="the GPU-host link offload uses: pcie4-x16 (default), pcie5-x16, nvlink-c2c")
    p.add_argument("--limit", type=int, default=15, help="rows to print (default 15; 0: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise MemlabError(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def _cmd_plan(args) -> int:
    """``memlab plan``: every set-up that fits the GPU, cheapest first."""
    from memlab.compute.plan import GPU_COUNTS, plan_training
    from memlab.model.config import get_config
    from memlab.moe.command import moe_plan

    if (done := moe_plan(args, _int_list)) is not None:  # a mixture of experts (chapter 9)
        return done

    trains = tuple(t.strip() for t in args.trains.split(",") if t.strip())
    counts = GPU_COUNTS if args.gpus is None else _int_list("--gpus", args.gpus)
    if isinstance(args.limit, int) and args.limit < 0:
        raise MemlabError(f"--limit must be 0 (all) or a positive number of rows, got {args.limit}")
    plan = plan_training(get_config(args.model), args.gpu, global_batch=args.global_batch,
                         seq_len=args.seq_len, trains=trains, gpu_counts=counts, mfu=args.mfu,
                         host_link_name=args.host_link, optimizers=tuple(
                             o.strip() for o in args.optimizers.split(",") if o.strip()))
    if args.json:
        print(json.dumps(plan.as_dict()))
    else:
        print(plan.table(limit=args.limit or None))
    return 0


# Any float literal, so that ``memlab bits -1.5e-3`` or ``-inf`` is a value, not an option.
_FLOAT_LITERAL = r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$"


def _bits_options(p: argparse.ArgumentParser) -> None:
    import re

    from memlab.precision.formats import FORMATS

    p._negative_number_matcher = re.compile(_FLOAT_LITERAL, re.IGNORECASE)
    p.add_argument("value", help="a number: 3.14, -1e-3, inf, nan, -0.0")
    p.add_argument("--format", default=None,
                   help=f"one of: {', '.join(FORMATS)} (default: one line for each)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (a list of them without --format)")


def _cmd_bits(args) -> int:
    from memlab.precision.formats import FORMATS, bits

    if args.format is not None:
        pattern = bits(args.value, args.format)
        print(json.dumps(pattern.as_dict()) if args.json else pattern.line())
        return 0
    bits(args.value, "fp32")  # a non-number fails here, once
    rows = []
    for fmt in FORMATS:
        try:
            pattern = bits(args.value, fmt)
        except MemlabError as exc:  # out of range for an integer or code-book format
            rows.append((dict(fmt=fmt, sign=None, exponent=None, mantissa=None, bit_string=None,
                              value=None, input=None, error=None, note=str(exc)),
                         f"{fmt:<8}  -  ({exc})"))
        else:
            rows.append((pattern.as_dict(), pattern.line()))
    if args.json:
        print(json.dumps([d for d, _ in rows]))
    else:
        for _, line in rows:
            print(line)
    return 0


def _step_options(p: argparse.ArgumentParser, estimate: bool) -> None:
    from memlab.model.config import OPTIMIZER_IMPLS, OPTIMIZERS, PRECISIONS, PRESETS

    p.add_argument("--model", help=f"a preset ({', '.join(PRESETS)}) or a path to a Hugging Face "
                                   "config.json")
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--from-config", metavar="FILE", help=_FROM_CONFIG)
    p.add_argument("--precision", default=None,
                   help=f"one of: {', '.join(PRECISIONS)} (default fp32; bf16 with --inference)")
    p.add_argument("--optimizer", default=None,
                   help=f"one of: {', '.join(OPTIMIZERS)} (default adamw)")
    p.add_argument("--optimizer-impl", default=None,
                   help=f"one of: {', '.join(OPTIMIZER_IMPLS)} (default foreach)")
    p.add_argument("--attention", default=None,
                   help="sdpa (default), eager or flash (the book's own FlashAttention)")
    p.add_argument("--checkpointing", nargs="?", const=True, default=False, metavar="PLAN",
                   help="activation checkpointing; alone: full (every block); or a plan: full, "
                        "selective (the attention core only), every-K (every K-th block), "
                        "segments-K (K blocks per recomputed segment)")
    p.add_argument("--grad-accum", type=int, default=1, help="gradient accumulation steps")
    p.add_argument("--loss-chunks", type=int, default=1, metavar="K",
                   help="compute the LM head and the loss over K chunks of tokens, so the "
                        "(batch, seq, vocab) logits never exist whole (default 1: unchunked)")
    p.add_argument("--offload-activations", action="store_true",
                   help="keep what the blocks save for the backward pass in the host's memory "
                        "(with --checkpointing: each checkpointed unit's input)")
    p.add_argument("--expert-parallel", type=int, default=None, metavar="N",
                   help="an MoE model's step on one of N ranks, each holding experts/N experts "
                        "of every block, the rest replicated (N must divide the experts)")
    p.add_argument("--context-parallel", type=int, default=1, metavar="N",
                   help="one rank's bytes when N ranks each hold seq-len/N tokens and attention "
                        "runs as a ring (zig-zag: 2N must divide --seq-len); model states are "
                        "replicated (default 1)")
    p.add_argument("--lora-rank", type=int, default=None,
                   help="fine-tune with LoRA adapters of this rank (the base frozen)")
    p.add_argument("--lora-alpha", type=float, default=None,
                   help="with --lora-rank: the scale alpha (default 16; the update is x alpha/r)")
    p.add_argument("--lora-targets", default=None,
                   help="with --lora-rank: comma-separated module names (default q_proj,v_proj), "
                        "or all-linear (every linear layer of the blocks)")
    p.add_argument("--freeze", type=int, default=None, metavar="K",
                   help="freeze everything but the last K blocks")
    p.add_argument("--quantize-base", default=None,
                   help="with --lora-rank: store the frozen base linears in nf4, nf4-dq, fp4 or "
                        "int8 (QLoRA); a 4-bit base runs on real tensors only")
    if estimate:
        p.add_argument("--device", default="cuda", help="cuda (default) or cpu conventions")
        p.add_argument("--inference", action="store_true",
                       help="generation with a KV cache instead of a training step: --seq-len "
                            "counts prompt and generated tokens")
        p.add_argument("--new-tokens", type=int, default=None,
                       help="with --inference: tokens generated, out of --seq-len (default 1)")
        p.add_argument("--kv-precision", default=None,
                       help="with --inference: the KV cache's dtype (default: --precision)")
        p.add_argument("--zero-stage", type=int, default=None,
                       help="data parallelism over --gpus GPUs with ZeRO stage 0 (DDP), 1, 2 or "
                            "3: estimate one GPU's memory")
        p.add_argument("--gpus", type=int, default=None,
                       help="the number of data-parallel GPUs (alone: stage 0, DDP)")
        p.add_argument("--offload", default=None,
                       help="with --zero-stage: none (default), optimizer (stage 1-3) or params "
                            "(stage 3): model states kept in CPU memory")
        p.add_argument("--layout", default=None,
                       help="bytes per parameter of (parameters, gradients, optimizer states): "
                            "the precision's own by default (fp32: 4+4+8, also under bf16-mixed "
                            "and fp16-mixed, as PyTorch trains; bf16: 2+2+4); mixed: the ZeRO "
                            "paper's 2+2+12 (a 16-bit working copy, an fp32 master), with "
                            "bf16-mixed or fp16-mixed")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _step_json(result, mode: str, spec) -> dict:
    """An estimate's or a trace's own fields (one vocabulary, memlab.model.step.STEP_BYTES), its
    conventions, and the step's FLOPs."""
    d = result.as_dict()
    if mode == "estimate":  # the estimate says whose conventions it follows; a trace is on CPU
        d = {"mode": "estimated", "conventions": result.setup["device"]} | d
    else:
        d |= {"conventions": "cpu", "parameters": result.setup["parameters"]}
    # the parameters one token passes through: all of a dense model's, k experts of an MoE's
    d["active_parameters"] = spec.config.active_parameters()
    return d | _flops_json(result, mode, spec)


def _flops_json(result, mode: str, spec) -> dict:
    """FLOPs of the step: counted by FlopCounterMode (trace), or from the shapes (estimate)."""
    if mode == "trace":
        return dict(flops=result.flops, flops_by_phase=result.flops_by_phase,
                    flops_source="counted (torch.utils.flop_counter.FlopCounterMode)")
    from memlab.compute.flops import ATTENTION_BACKWARD, step_flops

    if spec.attention not in ATTENTION_BACKWARD or spec.prepare is not None:
        return {}  # the book's FlashAttention and fine-tuning set-ups: counted by a trace only
    f = step_flops(spec)
    return dict(flops=f.total, flops_by_phase=dict(forward=f.forward, backward=f.backward,
                                                   optimizer=0),
                flops_source="estimated from the shapes (memlab.compute.flops.step_flops)")


# a training step's options, with their values when not given
_TRAINING_ONLY = (("optimizer", "--optimizer", None), ("optimizer_impl", "--optimizer-impl", None),
                  ("checkpointing", "--checkpointing", False), ("grad_accum", "--grad-accum", 1),
                  ("loss_chunks", "--loss-chunks", 1),
                  ("offload_activations", "--offload-activations", False))


def _cmd_inference(args) -> int:
    """``memlab estimate --inference``: weights, KV cache and peak of generation."""
    from memlab.memory.estimator import estimate_inference
    from memlab.model.config import get_config

    for attr, flag, unset in _TRAINING_ONLY:
        if getattr(args, attr) != unset:
            raise MemlabError(f"{flag} is for a training step, not with --inference; accepted "
                              "with --inference: --batch-size, --seq-len, --new-tokens, "
                              "--precision, --kv-precision, --json")
    new = 1 if args.new_tokens is None else args.new_tokens
    if isinstance(new, int) and new >= 1 and args.seq_len is not None and new >= args.seq_len:
        raise MemlabError(f"--new-tokens ({new}) must be below --seq-len ({args.seq_len}), which "
                          "counts the prompt and the generated tokens")
    cfg = get_config(args.model)
    if args.attention is not None:
        cfg = get_config(args.model, attention=args.attention)
    est = estimate_inference(cfg, args.batch_size, args.seq_len - new, args.precision or "bf16",
                             new, kv_precision=args.kv_precision)
    tokens = args.batch_size * args.seq_len
    if args.json:
        print(json.dumps({"mode": "estimated"} | est.as_dict()
                         | {"kv_cache_bytes_per_token": est.kv_cache_bytes // tokens}))
    else:
        print(est.table())
        print(f"KV cache per token: {est.kv_cache_bytes // tokens:,} bytes")
    return 0


def _cmd_step(args, mode: str) -> int:
    from memlab.measure.step import trace_step
    from memlab.memory.estimator import estimate
    from memlab.model.config import get_config
    from memlab.model.step import StepSpec
    from memlab.moe.command import moe_step

    if (done := moe_step(args, mode)) is not None:  # a mixture of experts (chapter 9)
        return done
    sharded = getattr(args, "zero_stage", None) is not None or getattr(args, "gpus", None) is not None
    layout = getattr(args, "layout", None)
    if args.context_parallel != 1:
        _check_context_parallel_flags(args, sharded or layout is not None
                                      or getattr(args, "offload", None) is not None)
    if layout is not None:
        from memlab.distributed.estimate import LAYOUT_OF, layout_of

        precision = args.precision or "fp32"
        if layout_of(precision, layout) != LAYOUT_OF[precision] and not sharded:
            # another layout than the one-GPU estimate's: one GPU of data parallelism
            args.zero_stage, args.gpus = 0, 1
            sharded = True
    if sharded or getattr(args, "offload", None) is not None:
        return _cmd_sharded(args)
    if getattr(args, "inference", False):
        return _cmd_inference(args)
    if getattr(args, "new_tokens", None) is not None or getattr(args, "kv_precision", None):
        raise MemlabError("--new-tokens and --kv-precision need --inference")
    cfg = get_config(args.model)
    prepare, trainable = _finetune_setup(args, cfg)
    spec = StepSpec(cfg, batch_size=args.batch_size, seq_len=args.seq_len,
                    precision=args.precision or "fp32", optimizer=args.optimizer or "adamw",
                    optimizer_impl=args.optimizer_impl or "foreach",
                    checkpointing=args.checkpointing, grad_accum_steps=args.grad_accum,
                    attention=args.attention, prepare=prepare, loss_chunks=args.loss_chunks,
                    offload_activations=args.offload_activations)
    if args.context_parallel != 1:
        from memlab.longcontext.context_parallel import trace_context_parallel

        result = (trace_context_parallel(cfg, seq_len=spec.seq_len, ranks=args.context_parallel,
                                         **{k: v for k, v in spec.as_dict().items() if k in (
                                             "precision", "optimizer", "optimizer_impl",
                                             "checkpointing", "grad_accum_steps", "attention",
                                             "loss_chunks")}, batch_size=spec.batch_size)
                  if mode == "trace" else
                  estimate(spec, device=args.device, context_parallel=args.context_parallel))
    elif mode == "trace":
        result = trace_step(spec, count_flops=True)
    elif prepare is None:  # a plain step: the plain estimator
        result = estimate(spec, device=args.device)
    else:  # a fine-tuning set-up (chapter 5)
        from memlab.finetune.estimate import estimate_finetune

        result = estimate_finetune(spec, device=args.device)
    if args.json:
        print(json.dumps(_step_json(result, mode, spec) | {"trainable_parameters": trainable}))
    else:
        print(result.table())
        print(f"trainable parameters: {trainable:,}")
        if spec.offload_activations:
            from memlab.units import fmt_bytes

            host = (result.offloaded["host_bytes"] if mode == "trace"
                    else result.setup["offloaded_bytes"])
            print(f"on the host after the forward pass: {fmt_bytes(host)} "
                  f"({host:,} bytes), copied there and back every step")
    return 0


def _check_context_parallel_flags(args, sharded: bool) -> None:
    """--context-parallel N: what it is not combined with, and the split it needs, in one line each."""
    from memlab.memory.context import check_context_parallel

    if getattr(args, "inference", False):
        raise MemlabError("--context-parallel estimates a training step: drop --inference")
    if sharded:
        raise MemlabError("--context-parallel replicates the model states on every rank: drop "
                          "--zero-stage, --gpus, --offload and --layout")
    if any(getattr(args, f) is not None for f in ("lora_rank", "freeze", "quantize_base")):
        raise MemlabError("--context-parallel estimates full training: drop --lora-rank, "
                          "--freeze and --quantize-base")
    if args.offload_activations:
        raise MemlabError("--context-parallel with --offload-activations is not modelled: drop "
                          "one of them")
    if args.checkpointing not in (False, True, "full"):
        raise MemlabError(f"--context-parallel works with no checkpointing or full "
                          f"(--checkpointing), got {args.checkpointing!r}")
    check_context_parallel(args.context_parallel, args.seq_len)


def _cmd_sharded(args) -> int:
    """``memlab estimate --zero-stage S --gpus N [--offload O]``: one GPU's memory under data parallelism."""
    from memlab.distributed.estimate import estimate_sharded
    from memlab.distributed.zero import check_gpus, check_offload, check_stage
    from memlab.memory.estimator import estimate
    from memlab.model.config import get_config
    from memlab.model.step import StepSpec

    flag = "--zero-stage" if args.zero_stage is not None else "--gpus"
    if args.zero_stage is None and args.gpus is None:
        raise MemlabError("--offload needs --zero-stage 1, 2 or 3 and --gpus N")
    if args.inference or args.new_tokens is not None or args.kv_precision is not None:
        raise MemlabError(f"{flag} models a data-parallel training step; sharded inference is "
                          "not modelled: drop --inference, --new-tokens, --kv-precision")
    finetune = [f for f, v in (("--lora-rank", args.lora_rank), ("--lora-alpha", args.lora_alpha),
                               ("--lora-targets", args.lora_targets), ("--freeze", args.freeze),
                               ("--quantize-base", args.quantize_base)) if v is not None]
    if finetune:
        raise MemlabError(f"{flag} with {finetune[0]}: sharding a fine-tuning set-up is not "
                          f"modelled; {flag} estimates a full training step")
    stage = 0 if args.zero_stage is None else check_stage(args.zero_stage)
    if args.gpus is None:
        raise MemlabError("--zero-stage needs --gpus N, the number of data-parallel GPUs")
    gpus = check_gpus(args.gpus)
    offload = check_offload("none" if args.offload is None else args.offload, stage)
    spec = StepSpec(get_config(args.model), batch_size=args.batch_size, seq_len=args.seq_len,
                    precision=args.precision or "fp32", optimizer=args.optimizer or "adamw",
                    optimizer_impl=args.optimizer_impl or "foreach",
                    checkpointing=args.checkpointing, grad_accum_steps=args.grad_accum,
                    attention=args.attention, loss_chunks=args.loss_chunks,
                    offload_activations=args.offload_activations)
    est = estimate_sharded(spec, zero_stage=stage, gpus=gpus, offload=offload, device=args.device,
                           layout=args.layout)
    if args.json:
        one_gpu = estimate(spec, device=args.device)
        print(json.dumps(_step_json(one_gpu, "estimate", spec) | dict(
            trainable_parameters=spec.config.num_parameters(), zero_stage=stage, gpus=gpus,
            offload=offload, layout=est.layout,
            per_gpu_model_state_bytes=est.per_gpu_model_state_bytes,
            per_gpu_peak_bytes=est.per_gpu_peak_bytes, per_gpu_peak_phase=est.peak_phase,
            cpu_offloaded_bytes=est.cpu_offloaded_bytes)))
    else:
        print(est.table())
    return 0


def _finetune_setup(args, cfg):
    """The set-up (a prepare hook) and the trainable-parameter count of the fine-tuning flags.

    The flags are --lora-rank, --freeze and --quantize-base.
    """
    lora_opts = {"--lora-alpha": args.lora_alpha, "--lora-targets": args.lora_targets,
                 "--quantize-base": args.quantize_base}
    if args.lora_rank is None:
        given = [k for k, v in lora_opts.items() if v is not None]
        if given:
            raise MemlabError(f"{given[0]} needs --lora-rank")
        if args.freeze is None:  # a plain step: every parameter trains
            return None, cfg.num_parameters()
    from memlab.finetune import LoraConfig, Setup, trainable_parameters
    from memlab.finetune.qlora import BASE_SCHEMES

    if args.lora_rank is None:
        if isinstance(args.freeze, int) and args.freeze <= 0:
            raise MemlabError(f"--freeze needs a positive number of blocks to keep trainable, "
                              f"got {args.freeze}")
        trainable = trainable_parameters(cfg, train_last=args.freeze)
        return Setup(f"freeze all but the last {args.freeze} blocks",
                     train_last=args.freeze), trainable
    if args.freeze is not None:
        raise MemlabError("choose --lora-rank or --freeze, not both")
    if args.lora_targets is not None and not args.lora_targets.strip():
        raise MemlabError("--lora-targets needs module names (q_proj,v_proj) or all-linear")
    lora = LoraConfig(r=args.lora_rank, alpha=16.0 if args.lora_alpha is None else args.lora_alpha,
                      target_modules=args.lora_targets or ("q_proj", "v_proj"),
                      dropout=getattr(args, "lora_dropout", 0.0))
    trainable = trainable_parameters(cfg, lora=lora)
    if args.quantize_base is not None:
        check_choice("base quantization", args.quantize_base, BASE_SCHEMES)
        return Setup(f"QLoRA r={lora.r}, base {args.quantize_base}", lora=lora,
                     quantize_base=args.quantize_base), trainable
    return Setup(f"LoRA r={lora.r} on {lora.target_modules}", lora=lora), trainable


def _writable_folder(out: str) -> str:
    """Create ``out`` if needed and check it can be written, before any experiment runs."""
    if not out.strip():
        raise MemlabError("--out needs a folder name, got ''")
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MemlabError(f"cannot create the --out folder {out!r}: {exc.strerror}") from None
    if not path.is_dir() or not os.access(path, os.W_OK):
        raise MemlabError(f"--out {out!r} is not a writable folder")
    return out


def _cmd_run(args, argv: list[str]) -> int:
    from memlab.device import get_scale
    from memlab.experiments import experiments, get_experiment, run_experiment

    if args.experiment is None:
        raise MemlabError(f"run needs an experiment; accepted: {', '.join(sorted(experiments()))}")
    get_experiment(args.experiment)  # validate before any work
    args.scale = get_scale(args.scale) if args.scale is not None else None
    if args.out is not None:
        _writable_folder(args.out)
    command = "python -m memlab " + " ".join(shlex.quote(a) for a in argv)
    result, record, path = run_experiment(args.experiment, args.scale, args.out, command=command)
    if args.json:
        print(record.to_json(), end="")
    else:
        table = getattr(result, "table", None)
        print(table() if callable(table) else result)
        print(f"\n{record.experiment} at scale {record.scale} on {record.provenance['device_name']}")
    if path is not None:
        print(f"wrote {os.path.relpath(path)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``memlab`` command; returns the exit code (chapter: all)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _build_parser().parse_args(argv)
        if args.command == "env":
            from memlab.device import env_report

            env_report()
            if args.packages:
                _print_packages()
            return 0
        if args.command == "list":
            from memlab.experiments import describe_sizes, experiments

            for name in sorted(experiments()):
                exp = experiments()[name]
                print(f"{name}: {exp.summary} ({exp.chapter}; needs {exp.needs}, about "
                      f"{exp.cost_s:.0f} s at full scale on a GPU, pass priority {exp.priority})")
                for scale, size in exp.sizes.items():
                    print(f"    {scale:<5} {describe_sizes(size)}")
            return 0
        if args.command == "run":
            return _cmd_run(args, argv)
        if args.command in ("estimate", "trace", "plan"):  # the settings --from-config FILE holds
            from memlab.fromconfig import settle_args, with_settings

            for line in settle_args(args, argv, args.command):
                print(f"memlab: {line}", file=sys.stderr)
            return with_settings(lambda: _cmd_plan(args) if args.command == "plan"
                                 else _cmd_step(args, args.command), args)
        if args.command == "bits":
            return _cmd_bits(args)
        if args.command == "record":
            return _cmd_record(args, argv)
        if args.command == "check-records":
            return _cmd_check_records(args)
        if args.command == "unpack-records":
            return _cmd_unpack(args)
        _build_parser().print_help()
        return 0
    except MemlabError as exc:
        print(f"memlab: error: {exc}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:  # pragma: no cover
        print(f"memlab: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """The reader of our output closed it (``memlab … | head``): stop quietly, as a pipe's writer does.

    Standard output is pointed at the null device, so that the flush at exit finds no closed
    pipe to complain about; the exit status is 0, since nothing went wrong on our side.
    """
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
