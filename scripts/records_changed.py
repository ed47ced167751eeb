"""Forget the cached executions of the notebooks that read recorded results, so the build runs them again.

    python scripts/records_changed.py [_build/.jupyter_cache] [NOTEBOOK_FOLDERS...]

jupyter-cache keys a notebook on its code cells, so a new record under ``results/`` would
re-execute nothing. The Makefile runs this when a record changes. A notebook reads records
when its code calls memlab's readers (``recorded(``, ``load_records(``, ``load_record(``),
shows claims (the claims modules read records), or runs a lab whose module reads them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READERS = ("recorded(", "load_records(", "load_record(", "memlab.claims")


def _code(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def reads_records(path: Path) -> bool:
    """Whether a notebook's code reads recorded results, directly or through its lab's module."""
    code = _code(path)
    if any(r in code for r in READERS):
        return True
    for lab in re.findall(r"get_lab\(\s*[\"'](lab\d+)[\"']", code) + \
            re.findall(r"memlab\.labs\.(lab\d+)", code):
        module = ROOT / "src" / "memlab" / "labs" / f"{lab}.py"
        if module.is_file() and any(r in module.read_text() for r in READERS):
            return True
    return False


def main(argv: list[str]) -> int:
    from jupyter_cache import get_cache

    folder = Path(argv[0]) if argv else ROOT / "_build" / ".jupyter_cache"
    dirs = [Path(a) for a in argv[1:]] or [ROOT / "chapters", ROOT / "labs" / "student",
                                           ROOT / "appendix"]  # the book runs a lab's student version
    readers = {p.resolve() for d in dirs for p in d.glob("*.ipynb") if reads_records(p)}
    if not folder.is_dir():
        print(f"records changed; no cache at {folder} yet, nothing to forget")
        return 0
    cache = get_cache(str(folder))
    forgotten = []
    for record in cache.list_cache_records():
        if Path(record.uri).resolve() in readers:
            cache.remove_cache(record.pk)
            forgotten.append(Path(record.uri).name)
    print("records changed; executed again: " + (", ".join(sorted(forgotten)) or "none cached"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
