"""Rubric scores: hand-built episodes with hand-computed values for every criterion of both shipped rubrics,
how an episode ended, the rollout's mean over episodes, rubrics this app cannot fully score, and the scores
in a served rollout (`metrics.outcome_score`, `metrics.events_score`, `metrics.details.rubrics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from support.rollouts import make_plan, request_body

from task_app.core.rubrics import Rubric, load_rubrics
from task_app.game import ACHIEVEMENTS, ActionPlan, DecisionOutcome
from task_app.game.actions import Rejection
from task_app.game.episode import ActionResult
from task_app.policy.base import PolicyDecision
from task_app.rollout.result import DecisionRecord, EpisodeSummary, RolloutResult
from task_app.rollout.rubric_scores import score_rollout

RUBRICS = load_rubrics(None)
START = {"health": 9, "food": 9, "drink": 9, "energy": 9} | {
    item: 0 for item in ("sapling", "wood", "stone", "coal", "iron", "diamond", "wood_pickaxe", "stone_pickaxe")
}
NO_COUNTS = dict.fromkeys(ACHIEVEMENTS, 0)
NOW = datetime(2025, 1, 1, tzinfo=UTC)


class Episode:
    """Builds one episode's decision records, carrying inventory and achievement counters along."""

    def __init__(self, index: int, first_record: int = 0) -> None:
        self.index, self.next = index, first_record
        self.inventory, self.counts = dict(START), dict(NO_COUNTS)
        self.records: list[DecisionRecord] = []

    def decide(
        self,
        actions: Sequence[str],
        *,
        gain: Mapping[str, int] | None = None,
        count: Sequence[str] = (),
        obs_text: str = "",
        rejected: int = 0,
        usable: bool = True,
        terminated: bool = False,
        truncated: bool = False,
    ) -> Episode:
        before_inventory, before_counts = dict(self.inventory), dict(self.counts)
        for item, delta in (gain or {}).items():
            self.inventory[item] = self.inventory.get(item, 0) + delta
        for name in count:
            self.counts[name] += 1
        unlocked = tuple(name for name in count if before_counts[name] == 0)
        outcome = DecisionOutcome(
            results=tuple(ActionResult(action, (), 0.0) for action in actions),
            unlocked=unlocked,
            terminated=terminated,
            truncated=truncated,
            counts_before=before_counts,
            counts_after=dict(self.counts),
            inventory_before=before_inventory,
            inventory_after=dict(self.inventory),
        )
        plan = ActionPlan(tuple(actions), tuple(Rejection("fly", "unknown action") for _ in range(rejected)))
        decision = PolicyDecision([], usable=usable)
        record = DecisionRecord(
            index=self.next,
            episode=self.index,
            obs_text=obs_text,
            decision=decision,
            plan=plan,
            outcome=outcome,
            obs_after_text="",
            done=terminated or truncated,
            truncated=truncated,
            started_at=NOW,
            finished_at=NOW,
            env_ms=0.1,
        )
        self.records.append(record)
        self.next += 1
        return self

    def summary(self) -> EpisodeSummary:
        last = self.records[-1].outcome
        achieved = [name for name in ACHIEVEMENTS if self.counts[name] > 0]
        return EpisodeSummary(
            self.index, len(self.records), achievements=achieved, terminated=last.terminated, truncated=last.truncated
        )


def result_of(*episodes: Episode) -> RolloutResult:
    result = RolloutResult(plan=make_plan(), started_at=NOW)
    result.episodes = [episode.summary() for episode in episodes]
    result.records = [record for episode in episodes for record in episode.records]
    return result


def wood_and_table() -> Episode:
    """Alive at the end of its decision budget: wood, more wood, a table, then an idle step that hurt."""
    return (
        Episode(0)
        .decide(["move_left", "do"], gain={"wood": 1}, count=["collect_wood"])
        .decide(["do"], gain={"wood": 1}, count=["collect_wood"])
        .decide(["place_table"], gain={"wood": -2}, count=["place_table"])
        .decide(["noop"], gain={"health": -1}, truncated=True)
    )


def starved(index: int = 1, first_record: int = 4) -> Episode:
    return Episode(index, first_record).decide(
        ["noop", "noop"],
        gain={"food": -9, "health": -9},
        obs_text="Nearest (steps along x and y):\n- zombie: 1 left (1 step)",
        terminated=True,
    )


def test_the_event_criteria_of_each_decision() -> None:
    scores = score_rollout(result_of(wood_and_table()), RUBRICS)
    (episode,) = scores.episodes
    # per decision: unlocks 1, 0.4 (wood, no unlock), 1, 0; milestone 0, 0.5 (2 wood: place_table), 0, 0;
    # buffers 0.3, 0.3, 0, 0; clean 0.1, 0.1, 0.1, 0 (idle and hurt)
    assert episode.events.criteria == pytest.approx(
        {"achievement_unlocks": 0.6, "milestone_setup": 0.125, "inventory_depth": 0.15, "execution_quality": 0.075}
    )
    assert episode.events.score == pytest.approx(0.55 * 0.6 + 0.2 * 0.125 + 0.15 * 0.15 + 0.1 * 0.075)  # 0.385


def test_the_outcome_criteria_of_an_episode() -> None:
    (episode,) = score_rollout(result_of(wood_and_table()), RUBRICS).episodes
    values = {
        "achievement_progression": 2 / 58,  # collect_wood and place_table, tier 1 each, of 58 tier points
        "resource_stockpile": 0.0,  # the wood went into the table
        "survival_state": (8 + 9 + 9 + 9) / 4 / 9,
        "failure_analysis": 1.0,  # a timeout with a known cause
        "future_readiness": (0 + 0.5 + 0) / 3,  # no pickaxe, a table not a furnace, no wood for the next pickaxe
    }
    assert episode.ending == {"kind": "timeout", "cause": "time_limit"}
    assert episode.outcome.criteria == pytest.approx(values)
    weights = {"achievement_progression": 0.35, "resource_stockpile": 0.2, "survival_state": 0.2}
    weights |= {"failure_analysis": 0.15, "future_readiness": 0.1}
    assert episode.outcome.score == pytest.approx(sum(values[name] * weight for name, weight in weights.items()))


def test_a_stockpile_and_tools_raise_the_outcome() -> None:
    rich = Episode(0).decide(
        ["do"],
        gain={"wood": 9, "stone": 2, "coal": 1, "wood_pickaxe": 1},
        count=["collect_wood", "collect_stone", "collect_coal", "make_wood_pickaxe", "place_table"],
        truncated=True,
    )
    (episode,) = score_rollout(result_of(rich), RUBRICS).episodes
    criteria = episode.outcome.criteria
    assert criteria["resource_stockpile"] == pytest.approx(0.4 + 0.3 * 2 / 4 + 0.15)
    assert criteria["achievement_progression"] == pytest.approx((1 + 3 + 4 + 2 + 1) / 58)
    # a wood pickaxe; a table; the stone pickaxe needs 1 wood + 1 stone, both held
    assert criteria["future_readiness"] == pytest.approx((1 / 3 + 1 / 2 + 1) / 3)
    assert criteria["survival_state"] == 1.0


def test_how_a_death_is_explained() -> None:
    (episode,) = score_rollout(result_of(starved(0, 0)), RUBRICS).episodes
    assert episode.ending == {"kind": "death", "cause": "starvation"}  # the vital at 0 comes before the zombie
    assert episode.outcome.criteria["survival_state"] == 0.0 and episode.outcome.criteria["failure_analysis"] == 1.0
    assert episode.outcome.score == pytest.approx(0.15)
    assert episode.events.score == 0.0  # an idle decision that lost health

    def death(obs_text: str) -> dict[str, str]:
        died = Episode(0).decide(["do"], gain={"health": -9}, obs_text=obs_text, terminated=True)
        return score_rollout(result_of(died), RUBRICS).episodes[0].ending

    threats = "- skeleton: 3 up (3 steps)\n- lava: 1 right, 1 down (2 steps)\n- zombie: 4 left (4 steps)"
    assert death(threats) == {"kind": "death", "cause": "lava"}  # the nearest threat within 3 steps
    assert death("- zombie: 5 left (5 steps)") == {"kind": "death", "cause": "unknown"}
    unexplained = Episode(0).decide(["do"], gain={"health": -9}, terminated=True)
    assert score_rollout(result_of(unexplained), RUBRICS).episodes[0].outcome.criteria["failure_analysis"] == 0.0


def test_an_idle_timeout_and_an_unfinished_episode() -> None:
    idle = Episode(0).decide(["noop"]).decide(["noop"]).decide(["do"], truncated=True)
    assert score_rollout(result_of(idle), RUBRICS).episodes[0].ending == {"kind": "timeout", "cause": "idling"}
    going = Episode(0).decide(["do"])
    assert score_rollout(result_of(going), RUBRICS).episodes[0].ending["kind"] == "unfinished"


def test_invalid_actions_and_unusable_answers_are_not_clean() -> None:
    sloppy = Episode(0).decide(["do"], rejected=1).decide(["noop", "do"], usable=False)
    (episode,) = score_rollout(result_of(sloppy), RUBRICS).episodes
    assert episode.events.criteria["execution_quality"] == 0.0


def test_buffers_built_before_vitals_run_low() -> None:
    thirsty = Episode(0).decide(["noop"], gain={"drink": -5}).decide(["do"], gain={"drink": 1}, count=["collect_drink"])
    thirsty.decide(["do"], gain={"drink": 1}, count=["collect_drink"])
    records = thirsty.records
    (episode,) = score_rollout(result_of(thirsty), RUBRICS).episodes
    # drink 4 -> 5 (low: 0.5), then 5 -> 6 (still at most 5 before: 0.5); the first decision built nothing
    assert episode.events.criteria["inventory_depth"] == pytest.approx((0 + 0.5 + 0.5) / 3)
    # the second drink repeats an achievement already unlocked: 0.1
    assert episode.events.criteria["achievement_unlocks"] == pytest.approx((0 + 1.0 + 0.1) / 3)
    assert len(records) == 3


def test_the_rollout_score_is_the_mean_over_its_episodes() -> None:
    scores = score_rollout(result_of(wood_and_table(), starved()), RUBRICS)
    first, second = scores.episodes
    assert scores.outcome.score == pytest.approx((first.outcome.score + second.outcome.score) / 2)
    assert scores.events.score == pytest.approx((first.events.score + 0.0) / 2)
    assert scores.outcome.criteria["survival_state"] == pytest.approx(first.outcome.criteria["survival_state"] / 2)
    body = result_of(wood_and_table(), starved())
    body.rubric_scores = scores
    metrics = body.metrics()
    assert metrics["outcome_score"] == scores.outcome.score and metrics["events_score"] == scores.events.score
    assert metrics["details"]["rubrics"]["outcome"]["criteria"].keys() == {c.id for c in RUBRICS["outcome"].criteria}
    assert [episode["ending"]["cause"] for episode in metrics["details"]["episodes"]] == ["time_limit", "starvation"]
    assert metrics["details"]["episodes"][1]["outcome_score"] == pytest.approx(0.15)


def test_an_episode_without_decisions_is_not_scored() -> None:
    result = result_of(wood_and_table())
    result.episodes.append(EpisodeSummary(1))  # reset, then the rollout ended
    scores = score_rollout(result, RUBRICS)
    assert [episode.index for episode in scores.episodes] == [0]
    empty = RolloutResult(plan=make_plan(), started_at=NOW)
    nothing = score_rollout(empty, RUBRICS)
    assert nothing.outcome.score is None and nothing.events.score is None


def _rubric(aggregation: str, *criteria: tuple[str, float]) -> Rubric:
    items = [{"id": name, "description": name, "weight": weight} for name, weight in criteria]
    return Rubric.model_validate({"version": "x", "criteria": items, "aggregation": aggregation})


def test_a_replaced_rubric_scores_only_what_is_defined() -> None:
    outcome = _rubric("weighted_sum", ("survival_state", 2.0), ("style", 1.0))
    rubrics: dict[str, Any] = {
        "outcome": outcome,
        "events": _rubric("sum", ("achievement_unlocks", 1.0), ("execution_quality", 1.0)),
    }
    (episode,) = score_rollout(result_of(wood_and_table()), rubrics).episodes
    assert episode.outcome.unscored == ["style"]
    assert episode.outcome.score == pytest.approx(35 / 36)  # only survival_state counts
    assert episode.events.score == pytest.approx(0.6 + 0.075)  # sum
    custom = {"outcome": _rubric("custom", ("survival_state", 1.0)), "events": RUBRICS["events"]}
    assert score_rollout(result_of(wood_and_table()), custom).outcome.score is None


@pytest.mark.e2e
def test_a_served_rollout_carries_both_scores(client: httpx.Client) -> None:
    body = request_body(run_id="rubric-served", ops=["agent", "env"] * 30, policy={"config": {"max_llm_calls": 30}})
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    metrics = response.json()["metrics"]
    assert 0 < metrics["outcome_score"] <= 1 and 0 < metrics["events_score"] <= 0.775
    info = client.get("/info").json()
    for kind in ("outcome", "events"):
        advertised = [criterion["id"] for criterion in info["rubrics"][kind]["criteria"]]
        assert list(metrics["details"]["rubrics"][kind]["criteria"]) == advertised
        assert all(0 <= value <= 1 for value in metrics["details"]["rubrics"][kind]["criteria"].values())
