"""The figures `task-app eval` reports, the ones papers compare (its `--json` file holds exactly these).

Every rollout of a seed is one of its `repeats`; failed rollouts are counted, never scored.

    per seed          the mean over its repeats of: achievements per episode, return, outcome_score, events_score
    mean ± SE         over seeds (the seed is the unit: repeats of one seed are not independent samples);
                      SE = sample standard deviation / sqrt(seeds), null with fewer than two seeds
    Crafter score     Hafner (2021) over every episode, with a 95 % percentile bootstrap interval that
                      resamples seeds (each with all its repeats), 1000 resamples, seeded
    progression       BALROG's Crafter progression: achievements unlocked / 22, in percent, mean ± SE over seeds
    pass@k            per achievement, the unbiased estimator 1 - C(n - c, k) / C(n, k) of each seed
                      (n scored repeats, c of them unlocked it), averaged over the seeds with n >= k;
                      k = 1 and k = repeats
    invalid actions   rejected actions / (executed actions the policy asked for + rejected actions)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..game import ACHIEVEMENTS
from .scoring import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    EpisodeRow,
    bootstrap,
    crafter_score,
    success_rates,
)

PERCENT = 100.0


@dataclass(frozen=True, slots=True)
class MeanSE:
    mean: float | None
    se: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "se": self.se, "n": self.n}

    def text(self, digits: int = 2) -> str:
        if self.mean is None:
            return "-"
        return f"{self.mean:.{digits}f}" + (f" ± {self.se:.{digits}f}" if self.se is not None else "")


def mean_se(values: Iterable[float | None]) -> MeanSE:
    """Mean and standard error of the values that are not None."""
    kept = [value for value in values if value is not None]
    if not kept:
        return MeanSE(None, None, 0)
    se = statistics.stdev(kept) / math.sqrt(len(kept)) if len(kept) > 1 else None
    return MeanSE(statistics.fmean(kept), se, len(kept))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that at least one of k of n attempts succeeds, c of n having succeeded (Chen et al., 2021)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} attempts, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def by_seed(rows: Sequence[EpisodeRow]) -> dict[int, list[EpisodeRow]]:
    """The scored rollouts (no error) of each seed, in seed order."""
    seeds: dict[int, list[EpisodeRow]] = {}
    for row in sorted(rows, key=lambda row: (row.seed, row.repeat)):
        if row.error is None:
            seeds.setdefault(row.seed, []).append(row)
    return seeds


def _seed_mean(rows: Sequence[EpisodeRow], value: str) -> float | None:
    values = [getattr(row, value) for row in rows if getattr(row, value) is not None]
    return statistics.fmean(float(item) for item in values) if values else None


def _pass_at_k(seeds: dict[int, list[EpisodeRow]], name: str, k: int) -> float | None:
    """pass@k of one achievement, averaged over the seeds with at least k scored rollouts."""
    values = [
        pass_at_k(len(runs), sum(name in run.achievements for run in runs), k)
        for runs in seeds.values()
        if len(runs) >= k
    ]
    return statistics.fmean(values) if values else None


def eval_summary(rows: Sequence[EpisodeRow], repeats: int) -> dict[str, Any]:
    """Every figure of the eval, as `--json` writes it."""
    seeds = by_seed(rows)
    achievements = [statistics.fmean(len(run.achievements) for run in runs) for runs in seeds.values()]
    per_seed = [
        {
            "seed": seed,
            "episodes": len(runs),
            "achievements": mean_achievements,
            "return": statistics.fmean(run.episode_return for run in runs),
            "outcome_score": _seed_mean(runs, "outcome_score"),
            "events_score": _seed_mean(runs, "events_score"),
        }
        for (seed, runs), mean_achievements in zip(seeds.items(), achievements, strict=True)
    ]
    episodes = [run.achievements for runs in seeds.values() for run in runs]
    clusters = [[run.achievements for run in runs] for runs in seeds.values()]
    interval = bootstrap(
        clusters,
        lambda sample: crafter_score([episode for cluster in sample for episode in cluster]),
        resamples=BOOTSTRAP_RESAMPLES,
        seed=BOOTSTRAP_SEED,
        confidence=CONFIDENCE,
    )
    proposed = sum(run.proposed_actions for runs in seeds.values() for run in runs)
    rejected = sum(run.rejected_actions for runs in seeds.values() for run in runs)
    ks = sorted({1, repeats})
    return {
        "seeds": len(seeds),
        "repeats": repeats,
        "episodes": len(episodes),
        "failed": sum(1 for row in rows if row.error is not None),
        "achievements_per_episode": mean_se(achievements).as_dict(),
        "return": mean_se(item["return"] for item in per_seed).as_dict(),
        "outcome_score": mean_se(item["outcome_score"] for item in per_seed).as_dict(),
        "events_score": mean_se(item["events_score"] for item in per_seed).as_dict(),
        "balrog_progression": mean_se(PERCENT * value / len(ACHIEVEMENTS) for value in achievements).as_dict(),
        "crafter_score": {"score": crafter_score(episodes), "ci95": list(interval), "resampled": "seeds"},
        "invalid_action_share": rejected / proposed if proposed else 0.0,
        "actions": {"proposed": proposed, "rejected": rejected},
        "success_rates": success_rates(episodes),
        "pass_at_k": {name: {f"pass@{k}": _pass_at_k(seeds, name, k) for k in ks} for name in ACHIEVEMENTS},
        "per_seed": per_seed,
    }
