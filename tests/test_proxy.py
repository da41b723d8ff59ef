"""Vendor proxies (`/proxy/v1/...`, `/proxy/groq/v1/...`) and `policy.config.provider` routing, fake vendor.

Every exchange is real HTTP on 127.0.0.1: the task app under uvicorn (`make_app_server`) and the fake
vendor (`tests/support/fake_model.py`). A guard fails the test on any connection or name lookup beyond loopback.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest
from support.errors import error_body
from support.fake_model import FakeModel, drop, error, hang, huge, raw, text, tool_call
from support.keys import GROQ_KEY, OPENAI_KEY, TEST_KEY, assert_no_key_material
from support.servers import AppServer

from task_app.policy.inference import chat_params
from task_app.policy.vendors import (
    HINT_TITLE,
    crafting_hint,
    redact,
    sanitised_error_body,
    shape_chat_body,
    synthesise_tool_call,
    with_crafting_hint,
)
from task_app.web.routes.proxy import SYNTHESISED_HEADER

ALL_SECRETS = (TEST_KEY, OPENAI_KEY, GROQ_KEY)
OPENAI_PATH = "/proxy/v1/chat/completions"
GROQ_PATH = "/proxy/groq/v1/chat/completions"
USER = {"role": "user", "content": "What next?"}


# --- no traffic beyond loopback --------------------------------------------------------------------


# --- helpers ---------------------------------------------------------------------------------------


def _post(server: AppServer, path: str, body: Any, **client_options: Any) -> Any:
    response = server.client(**client_options).post(path, json=body)
    assert_no_key_material(response.text + json.dumps(dict(response.headers)), ALL_SECRETS)
    return response


def _sent(model: FakeModel) -> dict[str, Any]:
    body = model.requests[-1].body
    assert isinstance(body, dict)
    return body


# --- auth, keys, refusals --------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("path", [OPENAI_PATH, GROQ_PATH])
def test_proxy_requires_the_app_key(vendor_app: AppServer, fake_model: FakeModel, path: str) -> None:
    for key in (None, "wrong-key"):
        response = _post(vendor_app, path, {"model": "gpt-4o-mini", "messages": [USER]}, key=key)
        error_body(response, 401, "unauthorized")
    assert fake_model.requests == []


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("path", "code"), [(OPENAI_PATH, "missing_openai_api_key"), (GROQ_PATH, "missing_groq_api_key")]
)
def test_missing_vendor_key_is_503(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel, path: str, code: str
) -> None:
    server = make_app_server(openai_base_url=fake_model.url("/v1"), groq_base_url=fake_model.url("/openai/v1"))
    response = _post(server, path, {"model": "llama-3.3-70b-versatile", "messages": [USER]})
    error = error_body(response, 503)["error"]
    assert error["code"] == code
    assert ("OPENAI_API_KEY" if "openai" in code else "GROQ_API_KEY") in error["message"]
    assert fake_model.requests == []


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"model": "gpt-4o-mini"}, 422, "invalid_messages"),
        ({"model": "gpt-4o-mini", "messages": []}, 422, "invalid_messages"),
        ({"messages": [USER]}, 422, "missing_model"),
        ({"model": "gpt-4o-mini", "messages": [USER], "max_tokens": -5}, 422, "invalid_parameter"),
        ({"model": "gpt-4o-mini", "messages": [USER], "temperature": "hot"}, 422, "invalid_parameter"),
        ({"model": "gpt-4o-mini", "messages": [USER], "stream": "yes"}, 422, "invalid_parameter"),
        ([1, 2, 3], 422, "invalid_request"),
    ],
)
def test_bad_bodies_are_client_errors(
    vendor_app: AppServer, fake_model: FakeModel, body: Any, status: int, code: str
) -> None:
    response = _post(vendor_app, OPENAI_PATH, body)
    error_body(response, status, code)
    assert fake_model.requests == []


@pytest.mark.e2e
def test_invalid_json_is_400(vendor_app: AppServer) -> None:
    client = vendor_app.client()
    response = client.post(OPENAI_PATH, content=b"{not json", headers={"Content-Type": "application/json"})
    error_body(response, 400, "invalid_json")


# --- what the vendor receives ----------------------------------------------------------------------


@pytest.mark.e2e
def test_vendor_gets_its_key_as_bearer_and_never_the_app_key(vendor_app: AppServer, fake_model: FakeModel) -> None:
    client = vendor_app.client(headers={"Authorization": f"Bearer {TEST_KEY}", "X-Custom": "x"})
    assert client.post(OPENAI_PATH, json={"model": "gpt-4o-mini", "messages": [USER]}).status_code == 200
    assert client.post(GROQ_PATH, json={"model": "llama-3.1-8b-instant", "messages": [USER]}).status_code == 200
    openai_request, groq_request = fake_model.requests
    assert (openai_request.path, groq_request.path) == ("/v1/chat/completions", "/openai/v1/chat/completions")
    assert openai_request.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert groq_request.headers["authorization"] == f"Bearer {GROQ_KEY}"
    for request in (openai_request, groq_request):
        assert "x-api-key" not in request.headers
        assert "x-custom" not in request.headers
        seen = json.dumps(request.headers) + request.raw.decode()
        assert_no_key_material(seen, (TEST_KEY,))


@pytest.mark.e2e
def test_reasoning_model_shaping(vendor_app: AppServer, fake_model: FakeModel) -> None:
    body = {
        "model": "gpt-5-mini",
        "messages": [USER],
        "max_tokens": 300,
        "temperature": 0.2,
        "top_p": 0.95,
        "tools": [{"type": "function", "function": {"name": "interact_many", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "interact_many"}},
        "parallel_tool_calls": False,
        "stop_after_tool_calls": 1,
        "thinking_mode": "think",
        "thinking_budget": 1028,
        "extra_body": {"chat_template_kwargs": {"enable_thinking": True}},
        "top_k": 20,
        "seed": 7,
    }
    assert _post(vendor_app, OPENAI_PATH, body).status_code == 200
    sent = _sent(fake_model)
    assert sent["max_completion_tokens"] == 300  # the caller's budget, not raised to 16000 (seed defect)
    for absent in (
        "max_tokens",
        "temperature",
        "top_p",
        "stop_after_tool_calls",
        "thinking_mode",
        "thinking_budget",
        "extra_body",
        "top_k",
    ):
        assert absent not in sent, absent
    assert sent["tools"] == body["tools"]
    assert sent["tool_choice"] == body["tool_choice"]
    assert sent["parallel_tool_calls"] is False
    assert sent["seed"] == 7


@pytest.mark.e2e
def test_chat_model_shaping(vendor_app: AppServer, fake_model: FakeModel) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [USER],
        "max_completion_tokens": 256,
        "temperature": 0.3,
        "stream": False,
        "stream_options": {"include_usage": True},
    }
    assert _post(vendor_app, OPENAI_PATH, body).status_code == 200
    sent = _sent(fake_model)
    assert "stream" not in sent and "stream_options" not in sent
    assert sent["max_tokens"] == 256
    assert "max_completion_tokens" not in sent
    assert sent["temperature"] == 0.3
    assert "top_p" not in sent


@pytest.mark.e2e
def test_groq_shaping_and_defaults(vendor_app: AppServer, fake_model: FakeModel) -> None:
    body = {
        "model": "llama-3.3-70b-versatile",
        "messages": [USER],
        "temperature": 0.2,
        "top_p": 0.9,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "reasoning": {"effort": "low"},
    }
    assert _post(vendor_app, GROQ_PATH, body).status_code == 200
    sent = _sent(fake_model)
    assert fake_model.requests[-1].path == "/openai/v1/chat/completions"
    assert sent["max_tokens"] == 512  # inference.py's default when the caller gives none
    assert (sent["temperature"], sent["top_p"]) == (0.2, 0.9)
    for absent in ("min_p", "repetition_penalty", "reasoning", "max_completion_tokens"):
        assert absent not in sent, absent


@pytest.mark.e2e
def test_legacy_function_call_becomes_tool_choice(vendor_app: AppServer, fake_model: FakeModel) -> None:
    tools = [{"type": "function", "function": {"name": "interact_many", "parameters": {}}}]
    body = {"model": "gpt-4o-mini", "messages": [USER], "tools": tools, "function_call": {"name": "interact_many"}}
    assert _post(vendor_app, OPENAI_PATH, body).status_code == 200
    sent = _sent(fake_model)
    assert "function_call" not in sent
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "interact_many"}}


def test_proxy_and_provider_routing_shape_alike() -> None:
    """The proxy's shaping is `chat_params` (what a provider rollout sends) plus the untouched rest."""
    for model, provider in (("gpt-5", "openai"), ("gpt-4o-mini", "openai"), ("llama-3.3-70b-versatile", "groq")):
        body = {"model": model, "messages": [USER], "temperature": 0.2, "top_p": 0.95, "max_tokens": 512}
        shaped = shape_chat_body(body, provider)
        params = chat_params(model, provider=provider, temperature=0.2, top_p=0.95, max_tokens=512)
        assert {key: value for key, value in shaped.items() if key != "messages"} == params
        assert body["max_tokens"] == 512  # the input is not modified


# --- the system hint -------------------------------------------------------------------------------


def _system(model: FakeModel) -> Any:
    return _sent(model)["messages"][0]


@pytest.mark.e2e
def test_hint_is_appended_to_a_string_system_message(vendor_app: AppServer, fake_model: FakeModel) -> None:
    messages = [{"role": "system", "content": "You play Crafter.  \n"}, USER]
    assert _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": messages}).status_code == 200
    sent = _sent(fake_model)["messages"]
    assert sent[0] == {"role": "system", "content": "You play Crafter.\n\n" + crafting_hint()}
    assert sent[1:] == [USER]


@pytest.mark.e2e
def test_hint_is_inserted_when_there_is_no_system_message(vendor_app: AppServer, fake_model: FakeModel) -> None:
    assert _post(vendor_app, GROQ_PATH, {"model": "llama-3.1-8b-instant", "messages": [USER]}).status_code == 200
    assert _sent(fake_model)["messages"] == [{"role": "system", "content": crafting_hint()}, USER]


@pytest.mark.e2e
def test_hint_leaves_list_content_and_existing_hints_alone(vendor_app: AppServer, fake_model: FakeModel) -> None:
    parts = [{"role": "system", "content": [{"type": "text", "text": "rules"}]}, USER]
    hinted = [{"role": "system", "content": "Play.\n\n" + crafting_hint()}, USER]
    for messages in (parts, hinted):
        assert _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": messages}).status_code == 200
        assert _sent(fake_model)["messages"] == messages


def test_hint_states_the_games_recipes() -> None:
    hint = crafting_hint()
    assert hint.startswith(HINT_TITLE)
    assert "make_wood_pickaxe: needs a nearby table; uses 1 wood" in hint
    assert "make_iron_sword: needs a nearby table and furnace; uses 1 wood, 1 coal, 1 iron" in hint
    assert len(hint.splitlines()) == 7  # title + six make_* actions
    assert with_crafting_hint([]) == [{"role": "system", "content": hint}]


# --- the answer ------------------------------------------------------------------------------------


TOOLS = [{"type": "function", "function": {"name": "interact_many", "parameters": {"type": "object"}}}]


@pytest.mark.e2e
def test_text_answer_gets_a_synthesised_interact_many_call(vendor_app: AppServer, fake_model: FakeModel) -> None:
    fake_model.script(text("The tree is left of me.\nactions: move_left, do, bogus"))
    response = _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER], "tools": TOOLS})
    assert response.status_code == 200
    assert response.headers[SYNTHESISED_HEADER] == "interact_many"
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"  # as a vendor's own call says
    message = choice["message"]
    assert message["content"].startswith("The tree")
    (call,) = message["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "interact_many"
    assert json.loads(call["function"]["arguments"]) == {"actions": ["move_left", "do"]}


@pytest.mark.e2e
@pytest.mark.parametrize(
    "offered",
    [
        {},
        {"tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]},
        {"tools": TOOLS, "tool_choice": "none"},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}},
        {"tools": [{"type": "function", "function": "interact_many"}, "x"]},
    ],
    ids=["no-tools", "another-tool", "tool-choice-none", "tool-choice-another", "malformed-tools"],
)
def test_no_call_is_synthesised_for_a_request_that_did_not_offer_it(
    vendor_app: AppServer, fake_model: FakeModel, offered: dict[str, Any]
) -> None:
    fake_model.script(text("actions: move_left, do"))
    response = _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER], **offered})
    assert response.status_code == 200
    assert SYNTHESISED_HEADER not in response.headers
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]


@pytest.mark.e2e
def test_json_text_answer_and_untouched_answers(vendor_app: AppServer, fake_model: FakeModel) -> None:
    fake_model.script(
        text('{"actions": ["place_table", "make_wood_pickaxe"]}'),
        text("I am not sure yet."),
        tool_call("move_up"),
    )
    body = {"model": "llama-3.3-70b-versatile", "messages": [USER], "tools": TOOLS}
    synthesised, prose, called = (_post(vendor_app, GROQ_PATH, body) for _ in range(3))
    arguments = synthesised.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"actions": ["place_table", "make_wood_pickaxe"]}
    for response in (prose, called):
        assert SYNTHESISED_HEADER not in response.headers
    assert "tool_calls" not in prose.json()["choices"][0]["message"]
    (call,) = called.json()["choices"][0]["message"]["tool_calls"]
    assert call["id"] != "call_text_fallback"
    assert json.loads(call["function"]["arguments"]) == {"actions": ["move_up"]}


def test_synthesis_ignores_odd_bodies() -> None:
    for body in ({}, {"choices": []}, {"choices": ["x"]}, {"choices": [{"message": None}]}):
        assert synthesise_tool_call(body, 8) is False


# --- vendor failures -------------------------------------------------------------------------------


@pytest.mark.e2e
def test_vendor_refusing_our_key_is_502_with_status_and_a_sanitised_body(
    vendor_app: AppServer, fake_model: FakeModel
) -> None:
    masked = f"sk-proj-********{OPENAI_KEY[-4:]}"
    body = {
        "error": {
            "message": f"Incorrect API key provided: {masked}. Or maybe {OPENAI_KEY}.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
            "param": None,
        }
    }
    fake_model.script(error(401, body=body))
    response = _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER]})
    problem = error_body(response, 502)["error"]
    assert response.headers["x-should-retry"] == "false"  # another attempt with the same key fails the same way
    assert problem["code"] == "openai_key_refused"
    assert "OPENAI_API_KEY" in problem["message"]
    assert (problem["vendor"], problem["status"]) == ("openai", 401)
    vendor_error = problem["body"]["error"]
    assert vendor_error["type"] == "invalid_request_error"
    assert vendor_error["code"] == "invalid_api_key"
    assert vendor_error["message"].startswith("Incorrect API key provided: [redacted]")


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("status", "answered", "code", "should_retry"),
    [
        (400, 400, "groq_bad_request", "false"),
        (404, 404, "groq_not_found", "false"),
        (422, 422, "groq_unprocessable", "false"),
        (403, 502, "groq_key_refused", "false"),
        (405, 502, "groq_error", "false"),
        (408, 502, "groq_error", None),
        (500, 502, "groq_error", None),
        (501, 502, "groq_error", "false"),
        (503, 502, "groq_error", None),
    ],
)
def test_vendor_error_mapping(
    vendor_app: AppServer, fake_model: FakeModel, status: int, answered: int, code: str, should_retry: str | None
) -> None:
    """The caller's mistakes keep the vendor's status; the rest is a 502, marked when a retry cannot help."""
    fake_model.script(error(status))
    response = _post(vendor_app, GROQ_PATH, {"model": "llama-3.1-8b-instant", "messages": [USER]})
    problem = error_body(response, answered)["error"]
    assert response.headers.get("x-should-retry") == should_retry
    assert (problem["code"], problem["status"], problem["vendor"]) == (code, status, "groq")
    assert problem["body"] == {"error": {"message": f"fake error {status}", "type": "fake_error"}}
    assert problem["type"] == "fake_error"  # what the openai SDK reads as `error.type`
    assert len(fake_model.requests) == 1  # one attempt: the caller owns retries


@pytest.mark.e2e
def test_a_refused_request_carries_the_vendors_own_error(vendor_app: AppServer, fake_model: FakeModel) -> None:
    vendor_error = {"message": "This model's maximum context length is 128000 tokens.", "type": "invalid_request_error"}
    vendor_error |= {"param": "messages", "code": "context_length_exceeded"}
    fake_model.script(error(400, body={"error": vendor_error}))
    response = _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER]})
    problem = error_body(response, 400)["error"]
    assert {key: problem[key] for key in vendor_error} == vendor_error


@pytest.mark.e2e
@pytest.mark.parametrize(("retry_after", "sent"), [("7", "7"), ("2.5", "3"), (None, "1"), ("soon", "1")])
def test_vendor_429_is_a_429_with_retry_after(
    vendor_app: AppServer, fake_model: FakeModel, retry_after: str | None, sent: str
) -> None:
    fake_model.script(error(429, retry_after=retry_after))
    response = _post(vendor_app, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER]})
    problem = error_body(response, 429)["error"]
    assert response.headers["Retry-After"] == sent
    assert (problem["code"], problem["status"], problem["retry_after_s"]) == (
        "openai_rate_limited",
        429,
        int(sent),
    )


@pytest.mark.e2e
def test_non_json_error_body_is_cut_and_redacted(vendor_app: AppServer, fake_model: FakeModel) -> None:
    fake_model.script(raw(f"<html>bad gateway {GROQ_KEY} {'x' * 5000}</html>", status=502, content_type="text/html"))
    problem = error_body(_post(vendor_app, GROQ_PATH, {"model": "llama-3.1-8b-instant", "messages": [USER]}), 502)[
        "error"
    ]
    assert problem["status"] == 502
    assert problem["body"]["text"].startswith("<html>bad gateway [redacted]")
    assert len(problem["body"]["text"]) <= 500


@pytest.mark.e2e
def test_vendor_timeout_is_504(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> None:
    server = make_app_server(
        openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY, inference_read_timeout_s=0.3
    )
    fake_model.script(hang())
    response = _post(server, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER]})
    error_body(response, 504, "openai_timeout")


@pytest.mark.e2e
def test_unreachable_vendor_is_502(make_app_server: Callable[..., AppServer]) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    server = make_app_server(groq_base_url=f"http://127.0.0.1:{port}/openai/v1", groq_api_key=GROQ_KEY)
    response = _post(server, GROQ_PATH, {"model": "llama-3.1-8b-instant", "messages": [USER]})
    error_body(response, 502, "groq_unreachable")


@pytest.mark.e2e
def test_dropped_connection_and_bad_answers_are_502(vendor_app: AppServer, fake_model: FakeModel) -> None:
    fake_model.script(drop(), raw(b"not json"), raw(b"[1, 2]"))
    body = {"model": "gpt-4o-mini", "messages": [USER]}
    codes = [error_body(_post(vendor_app, OPENAI_PATH, body), 502)["error"] for _ in range(3)]
    assert [(error["code"]) for error in codes] == [
        "openai_connection_error",
        "openai_invalid_response",
        "openai_invalid_response",
    ]


@pytest.mark.e2e
def test_oversized_answer_is_refused(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> None:
    server = make_app_server(
        openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY, inference_max_response_bytes=4096
    )
    fake_model.script(huge(100_000))
    response = _post(server, OPENAI_PATH, {"model": "gpt-4o-mini", "messages": [USER]})
    error_body(response, 502, "openai_response_too_large")


def test_redaction() -> None:
    assert redact("key sk-abc123XYZ and Bearer zzz and gsk_Q1w2", ()) == "key [redacted] and [redacted] and [redacted]"
    assert redact("plain words stay", ("secret-value",)) == "plain words stay"
    assert "hunter2" not in redact("pw hunter2", ("hunter2",))
    model = "The model `meta-llama/llama-4-scout-17b-16e-instruct` does not exist"
    assert redact(model, ()) == model
    assert redact("key ****************abcd and " + "A1b2" * 8, ()) == "key [redacted] and [redacted]"
    body = sanitised_error_body(
        json.dumps({"error": {"code": "x" * 200, "type": "sk-Abcdef", "message": 5}}).encode(), ()
    )
    assert body == {"error": {}}
    assert sanitised_error_body(b'{"error": "sk-Zyxwvut broke"}', ()) == {"error": {"message": "[redacted] broke"}}


# --- provider routing ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_rollout_with_provider_openai_goes_to_the_vendor(vendor_app: AppServer, fake_model: FakeModel) -> None:
    fake_model.default = tool_call("move_left", "do")
    request = {
        "run_id": "provider-openai",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 3, "config": {}},
        "policy": {
            "policy_name": "crafter-react",
            "config": {"provider": "openai", "model": "gpt-5-mini", "max_completion_tokens": 700, "max_llm_calls": 3},
        },
        "ops": ["agent", "env"] * 3,
    }
    response = vendor_app.client(timeout=60.0).post("/rollout", json=request)
    assert response.status_code == 200, response.text
    assert_no_key_material(response.text, ALL_SECRETS)
    assert response.json()["trajectories"][0]["length"] == 3
    assert len(fake_model.requests) == 3
    for record in fake_model.requests:
        assert record.path == "/v1/chat/completions"
        assert record.headers["authorization"] == f"Bearer {OPENAI_KEY}"
        assert "x-api-key" not in record.headers
    sent = _sent(fake_model)
    assert sent["max_completion_tokens"] == 700
    assert "temperature" not in sent and "max_tokens" not in sent
    # The same rules as the proxy: shaping the rollout's own body changes nothing but its messages.
    assert {key: value for key, value in shape_chat_body(sent, "openai").items() if key != "messages"} == {
        key: value for key, value in sent.items() if key != "messages"
    }
