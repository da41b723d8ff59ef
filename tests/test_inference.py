"""The inference client: URLs, vendor parameters, auth headers, retries, deadline, capped reads.

Real HTTP goes only to the loopback fake model server; the header rules for vendor hosts are checked
on the resolved target, so nothing ever leaves 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import time

import anyio
import anyio.to_thread
import pytest
from pydantic import SecretStr
from support.fake_model import FakeModel, delay, drop, error, hang, huge, raw, text, tool_call
from support.polling import wait_until

from task_app.core.errors import NotConfigured
from task_app.core.outbound import open_session
from task_app.core.settings import Settings
from task_app.policy.base import PolicyError
from task_app.policy.inference import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_REASONING_MAX_TOKENS,
    InferenceClient,
    InferenceLimits,
    InferenceTarget,
    chat_completions_url,
    chat_params,
    resolve_target,
)
from task_app.policy.providers import is_reasoning_model

pytestmark = pytest.mark.anyio

FAST = InferenceLimits(
    connect_timeout_s=2.0,
    read_timeout_s=5.0,
    max_attempts=4,
    backoff_s=0.01,
    backoff_max_s=0.05,
    max_response_bytes=1024 * 1024,
)
BODY = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def model(fake_model: FakeModel) -> FakeModel:
    """The session's fake model (tests/support/fake_model.py), reset for each test."""
    return fake_model


def _target(model: FakeModel, key: str | None = None) -> InferenceTarget:
    return InferenceTarget(model.url(), "custom", SecretStr(key) if key else None)


# --- URLs --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("https://api.openai.com/v1", "https://api.openai.com/v1/chat/completions"),
        ("https://api.openai.com/v1/", "https://api.openai.com/v1/chat/completions"),
        ("https://api.groq.com/openai/v1", "https://api.groq.com/openai/v1/chat/completions"),
        ("http://127.0.0.1:9", "http://127.0.0.1:9/v1/chat/completions"),
        ("http://127.0.0.1:9/", "http://127.0.0.1:9/v1/chat/completions"),
        ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
        ("http://h/v1/chat/completions/", "http://h/v1/chat/completions"),
        ("http://h/chat/completions", "http://h/chat/completions"),
        ("http://h/openai/chat", "http://h/openai/chat/completions"),
        ("http://h/v1/chat/completions?cid=trace_x", "http://h/v1/chat/completions?cid=trace_x"),
        ("http://h/v1?cid=trace_x", "http://h/v1/chat/completions?cid=trace_x"),
        ("http://h?cid=trace_x", "http://h/v1/chat/completions?cid=trace_x"),
        ("http://h/proxy", "http://h/proxy/v1/chat/completions"),
        ("http://h/proxy/groq", "http://h/proxy/groq/v1/chat/completions"),
        ("http://h/proxy/groq/v1", "http://h/proxy/groq/v1/chat/completions"),
        ("http://h?cid=trace_x/v1/chat/completions&a=b", "http://h/v1/chat/completions?cid=trace_x&a=b"),
    ],
)
def test_chat_completions_url(given: str, expected: str) -> None:
    assert chat_completions_url(given) == expected
    assert "/v1/v1" not in chat_completions_url(given)
    assert chat_completions_url(expected) == expected  # idempotent


# --- vendor parameters -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["gpt-5", "gpt-5-mini", "gpt-5-nano-2025-08-07", "o1", "o3-mini", "o4-mini", "openai/gpt-5"]
)
def test_reasoning_models_get_max_completion_tokens_and_no_sampling(name: str) -> None:
    assert is_reasoning_model(name)
    params = chat_params(name, provider="openai", temperature=0.2, top_p=0.95, max_tokens=300)
    assert params == {"model": name, "max_completion_tokens": 300}
    assert chat_params(name, provider="openai")["max_completion_tokens"] == DEFAULT_REASONING_MAX_TOKENS


@pytest.mark.parametrize(
    "name",
    ["gpt-4o-mini", "gpt-4.1", "qwen/qwen3-32b", "openai/gpt-oss-120b", "llama-3.3-70b-versatile", "Qwen/Qwen3-4B"],
)
def test_other_models_keep_max_tokens_and_sampling(name: str) -> None:
    assert not is_reasoning_model(name)
    params = chat_params(name, provider="groq", temperature=0.2, top_p=0.95, max_completion_tokens=256)
    assert params == {"model": name, "max_tokens": 256, "temperature": 0.2, "top_p": 0.95}
    assert chat_params(name, provider="groq")["max_tokens"] == DEFAULT_MAX_TOKENS


def test_extras_pass_through_by_vendor() -> None:
    extras = {"seed": 7, "top_k": 20, "chat_template_kwargs": {"enable_thinking": False}, "max_turns": 3}
    custom = chat_params("qwen", provider="custom", extras=extras)
    assert custom["seed"] == 7 and custom["top_k"] == 20 and custom["chat_template_kwargs"]
    assert "max_turns" not in custom  # unknown keys never reach a model server
    vendor = chat_params("gpt-4o", provider="openai", extras=extras)
    assert vendor["seed"] == 7 and "top_k" not in vendor and "chat_template_kwargs" not in vendor


# --- targets and auth --------------------------------------------------------------------------------


def _settings(**kwargs: object) -> Settings:
    values: dict[str, object] = {
        "environment_api_key": "env-secret-key",
        "openai_api_key": "sk-openai-secret",
        "groq_api_key": "gsk-groq-secret",
    }
    values.update(kwargs)
    return Settings(**values)  # type: ignore[arg-type]


def test_target_key_rules() -> None:
    settings = _settings()
    own = resolve_target(
        inference_url="https://api.openai.com/v1", provider=None, api_key=SecretStr("caller-key"), settings=settings
    )
    assert own.headers()["Authorization"] == "Bearer caller-key"
    openai = resolve_target(inference_url="https://api.openai.com/v1", provider=None, api_key=None, settings=settings)
    assert (openai.provider, openai.headers()["Authorization"]) == ("openai", "Bearer sk-openai-secret")
    groq = resolve_target(
        inference_url="https://api.groq.com/openai/v1", provider=None, api_key=None, settings=settings
    )
    assert (groq.provider, groq.headers()["Authorization"]) == ("groq", "Bearer gsk-groq-secret")
    # A trainer's own server never gets our vendor keys, whatever it claims to be.
    other = resolve_target(
        inference_url="https://openai.evil.example/v1", provider="openai", api_key=None, settings=settings
    )
    assert "Authorization" not in other.headers()
    assert "secret" not in repr(openai)


def test_provider_routes_to_settings_base_url() -> None:
    settings = _settings()
    openai = resolve_target(inference_url=None, provider="openai", api_key=None, settings=settings)
    assert openai.url == "https://api.openai.com/v1/chat/completions"
    assert openai.headers()["Authorization"] == "Bearer sk-openai-secret"
    groq = resolve_target(inference_url=None, provider="groq", api_key=None, settings=settings)
    assert groq.url == "https://api.groq.com/openai/v1/chat/completions"
    with pytest.raises(NotConfigured) as caught:
        resolve_target(inference_url=None, provider="groq", api_key=None, settings=Settings())
    assert caught.value.code == "missing_groq_api_key"


def test_vendor_host_gets_vendor_key_and_never_the_environment_key() -> None:
    settings = _settings()
    vendor, trainer = (
        resolve_target(inference_url=url, provider=None, api_key=None, settings=settings)
        for url in ("https://api.openai.com/v1", "https://trainer.example/v1?cid=trace_1")
    )
    assert vendor.headers()["Authorization"] == "Bearer sk-openai-secret"
    assert "Authorization" not in trainer.headers()
    assert trainer.url == "https://trainer.example/v1/chat/completions?cid=trace_1"
    assert str(trainer.http_url) == trainer.url
    for headers in (vendor.headers(), trainer.headers()):
        assert all("env-secret-key" not in value for value in headers.values())
        assert "X-API-Key" not in headers


@pytest.mark.e2e
async def test_fake_server_sees_url_body_and_auth(model: FakeModel) -> None:
    settings = _settings(openai_base_url=model.url("/v1"))  # the loopback server plays OpenAI's host
    async with open_session(8) as http:
        client = InferenceClient(http, FAST)
        target = resolve_target(inference_url=None, provider="openai", api_key=None, settings=settings)
        result = await client.chat(target, BODY, deadline=None)
        mine = resolve_target(
            inference_url=model.url("/v1?cid=trace_q"),
            provider=None,
            api_key=SecretStr("caller-key"),
            settings=_settings(),
        )
        await client.chat(mine, BODY, deadline=None)
    assert result.status == 200 and result.attempts == 1 and result.body is not None
    first, second = model.requests
    assert first.target == "/v1/chat/completions" and first.body == BODY
    assert first.headers["authorization"] == "Bearer sk-openai-secret"
    assert second.target == "/v1/chat/completions?cid=trace_q"
    assert second.headers["authorization"] == "Bearer caller-key"
    for request in model.requests:
        assert all("env-secret-key" not in value for value in request.headers.values())


# --- retries -----------------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_retries_500_then_succeeds(model: FakeModel) -> None:
    model.script(error(500), error(503), tool_call("do"))
    async with open_session(8) as http:
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert result.attempts == 3 and len(model.requests) == 3
    assert result.body is not None and result.body["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.e2e
async def test_429_honours_retry_after(model: FakeModel) -> None:
    model.script(error(429, retry_after="0.3"), text("ok"))
    limits = InferenceLimits(backoff_s=0.01, backoff_max_s=1.0)
    async with open_session(8) as http:
        start = time.monotonic()
        result = await InferenceClient(http, limits).chat(_target(model), BODY, deadline=None)
    assert result.attempts == 2
    assert time.monotonic() - start >= 0.3


@pytest.mark.e2e
async def test_retry_after_is_capped(model: FakeModel) -> None:
    model.script(error(429, retry_after="3600"), text("ok"))
    async with open_session(8) as http:
        start = time.monotonic()
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert result.attempts == 2 and time.monotonic() - start < 1.0


@pytest.mark.e2e
async def test_timeout_then_success(model: FakeModel) -> None:
    model.script(delay(2.0), tool_call("do"))
    limits = InferenceLimits(read_timeout_s=0.3, backoff_s=0.01, backoff_max_s=0.05)
    async with open_session(8) as http:
        result = await InferenceClient(http, limits).chat(_target(model), BODY, deadline=None)
    assert result.attempts == 2


@pytest.mark.e2e
async def test_dropped_connection_is_retried(model: FakeModel) -> None:
    model.script(drop(), tool_call("do"))
    async with open_session(8) as http:
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert result.attempts == 2


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
async def test_an_unsendable_request_fails_at_once_without_the_key(model: FakeModel) -> None:
    target = InferenceTarget(model.url(), "custom", SecretStr("caller-key\r\nX-Injected: 1"))
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(target, BODY, deadline=None)
    assert caught.value.code == "inference_request_error"  # not retried: another attempt cannot help
    assert "caller-key" not in str(caught.value) and model.requests == []


async def test_connection_refused_exhausts_attempts() -> None:
    target = InferenceTarget(f"http://127.0.0.1:{_closed_port()}/v1/chat/completions", "custom")
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(target, BODY, deadline=None)
    assert caught.value.code == "inference_unavailable"
    assert "4 attempt" in str(caught.value)


@pytest.mark.e2e
async def test_server_errors_exhaust_attempts(model: FakeModel) -> None:
    model.default = error(502)
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert (caught.value.code, caught.value.status) == ("inference_unavailable", 502)
    assert len(model.requests) == FAST.max_attempts


@pytest.mark.e2e
async def test_rate_limit_exhausts_attempts(model: FakeModel) -> None:
    model.default = error(429, retry_after=0)
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert (caught.value.code, caught.value.status) == ("inference_rate_limited", 429)


@pytest.mark.e2e
@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_fail_at_once(model: FakeModel, status: int) -> None:
    body = {"error": {"message": "Incorrect API key provided: sk-abc***xyz", "code": "invalid_api_key"}}
    model.script(error(status, body=body))
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(_target(model, "caller-key"), BODY, deadline=None)
    assert (caught.value.code, caught.value.status) == ("inference_http_error", status)
    assert len(model.requests) == 1
    assert "invalid_api_key" in str(caught.value)
    assert "sk-abc" not in str(caught.value)  # vendor messages may echo key prefixes: never repeated


# --- the deadline ------------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_hanging_server_returns_by_the_deadline(model: FakeModel) -> None:
    model.default = hang()
    async with open_session(8) as http:
        start = anyio.current_time()
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=start + 1.0)
        elapsed = anyio.current_time() - start
    assert caught.value.code == "inference_timeout"
    assert 0.9 <= elapsed < 3.0  # the 1 s deadline ended it, not the 5 s read timeout


@pytest.mark.e2e
async def test_no_sleep_past_the_deadline(model: FakeModel) -> None:
    model.default = error(503, retry_after=5)
    limits = InferenceLimits(backoff_s=2.0, backoff_max_s=10.0, max_attempts=10)
    async with open_session(8) as http:
        start = anyio.current_time()
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, limits).chat(_target(model), BODY, deadline=start + 1.0)
        elapsed = anyio.current_time() - start
    assert caught.value.code == "inference_unavailable" and "no time left" in str(caught.value)
    assert elapsed < 1.0 and len(model.requests) == 1  # gave up at once: it did not sleep to the deadline


@pytest.mark.e2e
async def test_expired_deadline_sends_nothing(model: FakeModel) -> None:
    async with open_session(8) as http:
        with pytest.raises(PolicyError) as caught:
            await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=anyio.current_time() - 1)
    assert caught.value.code == "inference_timeout" and model.requests == []


# --- reading the answer ------------------------------------------------------------------------------


@pytest.mark.e2e
async def test_huge_streamed_answer_is_cut_off(model: FakeModel) -> None:
    model.script(huge(50 * 1024 * 1024))
    async with open_session(8) as http:
        start = time.monotonic()
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
        elapsed = time.monotonic() - start
    # an answer for this decision that cannot be used, not a failure of the rollout
    assert (result.body, result.invalid_reason, result.attempts) == (None, "response_too_large", 1)
    assert elapsed < 2.0
    await anyio.to_thread.run_sync(wait_until, lambda: "huge_bytes_sent" in model.stats)  # the server saw us hang up
    assert model.stats["huge_bytes_sent"] < 20 * 1024 * 1024


@pytest.mark.e2e
async def test_declared_huge_answer_is_refused_before_reading(model: FakeModel) -> None:
    model.script(huge(50 * 1024 * 1024, declare_length=True))
    async with open_session(8) as http:
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert (result.body, result.invalid_reason) == (None, "response_too_large")
    assert len(model.requests) == 1  # not retried


@pytest.mark.e2e
async def test_answer_at_the_cap_is_read_whole_and_one_byte_more_is_not(model: FakeModel) -> None:
    """The cap is `max_response_bytes` exactly: an answer of that many bytes is read to its last byte and
    one byte more is refused, so a cap applied early, late or not at all fails one side."""
    cap, head, tail = FAST.max_response_bytes, b'{"choices": [{"message": {"content": "', b'"}}]}'
    model.script(huge(cap, head=head, tail=tail), huge(cap + 1, head=head, tail=tail))
    async with open_session(8) as http:
        client = InferenceClient(http, FAST)
        at_cap = await client.chat(_target(model), BODY, deadline=None)
        over = await client.chat(_target(model), BODY, deadline=None)
    assert at_cap.body is not None and at_cap.invalid_reason is None
    assert at_cap.body["choices"][0]["message"]["content"] == "x" * (cap - len(head) - len(tail))
    assert (over.body, over.invalid_reason, over.attempts) == (None, "response_too_large", 1)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"{not json", "invalid_json"), (b"[1, 2]", "response_not_an_object"), (b"", "invalid_json")],
)
async def test_non_object_answers_are_unusable_not_errors(model: FakeModel, content: bytes, reason: str) -> None:
    model.script(raw(content))
    async with open_session(8) as http:
        result = await InferenceClient(http, FAST).chat(_target(model), BODY, deadline=None)
    assert (result.body, result.invalid_reason, result.attempts) == (None, reason, 1)


@pytest.mark.e2e
async def test_warning_logged_per_retry_with_run_id(model: FakeModel, caplog: pytest.LogCaptureFixture) -> None:
    model.script(error(500), text("ok"))
    caplog.set_level("DEBUG", logger="task_app.policy.inference")
    async with open_session(8) as http:
        await InferenceClient(http, FAST).chat(_target(model, "caller-key"), BODY, deadline=None, run_id="run-7")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and getattr(warnings[0], "run_id", None) == "run-7"
    assert not any("caller-key" in r.getMessage() for r in caplog.records)
    assert not any(json.dumps(BODY["messages"]) in r.getMessage() for r in caplog.records)
