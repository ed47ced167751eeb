"""Command line: ``python -m memlab`` (or ``memlab``).

    memlab env                                   print the environment report
    memlab list                                  list the experiments
    memlab run <experiment> [--scale ci|full] [--out results/] [--json]

Bad input prints one line, ``memlab: error: …`` naming the accepted values, and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from memlab.errors import MemlabError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the accepted values, exit code 2."""

    def error(self, message: str):  # pragma: no cover - exercised through main()
        raise MemlabError(message)


def _build_parser() -> argparse.ArgumentParser:
    from memlab.device import SCALES
    from memlab.experiments import EXPERIMENTS

    p = _Parser(prog="memlab", description="Measure the memory of LLM training steps.")
    sub = p.add_subparsers(dest="command", metavar="{env,list,run}", parser_class=_Parser)
    sub.add_parser("env", help="print the device, versions and scale")
    sub.add_parser("list", help="list the experiments")
    run = sub.add_parser("run", help="run an experiment and store its record")
    run.add_argument("experiment", nargs="?", help=f"one of: {', '.join(sorted(EXPERIMENTS))}")
    run.add_argument("--scale", default=None, help=f"one of: {', '.join(SCALES)} (default: by device)")
    run.add_argument("--out", default=None, help="folder to write the JSON record to (e.g. results/)")
    run.add_argument("--json", action="store_true", help="print the record as JSON")
    return p


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
    from memlab.experiments import EXPERIMENTS, get_experiment, run_experiment

    if args.experiment is None:
        raise MemlabError(f"run needs an experiment; accepted: {', '.join(sorted(EXPERIMENTS))}")
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
            return 0
        if args.command == "list":
            from memlab.experiments import EXPERIMENTS

            width = max(len(n) for n in EXPERIMENTS)
            for name in sorted(EXPERIMENTS):
                print(f"{name:<{width}}  {EXPERIMENTS[name].summary}")
            return 0
        if args.command == "run":
            return _cmd_run(args, argv)
        _build_parser().print_help()
        return 0
    except MemlabError as exc:
        print(f"memlab: error: {exc}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:  # pragma: no cover
        print(f"memlab: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
