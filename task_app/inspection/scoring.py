"""Episodes as an eval sees them, and their statistics: success rates, the Crafter score (Hafner, 2021),
a seeded percentile bootstrap."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..game import ACHIEVEMENTS

T = TypeVar("T")
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


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
    repeat: int = 0  # `task-app eval --repeats K`: which of the seed's K rollouts
    outcome_score: float | None = None
    events_score: float | None = None
    proposed_actions: int = 0  # actions the policy asked for (executed ones plus rejected ones)
    rejected_actions: int = 0


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


def bootstrap(
    items: Sequence[T], score: Callable[[Sequence[T]], float], *, resamples: int, seed: int, confidence: float
) -> tuple[float, float]:
    """Percentile bootstrap interval of `score` over `items` resampled with replacement (a
    `random.Random(seed)`, so the same items give the same interval)."""
    if not items:
        return (0.0, 0.0)
    rng = random.Random(seed)
    count = len(items)
    scores = sorted(score([items[rng.randrange(count)] for _ in range(count)]) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return (scores[max(0, int(tail * resamples))], scores[min(resamples - 1, int((1 - tail) * resamples))])
