"""`policy.config.history: "messages"`: one growing conversation per episode (system, user observation, assistant
tool call, tool result with the next observation, ...), its turn and byte budget, its reset on a new episode,
and the token ids of every turn; the unit, then whole rollouts against the loopback fake model.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel, fake_ids, raw, text, tool_call
from support.rollouts import make_plan, request_body

from task_app.core.errors import InvalidRequest
from task_app.policy.conversation import DROPPED_NOTE, Conversation

pytestmark = pytest.mark.usefixtures("no_key_in_logs")


def answer(call_id: str | None, *actions: str) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "interact_many", "arguments": {"actions": list(actions)}}}
    return {"role": "assistant", "content": None, "tool_calls": [{**call, **({"id": call_id} if call_id else {})}]}


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [message["role"] for message in messages]


# --- the unit ------------------------------------------------------------------------------------------


def test_turns_alternate_and_results_answer_their_tool_calls() -> None:
    chat = Conversation("rules", max_turns=10, max_bytes=1 << 20)
    first, trim = chat.request("obs 0")
    assert first == [{"role": "system", "content": "rules"}, {"role": "user", "content": "obs 0"}]
    assert trim.as_dict() == {
        "mode": "messages",
        "turns": 0,
        "bytes": trim.bytes,
        "dropped_turns": 0,
        "dropped_turns_total": 0,
    }
    chat.answered(answer("call_a", "do"))
    second, trim = chat.request("ran do\n\nobs 1")
    assert roles(second) == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0] == {
        "id": "call_a",
        "type": "function",
        "function": {"name": "interact_many", "arguments": '{"actions":["do"]}'},  # arguments as JSON text
    }
    assert second[3] == {"role": "tool", "tool_call_id": "call_a", "content": "ran do\n\nobs 1"}
    chat.answered({"role": "assistant", "content": '{"actions": ["noop"]}'})  # a text answer, no tool call
    third, _ = chat.request("obs 2")
    assert roles(third) == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert third[4] == {"role": "assistant", "content": '{"actions": ["noop"]}'}


def test_a_missing_call_id_is_made_up_and_each_call_gets_its_result() -> None:
    chat = Conversation("rules", max_turns=10, max_bytes=1 << 20)
    chat.request("obs 0")
    two_calls = answer(None, "do")
    two_calls["tool_calls"].append({"id": "call_b", "type": "function", "function": {"name": "do", "arguments": "{}"}})
    chat.answered(two_calls)
    messages, _ = chat.request("obs 1")
    ids = [call["id"] for call in messages[2]["tool_calls"]]
    assert ids == ["call_0_0", "call_b"]
    assert [(m["role"], m.get("tool_call_id")) for m in messages[3:]] == [("tool", "call_0_0"), ("tool", "call_b")]
    assert messages[3]["content"] == "obs 1" and messages[4]["content"] == "(see the first call's result)"


def test_an_answer_that_never_came_keeps_its_prompt_open() -> None:
    chat = Conversation("rules", max_turns=10, max_bytes=1 << 20)
    chat.request("obs 0")
    chat.answered(None)  # the server's reply was not JSON
    messages, _ = chat.request("obs 1")
    assert messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "obs 0\n\nobs 1"}]


def test_the_turn_budget_drops_the_oldest_turns_and_says_so() -> None:
    chat = Conversation("rules", max_turns=2, max_bytes=1 << 20)
    for index in range(4):
        chat.request(f"obs {index}")
        chat.answered(answer(f"c{index}", "do"))
    messages, trim = chat.request("obs 4")
    assert (trim.turns, trim.dropped_turns, trim.dropped_turns_total) == (2, 1, 2)  # one dropped per turn over
    assert roles(messages) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert messages[1]["content"] == DROPPED_NOTE.format(n=2) + "\n\nobs 2"
    assert messages[2]["tool_calls"][0]["id"] == "c2" and messages[-1]["content"] == "obs 4"
    _, again = chat.request("obs 4")  # asking again drops nothing more
    assert again.dropped_turns == 0 and again.dropped_turns_total == 2


def test_the_byte_budget_drops_turns_until_the_request_fits() -> None:
    chat = Conversation("rules", max_turns=100, max_bytes=2000)
    for index in range(10):
        chat.request(f"obs {index} " + "x" * 300)
        chat.answered(answer(f"c{index}", "do"))
    messages, trim = chat.request("obs 10")
    assert trim.bytes <= 2000 and trim.dropped_turns_total == 10 - trim.turns and trim.turns >= 1
    assert sum(len(json.dumps(message, separators=(",", ":"))) for message in messages) == trim.bytes


def test_reset_starts_a_new_conversation() -> None:
    chat = Conversation("rules", max_turns=1, max_bytes=1 << 20)
    for index in range(3):
        chat.request(f"obs {index}")
        chat.answered(answer(f"c{index}", "do"))
    chat.reset()
    messages, trim = chat.request("new episode")
    assert messages == [{"role": "system", "content": "rules"}, {"role": "user", "content": "new episode"}]
    assert trim.dropped_turns_total == 0


def test_messages_mode_is_text_only() -> None:
    config = {"model": "m", "inference_url": "http://127.0.0.1:9/v1", "history": "messages", "use_vision": True}
    with pytest.raises(InvalidRequest) as caught:
        make_plan(policy={"policy_name": "crafter-react", "config": config})
    assert caught.value.code == "invalid_policy_config" and "text-only" in caught.value.message
    with pytest.raises(InvalidRequest):
        make_plan(policy={"policy_name": "crafter-react", "config": {**config, "use_vision": False, "history": "chat"}})


# --- whole rollouts ------------------------------------------------------------------------------------


def react(model: FakeModel, decisions: int, **overrides: Any) -> dict[str, Any]:
    config = {"model": "fake-model", "inference_url": model.url(), "max_llm_calls": decisions, "history": "messages"}
    config.update(overrides.pop("config", {}))
    body = request_body(
        run_id=f"chat-{uuid.uuid4().hex[:10]}",
        ops=["agent", "env"] * decisions,
        policy={"policy_name": "crafter-react"},
        **overrides,
    )
    body["policy"]["config"] = config
    return body


def rollout(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.e2e
def test_one_conversation_per_episode_with_results_and_observations(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.script(tool_call("move_left", "do"), text('{"actions": ["move_up"]}'), raw(b"not json"))
    fake_model.default = tool_call("noop")
    result = rollout(client, react(fake_model, 5))
    steps = result["trajectories"][0]["steps"]
    sent = [request.body["messages"] for request in fake_model.requests]
    assert [roles(messages) for messages in sent] == [
        ["system", "user"],
        ["system", "user", "assistant", "tool"],
        ["system", "user", "assistant", "tool", "assistant", "user"],  # the text answer had no tool call
        ["system", "user", "assistant", "tool", "assistant", "user"],  # no answer came: the prompt stays open
        ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"],
    ]
    # every prompt shows the observation the step started from; results name what ran
    for messages, step in zip(sent, steps, strict=True):
        assert step["obs"]["text"] in messages[-1]["content"]
    assert sent[1][3]["content"].startswith("Executed: move_left, do -> ")
    assert sent[1][3]["tool_call_id"] == fake_model.answers[0]["choices"][0]["message"]["tool_calls"][0]["id"]
    assert sent[2][-1]["content"].startswith("Executed: move_up -> ")
    assert sent[3][-1]["content"].count("Executed: ") == 2 and sent[3][-1]["content"].startswith(sent[2][-1]["content"])
    # the whole conversation is what the next request repeats, turn by turn
    assert sent[4][: len(sent[3])] == sent[3][:-1] + [sent[4][len(sent[3]) - 1]]
    histories = [step["info"]["meta"]["history"] for step in steps]
    assert [history["turns"] for history in histories] == [0, 1, 2, 2, 3]
    assert all(history["dropped_turns"] == 0 for history in histories)


@pytest.mark.e2e
def test_the_budget_drops_old_turns_and_the_step_says_so(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = tool_call("move_left")
    result = rollout(client, react(fake_model, 5, config={"history_max_turns": 2}))
    histories = [step["info"]["meta"]["history"] for step in result["trajectories"][0]["steps"]]
    assert [(h["turns"], h["dropped_turns"], h["dropped_turns_total"]) for h in histories] == [
        (0, 0, 0),
        (1, 0, 0),
        (2, 0, 0),
        (2, 1, 1),
        (2, 1, 2),
    ]
    last = fake_model.requests[-1].body["messages"]
    assert roles(last) == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[1]["content"].startswith(DROPPED_NOTE.format(n=2))


@pytest.mark.e2e
def test_a_new_episode_starts_a_new_conversation(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = tool_call("move_left", "noop")  # two steps per decision: an episode of 6 steps is 3 decisions
    result = rollout(client, react(fake_model, 5, env={"config": {"length": 6}}, on_done="reset"))
    episodes = [step["info"]["meta"]["episode"] for step in result["trajectories"][0]["steps"]]
    assert episodes == [0, 0, 0, 1, 1]
    sent = [request.body["messages"] for request in fake_model.requests]
    assert [len(messages) for messages in sent] == [2, 4, 6, 2, 4]
    assert "Step 0/6" in sent[3][1]["content"] and "Executed" not in sent[3][1]["content"]


@pytest.mark.e2e
def test_every_turn_carries_its_token_ids(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    fake_model.default = tool_call("move_left", "do")
    result = rollout(client, react(fake_model, 3, record={"logprobs": True}))
    prompts = []
    for step, request in zip(result["trajectories"][0]["steps"], fake_model.requests, strict=True):
        tokens = step["info"]["tokens"]
        assert tokens["prompt_token_ids"] == fake_ids(json.dumps(request.body["messages"]))  # the whole chat so far
        assert tokens["tokens_missing"] is False and tokens["completion_token_ids"]
        prompts.append(len(tokens["prompt_token_ids"]))
    assert prompts == sorted(prompts) and prompts[0] < prompts[-1]


@pytest.mark.e2e
def test_the_trace_keeps_each_decisions_own_prompt(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = tool_call("move_left")
    body = react(fake_model, 2, record={"return_trace": True, "trace_format": "structured"})
    result = rollout(client, body)
    assert result["metrics"]["details"]["storage"]["trace"] == {"stored": True}
    first, second = result["trace"]["session_time_steps"]
    types = [[message["message_type"] for message in step["markov_blanket_messages"]] for step in (first, second)]
    assert types == [["system", "user", "assistant", "assistant"], ["system", "tool_result", "assistant", "assistant"]]
    prompt = second["markov_blanket_messages"][1]["content"]["text"]
    assert prompt == fake_model.requests[1].body["messages"][-1]["content"] and prompt.startswith("Executed: ")
    inputs = second["events"][0]["call_records"][0]["input_messages"]
    assert [message["role"] for message in inputs] == ["system", "user", "assistant", "tool"]
