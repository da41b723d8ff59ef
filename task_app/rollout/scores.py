"""What scoring a rollout against the two shipped rubrics yields: a score per rubric, per episode and for
the rollout (`rubric_scores.py` computes them; `result.py` reports them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OUTCOME, EVENTS = "outcome", "events"


@dataclass(slots=True)
class RubricScore:
    """One rubric over one episode (or a rollout: the mean over its episodes)."""

    score: float | None
    criteria: dict[str, float]
    unscored: list[str] = field(default_factory=list)

    def as_dict(self, version: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": version,
            "score": None if self.score is None else round(self.score, 6),
            "criteria": {name: round(value, 6) for name, value in self.criteria.items()},
        }
        if self.unscored:
            body["unscored"] = self.unscored
        return body


@dataclass(slots=True)
class EpisodeScores:
    index: int
    ending: dict[str, str]
    outcome: RubricScore
    events: RubricScore


@dataclass(slots=True)
class RolloutScores:
    """Both rubrics over a rollout: the means over its scored episodes, and each episode's own."""

    outcome: RubricScore
    events: RubricScore
    episodes: list[EpisodeScores]
    versions: dict[str, str]

    def details(self) -> dict[str, Any]:
        return {
            OUTCOME: self.outcome.as_dict(self.versions[OUTCOME]),
            EVENTS: self.events.as_dict(self.versions[EVENTS]),
        }
