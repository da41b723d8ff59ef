"""The one percentile: nearest rank, as the loop-lag probe, the eval report and the benchmarks report it."""

from __future__ import annotations

import math
from collections.abc import Iterable

_FLOAT_NOISE = 1e-9  # 0.29 * 100 is 28.999999999999996: a rank that is whole must stay whole


def percentile(values: Iterable[float], q: float) -> float:
    """The smallest value with at least `q` % (0..100) of the values at or below it; raises on no values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = math.ceil(q / 100 * len(ordered) - _FLOAT_NOISE)
    return ordered[min(max(rank, 1), len(ordered)) - 1]
