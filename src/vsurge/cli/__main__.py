"""`python -m vsurge.cli ...`: the `vsurge` command without its console script (tests, benchmarks)."""

import sys

from .commands import main

sys.exit(main())
