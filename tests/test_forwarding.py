"""What the trainer sends goes through: sampling parameters and `policy.config.extra_body` reach the trainer's own
inference server verbatim, in the documented precedence; vendor routes keep their parameter rules and refuse
`extra_body` up front.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel
from support.rollouts import make_plan, request_body

from task_app.core.errors import InvalidRequest

pytestmark = pytest.mark.usefixtures("no_key_in_logs")


def react(model: FakeModel, **config: Any) -> dict[str, Any]:
    body = request_body(
        run_id=f"fwd-{uuid.uuid4().hex[:10]}", ops=["agent", "env"], policy={"policy_name": "crafter-react"}
    )
    body["policy"]["config"] = {"model": "fake-model", "inference_url": model.url(), "max_llm_calls": 1, **config}
    return body


def sent(client: httpx.Client, model: FakeModel, body: dict[str, Any]) -> dict[str, Any]:
    """POST the rollout; the body the model server received."""
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    (request,) = model.requests
    received: dict[str, Any] = request.body
    return received


@pytest.mark.e2e
def test_extra_body_reaches_the_trainers_server_verbatim(client: httpx.Client, fake_model: FakeModel) -> None:
    extra = {
        "required_prefix_token_ids": [151644, 77091, 198],
        "chat_template_kwargs": {"enable_thinking": False},
        "priority": -3,
        "vllm_xargs": {"nested": [1, {"deep": None}], "ratio": 0.125},
    }
    received = sent(client, fake_model, react(fake_model, extra_body=extra))
    assert {key: received[key] for key in extra} == extra
    assert received["tool_choice"] == {"type": "function", "function": {"name": "interact_many"}}  # the app's own


@pytest.mark.e2e
def test_self_hosted_sampling_parameters_are_forwarded(client: httpx.Client, fake_model: FakeModel) -> None:
    params = {"top_k": 20, "min_p": 0.05, "seed": 7, "stop_token_ids": [151645], "repetition_penalty": 1.05}
    received = sent(client, fake_model, react(fake_model, temperature=0.6, top_p=0.8, max_tokens=300, **params))
    assert {key: received[key] for key in params} == params
    assert (received["temperature"], received["top_p"], received["max_tokens"]) == (0.6, 0.8, 300)


@pytest.mark.e2e
def test_precedence_extra_body_over_typed_fields_over_token_defaults(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    body = react(
        fake_model,
        logprobs=True,
        temperature=0.7,
        top_logprobs=3,  # a typed/forwarded field beats the exact-token default (0)
        extra_body={"temperature": 0.0, "return_tokens_as_token_ids": False},  # extra_body beats both
    )
    received = sent(client, fake_model, body)
    assert received["temperature"] == 0.0 and received["top_logprobs"] == 3
    assert received["return_tokens_as_token_ids"] is False and received["return_token_ids"] is True


@pytest.mark.parametrize("field", ["messages", "tools", "tool_choice", "model", "stream", "parallel_tool_calls"])
def test_extra_body_cannot_replace_what_the_app_builds(field: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_plan(policy={"policy_name": "crafter-react", "config": _react_config(extra_body={field: None})})
    assert caught.value.code == "invalid_policy_config"
    assert f"extra_body cannot set {field}: the task app builds those" in caught.value.message


def _react_config(**config: Any) -> dict[str, Any]:
    return {"model": "m", "inference_url": "http://127.0.0.1:9/v1", **config}


@pytest.mark.parametrize(
    "config",
    [
        {"model": "gpt-4o-mini", "provider": "openai", "extra_body": {"top_k": 5}},
        {"model": "gpt-4o-mini", "inference_url": "https://api.openai.com/v1", "extra_body": {"top_k": 5}},
        {"model": "qwen/qwen3-32b", "provider": "groq", "extra_body": {"x": 1}},
    ],
    ids=["openai-provider", "openai-host", "groq-provider"],
)
def test_extra_body_is_refused_for_vendor_routes(config: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_plan(policy={"policy_name": "crafter-react", "config": config})
    assert caught.value.code == "extra_body_not_forwarded" and caught.value.status == 422


def test_extra_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_plan(policy={"policy_name": "crafter-react", "config": _react_config(extra_body=[1, 2])})
    assert caught.value.code == "invalid_policy_config" and "extra_body" in caught.value.message


def test_record_logprobs_turns_the_policy_switch_on() -> None:
    plan = make_plan(policy={"policy_name": "crafter-react", "config": _react_config()}, record={"logprobs": True})
    assert plan.record_tokens and plan.policy.logprobs
    assert not make_plan(policy={"policy_name": "crafter-react", "config": _react_config()}).record_tokens
