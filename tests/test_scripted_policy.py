"""The built-in baseline `crafter-scripted`: it plays well, reproducibly and cheaply, and its map
routines (routes, lava safety, shelters) do what crafter's rules need."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

import numpy as np
from helpers import clear_around, make_plan, trajectory_key

from task_app.game import ACTIONS, Game, Observation, WorldFactory
from task_app.game.actions import plan_from_names
from task_app.game.observation import SEMANTIC_IDS
from task_app.policy.base import HistoryEntry, PolicyDecision
from task_app.policy.navigation import Grid, enclosed, safe_prefix
from task_app.policy.scripted import DUSK, ScriptedPolicy
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.plan import RolloutPlan
from task_app.rollout.result import RolloutResult

SEEDS = range(20)
DECISIONS = 300
MIN_MEAN_ACHIEVEMENTS = 16  # docs/getting-started.md states 18.0 on these seeds; a random policy unlocks ~2.5


class TimedPolicy(ScriptedPolicy):
    """The scripted policy, timing each decision in CPU time of this thread: what decide() costs the
    event loop, which other processes on a loaded machine cannot stretch (wall time they can)."""

    def __init__(self, seed: int) -> None:
        super().__init__(max_actions=8, seed=seed)
        self.seconds: list[float] = []

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        start = time.thread_time()
        decision = await super().decide(observation, history)
        self.seconds.append(time.thread_time() - start)
        return decision


def scripted_plan(seed: int, decisions: int = DECISIONS) -> RolloutPlan:
    return make_plan(
        env={"seed": seed},
        policy={"config": {"max_llm_calls": decisions}},
        ops=["agent", "env"] * decisions,
        on_done="reset",
    )


async def play(worlds: WorldFactory, seeds: Sequence[int], decisions: int) -> list[tuple[RolloutResult, TimedPolicy]]:
    policies = [TimedPolicy(seed) for seed in seeds]
    plans = [scripted_plan(seed, decisions) for seed in seeds]
    runs = [RolloutEngine(plan, policy, worlds).run() for plan, policy in zip(plans, policies, strict=True)]
    results = await asyncio.gather(*runs)
    return list(zip(results, policies, strict=True))


def test_unlocks_many_achievements_quickly(worlds: WorldFactory) -> None:
    runs = asyncio.run(play(worlds, SEEDS, DECISIONS))

    firsts = [result.episodes[0].achievements for result, _ in runs]
    assert sum(map(len, firsts)) / len(firsts) >= MIN_MEAN_ACHIEVEMENTS
    for needed in ("collect_wood", "place_table", "make_wood_pickaxe", "collect_stone", "collect_drink"):
        assert sum(needed in unlocked for unlocked in firsts) >= len(firsts) * 3 // 4, needed

    for result, _ in runs:
        assert result.decisions == DECISIONS
        for record in result.records:
            assert record.decision is not None and record.decision.meta["goal"]
            assert record.decision.tool_calls[0]["tool_name"] == "interact_many"
            assert 1 <= len(record.plan.actions) <= 8 and not record.plan.rejected
            assert set(record.plan.actions) <= set(ACTIONS)
    # decide() runs on the event loop: it must stay far below a millisecond (generous bound for CI).
    assert statistics.median(s for _, policy in runs for s in policy.seconds) < 0.005


def test_same_seed_same_trajectory(worlds: WorldFactory) -> None:
    first, second = asyncio.run(play(worlds, [3, 3], 120))
    assert trajectory_key(first[0]) == trajectory_key(second[0])
    assert first[0].records[-1].decision.meta == second[0].records[-1].decision.meta  # type: ignore[union-attr]


def test_sleeps_walled_in_at_night(worlds: WorldFactory) -> None:
    """At dusk, with a pickaxe, the policy digs a pocket into stone, plugs it and sleeps inside."""
    env = worlds.generate(7, (64, 64), 10_000)
    clear_around(env, 8)
    px, py = int(env.player.pos[0]), int(env.player.pos[1])
    for x in range(px + 2, px + 7):
        for y in range(py - 2, py + 3):
            env.world[x, y] = "stone"
    env.player.inventory.update(wood_pickaxe=1, energy=5)
    env._step = DUSK + 1
    game, policy = Game(env), ScriptedPolicy(seed=0)
    observation = game.observe()
    for _ in range(10):
        _, observation = game.step(plan_from_names(policy.plan(observation).actions, 8))
        if env.player.sleeping:
            break
    assert env.player.sleeping
    assert enclosed(observation.semantic, (int(env.player.pos[0]), int(env.player.pos[1])))
    assert env.player.achievements["place_stone"] == 1  # the plug


def test_routes_dig_through_stone() -> None:
    stone, coal, grass = SEMANTIC_IDS["stone"], SEMANTIC_IDS["coal"], SEMANTIC_IDS["grass"]
    semantic = np.full((5, 3), stone)
    semantic[0, 1], semantic[3, 1] = grass, coal
    grid = Grid(semantic, (0, 1), (0, 1), diggable=("stone",))
    route = grid.face(semantic == coal, ["do"], max_cost=20)
    dig = ["move_right", "do", "move_right"]  # turn to the stone, mine it, step in
    assert route == [*dig, *dig, "move_right", "do"]


def test_plans_stop_before_a_move_that_could_reach_lava() -> None:
    lava = np.zeros((5, 5), dtype=bool)
    lava[1, 2] = True
    # Planned: right to (2, 1), then down to (2, 2). Were the first move blocked, the second would
    # take the player from (1, 1) into the lava at (1, 2).
    assert safe_prefix(["move_right", "move_down", "do"], (1, 1), lava) == ["move_right"]
    assert safe_prefix(["move_left", "move_up"], (1, 1), lava) == ["move_left", "move_up"]
