"""Execute notebooks in place at CI scale, so their committed outputs are fresh.

    python scripts/run_notebooks.py chapters/00_toolkit.ipynb labs/lab00_measure_step.ipynb

nbval compares the cells tagged ``nbval-check-output`` against these stored outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = p.parse_args(argv)
    os.environ.setdefault("MEMLAB_SCALE", "ci")
    for path in args.notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"run_notebooks: error: {path} is not a notebook", file=sys.stderr)
            return 2
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(path.parent)}}).execute()
        nbformat.write(nb, path)
        print(f"executed {path} in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
