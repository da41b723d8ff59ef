"""Exact tokens (`record.logprobs` / `policy.config.logprobs`): what each server is asked for, what its answer
says, and that the ids and logprobs reach the response, the stored trace and `traces export --format tokens`
exactly as the server sent them; bad token data is refused for its decision with a precise reason.

End to end against the loopback fake model in its vLLM, SGLang and OpenAI modes (tests/support/fake_model.py).
"""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel, huge, json_body, tool_call
from support.rollouts import post_rollout, request_body
from support.servers import AppServer

from task_app.cli.main import main
from task_app.policy.providers import PROVIDER_CUSTOM, PROVIDER_GROQ, PROVIDER_OPENAI
from task_app.policy.sampled_tokens import MAX_TOKEN_IDS, TokenData, read_tokens, request_fields

pytestmark = pytest.mark.usefixtures("no_key_in_logs")

OPENAI_KEY = "sk-fake-VqWzXbNmKp"
VLLM_FIELDS = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True}
TOKEN_KEYS = {
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "completion_tokens",
    "finish_reason",
    "model",
    "tokens_missing",
    "tokens_missing_reason",
}


def react(
    model: FakeModel, decisions: int = 2, *, record: dict[str, Any] | None = None, **config: Any
) -> dict[str, Any]:
    body = request_body(
        run_id=f"tokens-{uuid.uuid4().hex[:10]}",
        ops=["agent", "env"] * decisions,
        policy={"policy_name": "crafter-react"},
        record=record or {},
    )
    body["policy"]["config"] = {
        "model": "fake-model",
        "inference_url": model.url(),
        "max_llm_calls": decisions,
        **config,
    }
    return body


def served_tokens(answer: dict[str, Any]) -> dict[str, Any]:
    """What `info.tokens` must say for a fake vLLM answer: its own ids and logprobs, untouched."""
    choice = answer["choices"][0]
    return {
        "prompt_token_ids": answer["prompt_token_ids"],
        "completion_token_ids": choice["token_ids"],
        "completion_logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]],
        "completion_tokens": None,
        "finish_reason": choice["finish_reason"],
        "model": answer["model"],
        "tokens_missing": False,
        "tokens_missing_reason": None,
    }


def export_tokens(server: AppServer, out: Path, run_id: str) -> list[dict[str, Any]]:
    code = main(["traces", "--db", str(server.settings.traces_db), "export", "--format", "tokens", "-o", str(out)])
    assert code == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return [line for line in lines if line["run_id"] == run_id]


# --- what each server is asked for -------------------------------------------------------------------


def test_request_fields_per_server() -> None:
    assert request_fields(PROVIDER_CUSTOM, "Qwen/Qwen3-4B") == VLLM_FIELDS
    assert request_fields(PROVIDER_OPENAI, "gpt-4o-mini") == {"logprobs": True, "top_logprobs": 0}
    assert request_fields(PROVIDER_OPENAI, "gpt-5-mini") == {}  # reasoning models refuse logprobs
    assert request_fields(PROVIDER_GROQ, "qwen/qwen3-32b") == {}


# --- reading an answer -------------------------------------------------------------------------------


def _answer(choice: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"model": "served-name", "choices": [{"index": 0, "finish_reason": "stop", **choice}], **top}


def _content(*tokens: str, logprob: Any = -0.5) -> dict[str, Any]:
    return {"content": [{"token": token, "logprob": logprob, "bytes": None, "top_logprobs": []} for token in tokens]}


def test_vllm_answer_with_ids_and_spelled_tokens() -> None:
    data = read_tokens(
        _answer({"token_ids": [7, 8], "logprobs": _content("token_id:7", "token_id:8")}, prompt_token_ids=[1, 2, 3])
    )
    assert data == TokenData([1, 2, 3], [7, 8], [-0.5, -0.5], None, "stop", "served-name", False, None)
    assert data.logprob == -1.0


def test_vllm_answer_with_spelled_tokens_only_gives_the_ids() -> None:
    data = read_tokens(_answer({"logprobs": _content("token_id:42", "token_id:0")}, prompt_token_ids=[5]))
    assert data.completion_token_ids == [42, 0] and not data.tokens_missing


def test_sglang_answer_keeps_its_ids_on_the_choice_and_its_text_pieces() -> None:
    data = read_tokens(_answer({"prompt_token_ids": [9, 9], "token_ids": [3], "logprobs": _content("Hi")}))
    assert (data.prompt_token_ids, data.completion_token_ids, data.completion_tokens) == ([9, 9], [3], ["Hi"])
    assert not data.tokens_missing


def test_openai_answer_has_no_ids_and_says_so() -> None:
    data = read_tokens(_answer({"logprobs": _content("Hel", "lo")}))
    assert data.tokens_missing and data.completion_tokens == ["Hel", "lo"] and data.logprob == -1.0
    assert data.tokens_missing_reason == (
        "the server sent no completion token ids (choices[0].token_ids), no prompt token ids (prompt_token_ids)"
    )


def test_an_answer_without_token_data_is_missing_everything() -> None:
    data = read_tokens(_answer({"message": {"role": "assistant", "content": "x"}}))
    assert data.tokens_missing and data.completion_logprobs is None and data.logprob is None
    assert "no logprobs" in str(data.tokens_missing_reason) and "no prompt token ids" in str(data.tokens_missing_reason)


BAD = [
    (
        {"token_ids": [1, 2, 3], "logprobs": _content("a", "b")},
        "choices[0].token_ids has 3 entries but choices[0].logprobs.content has 2",
    ),
    ({"token_ids": [1, 2.5]}, "choices[0].token_ids[1] is 2.5, not a non-negative integer"),
    ({"token_ids": [1, True]}, "choices[0].token_ids[1] is True, not a non-negative integer"),
    ({"token_ids": [-4]}, "choices[0].token_ids[0] is -4, not a non-negative integer"),
    ({"token_ids": ["12"]}, "choices[0].token_ids[0] is '12', not a non-negative integer"),
    ({"token_ids": "1 2"}, "choices[0].token_ids is not a list"),
    ({"prompt_token_ids": [1, None]}, "choices[0].prompt_token_ids[1] is None, not a non-negative integer"),
    ({"logprobs": _content("a", logprob="-1")}, "choices[0].logprobs.content[0].logprob is '-1', not a finite number"),
    ({"logprobs": _content("a", logprob=float("nan"))}, "choices[0].logprobs.content[0].logprob is nan"),
    ({"logprobs": {"content": [{"logprob": -1}]}}, "choices[0].logprobs.content[0].token is not a string"),
    (
        {"token_ids": [5, 6], "logprobs": _content("token_id:5", "token_id:7")},
        "choices[0].logprobs.content[1].token is 'token_id:7' but choices[0].token_ids[1] is 6",
    ),
]


@pytest.mark.parametrize(("choice", "reason"), BAD, ids=[reason[:40] for _, reason in BAD])
def test_bad_token_data_is_refused_with_a_precise_reason(choice: dict[str, Any], reason: str) -> None:
    top = {} if "prompt_token_ids" in choice else {"prompt_token_ids": [1]}
    data = read_tokens(_answer(choice, **top))
    assert data.tokens_missing and data.tokens_missing_reason is not None
    assert data.tokens_missing_reason.startswith("invalid token data: ")
    assert reason in data.tokens_missing_reason
    assert (data.prompt_token_ids, data.completion_token_ids, data.completion_logprobs) == (None, None, None)
    assert data.finish_reason == "stop" and data.model == "served-name"


def test_more_completion_tokens_than_the_request_allowed_is_refused() -> None:
    data = read_tokens(_answer({"token_ids": list(range(17))}, prompt_token_ids=[1]), max_completion_tokens=16)
    assert data.tokens_missing_reason == (
        "invalid token data: choices[0].token_ids has 17 entries, more than the 16 tokens the request allowed"
    )
    overlong = read_tokens(_answer({}, prompt_token_ids=[0] * (MAX_TOKEN_IDS + 1)))
    assert "more than the 1048576 kept" in str(overlong.tokens_missing_reason)


# --- end to end: vLLM -------------------------------------------------------------------------------


@pytest.mark.e2e
def test_vllm_tokens_reach_the_response_the_trace_and_the_export(
    app_server: AppServer, client: httpx.Client, fake_model: FakeModel, tmp_path: Path
) -> None:
    fake_model.tokens = "vllm"
    fake_model.default = tool_call("move_left", "do")
    body = react(fake_model, 3, record={"logprobs": True, "return_trace": True, "trace_format": "structured"})
    result = post_rollout(client, body)
    assert [request.body | VLLM_FIELDS == request.body for request in fake_model.requests] == [True] * 3
    (trajectory,) = result["trajectories"]
    expected = [served_tokens(answer) for answer in fake_model.answers]
    assert [step["info"]["tokens"] for step in trajectory["steps"]] == expected
    assert [sample["tokens"] for sample in trajectory["decision_samples"]] == expected
    for step, tokens in zip(trajectory["steps"], expected, strict=True):
        assert step["logprob"] == pytest.approx(math.fsum(tokens["completion_logprobs"]))
        assert step["logprob"] < 0
    # the trace the response carries and the one the store kept
    traced = [step["events"][0]["call_records"][0]["token_traces"] for step in result["trace"]["session_time_steps"]]
    assert traced == [[tokens] for tokens in expected]
    exported = export_tokens(app_server, tmp_path / "tokens.jsonl", body["run_id"])
    assert [record["turn"] for record in exported] == [0, 1, 2]
    for record, tokens, request in zip(exported, expected, fake_model.requests, strict=True):
        assert {key: record[key] for key in TOKEN_KEYS - {"model"}} == {
            key: tokens[key] for key in TOKEN_KEYS - {"model"}
        }
        assert (record["model"], record["server_model"], record["usable"]) == ("fake-model", "fake-model", True)
        assert record["messages"] == request.body["messages"]
        assert json.loads(record["assistant"]["tool_calls"][0]["function"]["arguments"]) == {
            "actions": ["move_left", "do"]
        }


@pytest.mark.e2e
def test_policy_config_switch_asks_for_tokens_too(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    result = post_rollout(client, react(fake_model, 1, logprobs=True))
    (step,) = result["trajectories"][0]["steps"]
    assert step["info"]["tokens"] == served_tokens(fake_model.answers[0])


@pytest.mark.e2e
def test_without_logprobs_nothing_is_asked_and_nothing_added(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    result = post_rollout(client, react(fake_model, 2, record={"return_trace": True, "trace_format": "structured"}))
    assert not set(VLLM_FIELDS) & set(fake_model.requests[0].body)
    for step in result["trajectories"][0]["steps"]:
        assert "logprob" not in step and "tokens" not in step["info"]
    assert result["trajectories"][0]["decision_samples"] is None
    assert all(
        step["events"][0]["call_records"][0]["token_traces"] is None for step in result["trace"]["session_time_steps"]
    )


@pytest.mark.e2e
def test_compact_traces_stay_compact(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    result = post_rollout(client, react(fake_model, 2, record={"logprobs": True, "return_trace": True}))
    trace = json.dumps(result["trace"])
    assert "token_ids" not in trace and "logprobs" not in trace
    assert set(result["trace"]) == {
        "session_id",
        "created_at",
        "metadata",
        "events_count",
        "messages_count",
        "lm_calls",
        "decision_rewards",
    }


@pytest.mark.e2e
def test_a_server_that_sends_no_tokens_marks_each_decision(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = None  # a plain OpenAI-compatible server that ignores the token fields
    result = post_rollout(client, react(fake_model, 2, record={"logprobs": True}))
    assert [set(VLLM_FIELDS) <= set(request.body) for request in fake_model.requests] == [True, True]  # asked
    steps = result["trajectories"][0]["steps"]
    assert len(steps) == 2
    for step in steps:
        tokens = step["info"]["tokens"]
        assert tokens["tokens_missing"] is True and step["logprob"] is None
        assert tokens["tokens_missing_reason"] == (
            "the server sent no logprobs (choices[0].logprobs.content), no completion token ids "
            "(choices[0].token_ids), no prompt token ids (prompt_token_ids)"
        )
        assert tokens["finish_reason"] == "tool_calls" and tokens["model"] == "fake-model"


@pytest.mark.e2e
def test_sglang_tokens_with_its_prompt_field_in_extra_body(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "sglang"
    body = react(fake_model, 1, record={"logprobs": True}, extra_body={"return_prompt_token_ids": True})
    (step,) = post_rollout(client, body)["trajectories"][0]["steps"]
    choice = fake_model.answers[0]["choices"][0]
    tokens = step["info"]["tokens"]
    assert tokens["prompt_token_ids"] == choice["prompt_token_ids"] and tokens["tokens_missing"] is False
    assert tokens["completion_token_ids"] == choice["token_ids"]
    assert tokens["completion_tokens"] == [entry["token"] for entry in choice["logprobs"]["content"]]


@pytest.mark.e2e
def test_bad_token_data_costs_only_that_decisions_tokens(client: httpx.Client, fake_model: FakeModel) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "interact_many", "arguments": '{"actions": ["move_up"]}'},
    }
    choice = {
        "message": {"role": "assistant", "tool_calls": [call]},
        "finish_reason": "tool_calls",
        "token_ids": [4, 5, 6],
        "logprobs": _content("token_id:4", "token_id:5"),
    }
    bad = {"model": "fake-model", "prompt_token_ids": [1, 2], "choices": [{"index": 0, **choice}]}
    fake_model.tokens = "vllm"
    fake_model.script(json_body(bad))
    result = post_rollout(client, react(fake_model, 2, record={"logprobs": True}))
    first, second = result["trajectories"][0]["steps"]
    assert first["info"]["meta"]["actions"] == ["move_up"]  # the decision itself played
    assert first["info"]["tokens"]["tokens_missing"] is True and first["logprob"] is None
    assert first["info"]["tokens"]["tokens_missing_reason"] == (
        "invalid token data: choices[0].token_ids has 3 entries but choices[0].logprobs.content has 2"
    )
    assert second["info"]["tokens"]["tokens_missing"] is False
    assert result["metrics"]["details"]["stop_reason"] == "completed"


@pytest.mark.e2e
def test_a_50_mb_logprobs_list_is_refused_for_its_decision(client: httpx.Client, fake_model: FakeModel) -> None:
    entry = b'{"token": "token_id:17", "logprob": -0.25, "bytes": null, "top_logprobs": []}, '
    head = b'{"model": "fake-model", "choices": [{"index": 0, "finish_reason": "stop", "logprobs": {"content": ['
    fake_model.tokens = "vllm"
    fake_model.script(huge(50 * 1024 * 1024, head=head, unit=entry, tail=b"]}}]}"))
    result = post_rollout(client, react(fake_model, 2, record={"logprobs": True}))
    first, second = result["trajectories"][0]["steps"]
    assert first["info"]["meta"]["unusable_reason"] == "response_too_large"
    assert first["info"]["tokens"]["tokens_missing"] is True
    assert "longer than 8388608 bytes" in first["info"]["tokens"]["tokens_missing_reason"]
    assert second["info"]["tokens"]["tokens_missing"] is False


@pytest.mark.e2e
def test_a_logprobs_list_longer_than_max_tokens_is_refused(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.tokens = "vllm"
    fake_model.default = tool_call(*["move_left"] * 8)  # the stand-in tokenizer makes ~40 completion tokens
    result = post_rollout(client, react(fake_model, 1, record={"logprobs": True}, max_tokens=16))
    (step,) = result["trajectories"][0]["steps"]
    reason = step["info"]["tokens"]["tokens_missing_reason"]
    assert reason.startswith("invalid token data: choices[0].token_ids has ") and reason.endswith(
        "more than the 16 tokens the request allowed"
    )


# --- end to end: OpenAI ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_openai_gets_only_its_own_fields_and_gives_token_strings(make_app_server: Any, fake_model: FakeModel) -> None:
    server = make_app_server(openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY)
    fake_model.tokens = "openai"  # refuses vLLM's fields with a 400, as OpenAI does
    body = react(fake_model, 2, record={"logprobs": True})
    body["policy"]["config"] = {"provider": "openai", "model": "gpt-4o-mini", "max_llm_calls": 2}
    result = post_rollout(server.client(), body)
    assert result["metrics"]["details"]["stop_reason"] == "completed"
    sent = fake_model.requests[0].body
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 0) and "return_token_ids" not in sent
    for step, answer in zip(result["trajectories"][0]["steps"], fake_model.answers, strict=True):
        content = answer["choices"][0]["logprobs"]["content"]
        tokens = step["info"]["tokens"]
        assert tokens["completion_tokens"] == [entry["token"] for entry in content]
        assert tokens["completion_logprobs"] == [entry["logprob"] for entry in content]
        assert tokens["completion_token_ids"] is None and tokens["prompt_token_ids"] is None
        assert tokens["tokens_missing"] is True and "no completion token ids" in tokens["tokens_missing_reason"]
        assert step["logprob"] == pytest.approx(math.fsum(tokens["completion_logprobs"]))


@pytest.mark.e2e
def test_an_openai_reasoning_model_is_not_asked(make_app_server: Any, fake_model: FakeModel) -> None:
    server = make_app_server(openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY)
    fake_model.tokens = "openai"
    body = react(fake_model, 1, record={"logprobs": True})
    body["policy"]["config"] = {"provider": "openai", "model": "gpt-5-mini", "max_llm_calls": 1}
    (step,) = post_rollout(server.client(), body)["trajectories"][0]["steps"]
    assert "logprobs" not in fake_model.requests[0].body
    assert step["info"]["tokens"]["tokens_missing_reason"] == "OpenAI's reasoning model gpt-5-mini returns no logprobs"
