"""Prepare the GPU call on this machine: what travels, the plan, and the exact call.

    python scripts/gpu_prepare.py [--budget 540] [--timeout 600]      (make gpu-prepare)

The GPU machine has its own python3 and torch and nothing else of ours: the working tree travels
(with PYTHONPATH=src, nothing is installed there), and so does ``.gpu/`` (ignored by git):

* ``.gpu/site/``: bitsandbytes pruned from this virtual environment: its Python package, its
  CUDA 13.0 library and the 13.2 one as a spare, the CPU one, and its dist-info (about 10 MB;
  the wheel, with every CUDA build, is too large to carry). bitsandbytes loads its CUDA
  library through ctypes, so no build is needed there;
* ``.gpu/source.env``: the commit this tree is at and whether it is dirty, which the records
  made there carry in their provenance (the copy sent has no .git).

It then prints the pass's plan for a GPU and the budget, and the call to make.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / ".gpu"
CUDA_LIBS = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cuda132.so", "libbitsandbytes_cpu.so")
MARGIN_S = 60  # between the script's budget and the call's timeout


def prune_bitsandbytes(site: Path) -> int:
    """Copy bitsandbytes without the CUDA builds the GPU machine does not load; bytes copied."""
    dist = distribution("bitsandbytes")
    package = Path(dist.locate_file("bitsandbytes"))
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    shutil.copytree(package, site / "bitsandbytes", ignore=lambda d, names: [
        n for n in names if (n.endswith(".so") and n not in CUDA_LIBS) or n == "__pycache__"])
    info = Path(dist._path)  # the dist-info folder: its version, for the records' provenance
    shutil.copytree(info, site / info.name)
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file())


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=int, default=540, help="seconds the GPU script may take")
    p.add_argument("--timeout", type=int, default=600, help="the call's timeout, seconds")
    args = p.parse_args(argv)
    if args.timeout - args.budget < MARGIN_S:
        print(f"gpu_prepare: error: --budget {args.budget} leaves the {args.timeout} s timeout "
              f"less than {MARGIN_S} s of margin", file=sys.stderr)
        return 2
    size = prune_bitsandbytes(GPU_DIR / "site")
    dirty = "1" if git("status", "--porcelain", "--untracked-files=no") else "0"
    (GPU_DIR / "source.env").write_text(f"MEMLAB_GIT_COMMIT={git('rev-parse', 'HEAD')}\n"
                                        f"MEMLAB_GIT_DIRTY={dirty}\n")
    print(f"wrote .gpu/site (bitsandbytes, {size / 2**20:.1f} MiB) and .gpu/source.env"
          + ("  -- the tree is dirty: commit first, so the records name their code" if dirty == "1"
             else ""))
    share = 0.65  # scripts/gpu_pass.sh: MEMLAB_RECORD_SHARE
    subprocess.run([sys.executable, "-m", "memlab", "record", "--dry-run", "--device", "cuda",
                    "--skip-recorded", "--budget", str(int(args.budget * share))], cwd=ROOT,
                   check=True)
    print("\nthe call, from the repository's root on the GPU machine (carry .gpu):\n"
          f"    bash scripts/gpu_pass.sh {args.budget} $OUT      (timeout {args.timeout} s)\n"
          "then, here:\n"
          "    make gpu-unpack ARCHIVE=<folder with gpu-pass.tar.gz and notebooks.json>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
