"""The task app benchmark suite: `python -m benchmarks [--quick]` (see run.py)."""
