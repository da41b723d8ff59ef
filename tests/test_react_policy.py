"""`crafter-react`: prompt, tool, answer parsing, and whole rollouts against the loopback fake model."""

from __future__ import annotations

import json
from typing import Any

import anyio
import crafter.constants
import pytest
from support.fake_model import FakeModel, chat, error, hang, raw, text, tool_call
from support.rollouts import make_plan

from task_app.core import json_codec
from task_app.core.errors import NotConfigured
from task_app.core.outbound import open_session
from task_app.core.settings import Settings
from task_app.game import ACTIONS, Game, WorldFactory, normalise_tool_calls
from task_app.policy.base import HistoryEntry
from task_app.policy.inference import InferenceClient, InferenceLimits
from task_app.policy.prompts import build_messages, recipe_lines, system_prompt, tool_schema
from task_app.policy.react import ReactPolicy, build_react_policy, calls_from_text, parse_answer
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.plan import RolloutPlan
from task_app.tracing import build_session_trace

FAST = InferenceLimits(connect_timeout_s=2.0, read_timeout_s=5.0, max_attempts=3, backoff_s=0.01, backoff_max_s=0.05)


@pytest.fixture
def model(fake_model: FakeModel) -> FakeModel:
    """The session's fake model (tests/support/fake_model.py), reset for each test."""
    return fake_model


def _body(message: dict[str, Any], finish_reason: str = "stop") -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def _actions(calls: list[dict[str, Any]]) -> list[str]:
    return list(normalise_tool_calls(calls, 8).actions)


# --- parsing -----------------------------------------------------------------------------------------

PARSED = [
    (
        "args as JSON string",
        {"tool_calls": [_call("interact_many", '{"actions": ["move_left", "do"]}')]},
        "tool_calls",
        ["move_left", "do"],
    ),
    (
        "args as object",
        {"tool_calls": [_call("interact_many", {"actions": ["place_table"]})]},
        "tool_calls",
        ["place_table"],
    ),
    (
        "legacy function_call",
        {"function_call": {"name": "interact_many", "arguments": '{"actions": ["sleep"]}'}},
        "function_call",
        ["sleep"],
    ),
    ("interact with action", {"tool_calls": [_call("interact", {"action": "do"})]}, "tool_calls", ["do"]),
    (
        "interact with actions",
        {"tool_calls": [_call("interact", '{"actions": ["noop", "do"]}')]},
        "tool_calls",
        ["noop", "do"],
    ),
    ("action ids", {"tool_calls": [_call("interact_many", {"actions": [2, 5]})]}, "tool_calls", ["move_right", "do"]),
    ("tool named after the action", {"tool_calls": [_call("move_up", "{}")]}, "tool_calls", ["move_up"]),
    ("several calls", {"tool_calls": [_call("move_up", "{}"), _call("do", None)]}, "tool_calls", ["move_up", "do"]),
    ("some items invalid", {"tool_calls": [_call("interact_many", {"actions": ["fly", "do"]})]}, "tool_calls", ["do"]),
    ("bad call, good text", {"content": '{"actions": ["do"]}', "tool_calls": [_call("dance", "{}")]}, "text", ["do"]),
    ("text JSON", {"content": '{"actions": ["move_down", "do"]}'}, "text", ["move_down", "do"]),
    (
        "text JSON in fences",
        {"content": 'Plan:\n```json\n{"actions": ["do", "do"]}\n```\nGood luck'},
        "text",
        ["do", "do"],
    ),
    (
        "text JSON in prose",
        {"content": 'I will chop. {"actions": ["move_left", "do"], "why": "tree"} ok?'},
        "text",
        ["move_left", "do"],
    ),
    ("text JSON actions string", {"content": '{"actions": "move_up; do"}'}, "text", ["move_up", "do"]),
    (
        "text JSON tool call",
        {"content": '<tool_call>{"name": "interact_many", "arguments": {"actions": ["do"]}}</tool_call>'},
        "text",
        ["do"],
    ),
    ("actions line", {"content": "The tree is left.\nactions: move_left, do"}, "text", ["move_left", "do"]),
    ("numbered actions", {"content": "Action 1: move left\nAction 2: Do"}, "text", ["move_left", "do"]),
    (
        "last line mentions",
        {"content": "Avoid the lava on the right.\nmove_up, move_up"},
        "text",
        ["move_up", "move_up"],
    ),
    ("think block ignored", {"content": "<think>maybe move_right</think>\nactions: move_left"}, "text", ["move_left"]),
    ("content parts", {"content": [{"type": "text", "text": "actions: sleep"}]}, "text", ["sleep"]),
]


@pytest.mark.parametrize(("case", "message", "source", "actions"), PARSED, ids=[p[0] for p in PARSED])
def test_usable_answers(case: str, message: dict[str, Any], source: str, actions: list[str]) -> None:
    parsed = parse_answer(_body({"role": "assistant", **message}), 8)
    assert parsed.usable, parsed.detail
    assert parsed.parsed_from == source
    assert _actions(parsed.tool_calls) == actions


UNUSABLE = [
    ("no choices", {"choices": []}, "no_choices"),
    ("error object", {"error": {"message": "overloaded"}}, "no_choices"),
    ("no message", {"choices": [{"index": 0}]}, "no_message"),
    ("empty", _body({"role": "assistant", "content": ""}), "empty_answer"),
    ("null content", _body({"role": "assistant", "content": None, "tool_calls": []}), "empty_answer"),
    ("prose only", _body({"role": "assistant", "content": "I like trees."}), "no_actions_in_text"),
    ("think only", _body({"role": "assistant", "content": "<think>move_left or do?"}, "length"), "no_actions_in_text"),
    ("unknown tool", _body({"tool_calls": [_call("dance", "{}")]}), "invalid_tool_calls"),
    (
        "unknown actions",
        _body({"tool_calls": [_call("interact_many", {"actions": ["fly", 99]})]}),
        "invalid_tool_calls",
    ),
    ("broken arguments", _body({"tool_calls": [_call("interact_many", '{"actions": [')]}), "invalid_tool_calls"),
    ("no actions", _body({"tool_calls": [_call("interact_many", "{}")]}), "invalid_tool_calls"),
]


@pytest.mark.parametrize(("case", "body", "reason"), UNUSABLE, ids=[u[0] for u in UNUSABLE])
def test_unusable_answers(case: str, body: dict[str, Any], reason: str) -> None:
    parsed = parse_answer(body, 8)
    assert not parsed.usable
    assert parsed.tool_calls == []
    assert parsed.unusable_reason == reason
    assert parsed.detail


def test_text_fallback_is_capped_at_max_actions() -> None:
    calls = calls_from_text("actions: " + ", ".join(["do"] * 20), 8)
    assert len(calls[0]["function"]["arguments"]["actions"]) == 8


def test_finish_reason_is_reported() -> None:
    parsed = parse_answer(_body({"tool_calls": [_call("do", "{}")]}, "tool_calls"), 8)
    assert parsed.finish_reason == "tool_calls"


# --- prompt and tool ---------------------------------------------------------------------------------


def test_tool_schema() -> None:
    schema = tool_schema(8)
    assert schema["function"]["name"] == "interact_many"
    actions = schema["function"]["parameters"]["properties"]["actions"]
    assert actions["items"]["enum"] == list(ACTIONS) and len(ACTIONS) == 17
    assert (actions["minItems"], actions["maxItems"]) == (1, 8)
    assert schema["function"]["parameters"]["required"] == ["actions"]


def test_system_prompt_states_the_games_recipes() -> None:
    prompt = system_prompt(8)
    for name in ACTIONS:
        assert f"- {name}:" in prompt
    lines = recipe_lines()
    for name, info in crafter.constants.place.items():
        costs = " + ".join(f"{count} {item}" for item, count in info["uses"].items())
        assert any(line.startswith(f"- place_{name}: costs {costs}") for line in lines)
    for name, info in crafter.constants.make.items():
        assert any(line.startswith(f"- make_{name}:") and " and ".join(info["nearby"]) in line for line in lines)
    assert "- make_iron_pickaxe: costs 1 wood + 1 coal + 1 iron, near table and furnace" in lines
    assert "- stone: gives 1 stone, needs 1 wood_pickaxe; the tile becomes path" in lines
    assert "Map around you" in prompt and "Nearest" in prompt


def test_user_message_has_observation_and_history(worlds: WorldFactory) -> None:
    observation = Game(worlds.world(3)).observe()
    history = [
        HistoryEntry(0, ("move_left", "do"), ("collect_wood",), 1.0),
        HistoryEntry(1, ("noop",), (), 0.0, rejected=2),
    ]
    system, user = build_messages(observation.text, history)
    assert system["role"] == "system" and user["role"] == "user"
    assert isinstance(user["content"], str) and user["content"].startswith(observation.text)
    assert "- #1: move_left, do -> unlocked collect_wood" in user["content"]
    assert "- #2: noop -> nothing new (2 invalid action(s) ignored)" in user["content"]
    assert "none yet" in build_messages(observation.text, [])[1]["content"]


def test_vision_and_image_only_messages(worlds: WorldFactory) -> None:
    observation = Game(worlds.world(3), image_size=32).observe()
    url = observation.image_data_url
    assert url is not None
    vision = build_messages(observation.text, [], image_data_url=url, use_vision=True)[1]["content"]
    assert [part["type"] for part in vision] == ["text", "image_url"]
    assert vision[0]["text"].startswith(observation.text) and vision[1]["image_url"]["url"] == url
    only = build_messages(observation.text, [], image_data_url=url, use_vision=True, image_only=True)[1]["content"]
    assert [part["type"] for part in only] == ["text", "image_url"]
    assert observation.text not in only[0]["text"]


# --- the policy against the fake model ---------------------------------------------------------------


def _plan(fake: FakeModel, *, ops: int = 8, run_id: str = "react-1", **config: Any) -> RolloutPlan:
    safety = config.pop("safety", {"max_time_s": 60})
    return make_plan(
        inference_url=fake.url("/v1?cid=trace_react"),
        decisions=ops,
        run_id=run_id,
        env={"seed": 7},
        safety=safety,
        policy={"config": config},
    )


def _react(plan: RolloutPlan, **kwargs: Any) -> ReactPolicy:
    return build_react_policy(
        plan.policy, run_id=plan.run_id, max_actions=plan.max_actions, max_time_s=plan.max_time_s, **kwargs
    )


@pytest.mark.e2e
@pytest.mark.anyio
async def test_decide_sends_tool_request_and_reports(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(tool_call("move_left", "do"))
    plan = _plan(model)
    observation = Game(worlds.world(7)).observe()
    async with open_session(8) as http:
        policy = _react(plan, client=InferenceClient(http, FAST), settings=Settings())
        decision = await policy.decide(observation, [HistoryEntry(0, ("noop",), (), 0.0)])
        await policy.aclose()
    assert decision.usable and _actions(decision.tool_calls) == ["move_left", "do"]
    assert decision.meta["parsed_from"] == "tool_calls" and decision.meta["attempts"] == 1
    assert decision.meta["usage"] == {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132}
    assert decision.meta["model"] == "fake-model" and decision.meta["finish_reason"] == "tool_calls"
    assert "messages" not in json.dumps(decision.meta)  # meta stays small
    (request,) = model.requests
    assert request.target == "/v1/chat/completions?cid=trace_react"
    assert "authorization" not in request.headers
    body = request.body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "interact_many"}}
    assert body["parallel_tool_calls"] is False
    assert [tool["function"]["name"] for tool in body["tools"]] == ["interact_many"]
    assert (body["model"], body["temperature"], body["top_p"], body["max_tokens"]) == ("fake-model", 0.2, 0.95, 512)
    assert body["messages"][1]["content"].startswith(observation.text)
    call = decision.lm_call
    assert call is not None and call.messages == body["messages"] and call.attempts == 1
    assert call.request_params["tool_choice"] == body["tool_choice"] and "messages" not in call.request_params
    assert call.response is not None and call.assistant_message is not None
    assert call.input_tokens == 120 and call.finish_reason == "tool_calls"


@pytest.mark.e2e
@pytest.mark.anyio
async def test_decide_vision_and_api_key(model: FakeModel, worlds: WorldFactory) -> None:
    plan = _plan(model, use_vision=True, api_key="caller-key", model="gpt-5-mini")
    observation = Game(worlds.world(7), image_size=plan.image_size).observe()
    async with open_session(8) as http:
        policy = _react(plan, client=InferenceClient(http, FAST), settings=Settings())
        await policy.decide(observation, [])
    request = model.requests[0]
    assert request.headers["authorization"] == "Bearer caller-key"
    body = request.body
    assert "max_completion_tokens" in body and "temperature" not in body and "max_tokens" not in body
    assert [part["type"] for part in body["messages"][1]["content"]] == ["text", "image_url"]


@pytest.mark.e2e
@pytest.mark.anyio
async def test_text_and_garbage_answers(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(text("actions: move_right, do"), raw(b"<html>oops"), chat({"role": "assistant", "content": "hm"}))
    observation = Game(worlds.world(7)).observe()
    async with open_session(8) as http:
        policy = _react(_plan(model), client=InferenceClient(http, FAST), settings=Settings())
        from_text = await policy.decide(observation, [])
        garbage = await policy.decide(observation, [])
        prose = await policy.decide(observation, [])
    assert from_text.usable and from_text.meta["parsed_from"] == "text"
    assert from_text.tool_calls[0]["function"]["name"] == "interact_many"
    assert (garbage.usable, garbage.tool_calls, garbage.meta["unusable_reason"]) == (False, [], "invalid_json")
    assert garbage.lm_call is not None and garbage.lm_call.error == "invalid_json"
    assert (prose.usable, prose.meta["unusable_reason"]) == (False, "no_actions_in_text")


@pytest.mark.anyio
async def test_provider_without_key_is_refused() -> None:
    plan = make_plan(
        ops=["agent"], policy={"policy_name": "crafter-react", "config": {"provider": "openai", "model": "gpt-4o-mini"}}
    )
    async with open_session(8) as http:
        client = InferenceClient(http, FAST)
        with pytest.raises(NotConfigured) as caught:
            _react(plan, client=client, settings=Settings())
        assert caught.value.code == "missing_openai_api_key"
        policy = _react(plan, client=client, settings=Settings(openai_api_key="sk-x"))  # type: ignore[arg-type]
    assert isinstance(policy, ReactPolicy) and policy.target.url == "https://api.openai.com/v1/chat/completions"


# --- whole rollouts ----------------------------------------------------------------------------------


async def _run(plan: RolloutPlan, worlds: WorldFactory, limits: InferenceLimits = FAST, **engine: Any) -> Any:
    async with open_session(8) as http:
        start = anyio.current_time()
        deadline = start + plan.max_time_s
        policy = _react(plan, client=InferenceClient(http, limits), settings=Settings(), deadline=deadline)
        result = await RolloutEngine(plan, policy, worlds, deadline=deadline, **engine).run()
        return result, anyio.current_time() - start


@pytest.mark.e2e
@pytest.mark.anyio
async def test_rollout_completes(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(tool_call("move_left", "move_left"), text('```json\n{"actions": ["do"]}\n```'), tool_call("noop"))
    model.default = tool_call("move_up", "do")
    result, _ = await _run(_plan(model, ops=5), worlds)
    assert result.stop_reason == "completed" and not result.aborted
    assert len(result.records) == 5 and len(model.requests) == 5
    assert list(result.records[0].plan.actions) == ["move_left", "move_left"]
    assert result.records[1].decision.meta["parsed_from"] == "text"
    assert list(result.records[4].plan.actions) == ["move_up", "do"]
    info = result.records[0].step_info()
    assert info["meta"]["model"] == "fake-model" and info["meta"]["parsed_from"] == "tool_calls"
    # the second request carries the first decision in its history
    assert "- #1: move_left, move_left" in model.requests[1].body["messages"][1]["content"]


@pytest.mark.e2e
@pytest.mark.anyio
async def test_tool_call_arguments_are_parsed_once_a_decision(
    model: FakeModel, worlds: WorldFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy parses each call's `arguments` text; the engine plays the policy's `ActionPlan` and the
    trace records the parsed value: no other reading of that text, from the answer to the stored trace."""
    readings: list[str] = []
    real_loads = json_codec.loads

    def counting_loads(data: str | bytes, **options: Any) -> Any:
        if isinstance(data, str) and data.startswith('{"actions"'):
            readings.append(data)
        return real_loads(data, **options)

    monkeypatch.setattr(json_codec, "loads", counting_loads)
    model.script(tool_call("move_left", "do"), tool_call("noop"), tool_call("move_up"))
    result, _ = await _run(_plan(model, ops=3), worlds)
    trace = build_session_trace(result)
    assert [list(record.plan.actions) for record in result.records] == [["move_left", "do"], ["noop"], ["move_up"]]
    assert readings == ['{"actions": ["move_left", "do"]}', '{"actions": ["noop"]}', '{"actions": ["move_up"]}']
    call_records = [
        event["call_records"][0]
        for step in trace["session_time_steps"]
        for event in step["events"]
        if event.get("call_records")
    ]
    assert [record["output_tool_calls"][0]["arguments"] for record in call_records] == [
        {"actions": ["move_left", "do"]},
        {"actions": ["noop"]},
        {"actions": ["move_up"]},
    ]


@pytest.mark.e2e
@pytest.mark.anyio
async def test_three_unusable_answers_stop_the_rollout(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(tool_call("do"), text("I am thinking."), raw(b"nope"), tool_call("dance"))
    result, _ = await _run(_plan(model, ops=6), worlds)
    assert result.stop_reason == "policy_unusable" and result.aborted
    assert result.unusable_answers == 3 and len(model.requests) == 4
    # the unusable answers before the stop played noops
    assert [list(record.plan.actions) for record in result.records] == [["do"], ["noop"], ["noop"]]
    assert result.records[1].step_info()["meta"]["unusable_reason"] == "no_actions_in_text"


@pytest.mark.e2e
@pytest.mark.anyio
async def test_model_server_refusal_stops_with_policy_error(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(tool_call("do"), error(401))
    result, _ = await _run(_plan(model, ops=4), worlds)
    assert result.stop_reason == "policy_error"
    assert result.error == {"code": "inference_http_error", "message": result.error["message"], "status": 401}
    assert len(result.records) == 1


@pytest.mark.e2e
@pytest.mark.anyio
async def test_hanging_model_cannot_outlive_the_rollout(model: FakeModel, worlds: WorldFactory) -> None:
    model.script(tool_call("do"))
    model.default = hang()
    plan = _plan(model, ops=4, safety={"max_time_s": 1.5})
    result, elapsed = await _run(plan, worlds)
    assert result.aborted and result.stop_reason == "deadline" and result.error is None
    assert len(result.records) == 1
    assert elapsed < 2.5


def test_pathological_text_is_bounded() -> None:
    assert calls_from_text("[" * 200_000, 8) == []
    parsed = parse_answer(_body({"role": "assistant", "content": "{" * 50_000 + "\nactions: do"}), 8)
    assert parsed.usable and _actions(parsed.tool_calls) == ["do"]
