"""Vendor chat-completions proxies: `/proxy/v1/chat/completions` (OpenAI), `/proxy/groq/v1/chat/completions` (Groq).

    caller ──X-API-Key──► auth ─► vendor key or 503 ─► shape_chat_body + crafting hint
        ─► one POST through the app's pooled client (Bearer <vendor key>; the caller's headers are not forwarded)
        ─► 2xx JSON: a text answer to a request that offered `interact_many` gets a synthesised call
           (finish_reason "tool_calls"); otherwise the answer as the vendor sent it
        ─► `stream: true`: the vendor's server-sent events relayed unchanged as they arrive, within the
           answer-size and time limits (a limit ends the stream with an SSE `error` event); no synthesis
        ─► a vendor error, mapped for an OpenAI SDK (which retries 408/409/429/5xx twice unless the
           answer carries `x-should-retry: false`):
             400 / 404 / 422   the vendor's status and its sanitised error: the caller's mistake, no retry
             429               429 with Retry-After (the vendor's delay, else 1 s)
             401 / 403         502 `<vendor>_key_refused`, x-should-retry: false: this app's key is wrong
             5xx               502 `<vendor>_error` (retryable; 501 / 505 with x-should-retry: false)
             any other         502 `<vendor>_error`, x-should-retry: false (408 / 409 left retryable)
        ─► timeout: 504 `<vendor>_timeout`; cannot connect: 502 `<vendor>_unreachable`; other transport
           failure: 502 `<vendor>_connection_error`; non-JSON or oversized answer: 502

One attempt per call: the caller (a trainer's policy, an SDK) owns retries, so a failure is reported at
once with what it needs to decide. The rules shared with `policy.config.provider` rollouts live in
`task_app/policy/vendors.py` and `task_app/policy/inference.py`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from ...core.backoff import retry_after_seconds
from ...core.errors import (
    InvalidRequest,
    TaskAppError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamRefused,
    UpstreamTimeout,
)
from ...core.json_codec import dumps_bytes, loads
from ...core.outbound import AnswerTooLarge, SendFailure, Stream, open_stream, post
from ...core.settings import Settings
from ...policy.inference import PROVIDER_GROQ, PROVIDER_OPENAI, InferenceTarget, resolve_target
from ...policy.vendors import (
    offers_tool_call,
    sanitised_error_body,
    shape_chat_body,
    synthesise_tool_call,
    with_crafting_hint,
)
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute

logger = logging.getLogger(__name__)

router = APIRouter(
    prefix="/proxy",
    tags=["proxy"],
    dependencies=[AuthDep],
    route_class=StrictJSONRoute,
    responses=errors(*PROTECTED, *BODY, 404, 429, 502, 504),
)

SYNTHESISED_HEADER = "X-Task-App-Synthesised-Tool-Call"
ChatBody = Annotated[dict[str, Any], Body()]
_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the vendor's chat completion, or with `stream: true` its server-sent events",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
    }
}
KEY_NAMES = {PROVIDER_OPENAI: "OPENAI_API_KEY", PROVIDER_GROQ: "GROQ_API_KEY"}
CALLERS_MISTAKES = frozenset({400, 404, 422})  # the vendor refused the request itself
KEY_REFUSED = frozenset({401, 403})  # the vendor refused this app's key: nothing the caller can change
RATE_LIMITED = 429
_RETRYABLE = frozenset({408, 409, 429})  # with 5xx: what the openai SDK retries, where a retry may help
_NOT_RETRYABLE_5XX = frozenset({501, 505})
_SERVER_ERROR = 500
_NO_RETRY = {"x-should-retry": "false"}
_DEFAULT_RETRY_AFTER_S = 1
_STATUS_WORDS = {400: "bad_request", 404: "not_found", 422: "unprocessable", 429: "rate_limited"}
_SNAKE_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")


@router.post("/v1/chat/completions", responses=_ANSWERS)
async def openai_chat_completions(body: ChatBody, state: StateDep) -> Response:
    return await _proxy(PROVIDER_OPENAI, body, state)


@router.post("/groq/v1/chat/completions", responses=_ANSWERS)
async def groq_chat_completions(body: ChatBody, state: StateDep) -> Response:
    return await _proxy(PROVIDER_GROQ, body, state)


def _known_secrets(settings: Settings) -> list[str]:
    vendor = [key.get_secret_value() for key in (settings.openai_api_key, settings.groq_api_key) if key is not None]
    return [*vendor, *settings.api_keys]


async def _proxy(vendor: str, body: dict[str, Any], state: AppState) -> Response:
    settings = state.settings
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", code="invalid_messages")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", code="invalid_parameter", field="stream")
    target = resolve_target(inference_url=None, provider=vendor, api_key=None, settings=settings)
    shaped = shape_chat_body(body, vendor)
    if not stream:
        shaped.pop("stream", None)
        shaped.pop("stream_options", None)  # vendors refuse it on a non-streaming request
    shaped["messages"] = with_crafting_hint(shaped["messages"])
    if stream:
        return await _stream(vendor, target, shaped, state)
    started = anyio.current_time()
    status, answer = await _send(vendor, target, shaped, state)
    synthesised = offers_tool_call(shaped) and synthesise_tool_call(answer, settings.max_actions_per_decision)
    logger.info(
        "proxy %s model=%s messages=%d tools=%d status=%d latency_ms=%.0f synthesised=%s",
        vendor,
        shaped.get("model"),
        len(shaped["messages"]),
        len(shaped.get("tools") or ()),
        status,
        (anyio.current_time() - started) * 1000,
        synthesised,
    )
    headers = {SYNTHESISED_HEADER: "interact_many"} if synthesised else None
    return JSONBytes(answer, status_code=status, headers=headers)


def _limits(settings: Settings) -> dict[str, float]:
    connect, read = settings.inference_connect_timeout_s, settings.inference_read_timeout_s
    return {"connect_timeout_s": connect, "read_timeout_s": read, "total_timeout_s": connect + read}


async def _send(
    vendor: str, target: InferenceTarget, body: dict[str, Any], state: AppState
) -> tuple[int, dict[str, Any]]:
    """One POST to the vendor: (status, JSON object), or the precise TaskAppError."""
    settings = state.settings
    headers = {**target.headers(), "Content-Type": "application/json"}
    try:
        answer = await post(
            state.http,
            target.http_url or target.url,
            dumps_bytes(body, allow_nan=False),
            headers,
            max_bytes=settings.inference_max_response_bytes,
            **_limits(settings),
        )
    except AnswerTooLarge as exc:
        raise _too_large(vendor, exc.limit) from exc
    except SendFailure as exc:
        raise _send_failure(vendor, exc) from exc
    if not answer.ok:
        raise _vendor_error(vendor, answer.status, answer.body, answer.retry_after, answer.should_retry, settings)
    try:
        parsed = loads(answer.body)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise UpstreamError(
            f"{vendor} answered with something other than a JSON object",
            code=f"{vendor}_invalid_response",
            vendor=vendor,
            status=answer.status,
        )
    return answer.status, parsed


# --- streaming ----------------------------------------------------------------------------------


async def _stream(vendor: str, target: InferenceTarget, body: dict[str, Any], state: AppState) -> Response:
    """The vendor's event stream as it arrives; a vendor error before the first byte is mapped as above."""
    settings = state.settings
    headers = {**target.headers(), "Content-Type": "application/json", "Accept": "text/event-stream"}
    started = anyio.current_time()
    try:
        upstream = await open_stream(
            state.http, target.http_url or target.url, dumps_bytes(body, allow_nan=False), headers, **_limits(settings)
        )
    except SendFailure as exc:
        raise _send_failure(vendor, exc) from exc
    if not upstream.ok:
        try:
            raw = await upstream.read_error()
        except SendFailure:
            raw = b""
        finally:
            upstream.close()
        raise _vendor_error(vendor, upstream.status, raw, upstream.retry_after, upstream.should_retry, settings)
    relay = _relay(vendor, upstream, settings.inference_max_response_bytes, started, body.get("model"))
    # The relay closes the vendor connection when it ends; the background task when the client left
    # while the relay was suspended (Starlette stops iterating it without closing it).
    return StreamingResponse(
        relay,
        status_code=upstream.status,
        media_type=upstream.content_type or "text/event-stream",
        headers={"Cache-Control": "no-cache"},
        background=BackgroundTask(upstream.close),
    )


def _event_end(data: bytes | bytearray) -> int:
    """The length of the longest prefix of `data` that ends at a server-sent-event boundary (0: none)."""
    return max((found + len(end) for end in _EVENT_ENDS if (found := data.rfind(end)) >= 0), default=0)


def _error_event(error: TaskAppError) -> bytes:
    """An SSE `data:` line the openai SDK raises as an APIError (it checks every event for `error`)."""
    payload = {"error": {"message": error.message, "type": "proxy_error", "code": error.code}}
    return b"data: " + dumps_bytes(payload) + b"\n\n"


async def _relay(vendor: str, upstream: Stream, limit: int, started: float, model: Any) -> AsyncIterator[bytes]:
    """The vendor's bytes unchanged, passed on at event boundaries (at most one partial event held
    back), so that a limit ends the stream with a whole error event rather than half an event."""
    pending, sent, outcome = bytearray(), 0, "client_disconnected"
    try:
        async for chunk in upstream.chunks():
            pending += chunk
            if sent + len(pending) > limit:
                if fits := _event_end(pending[: limit - sent]):  # the whole events within the limit
                    sent += fits
                    yield bytes(pending[:fits])
                too_large = _too_large(vendor, limit)
                outcome = too_large.code
                yield _error_event(too_large)
                return
            if cut := _event_end(pending):
                sent += cut
                yield bytes(pending[:cut])
                del pending[:cut]
        if pending:
            sent += len(pending)
            yield bytes(pending)
        outcome = "completed"
    except SendFailure as exc:
        failure = _send_failure(vendor, exc)
        outcome = failure.code
        yield _error_event(failure)
    finally:
        upstream.close()
        logger.info(
            "proxy %s stream model=%s bytes=%d latency_ms=%.0f outcome=%s",
            vendor,
            model,
            sent,
            (anyio.current_time() - started) * 1000,
            outcome,
        )


# --- errors -------------------------------------------------------------------------------------


def _too_large(vendor: str, limit: int) -> UpstreamError:
    return UpstreamError(
        f"the {vendor} answer exceeded {limit} bytes", code=f"{vendor}_response_too_large", vendor=vendor, limit=limit
    )


def _send_failure(vendor: str, exc: SendFailure) -> TaskAppError:
    if exc.kind == SendFailure.TIMEOUT:
        return UpstreamTimeout(
            f"{vendor} did not answer within the time limit", code=f"{vendor}_timeout", vendor=vendor
        )
    if exc.kind == SendFailure.CONNECT:
        return UpstreamError(f"cannot connect to {vendor}", code=f"{vendor}_unreachable", vendor=vendor)
    headers = _NO_RETRY if exc.kind == SendFailure.REQUEST else None  # this app's vendor URL is unusable
    return UpstreamError(
        f"the connection to {vendor} failed ({exc})", code=f"{vendor}_connection_error", headers=headers, vendor=vendor
    )


def _retry_after(header: str | None) -> int:
    seconds = retry_after_seconds(header)
    return math.ceil(seconds) if seconds is not None and math.isfinite(seconds) else _DEFAULT_RETRY_AFTER_S


def _vendor_error(
    vendor: str, status: int, raw: bytes, retry_after: str | None, should_retry: str | None, settings: Settings
) -> TaskAppError:
    """The vendor's error answer as the caller should see it (the module docstring's table)."""
    body = sanitised_error_body(raw, _known_secrets(settings))
    found = body.get("error")
    vendor_error: dict[str, Any] = found if isinstance(found, dict) else {}
    details: dict[str, Any] = {"vendor": vendor, "status": status, "body": body}
    details.update({key: vendor_error[key] for key in ("type", "param") if key in vendor_error})
    relayed = {"x-should-retry": should_retry} if should_retry in ("true", "false") else {}
    logger.warning("proxy %s: vendor answered HTTP %d", vendor, status)
    if status in CALLERS_MISTAKES or status == RATE_LIMITED:
        vendor_code = vendor_error.get("code")
        code = vendor_code if isinstance(vendor_code, str) and _SNAKE_CODE.match(vendor_code) else None
        code = code or f"{vendor}_{_STATUS_WORDS[status]}"
        message = vendor_error.get("message") or f"{vendor} answered HTTP {status}"
        if status == RATE_LIMITED:
            seconds = _retry_after(retry_after)
            headers = {"Retry-After": str(seconds), **relayed}
            return UpstreamRateLimited(message, code=code, headers=headers, retry_after_s=seconds, **details)
        return UpstreamRefused(message, code=code, headers=_NO_RETRY, **details)  # details carry the status
    if status in KEY_REFUSED:
        message = f"{vendor} refused this app's {KEY_NAMES[vendor]} (HTTP {status}): the deployment's key needs fixing"
        return UpstreamError(message, code=f"{vendor}_key_refused", headers=_NO_RETRY, **details)
    retryable = status in _RETRYABLE or (status >= _SERVER_ERROR and status not in _NOT_RETRYABLE_5XX)
    headers = relayed if retryable else _NO_RETRY
    return UpstreamError(f"{vendor} answered HTTP {status}", code=f"{vendor}_error", headers=headers, **details)
