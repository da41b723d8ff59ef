"""Episodes as an eval sees them, and their statistics: success rates and the Crafter score (Hafner, 2021)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..game import ACHIEVEMENTS


@dataclass(slots=True)
class EpisodeRow:
    seed: int
    run_id: str
    achievements: list[str] = field(default_factory=list)
    episode_return: float = 0.0
    decisions: int = 0
    duration_s: float = 0.0
    stop_reason: str = ""
    error: str | None = None
    response: dict[str, Any] | None = None


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
