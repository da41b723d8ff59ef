"""Small deterministic policies (`task_app.policy.base.Policy` without a model: they answer from the
observation or a fixed script, so rollouts driven by them are reproducible), and `FakeLLMPolicy`, which
answers like a chat model would (system prompt + observation, a forced `interact_many` tool call, usage,
latency), without a network."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from task_app.game import TOOL_NAME, Observation
from task_app.game.observation import nearest
from task_app.policy.base import HistoryEntry, LMCall, PolicyDecision, PolicyError

MOVES = {(-1, 0): "move_left", (1, 0): "move_right", (0, -1): "move_up", (0, 1): "move_down"}
MOVE_ACTIONS = tuple(MOVES.values())


def call(*actions: str | int) -> dict[str, Any]:
    """One `interact_many` tool call in the simplified shape the engine records."""
    return {"tool_name": TOOL_NAME, "arguments": {"actions": list(actions)}}


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
