"""`python -m benchmarks`: see benchmarks/run.py."""

import sys

from .run import main

sys.exit(main())
