"""Decision-level step-reward shaping (docs/contract.md, "Step rewards"; the old system's with its bugs fixed).

Shaping is metadata: it never changes a step's `reward` or the episode returns. Fixed relative to
the old system:
- `k_limits` count unlocks (each increment of an achievement's counter), so a limit of 3 credits an
  achievement up to three times per episode;
- `indicator_lambda: 0` means 0 (the seed read it as 1.0); absent means 1.0;
- `step_beta` is a constant cost subtracted from every decision's shaped reward (the seed ignored it);
- resource shaping ignores the vitals (health, food, drink, energy), which regenerate on their own;
  eating and drinking are credited through their achievement counters instead;
- the per-episode baselines reset when the episode resets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..game import VITALS, DecisionOutcome

Strategy = Literal["consistent", "per_achievement"]
_STRATEGY_ALIASES: dict[str, Strategy] = {
    **dict.fromkeys(["simple", "consistent", "consistent_stepwise", "decision_consistent"], "consistent"),
    **dict.fromkeys(
        ["per_achievement", "per-achievement", "perachievement", "achievement_weighted", "complex"],
        "per_achievement",
    ),
}
RESOURCE_WEIGHTS: dict[str, float] = {
    "wood": 0.10,
    "sapling": 0.08,
    "stone": 0.15,
    "coal": 0.18,
    "iron": 0.22,
    "diamond": 0.05,
    "wood_pickaxe": 0.40,
    "stone_pickaxe": 0.55,
    "iron_pickaxe": 0.75,
    "wood_sword": 0.35,
    "stone_sword": 0.50,
    "iron_sword": 0.70,
}
COUNT_WEIGHTS: dict[str, float] = {
    "collect_wood": 0.08,
    "collect_sapling": 0.06,
    "collect_stone": 0.10,
    "collect_coal": 0.12,
    "collect_iron": 0.14,
    "collect_drink": 0.06,
}
DEFAULT_RESOURCE_WEIGHT = 0.05
DEFAULT_COUNT_WEIGHT = 0.05


class StepRewardConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    enabled: bool = False
    mode: str = "off"
    strategy: Strategy = "consistent"
    weights: dict[str, float] = Field(default_factory=dict)
    k_limits: dict[str, int] = Field(default_factory=dict)
    indicator_lambda: float | None = None
    step_beta: float = 0.0

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy(cls, value: object) -> object:
        if value is None:
            return "consistent"
        if isinstance(value, str):
            return _STRATEGY_ALIASES.get(value.strip().lower(), "consistent")
        return value

    @property
    def active(self) -> bool:
        return self.enabled and self.mode.strip().lower() == "decision_stepwise"

    @property
    def lambda_effective(self) -> float:
        return 1.0 if self.indicator_lambda is None else self.indicator_lambda


@dataclass(slots=True)
class StepwiseResult:
    info: dict[str, Any]  # -> step.info.stepwise
    decision_rewards: dict[str, Any]  # -> step.info.meta.decision_rewards
    sample: dict[str, Any]  # -> trajectory.decision_samples[]


def _positive_deltas(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] > before.get(key, 0)}


@dataclass(slots=True)
class StepRewardShaper:
    """Per-rollout shaping state; `reset_episode()` at every new episode."""

    config: StepRewardConfig
    _credited: dict[str, int] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    totals: dict[str, float] = field(
        default_factory=lambda: {
            "indicator_sum": 0.0,
            "reward_sum": 0.0,
            "resource_reward": 0.0,
            "new_achievements_total": 0.0,
        }
    )
    unique_achievements: set[str] = field(default_factory=set)

    def reset_episode(self) -> None:
        self._credited.clear()
        self._seen.clear()

    def _per_achievement(self, count_deltas: dict[str, int]) -> tuple[float, list[dict[str, Any]], list[str]]:
        base, components, credited = 0.0, [], []
        for name, delta in count_deltas.items():
            limit = int(self.config.k_limits.get(name, 1))
            weight = float(self.config.weights.get(name, 1.0))
            for _ in range(delta):
                prior = self._credited.get(name, 0)
                if limit > 0 and prior >= limit:
                    break
                base += weight
                components.append({"achievement": name, "weight": weight, "count_prior": prior, "count_limit": limit})
                credited.append(name)
                self._credited[name] = prior + 1
        return base, components, credited

    def _resources(self, outcome: DecisionOutcome, count_deltas: dict[str, int]) -> tuple[float, list[dict[str, Any]]]:
        total, components = 0.0, []
        inventory_deltas = _positive_deltas(outcome.inventory_before, outcome.inventory_after)
        for item, delta in inventory_deltas.items():
            if item in VITALS:
                continue
            weight = RESOURCE_WEIGHTS.get(item, DEFAULT_RESOURCE_WEIGHT)
            total += weight * delta
            components.append(
                {
                    "type": "inventory",
                    "item": item,
                    "delta": delta,
                    "weight": weight,
                    "reward": weight * delta,
                }
            )
        for name, delta in count_deltas.items():
            weight = COUNT_WEIGHTS.get(name, DEFAULT_COUNT_WEIGHT)
            total += weight * delta
            components.append(
                {
                    "type": "achievement_count",
                    "name": name,
                    "delta": delta,
                    "weight": weight,
                    "reward": weight * delta,
                }
            )
        return total, components

    def score(self, decision_index: int, outcome: DecisionOutcome, actions: list[str]) -> StepwiseResult:
        unlocked = list(outcome.unlocked)
        count_deltas = _positive_deltas(outcome.counts_before, outcome.counts_after)
        info: dict[str, Any] = {
            "decision_index": decision_index,
            "new_achievements": unlocked,
            "strategy": self.config.strategy,
        }
        resource_reward = 0.0
        if self.config.strategy == "consistent":
            base = 1.0 if unlocked else 0.0
            components = (
                [{"achievement": "__indicator__", "weight": 1.0, "count_prior": 0, "count_limit": 1}]
                if unlocked
                else []
            )
        else:
            base, components, credited = self._per_achievement(count_deltas)
            resource_reward, resource_components = self._resources(outcome, count_deltas)
            base += resource_reward
            components += resource_components
            if credited:
                info["credited_achievements"] = credited
            if resource_reward:
                info["resource_reward"] = resource_reward
        indicator = 1 if base > 0 or unlocked else 0
        reward = self.config.lambda_effective * base - self.config.step_beta
        info.update(indicator=indicator, reward=reward, base_reward=base)
        if components:
            info["components"] = components
        unique = [name for name in unlocked if name not in self._seen]
        self._seen.update(unique)
        self.unique_achievements.update(unique)
        self.totals["indicator_sum"] += indicator
        self.totals["reward_sum"] += reward
        self.totals["resource_reward"] += resource_reward
        self.totals["new_achievements_total"] += len(unlocked)
        decision_rewards = {
            "turn": decision_index,
            "ach_delta": len(unlocked),
            "unique_delta": len(unique),
            "all": sorted(unlocked),
            "unique": sorted(unique),
        }
        sample: dict[str, Any] = {
            "decision_index": decision_index,
            "indicator": indicator,
            "r_i": reward,
            "base": base,
            "strategy": self.config.strategy,
            "actions": [{"tool": "interact_many", "args": {"actions": actions}}],
        }
        if components:
            sample["components"] = components
        if resource_reward:
            sample["resource_reward"] = resource_reward
        return StepwiseResult(info, decision_rewards, sample)

    def summary(self, final_achievements: list[str]) -> dict[str, Any]:
        config = self.config
        summary: dict[str, Any] = {
            **self.totals,
            "mode": config.mode,
            "strategy": config.strategy,
            "indicator_lambda": config.lambda_effective,
            "unique_achievements_total": len(self.unique_achievements),
            "unique_achievements": sorted(self.unique_achievements),
            "final_achievements": sorted(final_achievements),
        }
        if config.step_beta:
            summary["step_beta"] = config.step_beta
        if config.strategy == "per_achievement":
            if config.weights:
                summary["weights"] = dict(config.weights)
            if config.k_limits:
                summary["k_limits"] = dict(config.k_limits)
        return summary
