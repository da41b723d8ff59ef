"""NeMo Gym: the Crafter side of a resources server in NeMo Gym's Gymnasium flavour
(`resources_servers.gymnasium.GymnasiumServer`, driven by its `gymnasium_agent`; docs/trainers/nemo-gym.md).

NeMo Gym itself is not imported: it needs Python >= 3.13.14. `CrafterGymnasium` answers its two hooks
with the documented tuples, and a ten-line `GymnasiumServer` subclass (in the docs page) delegates to it:

    reset(metadata, session_id) -> (observation, info)
    step(action, metadata, session_id) -> (observation, reward, terminated, truncated, info)

`metadata` is the dataset row's extra fields (`task_id` or `seed`); `action` is the agent's
`NeMoGymResponse` (an object or its JSON). Its `function_call` items go to the app's `/step` as they
are (the app reads Responses-API calls), and their outputs go back in `info["tool_outputs"]`, one
`{"call_id", "output"}` per call; a reply without calls is read as text (`[move_left, do]`), and the
next observation is the next user message. The episode's env session is terminated when it ends or when
NeMo Gym closes the session.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._async_client import AsyncClient, AsyncEnv
from ._play import Tally, parse_actions, step_text
from ._requests import ObservationFormat
from .trl import TRAINER_RETRY, TRAINER_TIMEOUT

DEFAULT_MAX_TURNS = 50
SEE_LAST = "Ran together with the turn's other calls; the last call's output has the result."


def _get(item: Any, name: str) -> Any:
    """A field of an output item: a pydantic object's attribute or a dict's key."""
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def output_items(action: Any) -> list[Any]:
    """The `output` list of a `NeMoGymResponse` (object or dict)."""
    items = _get(action, "output")
    return list(items) if items else []


def reply_text(action: Any) -> str:
    """The text of the response's `message` items (what NeMo Gym's `extract_text` reads)."""
    parts: list[str] = []
    for item in output_items(action):
        if _get(item, "type") != "message":
            continue
        content = _get(item, "content")
        if isinstance(content, str):
            parts.append(content)
            continue
        for piece in content or ():
            if _get(piece, "type") == "output_text":
                parts.append(str(_get(piece, "text") or ""))
    return "".join(parts)


def function_calls(action: Any) -> list[dict[str, Any]]:
    """The response's `function_call` items as dicts (call_id, name, arguments)."""
    return [
        {
            "type": "function_call",
            "call_id": _get(item, "call_id"),
            "name": _get(item, "name"),
            "arguments": _get(item, "arguments"),
        }
        for item in output_items(action)
        if _get(item, "type") == "function_call"
    ]


class CrafterGymnasium:
    """One env session of the app per NeMo Gym session id.

    `base_url` and `api_key` default to `TASK_APP_URL` and `ENVIRONMENT_API_KEY`; `observation` is the
    text format ("full" or "compact"), `config` the world's (`length`), `max_turns` the steps an episode
    may take before it is truncated.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        observation: ObservationFormat = "full",
        config: Mapping[str, Any] | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        client: AsyncClient | None = None,
    ) -> None:
        self._owns_client = client is None
        self.client = client or AsyncClient(base_url, api_key, retry=TRAINER_RETRY, timeout=TRAINER_TIMEOUT)
        self.observation_format: ObservationFormat = observation
        self.world_config = dict(config or {})
        self.max_turns = max_turns
        self._episodes: dict[str | None, tuple[AsyncEnv, Tally]] = {}

    async def reset(
        self, metadata: Mapping[str, Any], session_id: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        """A new episode on the row's `task_id` or `seed` (else a random train world): its first
        observation, appended to the input as a user message."""
        await self.close(session_id)
        env = await self.client.env(
            metadata.get("seed"),
            task_id=metadata.get("task_id"),
            config=self.world_config,
            observation=self.observation_format,
        )
        self._episodes[session_id] = (env, Tally())
        return env.observation.text, {"env_id": env.env_id, "task_id": env.info.task_id, "seed": env.info.seed}

    async def step(
        self, action: Any, metadata: Mapping[str, Any], session_id: str | None = None
    ) -> tuple[str | None, float, bool, bool, dict[str, Any]]:
        if session_id not in self._episodes:
            await self.reset(metadata, session_id)
        env, tally = self._episodes[session_id]
        calls = function_calls(action)
        if calls:
            step = await env.step(tool_calls=calls)
        else:
            step = await env.step(parse_actions(reply_text(action)))
        tally.add(step)
        truncated = bool(step.truncated) or (not step.done and tally.steps >= self.max_turns)
        terminated = step.done and not truncated
        info: dict[str, Any] = {
            "actions": step.info.actions,
            "rejected": [each.item for each in step.info.rejected],
            "achievements_added": step.info.achievements_added,
            "achievements": list(tally.achievements),
            "return": tally.total,
        }
        text: str | None = step_text(step)
        if calls:  # the observation goes back as the calls' outputs, tied to their call_ids
            info["tool_outputs"] = [
                {"call_id": call["call_id"], "output": json.dumps(text if index == len(calls) - 1 else SEE_LAST)}
                for index, call in enumerate(calls)
            ]
            text = None
        if terminated or truncated:
            await self.close(session_id)
            text = None
        return text, float(step.reward or 0.0), terminated, truncated, info

    async def close(self, session_id: str | None) -> None:
        """End the session's episode, if any (NeMo Gym's `close_session`; safe to call again)."""
        episode = self._episodes.pop(session_id, None)
        if episode is not None:
            await episode[0].terminate()

    async def aclose(self) -> None:
        """End every episode and, if this object opened it, the client."""
        for session_id in list(self._episodes):
            await self.close(session_id)
        if self._owns_client:
            await self.client.aclose()
