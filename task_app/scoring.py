"""Episode statistics: per-achievement success rates and the Crafter score (Hafner, 2021)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .crafter import ACHIEVEMENTS


def success_rates(episodes: Sequence[Sequence[str]]) -> dict[str, float]:
    """Percentage of episodes that unlocked each of the 22 achievements."""
    if not episodes:
        return dict.fromkeys(ACHIEVEMENTS, 0.0)
    return {name: 100.0 * sum(name in unlocked for unlocked in episodes) / len(episodes) for name in ACHIEVEMENTS}


def crafter_score(episodes: Sequence[Sequence[str]]) -> float:
    """S = exp(mean_i ln(1 + s_i)) - 1 over the success rates s_i in percent: the paper's geometric mean."""
    rates = success_rates(episodes)
    return math.exp(sum(math.log1p(rate) for rate in rates.values()) / len(rates)) - 1


def mean_achievements(episodes: Sequence[Sequence[str]]) -> float:
    return sum(len(unlocked) for unlocked in episodes) / len(episodes) if episodes else 0.0
