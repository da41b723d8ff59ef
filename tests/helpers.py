"""Shared test helpers: small deterministic policies, request builders and world fingerprints.

The policies implement `task_app.policy.base.Policy` without any model: they answer from the
observation (or a fixed script), so rollouts driven by them are reproducible.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import random
from collections.abc import Iterable, Sequence
from typing import Any

from task_app.core.contracts import RolloutRequest
from task_app.core.settings import Settings
from task_app.game import TOOL_NAME, VITALS, GameEnv, Observation
from task_app.game.observation import nearest
from task_app.policy.base import HistoryEntry, PolicyDecision, PolicyError
from task_app.rollout.control import RunControl
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.plan import RolloutPlan, build_plan
from task_app.rollout.result import RolloutResult
from task_app.tracing import TraceStore, build_session_trace
from task_app.tracing.rows import session_rows

MOVES = {(-1, 0): "move_left", (1, 0): "move_right", (0, -1): "move_up", (0, 1): "move_down"}
MOVE_ACTIONS = tuple(MOVES.values())


def call(*actions: str | int) -> dict[str, Any]:
    """One `interact_many` tool call in the simplified shape the engine records."""
    return {"tool_name": TOOL_NAME, "arguments": {"actions": list(actions)}}


# --- worlds ---------------------------------------------------------------------------------------


def world_state(env: Any) -> dict[str, Any]:
    """Everything that defines a world right after reset, comparable with `==`.

    Works on both `GameEnv` and stock `crafter.Env` (private attributes, as crafter names them).
    """
    world, player = env._world, env._player
    return {
        "materials": world._mat_map.tobytes(),
        "material_names": dict(world._mat_names),
        "objects": [(type(obj).__name__, int(obj.pos[0]), int(obj.pos[1]), int(obj.health)) for obj in world.objects],
        "player": (int(player.pos[0]), int(player.pos[1]), int(player.facing[0]), int(player.facing[1])),
        "inventory": dict(player.inventory),
        "achievements": dict(player.achievements),
        "daylight": float(world.daylight),
        "step": env._step,
    }


def world_digest(env: Any) -> str:
    """A short hash of the material map and the objects (type, position, health)."""
    state = world_state(env)
    digest = hashlib.sha256(state["materials"])
    digest.update(repr(state["objects"]).encode())
    digest.update(repr(state["player"]).encode())
    return digest.hexdigest()


def clear_around(env: GameEnv, radius: int, material: str = "grass") -> None:
    """Remove every creature but the player and cover a square of `radius` around it with `material`."""
    world, player = env.world, env.player
    for obj in world.objects:
        if obj is not player:
            world.remove(obj)
    px, py = int(player.pos[0]), int(player.pos[1])
    for x in range(px - radius, px + radius + 1):
        for y in range(py - radius, py + radius + 1):
            if 0 <= x < world.area[0] and 0 <= y < world.area[1]:
                world[x, y] = material


def keep_alive(env: GameEnv) -> None:
    """Refill the vitals so long random walks outlive hunger and thirst (applied identically to every run)."""
    for vital in VITALS:
        env.player.inventory[vital] = 9


# --- policies -------------------------------------------------------------------------------------


class ScriptedPolicy:
    """Answers with a fixed list of decisions (each a list of actions), cycling; records what it saw."""

    name = "test-scripted"

    def __init__(self, answers: Sequence[Sequence[str | int]]) -> None:
        self.answers = [list(answer) for answer in answers]
        self.calls = 0
        self.seen: list[str] = []
        self.histories: list[tuple[HistoryEntry, ...]] = []

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        self.seen.append(observation.text)
        self.histories.append(tuple(history))
        answer = self.answers[self.calls % len(self.answers)]
        self.calls += 1
        return PolicyDecision([call(*answer)], meta={"answer": self.calls})

    async def aclose(self) -> None:
        return None


class RandomPolicy:
    """Random actions from its own seeded generator (never the global one)."""

    name = "test-random"

    def __init__(self, seed: int, actions: Sequence[str] = MOVE_ACTIONS, per_decision: int = 4) -> None:
        self.random = random.Random(seed)
        self.actions = tuple(actions)
        self.per_decision = per_decision

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        return PolicyDecision([call(*(self.random.choice(self.actions) for _ in range(self.per_decision)))])

    async def aclose(self) -> None:
        return None


class SeekerPolicy:
    """A scripted-like heuristic: walk to the nearest tile of `kind`, face it and `do` (a pure function of the obs).

    Crafter turns the player towards a blocked tile it tries to walk into, so "move towards it" also faces it.
    """

    name = "test-seeker"

    def __init__(self, kind: str = "tree", per_decision: int = 4) -> None:
        self.kind = kind
        self.per_decision = per_decision

    def actions_for(self, observation: Observation) -> list[str]:
        x, y = observation.data["player_position"]
        found = nearest(observation.semantic, (x, y), (self.kind,))
        if self.kind not in found:
            return ["noop"]
        dx, dy = found[self.kind]
        actions: list[str] = []
        if abs(dx) + abs(dy) == 1:
            return [MOVES[(dx, dy)], *["do"] * (self.per_decision - 1)]
        steps_x = abs(dx) - (1 if dy == 0 else 0)
        actions += [MOVES[(1 if dx > 0 else -1, 0)]] * steps_x
        if dy:
            actions += [MOVES[(0, 1 if dy > 0 else -1)]] * (abs(dy) - 1)
            actions.append(MOVES[(0, 1 if dy > 0 else -1)])
        else:
            actions.append(MOVES[(1 if dx > 0 else -1, 0)])
        actions.append("do")
        return actions[: self.per_decision]

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        return PolicyDecision([call(*self.actions_for(observation))])

    async def aclose(self) -> None:
        return None


class SlowPolicy:
    """Waits `delay` seconds per decision (cancellable); `waiting` is set once it is waiting."""

    name = "test-slow"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.waiting = asyncio.Event()
        self.cancelled = False

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        self.waiting.set()
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return PolicyDecision([call("noop")])

    async def aclose(self) -> None:
        return None


class FailingPolicy:
    """Answers `good` decisions, then raises PolicyError."""

    name = "test-failing"

    def __init__(self, good: int = 1) -> None:
        self.good = good
        self.calls = 0

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        self.calls += 1
        if self.calls > self.good:
            raise PolicyError("model server kept failing", code="upstream_error", status=502)
        return PolicyDecision([call("noop")])

    async def aclose(self) -> None:
        return None


class PatternPolicy:
    """Usable or unusable answers following a pattern of booleans (cycling)."""

    name = "test-pattern"

    def __init__(self, usable: Iterable[bool]) -> None:
        self.pattern = list(usable)
        self.calls = 0

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        usable = self.pattern[self.calls % len(self.pattern)]
        self.calls += 1
        if usable:
            return PolicyDecision([call("noop")])
        return PolicyDecision([], meta={"unusable_reason": "no tool call"}, usable=False)

    async def aclose(self) -> None:
        return None


# --- requests and rollouts ------------------------------------------------------------------------


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def request_body(**overrides: Any) -> dict[str, Any]:
    """A valid eval request for the built-in scripted policy; nested dicts in `overrides` are merged."""
    base: dict[str, Any] = {
        "run_id": "test-run",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 1, "config": {}},
        "policy": {"policy_name": "crafter-scripted", "config": {}},
        "ops": ["agent", "env"] * 10,
    }
    return _merge(base, overrides)


def make_plan(settings: Settings | None = None, **overrides: Any) -> RolloutPlan:
    return build_plan(RolloutRequest.model_validate(request_body(**overrides)), settings or Settings())


def run_rollout(plan: RolloutPlan, policy: Any, worlds: Any, control: RunControl | None = None) -> RolloutResult:
    return asyncio.run(RolloutEngine(plan, policy, worlds, control=control).run())


def trajectory_key(result: RolloutResult) -> list[tuple[Any, ...]]:
    """What two rollouts must share to be 'the same trajectory' (timings excluded)."""
    return [
        (
            record.episode,
            record.obs_text,
            tuple(record.outcome.actions),
            record.outcome.unlocked,
            record.reward,
            record.done,
            record.obs_after_text,
        )
        for record in result.records
    ]


async def store_result(store: TraceStore, result: RolloutResult) -> dict[str, Any]:
    """Write a finished rollout's structured trace to `store`, as the recorder does without live rows."""
    return await store.write(result.plan.run_id, session_rows(build_session_trace(result)))
