"""Step-reward shaping with hand-computed numbers (docs/contract.md, "Step rewards": the old system's,
fixed)."""

from __future__ import annotations

from typing import Any

import pytest

from task_app.game import ACHIEVEMENTS, DecisionOutcome
from task_app.rollout.rewards import StepRewardConfig, StepRewardShaper

INVENTORY = {
    "health": 9,
    "food": 9,
    "drink": 9,
    "energy": 9,
    "sapling": 0,
    "wood": 0,
    "stone": 0,
    "coal": 0,
    "iron": 0,
    "diamond": 0,
    "wood_pickaxe": 0,
    "stone_pickaxe": 0,
    "iron_pickaxe": 0,
    "wood_sword": 0,
    "stone_sword": 0,
    "iron_sword": 0,
}
COUNTS = dict.fromkeys(ACHIEVEMENTS, 0)


class Episode:
    """Builds consecutive DecisionOutcomes from count and inventory changes, as the game would."""

    def __init__(self) -> None:
        self.counts = dict(COUNTS)
        self.inventory = dict(INVENTORY)

    def decide(self, counts: dict[str, int] | None = None, inventory: dict[str, int] | None = None) -> DecisionOutcome:
        before_counts, before_inventory = dict(self.counts), dict(self.inventory)
        for name, delta in (counts or {}).items():
            self.counts[name] += delta
        for name, delta in (inventory or {}).items():
            self.inventory[name] += delta
        unlocked = tuple(name for name in ACHIEVEMENTS if self.counts[name] > 0 and before_counts[name] == 0)
        return DecisionOutcome(
            results=(),
            unlocked=unlocked,
            terminated=False,
            truncated=False,
            counts_before=before_counts,
            counts_after=dict(self.counts),
            inventory_before=before_inventory,
            inventory_after=dict(self.inventory),
        )


def shaper(**config: Any) -> StepRewardShaper:
    return StepRewardShaper(StepRewardConfig.model_validate({"enabled": True, "mode": "decision_stepwise", **config}))


WOOD = {"counts": {"collect_wood": 1}, "inventory": {"wood": 1}}


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "strategy"),
    [
        (None, "consistent"),
        ("simple", "consistent"),
        ("Consistent", "consistent"),
        ("decision_consistent", "consistent"),
        ("per_achievement", "per_achievement"),
        ("per-achievement", "per_achievement"),
        ("complex", "per_achievement"),
        ("achievement_weighted", "per_achievement"),
        ("something-else", "consistent"),
    ],
)
def test_strategy_aliases(raw: str | None, strategy: str) -> None:
    assert StepRewardConfig.model_validate({"strategy": raw}).strategy == strategy


@pytest.mark.parametrize(
    ("config", "active"),
    [
        ({}, False),
        ({"enabled": True}, False),
        ({"enabled": True, "mode": "decision_stepwise"}, True),
        ({"enabled": True, "mode": " Decision_Stepwise "}, True),
        ({"enabled": False, "mode": "decision_stepwise"}, False),
        ({"enabled": True, "mode": "off"}, False),
    ],
)
def test_active_only_when_enabled_and_decision_stepwise(config: dict[str, Any], active: bool) -> None:
    assert StepRewardConfig.model_validate(config).active is active


def test_indicator_lambda_absent_is_one_and_zero_is_zero() -> None:
    assert StepRewardConfig().lambda_effective == 1.0
    assert StepRewardConfig(indicator_lambda=None).lambda_effective == 1.0
    assert StepRewardConfig(indicator_lambda=0).lambda_effective == 0.0
    assert StepRewardConfig(indicator_lambda=2.5).lambda_effective == 2.5


# --- consistent -----------------------------------------------------------------------------------


def test_consistent_indicator() -> None:
    shaping, episode = shaper(strategy="consistent"), Episode()
    first = shaping.score(0, episode.decide(**WOOD), ["do"])
    assert first.info == {
        "decision_index": 0,
        "new_achievements": ["collect_wood"],
        "strategy": "consistent",
        "indicator": 1,
        "reward": 1.0,
        "base_reward": 1.0,
        "components": [{"achievement": "__indicator__", "weight": 1.0, "count_prior": 0, "count_limit": 1}],
    }
    assert first.decision_rewards == {
        "turn": 0,
        "ach_delta": 1,
        "unique_delta": 1,
        "all": ["collect_wood"],
        "unique": ["collect_wood"],
    }
    assert first.sample == {
        "decision_index": 0,
        "indicator": 1,
        "r_i": 1.0,
        "base": 1.0,
        "strategy": "consistent",
        "actions": [{"tool": "interact_many", "args": {"actions": ["do"]}}],
        "components": [{"achievement": "__indicator__", "weight": 1.0, "count_prior": 0, "count_limit": 1}],
    }
    # collecting wood again unlocks nothing: no indicator, no reward, no components
    again = shaping.score(1, episode.decide(**WOOD), ["do"])
    assert (again.info["indicator"], again.info["reward"], again.info["base_reward"]) == (0, 0.0, 0.0)
    assert "components" not in again.info and "components" not in again.sample
    # two unlocks in one decision are still one indicator
    both = shaping.score(2, episode.decide({"collect_sapling": 1, "place_plant": 1}, {"sapling": 0}), ["do"])
    assert both.info["new_achievements"] == ["collect_sapling", "place_plant"]
    assert (both.info["indicator"], both.info["reward"]) == (1, 1.0)
    assert both.decision_rewards["ach_delta"] == 2


def test_consistent_lambda_and_beta() -> None:
    shaping, episode = shaper(strategy="consistent", indicator_lambda=0.5, step_beta=0.1), Episode()
    assert shaping.score(0, episode.decide(**WOOD), ["do"]).info["reward"] == pytest.approx(0.4)  # 0.5 * 1 - 0.1
    assert shaping.score(1, episode.decide(), ["noop"]).info["reward"] == pytest.approx(-0.1)  # 0.5 * 0 - 0.1


def test_indicator_lambda_zero_is_honoured() -> None:
    shaping, episode = shaper(strategy="consistent", indicator_lambda=0, step_beta=0.25), Episode()
    result = shaping.score(0, episode.decide(**WOOD), ["do"])
    assert result.info["indicator"] == 1 and result.info["base_reward"] == 1.0
    assert result.info["reward"] == pytest.approx(-0.25)  # 0 * 1 - 0.25


# --- per_achievement ------------------------------------------------------------------------------


def test_per_achievement_weights_and_k_limit_three() -> None:
    shaping = shaper(strategy="per_achievement", weights={"collect_wood": 2.0}, k_limits={"collect_wood": 3})
    episode = Episode()

    first = shaping.score(0, episode.decide(**WOOD), ["do"])
    # 2.0 (weighted unlock) + 0.10 (1 wood) + 0.08 (1 collect_wood count)
    assert first.info["base_reward"] == pytest.approx(2.18)
    assert first.info["reward"] == pytest.approx(2.18)
    assert first.info["credited_achievements"] == ["collect_wood"]
    assert first.info["resource_reward"] == pytest.approx(0.18)
    assert first.info["components"] == [
        {"achievement": "collect_wood", "weight": 2.0, "count_prior": 0, "count_limit": 3},
        {"type": "inventory", "item": "wood", "delta": 1, "weight": 0.10, "reward": pytest.approx(0.10)},
        {"type": "achievement_count", "name": "collect_wood", "delta": 1, "weight": 0.08, "reward": 0.08},
    ]

    # two more collections in one decision: both credited (counts 1 and 2 are under the limit of 3)
    second = shaping.score(1, episode.decide({"collect_wood": 2}, {"wood": 2}), ["do", "do"])
    assert second.info["new_achievements"] == []
    assert second.info["credited_achievements"] == ["collect_wood", "collect_wood"]
    assert [c["count_prior"] for c in second.info["components"] if "achievement" in c] == [1, 2]
    assert second.info["base_reward"] == pytest.approx(2 * 2.0 + 2 * 0.10 + 2 * 0.08)  # 4.36
    assert second.info["indicator"] == 1  # credited although nothing was unlocked for the first time

    # the fourth collection is over the limit: only resource shaping is left
    third = shaping.score(2, episode.decide(**WOOD), ["do"])
    assert "credited_achievements" not in third.info
    assert third.info["base_reward"] == pytest.approx(0.18)
    assert third.info["indicator"] == 1


def test_per_achievement_default_weight_and_k_limit_one() -> None:
    shaping, episode = shaper(strategy="per_achievement"), Episode()
    first = shaping.score(0, episode.decide({"collect_stone": 1}, {"stone": 1}), ["do"])
    assert first.info["base_reward"] == pytest.approx(1.0 + 0.15 + 0.10)
    assert first.info["components"][0] == {
        "achievement": "collect_stone",
        "weight": 1.0,
        "count_prior": 0,
        "count_limit": 1,
    }
    second = shaping.score(1, episode.decide({"collect_stone": 1}, {"stone": 1}), ["do"])
    assert "credited_achievements" not in second.info
    assert second.info["base_reward"] == pytest.approx(0.15 + 0.10)


def test_per_achievement_k_limit_zero_is_unlimited() -> None:
    shaping = shaper(strategy="per_achievement", weights={"collect_drink": 0.5}, k_limits={"collect_drink": 0})
    episode = Episode()
    result = shaping.score(0, episode.decide({"collect_drink": 5}), ["do"] * 5)
    assert result.info["credited_achievements"] == ["collect_drink"] * 5
    # 5 * 0.5 credited + 5 * 0.06 count shaping; drink itself is a vital, not a resource
    assert result.info["base_reward"] == pytest.approx(2.5 + 0.3)


def test_resource_shaping_ignores_vitals() -> None:
    shaping, episode = shaper(strategy="per_achievement"), Episode()
    episode.inventory.update(food=3, drink=4, health=5, energy=2)
    result = shaping.score(
        0,
        episode.decide(
            {"eat_cow": 1, "collect_drink": 1},
            {"food": 6, "drink": 1, "health": 2, "energy": 1, "iron_sword": 1},
        ),
        ["do"],
    )
    inventory_items = [c["item"] for c in result.info["components"] if c.get("type") == "inventory"]
    assert inventory_items == ["iron_sword"]
    assert result.info["components"][-2:] == [
        {"type": "achievement_count", "name": "collect_drink", "delta": 1, "weight": 0.06, "reward": 0.06},
        {"type": "achievement_count", "name": "eat_cow", "delta": 1, "weight": 0.05, "reward": 0.05},
    ]
    # 1.0 + 1.0 credited, 0.70 iron sword, 0.06 + 0.05 counts
    assert result.info["resource_reward"] == pytest.approx(0.70 + 0.06 + 0.05)
    assert result.info["base_reward"] == pytest.approx(2.0 + 0.81)


def test_per_achievement_step_beta_and_lambda() -> None:
    shaping, episode = shaper(strategy="per_achievement", indicator_lambda=0.5, step_beta=0.05), Episode()
    idle = shaping.score(0, episode.decide(), ["noop"])
    assert (idle.info["indicator"], idle.info["base_reward"]) == (0, 0.0)
    assert idle.info["reward"] == pytest.approx(-0.05)
    assert "components" not in idle.info and "resource_reward" not in idle.info
    wood = shaping.score(1, episode.decide(**WOOD), ["do"])
    assert wood.info["reward"] == pytest.approx(0.5 * 1.18 - 0.05)
    assert wood.sample["r_i"] == pytest.approx(0.5 * 1.18 - 0.05)
    assert wood.sample["resource_reward"] == pytest.approx(0.18)


def test_baselines_reset_with_the_episode() -> None:
    shaping = shaper(strategy="per_achievement")
    episode = Episode()
    assert shaping.score(0, episode.decide(**WOOD), ["do"]).info["credited_achievements"] == ["collect_wood"]
    second = shaping.score(1, episode.decide(**WOOD), ["do"])
    assert "credited_achievements" not in second.info

    shaping.reset_episode()
    episode = Episode()  # the game restarts from zero counts too
    again = shaping.score(2, episode.decide(**WOOD), ["do"])
    assert again.info["credited_achievements"] == ["collect_wood"]
    assert again.info["components"][0]["count_prior"] == 0
    assert again.decision_rewards["unique_delta"] == 1  # unique per episode


def test_unique_achievements_are_per_episode_without_reset() -> None:
    shaping = shaper(strategy="consistent")
    shaping.score(0, Episode().decide(**WOOD), ["do"])
    # a second episode without reset_episode() would wrongly count nothing as unique
    repeat = shaping.score(1, Episode().decide(**WOOD), ["do"])
    assert repeat.decision_rewards["unique_delta"] == 0


def test_summary_totals() -> None:
    shaping = shaper(
        strategy="per_achievement", weights={"collect_wood": 2.0}, k_limits={"collect_wood": 2}, step_beta=0.1
    )
    episode = Episode()
    shaping.score(0, episode.decide(**WOOD), ["do"])  # 2.18 - 0.1
    shaping.score(1, episode.decide(), ["noop"])  # -0.1
    shaping.reset_episode()
    episode = Episode()
    shaping.score(2, episode.decide({"collect_sapling": 1}, {"sapling": 1}), ["do"])  # 1 + 0.08 + 0.06 - 0.1
    summary = shaping.summary(["collect_sapling"])
    assert summary["indicator_sum"] == 2
    assert summary["reward_sum"] == pytest.approx(2.08 - 0.1 + 1.04)
    assert summary["resource_reward"] == pytest.approx(0.18 + 0.14)
    assert summary["new_achievements_total"] == 2
    assert summary["unique_achievements"] == ["collect_sapling", "collect_wood"]
    assert summary["unique_achievements_total"] == 2
    assert summary["final_achievements"] == ["collect_sapling"]
    assert summary["strategy"] == "per_achievement" and summary["mode"] == "decision_stepwise"
    assert summary["indicator_lambda"] == 1.0
    assert summary["step_beta"] == 0.1
    assert summary["weights"] == {"collect_wood": 2.0} and summary["k_limits"] == {"collect_wood": 2}


def test_summary_of_consistent_has_no_per_achievement_keys() -> None:
    summary = shaper(strategy="consistent", weights={"collect_wood": 2.0}).summary([])
    assert "weights" not in summary and "k_limits" not in summary and "step_beta" not in summary
