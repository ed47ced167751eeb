#!/usr/bin/env python3
"""Write the student versions of lab notebooks (``make student``): see :mod:`memlab.labs.student`.

    python scripts/make_student.py labs --out labs/student
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from memlab.labs.student import main
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from memlab.labs.student import main

if __name__ == "__main__":
    sys.exit(main())
