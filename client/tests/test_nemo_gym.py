"""The NeMo Gym helper against a live app, with requests and answers in the shapes NeMo Gym 0.7
documents for Gymnasium-flavour resources servers (resources_servers/gymnasium/base.py and README.md
of the nemo-gym 0.7.0 wheel). NeMo Gym itself needs Python >= 3.13.14 and is not installed here: the
models below restate its request and response classes, field for field, and the tests feed the helper
what NeMo Gym's `_reset_endpoint` and `_step_endpoint` pass to `reset()` and `step()`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import KEY, App
from pydantic import BaseModel, ConfigDict

from task_app_client import AsyncEnv, GoneError, NotFoundError
from task_app_client._results import EnvState, Observation
from task_app_client.nemo_gym import CrafterGymnasium

pytestmark = pytest.mark.e2e


class EnvResetRequest(BaseModel):  # nemo-gym 0.7.0, resources_servers/gymnasium/base.py
    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]


class EnvResetResponse(BaseModel):
    observation: str | None = None
    info: dict[str, Any] = {}


class EnvStepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]
    response: dict[str, Any]  # a NeMoGymResponse as JSON


class EnvStepResponse(BaseModel):
    observation: str | None = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = {}


def _response(*items: dict[str, Any]) -> dict[str, Any]:
    """A Responses-API response as the agent posts it (NeMoGymResponse fields)."""
    return {
        "id": "resp_1",
        "created_at": 0.0,
        "model": "policy",
        "object": "response",
        "output": list(items),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def _message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call(call_id: str, *actions: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": "interact_many",
        "arguments": json.dumps({"actions": list(actions)}),
        "status": "completed",
    }


PARAMS = {"input": [{"role": "user", "content": "Play Crafter."}], "tools": []}


async def _reset(env: CrafterGymnasium, body: dict[str, Any], session_id: str) -> EnvResetResponse:
    request = EnvResetRequest.model_validate(body)
    observation, info = await env.reset(request.model_extra or {}, session_id)
    return EnvResetResponse(observation=observation, info=info)


async def _step(env: CrafterGymnasium, body: dict[str, Any], session_id: str) -> EnvStepResponse:
    request = EnvStepRequest.model_validate(body)
    observation, reward, terminated, truncated, info = await env.step(
        request.response, request.model_extra or {}, session_id
    )
    answer = EnvStepResponse(
        observation=observation, reward=reward, terminated=terminated, truncated=truncated, info=info
    )
    if terminated or truncated:  # GymnasiumServer closes the session
        await env.close(session_id)
    json.dumps(answer.model_dump())  # the answer goes out as JSON
    return answer


def test_text_replies_play_an_episode_to_its_end(app: App) -> None:
    async def main() -> None:
        env = CrafterGymnasium(app.base_url, KEY, config={"length": 4})
        try:
            row = {"responses_create_params": PARAMS, "task_id": "crafter/eval/2"}
            reset = await _reset(env, row, "sid-1")
            assert reset.observation is not None and reset.observation.startswith("Step 0/4")
            assert reset.info["task_id"] == "crafter/eval/2"
            step = {"responses_create_params": PARAMS, "task_id": "crafter/eval/2"}
            first = await _step(env, {**step, "response": _response(_message("Wood first. [move_left, do]"))}, "sid-1")
            assert not (first.terminated or first.truncated)
            assert first.observation is not None and first.observation.startswith("Ran move_left, do.")
            assert first.info["actions"] == ["move_left", "do"]
            last = await _step(env, {**step, "response": _response(_message("[do, noop]"))}, "sid-1")
            assert (last.observation, last.terminated, last.truncated) == (None, False, True)  # the length
        finally:
            await env.aclose()

    asyncio.run(main())


def test_function_calls_answer_through_tool_outputs(app: App) -> None:
    async def main() -> None:
        env = CrafterGymnasium(app.base_url, KEY, observation="full", max_turns=2)
        try:
            reset = await _reset(env, {"responses_create_params": PARAMS, "seed": 6}, "sid-2")
            env_id = reset.info["env_id"]
            response = _response(
                {"type": "reasoning", "id": "rs_1", "summary": []}, _call("c1", "move_up"), _call("c2", "do")
            )
            first = await _step(env, {"responses_create_params": PARAMS, "response": response}, "sid-2")
            assert first.observation is None and not first.terminated
            assert first.info["actions"] == ["move_up", "do"]
            outputs = first.info["tool_outputs"]
            assert [output["call_id"] for output in outputs] == ["c1", "c2"]
            assert json.loads(outputs[1]["output"]).startswith("Ran move_up, do.")
            second = await _step(
                env, {"responses_create_params": PARAMS, "response": _response(_call("c3", "noop"))}, "sid-2"
            )
            assert (second.terminated, second.truncated) == (False, True)  # max_turns
            with pytest.raises((NotFoundError, GoneError)):  # the episode's env session is gone
                await AsyncEnv(env.client, EnvState(env_id=env_id, observation=Observation())).step("noop")
        finally:
            await env.aclose()

    asyncio.run(main())
