"""The proxies as a user of the official `openai` SDK sees them: every error mapping, retries counted at
the vendor, `stream=True`, and a client that leaves mid-stream.

The SDK (default `max_retries=2`) points at the task app under uvicorn; the fake vendor
(`tests/support/fake_model.py`) on loopback counts the calls it gets. A bad request must cost exactly one
vendor call: the SDK retries only 408/409/429/5xx, and not when the answer says `x-should-retry: false`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest
from support.fake_model import FakeModel, chunk, error, sse, text, tool_call
from support.keys import GROQ_KEY, OPENAI_KEY, TEST_KEY, assert_no_key_material
from support.polling import wait_until
from support.servers import AppServer

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process

SECRETS = (TEST_KEY, OPENAI_KEY, GROQ_KEY)
MESSAGES: Any = [{"role": "user", "content": "What next?"}]
TOOLS: Any = [{"type": "function", "function": {"name": "interact_many", "parameters": {"type": "object"}}}]
WORDS = ["I ", "see ", "a ", "tree", "."]
STATUS_CODES = {400: "openai_bad_request", 404: "openai_not_found", 422: "openai_unprocessable"}


def sdk_client(server: AppServer, path: str = "/proxy/v1", key: str = TEST_KEY, **options: Any) -> openai.OpenAI:
    """An OpenAI SDK client of the app's proxy (default retries), closed when the server stops."""
    http = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(base_url=server.base_url + path, api_key=key, http_client=http, **options)
    server.stack.callback(client.close)
    return client


@pytest.fixture
def sdk(vendor_app: AppServer) -> Callable[..., openai.OpenAI]:
    """`sdk(path="/proxy/v1", key=TEST_KEY, **options)`: an SDK client of `vendor_app`."""
    return lambda path="/proxy/v1", key=TEST_KEY, **options: sdk_client(vendor_app, path, key, **options)


def _words_stream(**options: Any) -> Any:
    return sse([chunk(word) for word in WORDS] + [chunk(finish_reason="stop")], **options)


# --- answers ---------------------------------------------------------------------------------------


def test_a_completion_and_a_synthesised_call(sdk: Callable[..., openai.OpenAI], fake_model: FakeModel) -> None:
    fake_model.script(tool_call("move_left"), text("actions: move_left, do"), text("actions: move_left, do"))
    client = sdk()
    called = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, tools=TOOLS)
    assert called.choices[0].message.tool_calls and called.choices[0].finish_reason == "tool_calls"
    synthesised = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, tools=TOOLS)
    (call,) = synthesised.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "interact_many"
    assert synthesised.choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # no tool offered
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.content == "actions: move_left, do"
    assert len(fake_model.requests) == 3


def test_the_app_key_is_checked_and_never_forwarded(sdk: Callable[..., openai.OpenAI], fake_model: FakeModel) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        sdk(key="not-the-key").chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert caught.value.code == "unauthorized"
    with pytest.raises(openai.AuthenticationError):
        sdk(key="not-the-key").chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    assert fake_model.requests == []
    fake_model.script(_words_stream())
    list(sdk().chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True))
    (record,) = fake_model.requests
    assert record.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert_no_key_material(str(record.headers) + record.raw.decode(), (TEST_KEY,))


# --- errors: what each vendor status costs ---------------------------------------------------------

ERRORS: list[tuple[int, type[openai.APIStatusError], int, int]] = [
    # vendor status, the SDK's exception, the status it saw, vendor calls for one SDK call
    (400, openai.BadRequestError, 400, 1),
    (404, openai.NotFoundError, 404, 1),
    (422, openai.UnprocessableEntityError, 422, 1),
    (401, openai.InternalServerError, 502, 1),  # this app's vendor key is wrong: x-should-retry: false
    (403, openai.InternalServerError, 502, 1),
    (501, openai.InternalServerError, 502, 1),
    (500, openai.InternalServerError, 502, 3),  # transient: the SDK's two retries may help
    (503, openai.InternalServerError, 502, 3),
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("status", "raised", "seen", "calls"), ERRORS, ids=[str(case[0]) for case in ERRORS])
def test_vendor_errors_as_the_sdk_sees_them(
    sdk: Callable[..., openai.OpenAI],
    fake_model: FakeModel,
    status: int,
    raised: type[openai.APIStatusError],
    seen: int,
    calls: int,
    stream: bool,
) -> None:
    vendor_error = {"message": f"no, {status}", "type": "invalid_request_error", "param": "model", "code": None}
    fake_model.default = error(status, body={"error": vendor_error})
    with pytest.raises(raised) as caught:
        sdk().chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=stream)
    assert caught.value.status_code == seen
    assert len(fake_model.requests) == calls
    if seen == status:  # the caller's mistake: the vendor's error, as the SDK reads it
        assert (caught.value.type, caught.value.param) == ("invalid_request_error", "model")
        assert caught.value.code == STATUS_CODES[status]
        assert caught.value.message.startswith(f"Error code: {status}") and f"no, {status}" in caught.value.message
    assert_no_key_material(str(caught.value.body) + str(caught.value.response.headers), SECRETS)


def test_a_vendor_code_is_the_sdks_error_code(sdk: Callable[..., openai.OpenAI], fake_model: FakeModel) -> None:
    fake_model.script(error(404, body={"error": {"message": "no such model", "code": "model_not_found"}}))
    with pytest.raises(openai.NotFoundError) as caught:
        sdk(path="/proxy/groq/v1").chat.completions.create(model="llama-9", messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    assert len(fake_model.requests) == 1


def test_a_vendor_429_is_retried_after_its_delay(sdk: Callable[..., openai.OpenAI], fake_model: FakeModel) -> None:
    fake_model.default = error(429, retry_after=1)
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as caught:
        sdk(max_retries=1).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert time.monotonic() - started >= 1.0  # the SDK waited the Retry-After the app relayed
    assert caught.value.response.headers["retry-after"] == "1"
    assert len(fake_model.requests) == 2


def test_a_vendor_429_that_says_no_retry_is_not_retried(
    sdk: Callable[..., openai.OpenAI], fake_model: FakeModel
) -> None:
    """A vendor's own `x-should-retry` is relayed (e.g. an exhausted quota)."""
    quota = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    fake_model.default = error(429, body=quota, headers={"x-should-retry": "false"})
    with pytest.raises(openai.RateLimitError) as caught:
        sdk().chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert caught.value.code == "insufficient_quota"
    assert len(fake_model.requests) == 1


# --- streaming -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/proxy/v1", "/proxy/groq/v1"])
def test_stream_true_relays_the_vendors_events(
    sdk: Callable[..., openai.OpenAI], fake_model: FakeModel, path: str
) -> None:
    fake_model.script(_words_stream(interval_s=0.01))
    stream = sdk(path=path).chat.completions.create(
        model="gpt-4o-mini", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(part.choices[0].delta.content or "" for part in chunks) == "".join(WORDS)
    assert chunks[-1].choices[0].finish_reason == "stop"
    (record,) = fake_model.requests
    assert (record.body["stream"], record.body["stream_options"]) == (True, {"include_usage": True})
    assert record.headers["accept"] == "text/event-stream"


def test_the_stream_arrives_as_the_vendor_sends_it(vendor_app: AppServer, fake_model: FakeModel) -> None:
    """Unbuffered and byte for byte: the first event is out while the vendor is still sending."""
    fake_model.script(_words_stream(interval_s=0.3))
    client = vendor_app.client(guard=False)  # the key guard reads the whole body before the test could
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    with client.stream("POST", "/proxy/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert "content-encoding" not in response.headers  # never gzipped (that would buffer it)
        pieces = iter(response.iter_bytes())
        first = next(pieces)
        first_at = time.monotonic()
        relayed = first + b"".join(pieces)
        last_at = time.monotonic()
    assert last_at - first_at > 1.0  # the vendor spends ~1.8 s between its first and last event
    events = [chunk(word) for word in WORDS] + [chunk(finish_reason="stop")]
    assert (
        relayed == b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    )
    assert_no_key_material(relayed.decode(), SECRETS)


def test_a_client_that_leaves_mid_stream_closes_the_vendor_connection(
    sdk: Callable[..., openai.OpenAI], fake_model: FakeModel
) -> None:
    events = 200
    fake_model.script(sse([chunk(f"w{index} ") for index in range(events)], interval_s=0.02))
    stream = sdk().chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    received = [next(stream), next(stream)]
    stream.close()
    assert received[0].choices[0].delta.content == "w0 "
    wait_until(lambda: fake_model.stats.get("sse_client_gone") == 1, timeout=10.0)
    assert fake_model.stats["sse_events_sent"] < events


def test_an_oversized_stream_ends_with_an_error_event(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel
) -> None:
    server = make_app_server(
        openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY, inference_max_response_bytes=4096
    )
    fake_model.script(sse([chunk("x" * 100) for _ in range(200)]))
    stream = sdk_client(server).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    received: list[Any] = []
    with pytest.raises(openai.APIError) as caught:
        received.extend(stream)
    assert caught.value.code == "openai_response_too_large"
    assert 10 < len(received) < 40  # the whole events that fit in 4096 bytes, then the error


def test_a_stalled_stream_ends_with_a_timeout_event(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel
) -> None:
    server = make_app_server(
        openai_base_url=fake_model.url("/v1"), openai_api_key=OPENAI_KEY, inference_read_timeout_s=0.5
    )
    fake_model.script(sse([chunk("first")], done=False, then_hang=True))
    stream = sdk_client(server).chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    assert next(stream).choices[0].delta.content == "first"
    with pytest.raises(openai.APIError) as caught:
        next(stream)
    assert caught.value.code == "openai_timeout"
    wait_until(lambda: fake_model.stats.get("sse_client_gone") == 1, timeout=10.0)  # the app let go of it
