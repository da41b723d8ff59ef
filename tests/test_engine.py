"""The ops loop: limits, on_done modes, abort, policy failures, determinism, and the response shape."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
from time import perf_counter
from typing import Any

import pytest
from support.policies import FailingPolicy, PatternPolicy, RandomPolicy, ScriptedPolicy, SeekerPolicy, SlowPolicy
from support.rollouts import make_plan, run_rollout, trajectory_key
from support.worlds import RecordedWorlds

from task_app.core.contracts import RolloutResponse
from task_app.game import GameEnv, WorldFactory
from task_app.rollout.control import RunControl
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.result import RolloutResult

SHAPING = {"enabled": True, "mode": "decision_stepwise", "strategy": "per_achievement"}
SHORT_EPISODES = {"length": 20}  # crafter ends the episode (truncated) after 20 primitive steps


def response_of(result: RolloutResult) -> dict[str, Any]:
    """The response body, checked against the wire models and for plain-JSON values; the bytes the
    service sends are the same body's."""
    body = result.response()
    RolloutResponse.model_validate(body)
    assert json.loads(json.dumps(body)) == body  # no numpy scalars, tuples or datetimes on the wire
    assert json.loads(result.response_bytes()) == body
    return body


def details(body: dict[str, Any]) -> dict[str, Any]:
    return body["metrics"]["details"]


# --- a plain rollout ------------------------------------------------------------------------------


def test_plain_rollout_response(worlds: WorldFactory) -> None:
    policy = ScriptedPolicy([["move_left", "move_left"], ["do"], [5, "jump"]])
    result = run_rollout(make_plan(run_id="test-run", ops=["agent", "env"] * 3), policy, worlds)
    body = response_of(result)
    assert (body["run_id"], body["aborted"], body["ops_executed"]) == ("test-run", False, 6)
    assert body["trace_correlation_id"] == body["pipeline_metadata"]["trace_correlation_id"] == "trace_test-run"
    assert body["branches"] == {} and body["trace"] is None
    trajectory = body["trajectories"][0]
    assert trajectory["length"] == len(trajectory["steps"]) == 3
    assert trajectory["decision_samples"] is None
    steps = trajectory["steps"]
    assert [step["tool_calls"] for step in steps] == [
        [{"tool_name": "interact_many", "arguments": {"actions": ["move_left", "move_left"]}}],
        [{"tool_name": "interact_many", "arguments": {"actions": ["do"]}}],
        [{"tool_name": "interact_many", "arguments": {"actions": ["do"]}}],
    ]
    # each step carries the observation BEFORE its action; the policy saw the same text
    assert [step["obs"]["text"] for step in steps] == policy.seen
    assert steps[0]["obs"]["text"].startswith("Step 0/10000")
    assert steps[1]["obs"]["text"].startswith("Step 2/10000")
    assert trajectory["final"]["observation"]["text"].startswith("Step 4/10000")
    assert steps[2]["info"]["meta"]["rejected"] == [{"item": "jump", "reason": "unknown action"}]
    assert steps[0]["info"]["meta"]["answer"] == 1  # the policy's own meta is passed through
    assert all(step["done"] is False and step["truncated"] is False for step in steps)
    metrics = body["metrics"]
    assert (metrics["num_steps"], metrics["num_episodes"]) == (3, 1)
    assert metrics["outcome_score"] is None and metrics["events_score"] is None
    assert details(body)["stop_reason"] == "completed"
    assert details(body)["actions_executed"] == 4 and details(body)["rejected_actions"] == 1
    assert len(policy.histories[2]) == 2 and policy.histories[2][0].actions == ("move_left", "move_left")


def test_rewards_count_unlocks_and_sum_to_the_return(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 8, env={"seed": 1}, policy={"config": {"step_rewards": SHAPING}})
    body = response_of(run_rollout(plan, SeekerPolicy("tree"), worlds))
    steps = body["trajectories"][0]["steps"]
    rewards = [step["reward"] for step in steps]
    assert None in rewards and 1.0 in rewards  # null when nothing unlocked, as in the seed
    assert sum(r or 0 for r in rewards) == body["metrics"]["episode_returns"][0] == body["metrics"]["mean_return"]
    assert sum(len(step["info"]["achievements_added"]) for step in steps) == details(body)["achievement_count"]
    assert "collect_wood" in details(body)["achievements"]
    # shaping is metadata: stepwise info everywhere, rewards untouched
    assert all("stepwise" in step["info"] and "decision_rewards" in step["info"]["meta"] for step in steps)
    assert len(body["trajectories"][0]["decision_samples"]) == len(steps)
    assert details(body)["stepwise"]["unique_achievements"] == sorted(details(body)["achievements"])


# --- on_done --------------------------------------------------------------------------------------


def test_on_done_reset_plays_several_episodes(worlds: WorldFactory) -> None:
    plan = make_plan(
        ops=["agent", "env"] * 14,
        env={"seed": 1, "config": SHORT_EPISODES},
        policy={"config": {"max_llm_calls": 14, "step_rewards": SHAPING}},
    )
    result = run_rollout(plan, SeekerPolicy("tree"), worlds)
    body = response_of(result)
    metrics, steps = body["metrics"], body["trajectories"][0]["steps"]
    assert metrics["num_episodes"] == 3  # 4 actions per decision, 20 steps per episode: 5 decisions each
    assert len(metrics["episode_returns"]) == 3
    assert details(body)["stop_reason"] == "completed" and body["aborted"] is False
    by_episode: dict[int, float] = {}
    for step in steps:
        episode = step["info"]["meta"]["episode"]
        by_episode[episode] = by_episode.get(episode, 0.0) + (step["reward"] or 0.0)
    assert list(by_episode.values()) == metrics["episode_returns"]
    assert metrics["mean_return"] == pytest.approx(sum(metrics["episode_returns"]) / 3)
    # episodes end on crafter's length: done and truncated, then the next one starts from the same world
    ends = [step for step in steps if step["done"]]
    assert len(ends) == 2 and all(step["truncated"] for step in ends)
    starts = [step["obs"]["text"] for step in steps if step["obs"]["text"].startswith("Step 0/20")]
    assert len(starts) == 3 and len(set(starts)) == 1
    # shaping baselines reset: collect_wood is unique and credited again in every episode
    credited = [
        (step["info"]["meta"]["episode"], step["info"]["stepwise"].get("credited_achievements", [])) for step in steps
    ]
    for episode in range(3):
        assert ["collect_wood"] in [names for number, names in credited if number == episode]
    unique = [step["info"]["meta"]["decision_rewards"]["unique"] for step in steps]
    assert sum(names.count("collect_wood") for names in unique) == 3
    assert [episode["terminated"] for episode in details(body)["episodes"][:2]] == [False, False]


def test_on_done_terminate_stops_after_the_first_episode(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 10, env={"seed": 1, "config": SHORT_EPISODES}, on_done="terminate")
    body = response_of(run_rollout(plan, SeekerPolicy("tree"), worlds))
    assert details(body)["stop_reason"] == "episode_done"
    assert body["aborted"] is False
    assert body["metrics"]["num_episodes"] == 1
    assert details(body)["actions_executed"] == 20  # the game stopped mid-decision at its length
    steps = body["trajectories"][0]["steps"]
    assert body["ops_executed"] == 2 * len(steps) < 20
    assert [step["done"] for step in steps] == [False] * (len(steps) - 1) + [True]


class StarvingWorlds:
    """Hands out the cached worlds with a player one hit from death, starving and parched."""

    def __init__(self, worlds: WorldFactory) -> None:
        self.worlds = worlds

    def world(self, seed: int, area: tuple[int, int], length: int) -> GameEnv:
        env = self.worlds.world(seed, area, length)
        env.player.inventory.update(health=1, food=0, drink=0)
        return env


def test_death_ends_the_episode(worlds: WorldFactory) -> None:
    plan = make_plan(
        ops=["agent", "env"] * 40, env={"seed": 1}, on_done="terminate", policy={"config": {"max_llm_calls": 40}}
    )
    body = response_of(run_rollout(plan, ScriptedPolicy([["noop"] * 8]), StarvingWorlds(worlds)))
    last = body["trajectories"][0]["steps"][-1]
    assert last["done"] is True and last["truncated"] is False
    assert details(body)["episodes"][0]["terminated"] is True
    assert details(body)["stop_reason"] == "episode_done"
    assert "You died" in body["trajectories"][0]["final"]["observation"]["text"]
    assert len(body["trajectories"][0]["steps"]) < 40


def test_on_done_reset_after_death(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 40, env={"seed": 1}, policy={"config": {"max_llm_calls": 40}})
    body = response_of(run_rollout(plan, ScriptedPolicy([["noop"] * 8]), StarvingWorlds(worlds)))
    episodes = details(body)["episodes"]
    assert len(episodes) >= 3 and body["metrics"]["num_episodes"] == len(episodes)
    assert all(episode["terminated"] and not episode["truncated"] for episode in episodes[:-1])
    assert len(body["metrics"]["episode_returns"]) == len(episodes)
    assert details(body)["stop_reason"] == "completed"
    starts = [step for step in body["trajectories"][0]["steps"] if step["obs"]["text"].startswith("Step 0/")]
    assert len(starts) == len(episodes)


def test_max_steps_per_episode_truncates_and_resets(worlds: WorldFactory) -> None:
    plan = make_plan(
        ops=["agent", "env"] * 10,
        policy={"config": {"max_llm_calls": 10}},
        env={"config": {"env_params": {"max_steps_per_episode": 3}}},
    )
    assert plan.max_steps_per_episode == 10  # raised to the cap...
    plan = make_plan(
        ops=["agent", "env"] * 10,
        policy={"config": {"max_llm_calls": 3}},
        env={"config": {"env_params": {"max_steps_per_episode": 3}}},
    )
    body = response_of(run_rollout(plan, RandomPolicy(1), worlds))
    assert plan.ops == ("agent", "env") * 3  # ...and the ops to twice the cap
    assert body["metrics"]["num_episodes"] == 1
    steps = body["trajectories"][0]["steps"]
    assert [(step["done"], step["truncated"]) for step in steps] == [(False, False), (False, False), (True, True)]


def test_max_steps_per_episode_with_reset(worlds: WorldFactory) -> None:
    plan = make_plan(
        ops=["agent", "env"] * 8,
        policy={"config": {"max_llm_calls": 8}},
        env={"config": {"env_params": {"max_steps_per_episode": 8}}},
    )
    # build_plan never makes the per-episode cap smaller than the decision cap; the engine still
    # has to handle it (and the seed system's trainers did send such configs)
    plan = dataclasses.replace(plan, max_steps_per_episode=3)
    body = response_of(run_rollout(plan, RandomPolicy(2), worlds))
    assert [episode["decisions"] for episode in details(body)["episodes"]] == [3, 3, 2]
    assert body["metrics"]["num_episodes"] == 3 and len(body["metrics"]["episode_returns"]) == 3
    assert [step["done"] for step in body["trajectories"][0]["steps"]] == [False, False, True] * 2 + [False] * 2


# --- limits ---------------------------------------------------------------------------------------


def test_max_ops(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 10, safety={"max_ops": 5})
    body = response_of(run_rollout(plan, RandomPolicy(3), worlds))
    assert details(body)["stop_reason"] == "max_ops"
    assert body["aborted"] is True
    assert body["ops_executed"] == 5
    assert body["trajectories"][0]["length"] == 2  # partial trajectory: what ran is returned
    assert details(body)["decisions"] == 3


def test_deadline_with_a_slow_policy(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 5, safety={"max_time_s": 0.4})
    policy = SlowPolicy(30.0)
    start = perf_counter()
    body = response_of(run_rollout(plan, policy, worlds))
    elapsed = perf_counter() - start
    assert elapsed < 2.0
    assert policy.cancelled is True
    assert details(body)["stop_reason"] == "deadline"
    assert body["aborted"] is True and body["ops_executed"] == 0
    assert body["trajectories"][0]["steps"] == []


def test_deadline_between_decisions(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 10, safety={"max_time_s": 0.5})
    body = response_of(run_rollout(plan, SlowPolicy(0.15), worlds))
    assert details(body)["stop_reason"] == "deadline"
    assert 1 <= body["trajectories"][0]["length"] <= 4


def test_abort_while_the_policy_waits(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 5)
    policy, control = SlowPolicy(30.0), RunControl()

    async def run() -> RolloutResult:
        task = asyncio.create_task(RolloutEngine(plan, policy, worlds, control=control).run())
        await asyncio.wait_for(policy.waiting.wait(), 10)
        control.abort()
        return await asyncio.wait_for(task, 10)  # a guard against a hang, not a measurement

    body = response_of(asyncio.run(run()))
    # The 30 s wait was cut, not waited out: the policy saw the cancellation (no clock needed).
    assert policy.cancelled is True
    assert details(body)["stop_reason"] == "aborted" and body["aborted"] is True
    assert control.aborted is True


def test_abort_between_ops(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 10)
    control = RunControl()

    class AbortAfterTwo(ScriptedPolicy):
        async def decide(self, observation: Any, history: Any) -> Any:
            if self.calls == 2:
                control.abort()
            return await super().decide(observation, history)

    body = response_of(run_rollout(plan, AbortAfterTwo([["noop"]]), worlds, control))
    assert details(body)["stop_reason"] == "aborted"
    assert body["trajectories"][0]["length"] == 2
    # the third agent op finished before it noticed the abort; nothing ran after it
    assert body["ops_executed"] == 5
    assert control.progress["decisions"] == 2 and control.progress["ops_executed"] == 5


# --- odd op sequences -----------------------------------------------------------------------------


def test_env_op_without_agent_injects_a_noop(worlds: WorldFactory) -> None:
    policy = ScriptedPolicy([["move_left"]])
    body = response_of(run_rollout(make_plan(ops=["env", "agent", "env", "env"]), policy, worlds))
    steps = body["trajectories"][0]["steps"]
    assert [step["tool_calls"][0]["arguments"]["actions"] for step in steps] == [["noop"], ["move_left"], ["noop"]]
    assert [step["info"]["meta"].get("injected_noop", False) for step in steps] == [True, False, True]
    assert policy.calls == 1


def test_the_last_of_two_agent_ops_wins(worlds: WorldFactory) -> None:
    policy = ScriptedPolicy([["move_left"], ["move_right", "move_right"]])
    body = response_of(run_rollout(make_plan(ops=["agent", "agent", "env"]), policy, worlds))
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == 1
    assert steps[0]["tool_calls"][0]["arguments"]["actions"] == ["move_right", "move_right"]
    assert details(body)["decisions"] == 2 and body["ops_executed"] == 3


def test_fallback_noop_is_reported(worlds: WorldFactory) -> None:
    body = response_of(run_rollout(make_plan(ops=["agent", "env"]), ScriptedPolicy([["fly", 42]]), worlds))
    meta = body["trajectories"][0]["steps"][0]["info"]["meta"]
    assert meta["fallback_noop"] is True
    assert [item["item"] for item in meta["rejected"]] == ["fly", "42"]
    assert body["trajectories"][0]["steps"][0]["tool_calls"][0]["arguments"]["actions"] == ["noop"]


# --- policy failures ------------------------------------------------------------------------------


def test_policy_error_stops_the_rollout(worlds: WorldFactory) -> None:
    body = response_of(run_rollout(make_plan(ops=["agent", "env"] * 5), FailingPolicy(good=2), worlds))
    assert details(body)["stop_reason"] == "policy_error"
    assert body["aborted"] is True
    assert details(body)["error"] == {
        "class": "model_unreachable",  # a 5xx after every retry
        "message": "model server kept failing",
        "retryable": True,
        "code": "upstream_error",
        "status": 502,
    }
    assert body["trajectories"][0]["length"] == 2 and body["ops_executed"] == 4


def test_three_unusable_answers_in_a_row(worlds: WorldFactory) -> None:
    body = response_of(run_rollout(make_plan(ops=["agent", "env"] * 10), PatternPolicy([False]), worlds))
    assert details(body)["stop_reason"] == "policy_unusable"
    assert body["aborted"] is True
    assert details(body)["unusable_answers"] == 3
    steps = body["trajectories"][0]["steps"]
    assert len(steps) == 2 and all(step["info"]["meta"]["fallback_noop"] for step in steps)
    assert steps[0]["info"]["meta"]["unusable_reason"] == "no tool call"


def test_unusable_answers_that_are_not_consecutive_are_tolerated(worlds: WorldFactory) -> None:
    policy = PatternPolicy([False, False, True])
    body = response_of(run_rollout(make_plan(ops=["agent", "env"] * 9), policy, worlds))
    assert details(body)["stop_reason"] == "completed"
    assert details(body)["unusable_answers"] == 6


# --- determinism ----------------------------------------------------------------------------------


def test_concurrent_rollouts_with_one_seed_are_identical(worlds: WorldFactory) -> None:
    plan = make_plan(ops=["agent", "env"] * 30, env={"seed": 9}, policy={"config": {"max_llm_calls": 30}})
    other = make_plan(ops=["agent", "env"] * 30, env={"seed": 10}, policy={"config": {"max_llm_calls": 30}})

    async def run() -> list[RolloutResult]:
        engines = [
            RolloutEngine(plan, SeekerPolicy("tree"), worlds),
            RolloutEngine(other, SeekerPolicy("tree"), worlds),
            RolloutEngine(plan, SeekerPolicy("tree"), worlds),
            RolloutEngine(plan, RandomPolicy(5), worlds),
            RolloutEngine(plan, RandomPolicy(5), worlds),
        ]
        return list(await asyncio.gather(*(engine.run() for engine in engines)))

    first, different, second, random_a, random_b = asyncio.run(run())
    assert trajectory_key(first) == trajectory_key(second)
    assert trajectory_key(random_a) == trajectory_key(random_b)
    assert trajectory_key(first) != trajectory_key(different)
    assert len(first.records) == 30
    assert first.final_obs_text == second.final_obs_text
    solo = run_rollout(plan, SeekerPolicy("tree"), worlds)  # and the same alone
    assert trajectory_key(solo) == trajectory_key(first)


def test_progress_is_published(worlds: WorldFactory) -> None:
    control = RunControl()
    plan = make_plan(ops=["agent", "env"] * 6, env={"seed": 1})
    run_rollout(plan, SeekerPolicy("tree"), worlds, control)
    assert control.progress["ops_executed"] == 12
    assert control.progress["decisions"] == 6 and control.progress["episodes"] == 1
    assert "collect_wood" in control.progress["achievements"]


def test_vision_rollout_passes_images_to_the_policy(worlds: WorldFactory) -> None:
    seen: list[Any] = []

    class Looking(ScriptedPolicy):
        async def decide(self, observation: Any, history: Any) -> Any:
            seen.append(observation)
            return await super().decide(observation, history)

    plan = make_plan(ops=["agent", "env"] * 2, policy={"config": {"use_vision": True, "image_size": 32}})
    response_of(run_rollout(plan, Looking([["noop"]]), worlds))
    assert all(obs.image_png and obs.data["observation_image_width"] == 32 for obs in seen)


def test_a_finished_rollout_frees_its_worlds_without_the_cycle_collector(worlds: WorldFactory) -> None:
    """crafter's objects and world refer to each other; the engine breaks that when it is done with a
    game, so the memory returns at once, not at the next full collection."""
    recorded = RecordedWorlds(worlds)
    plan = make_plan(ops=["agent", "env"] * 14, env={"seed": 1, "config": SHORT_EPISODES})
    gc.disable()
    try:
        result = run_rollout(plan, SeekerPolicy("tree"), recorded)
        assert len(recorded.made) == len(result.episodes) >= 2  # a world replaced by the next episode's, and the last
        assert [ref() for ref in recorded.made] == [None] * len(recorded.made)
    finally:
        gc.enable()
