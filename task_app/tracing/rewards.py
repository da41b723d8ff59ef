"""Rewards as traces record them: per-decision achievement deltas, event rewards, the outcome.

Zero rewards are never recorded (the old system stored a 0.0 `achievement_delta` for every decision
and a `sparse` copy of every environment reward); `total_reward` is a float (the old system truncated
it). docs/compatibility.md lists the old system's defects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .calls import iso

if TYPE_CHECKING:
    from ..rollout.result import DecisionRecord, RolloutResult


def decision_rewards(record: DecisionRecord) -> dict[str, Any]:
    """The decision's achievement deltas: from step shaping when on, else from the unlocks themselves.

    An achievement is unlocked at most once per episode, so without shaping every unlock is unique.
    """
    if record.stepwise is not None:
        shaped = record.stepwise.decision_rewards
        return {
            "turn": record.index,
            "ach_delta": int(shaped["ach_delta"]),
            "unique_delta": int(shaped["unique_delta"]),
            "achievements": list(shaped["all"]),
            "unique_achievements": list(shaped["unique"]),
        }
    unlocked = sorted(record.outcome.unlocked)
    return {
        "turn": record.index,
        "ach_delta": len(unlocked),
        "unique_delta": len(unlocked),
        "achievements": unlocked,
        "unique_achievements": list(unlocked),
    }


def event_rewards(record: DecisionRecord) -> list[dict[str, Any]]:
    """Non-zero rewards of one decision, attached to its environment event (no zero rows, unlike the old system's)."""
    deltas = decision_rewards(record)
    rewards = []
    if deltas["ach_delta"]:
        rewards.append(
            _event_reward(
                record,
                "achievement_delta",
                "achievements",
                deltas["ach_delta"],
                {"achievements": deltas["achievements"]},
                "environment",
            )
        )
    if deltas["unique_delta"]:
        rewards.append(
            _event_reward(
                record,
                "unique_achievement_delta",
                "unique_achievements",
                deltas["unique_delta"],
                {"achievements": deltas["unique_achievements"]},
                "environment",
            )
        )
    if record.stepwise is not None and record.stepwise.info.get("reward"):
        info = record.stepwise.info
        annotation: dict[str, Any] = {key: info[key] for key in ("indicator", "base_reward", "strategy") if key in info}
        rewards.append(
            _event_reward(
                record,
                "decision_stepwise",
                str(info.get("strategy", "stepwise")),
                info["reward"],
                annotation,
                "step_rewards",
            )
        )
    return rewards


def _event_reward(
    record: DecisionRecord, kind: str, key: str, value: float, annotation: dict[str, Any], source: str
) -> dict[str, Any]:
    return {
        "turn_number": record.index,
        "reward_value": float(value),
        "reward_type": kind,
        "key": key,
        "annotation": annotation,
        "source": source,
        "created_at": iso(record.finished_at),
    }


def outcome_reward(result: RolloutResult) -> dict[str, Any]:
    """The rollout's outcome: total reward as a float (the seed truncated it), unlocks, env ops."""
    return {
        "total_reward": float(sum(episode.episode_return for episode in result.episodes)),
        "achievements_count": len(result.final_achievements),
        "total_steps": len(result.records),
    }
