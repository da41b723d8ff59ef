"""Shared test helpers: small deterministic policies, the request builder, the error-body check, world
fingerprints, and rollouts stored in and read back from real trace databases.

The policies implement `task_app.policy.base.Policy` without any model: they answer from the
observation (or a fixed script), so rollouts driven by them are reproducible. `FakeLLMPolicy` answers
like a chat model would (system prompt + observation, a forced `interact_many` tool call, usage,
latency), without a network.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import copy
import dataclasses
import functools
import hashlib
import json
import pickle
import random
import re
import selectors
import subprocess
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from task_app.cli.traces import add_traces_parser
from task_app.cli.view import add_viewer_parsers
from task_app.core.contracts import ErrorResponse, RolloutRequest
from task_app.core.settings import Settings
from task_app.game import TOOL_NAME, VITALS, Game, GameEnv, Observation, WorldFactory
from task_app.game.observation import nearest
from task_app.policy.base import HistoryEntry, LMCall, PolicyDecision, PolicyError
from task_app.rollout.control import RunControl
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.plan import RolloutPlan, build_plan
from task_app.rollout.result import RolloutResult
from task_app.tracing import TraceReader, TraceStore
from task_app.tracing.rows import session_rows

SAMPLES = Path(__file__).resolve().parent / "samples"
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


_ENV_LINKS = {"_textures", "_local_view", "_item_view", "_sem_view", "_world", "_player"}


def game_state(game: Game) -> dict[str, Any]:
    """Every attribute of the env, its world and its objects, and the generator's state, comparable with ==.

    References are written as roles (the world, its generator, an object by its index), so two games
    compare equal exactly when they are copies of each other."""
    env = game.env
    world = env._world
    index = {id(obj): position for position, obj in enumerate(world._objects) if obj is not None}

    def plain(value: Any) -> Any:
        if value is world:
            return "<world>"
        if value is world.random:
            return "<random>"
        if id(value) in index:
            return ("<object>", index[id(value)])
        if isinstance(value, np.ndarray):
            return ("ndarray", value.dtype.str, value.shape, value.tobytes())
        if isinstance(value, np.generic):
            return ("numpy", value.dtype.str, value.item())
        if isinstance(value, dict):
            return ("dict", [(plain(key), plain(item)) for key, item in value.items()])
        if isinstance(value, list | tuple):
            return (type(value).__name__, [plain(item) for item in value])
        if isinstance(value, set):
            return ("set", sorted(repr(plain(item)) for item in value))
        return (type(value).__name__, value)

    name, keys, position, has_gauss, gauss = world.random.get_state()
    return {
        "env": {key: plain(value) for key, value in vars(env).items() if key not in _ENV_LINKS},
        "player": index[id(env._player)],
        "world": {key: plain(value) for key, value in vars(world).items() if key not in {"random", "_chunks"}},
        # chunk keys are ints or numpy ints depending on how crafter computed them: compare their values
        "objects": [
            (position, type(obj).__name__, {key: plain(value) for key, value in vars(obj).items()})
            for position, obj in enumerate(world._objects)
            if obj is not None
        ],
        "chunks": [
            (tuple(int(part) for part in key), sorted(index[id(obj)] for obj in objs))
            for key, objs in world._chunks.items()
        ],
        "random": (name, keys.tobytes(), position, has_gauss, gauss),
        "game": (game.terminated, game.truncated, game.decisions),
    }


class RecordedWorlds:
    """The factory, with a weak reference to every world it hands out (to see what is freed when)."""

    def __init__(self, worlds: WorldFactory) -> None:
        self.worlds = worlds
        self.made: list[weakref.ref[Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worlds, name)

    def world(self, *args: Any) -> GameEnv:
        env = self.worlds.world(*args)
        self.made.append(weakref.ref(env.world))
        return env


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


def new_run_id(prefix: str = "test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def request_body(*, decisions: int | None = None, inference_url: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The one request builder: a valid eval request with a fresh run_id; nested dicts in `overrides`
    are merged in.

    By default the built-in scripted policy and 10 decisions. With `inference_url`: crafter-react
    against that model server (the loopback fake model), model "fake-model" and `max_llm_calls` =
    `decisions` (default 1). `decisions` sets `ops` to that many agent/env pairs.
    """
    base: dict[str, Any] = {
        "run_id": new_run_id(),
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 1, "config": {}},
        "policy": {"policy_name": "crafter-scripted", "config": {}},
        "ops": ["agent", "env"] * 10,
    }
    if inference_url is not None:
        decisions = 1 if decisions is None else decisions
        base["policy"] = {
            "policy_name": "crafter-react",
            "config": {"model": "fake-model", "inference_url": inference_url, "max_llm_calls": decisions},
        }
    if decisions is not None:
        base["ops"] = ["agent", "env"] * decisions
    return _merge(base, overrides)


def error_body(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The one error-body check: exactly `status`, JSON, `{"error": {"code", "message", ...}, "detail":
    message}` with a message (and `code`, when given), in JSON's words: no Python `None` (a message
    built from a missing value once said "unknown env_name None"). Returns the body."""
    assert response.status_code == status, response.text
    assert not re.search(r"\bNone\b", response.text), response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body: dict[str, Any] = response.json()
    parsed = ErrorResponse.model_validate(body)
    assert parsed.detail == parsed.error.message and parsed.error.message, body
    if code is not None:
        assert parsed.error.code == code, body
    return body


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
    """Write a finished rollout's rows to `store`, as the recorder does without live rows."""
    return await store.write(result.plan.run_id, session_rows(result))


# --- a fake chat model as a policy, and its rollouts --------------------------------------------------

MODEL = "fake-model-7b"
INFERENCE_URL = "http://127.0.0.1:9/v1/chat/completions?cid=trace_fake_cid"
USEFUL_ACTIONS = ("move_left", "move_right", "move_up", "move_down", "do", "do", "noop")
SYSTEM_PROMPT = (
    "You are an agent playing Crafter, a 2D survival game. Each turn you see a text rendering of the "
    "world around you, your vitals, inventory and achievements. Call the interact_many tool with 1 to 8 "
    "actions from: noop, move_left, move_right, move_up, move_down, do, sleep, place_stone, place_table, "
    "place_furnace, place_plant, make_wood_pickaxe, make_stone_pickaxe, make_iron_pickaxe, make_wood_sword, "
    "make_stone_sword, make_iron_sword. "
) * 4  # about 2 KB: with the observation, a ~3 KB prompt like the real one
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "interact_many",
            "description": "Execute 1-8 Crafter actions in order.",
            "parameters": {
                "type": "object",
                "properties": {"actions": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
                "required": ["actions"],
            },
        },
    }
]
FAKE_PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()


class FakeLLMPolicy:
    """Answers every decision with a realistic chat-completions exchange (no network)."""

    name = "crafter-react"

    def __init__(self, *, seed: int = 0, image: bool = False, lm: bool = True, fail_turns: Sequence[int] = ()):
        self.rng = random.Random(seed)
        self.image = image
        self.lm = lm
        self.fail_turns = set(fail_turns)
        self.calls = 0

    def _user_content(self, observation: Observation, turn: int) -> Any:
        text = f"Turn {turn}.\n{observation.text}\n\nChoose your next actions with interact_many."
        if not self.image:
            return text
        url = observation.image_data_url or f"data:image/png;base64,{FAKE_PNG}"
        return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        turn, self.calls = self.calls, self.calls + 1
        actions = [self.rng.choice(USEFUL_ACTIONS) for _ in range(self.rng.randint(1, 4))]
        tool_calls = [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "interact_many", "arguments": json.dumps({"actions": actions})},
            }
        ]
        if not self.lm:
            return PolicyDecision(tool_calls=[{"tool_name": "interact_many", "arguments": {"actions": actions}}])
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self._user_content(observation, turn)},
        ]
        started = datetime.now(UTC)
        finished = started + timedelta(milliseconds=420 + turn)
        params = {
            "temperature": 0.2,
            "top_p": 0.95,
            "max_tokens": 512,
            "tools": TOOLS,
            "parallel_tool_calls": False,
            "tool_choice": {"type": "function", "function": {"name": "interact_many"}},
        }
        usage = {"prompt_tokens": 812, "completion_tokens": 24, "total_tokens": 836}
        exchange = functools.partial(LMCall, MODEL, "openai", INFERENCE_URL, messages, params, started, finished)
        if turn in self.fail_turns:
            call = exchange(30000.0, attempts=4, error="ReadTimeout: model server did not answer")
            return PolicyDecision(tool_calls=[], usable=False, meta={"unusable_reason": "error"}, lm_call=call)
        assistant = {"role": "assistant", "content": None, "tool_calls": tool_calls}
        response = {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [{"index": 0, "message": assistant, "finish_reason": "tool_calls"}],
            "usage": usage,
        }
        call = exchange(
            420.0 + turn, response=response, assistant_message=assistant, usage=usage, finish_reason="tool_calls"
        )
        return PolicyDecision(tool_calls=tool_calls, meta={"inference_ms": 420.0 + turn}, lm_call=call)

    async def aclose(self) -> None:
        return None


async def run_llm_rollout(
    worlds: WorldFactory,
    *,
    run_id: str = "trace-run",
    decisions: int = 5,
    seed: int = 3,
    policy: FakeLLMPolicy | None = None,
    ops: list[str] | None = None,
    step_rewards: dict[str, Any] | None = None,
) -> RolloutResult:
    """A rollout of `FakeLLMPolicy` through the real engine and crafter (a compact trace requested)."""
    config: dict[str, Any] = {"model": MODEL, "inference_url": INFERENCE_URL, "max_llm_calls": decisions}
    if step_rewards:
        config["step_rewards"] = step_rewards
    body = request_body(
        run_id=run_id,
        env={"seed": seed},
        policy={"policy_name": "crafter-react", "config": config},
        ops=ops or ["agent", "env"] * decisions,
        record={"return_trace": True, "trace_format": "compact"},
    )
    plan = build_plan(RolloutRequest.model_validate(body), Settings())
    return await RolloutEngine(plan, policy or FakeLLMPolicy(seed=seed), worlds).run()


def llm_rollout(worlds: WorldFactory, **kwargs: Any) -> RolloutResult:
    return asyncio.run(run_llm_rollout(worlds, **kwargs))


def with_run_id(result: RolloutResult, run_id: str) -> RolloutResult:
    return dataclasses.replace(result, plan=dataclasses.replace(result.plan, run_id=run_id))


# --- trace databases and the commands that read them ---------------------------------------------------

NOOPS = 64  # a decision of 64 noops: an idle player dies within about three decisions


def deaths_rollout(worlds: WorldFactory, run_id: str = "deaths", decisions: int = 10) -> RolloutResult:
    """Seed 1, an idle player: it dies in its third decision (mid-decision), and on_done resets the world."""
    plan = make_plan(
        Settings(max_actions_per_decision=NOOPS),
        run_id=run_id,
        env={"seed": 1},
        policy={"config": {"max_llm_calls": decisions}},
        ops=["agent", "env"] * decisions,
        on_done="reset",
    )
    return run_rollout(plan, ScriptedPolicy([["noop"] * NOOPS]), worlds)


def store_all(path: Path, *results: RolloutResult) -> Path:
    """A trace database at `path` holding these rollouts."""

    async def write() -> None:
        async with TraceStore(path) as trace_store:
            for result in results:
                assert (await store_result(trace_store, result)) == {"stored": True}

    asyncio.run(write())
    return path


def load_session(path: Path, run_id: str) -> dict[str, Any]:
    """The stored session of `run_id`, read through a reader."""

    async def read() -> dict[str, Any] | None:
        async with TraceReader(path) as reader:
            return await reader.get_session(run_id)

    trace = asyncio.run(read())
    assert trace is not None
    return trace


def run_cli(argv: Sequence[str | Path]) -> int:
    """`task-app traces | replay | view ...` in-process, through the real parsers; the exit code."""
    parser = argparse.ArgumentParser(prog="task-app")
    commands = parser.add_subparsers(dest="command", required=True)
    add_traces_parser(commands)
    add_viewer_parsers(commands)
    args = parser.parse_args([str(arg) for arg in argv])
    return int(args.run(args))


# --- HTML pages ---------------------------------------------------------------------------------------

# a reference to anything outside the page: the viewer and the report must be self-contained
EXTERNAL = re.compile(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//|@import|url\(\s*["']?(?:https?:)?//|<link""")


def page_data(page: str) -> dict[str, Any]:
    """The episode data a viewer page embeds."""
    match = re.search(r'<script type="application/json" id="episode-data">(.*?)</script>', page, re.DOTALL)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data


# --- child processes ----------------------------------------------------------------------------------


def first_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line on stdout, or "" as soon as it exits without one or `timeout` passes: a
    child that fails before printing fails the test at once (the caller shows its stderr), not at the
    suite's 300 s timeout."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if selector.select(min(left, 0.1)):
                return process.stdout.readline()  # "" at end of file: the child closed stdout or exited
            if process.poll() is not None:
                return ""
    return ""


# --- a stand-in for modal.Dict, and a clock tests move ---------------------------------------------


class FakeClock:
    """A wall clock that moves only when a test says so (`clock.now += 60`)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _DictMethod:
    """A method of the double, callable as `method(...)` and, as Modal's are, as `await method.aio(...)`."""

    def __init__(self, owner: FakeModalDict, name: str) -> None:
        self._owner, self._name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._owner, f"_{self._name}")(*args, **kwargs)

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self._owner.calls[self._name] += 1
        await asyncio.sleep(self._owner.latency_s)  # a network round trip
        return self(*args, **kwargs)


class _KeysMethod(_DictMethod):
    async def aio(self, *args: Any, **kwargs: Any) -> Any:  # an async generator, as Modal's `keys.aio()`
        self._owner.calls["keys"] += 1
        await asyncio.sleep(self._owner.latency_s)
        for key in self(*args, **kwargs):
            yield key


class FakeModalDict:
    """`modal.Dict` as modal 1.6.4 documents it, for tests (there is no Modal account here).

    Keys and values are pickled on the way in and unpickled on the way out; an entry expires after 7 days
    without a read or a write; there is no compare-and-set: `put(key, value, skip_if_exists=True)` (True
    when it wrote) is the one atomic primitive; `get(key, default)`, `pop(key, default)`, `contains`,
    `keys`; every `.aio` call takes `latency_s` (tens of ms on Modal) and is counted in `calls`.
    """

    EXPIRY_S = 7 * 24 * 3600

    def __init__(self, latency_s: float = 0.0, clock: Any = None) -> None:
        import time

        self.latency_s = latency_s
        self.clock = clock or time.time
        self.calls: collections.Counter[str] = collections.Counter()
        self._entries: dict[bytes, tuple[bytes, float]] = {}
        self.get, self.put, self.pop = _DictMethod(self, "get"), _DictMethod(self, "put"), _DictMethod(self, "pop")
        self.contains, self.keys = _DictMethod(self, "contains"), _KeysMethod(self, "keys")

    def _live(self, key: bytes) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self.clock() - entry[1] > self.EXPIRY_S:
            del self._entries[key]
            return None
        self._entries[key] = (entry[0], self.clock())  # a read is an access
        return entry[0]

    def _get(self, key: Any, default: Any = None) -> Any:
        raw = self._live(pickle.dumps(key))
        return default if raw is None else pickle.loads(raw)  # the double unpickles only what it pickled

    def _put(self, key: Any, value: Any, *, skip_if_exists: bool = False) -> bool:
        packed = pickle.dumps(key)
        if skip_if_exists and self._live(packed) is not None:
            return False
        self._entries[packed] = (pickle.dumps(value), self.clock())
        return True

    def _pop(self, key: Any, default: Any = None) -> Any:
        packed = pickle.dumps(key)
        raw = self._live(packed)
        if raw is None:
            return default
        del self._entries[packed]
        return pickle.loads(raw)

    def _contains(self, key: Any) -> bool:
        return self._live(pickle.dumps(key)) is not None

    def _keys(self) -> list[Any]:
        return [pickle.loads(key) for key in list(self._entries) if self._live(key) is not None]

    def __len__(self) -> int:
        return len(self._entries)
