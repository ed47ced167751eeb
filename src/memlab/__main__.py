"""``python -m memlab``: see :mod:`memlab.cli`."""

import sys

from memlab.cli import main

sys.exit(main())
