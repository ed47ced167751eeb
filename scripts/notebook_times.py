"""Print how long the book build took to execute each notebook, from jupyter-cache's records.

    python scripts/notebook_times.py [_build/.jupyter_cache]

The numbers are the last execution of each notebook (a cached notebook keeps its old time).
Speed is reported, never asserted: a notebook over the budget is marked, the exit code is 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

BUDGET_S = 60  # seconds per notebook at CI scale on 2 CPU cores


def main(argv: list[str]) -> int:
    from jupyter_cache import get_cache

    folder = Path(argv[0] if argv else "_build/.jupyter_cache")
    if not folder.is_dir():
        print(f"notebook_times: error: no jupyter-cache at {folder}; build the book first",
              file=sys.stderr)
        return 2
    cache = get_cache(str(folder))
    root = Path.cwd()
    rows = []
    for record in cache.list_project_records():
        cached = cache.get_cached_project_nb(record.pk)
        seconds = None if cached is None else cached.data.get("execution_seconds")
        try:
            name = str(Path(record.uri).relative_to(root))
        except ValueError:
            name = record.uri
        rows.append((name, seconds))
    total = sum(s for _, s in rows if s is not None)
    for name, s in sorted(rows):
        shown = "not executed" if s is None else f"{s:6.1f} s" + (
            f"  (over the {BUDGET_S} s budget)" if s > BUDGET_S else "")
        print(f"notebook {name:<45} {shown}")
    print(f"notebooks: {total:.1f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
