"""Vendor chat-completions proxies: `/proxy/v1/chat/completions` (OpenAI), `/proxy/groq/v1/chat/completions` (Groq).

    caller ──X-API-Key──► auth ─► refuse `stream` (400) ─► vendor key or 503 ─► shape_chat_body + crafting hint
        ─► one POST through the app's pooled client (Bearer <vendor key>; the caller's headers are not forwarded)
        ─► 2xx JSON: text answer → synthesised `interact_many` call; returned as the vendor sent it otherwise
        ─► vendor status ≥ 300: 502 `<vendor>_error` with the status and a sanitised body
        ─► timeout: 504 `<vendor>_timeout`; cannot connect: 502 `<vendor>_unreachable`; other transport
           failure: 502 `<vendor>_connection_error`; non-JSON or oversized answer: 502

One attempt per call: the caller (a trainer's policy) owns retries, so a failure is reported at once
with enough detail to decide. The rules shared with `policy.config.provider` rollouts live in
`task_app/policy/vendors.py` and `task_app/policy/inference.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Annotated, Any

import anyio
import httpx
from fastapi import APIRouter, Body

from ..deps import AuthDep, StateDep
from ..errors import BadRequest, InvalidRequest, UpstreamError, UpstreamTimeout
from ..policy.inference import PROVIDER_GROQ, PROVIDER_OPENAI, InferenceTarget, resolve_target
from ..policy.vendors import sanitised_error_body, shape_chat_body, synthesise_tool_call, with_crafting_hint
from ..responses import JSONBytes
from ..settings import Settings
from ..state import AppState
from .openapi import BODY, PROTECTED, errors, ok
from .strict_json import StrictJSONRoute

logger = logging.getLogger(__name__)

router = APIRouter(
    prefix="/proxy",
    tags=["proxy"],
    dependencies=[AuthDep],
    route_class=StrictJSONRoute,
    responses=errors(*PROTECTED, *BODY, 502, 504),
)

SYNTHESISED_HEADER = "X-Task-App-Synthesised-Tool-Call"
_ERROR_BODY_BYTES = 4096
_HTTP_OK_MIN, _HTTP_OK_MAX = 200, 299
ChatBody = Annotated[dict[str, Any], Body()]


@router.post("/v1/chat/completions", responses=ok(dict[str, Any], "the vendor's chat completion"))
async def openai_chat_completions(body: ChatBody, state: StateDep) -> JSONBytes:
    return await _proxy(PROVIDER_OPENAI, body, state)


@router.post("/groq/v1/chat/completions", responses=ok(dict[str, Any], "the vendor's chat completion"))
async def groq_chat_completions(body: ChatBody, state: StateDep) -> JSONBytes:
    return await _proxy(PROVIDER_GROQ, body, state)


def _known_secrets(settings: Settings) -> list[str]:
    vendor = [key.get_secret_value() for key in (settings.openai_api_key, settings.groq_api_key) if key is not None]
    return [*vendor, *settings.api_keys]


async def _proxy(vendor: str, body: dict[str, Any], state: AppState) -> JSONBytes:
    settings = state.settings
    if body.get("stream"):
        raise BadRequest("streaming is not supported by this proxy; send stream: false", code="streaming_not_supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", code="invalid_messages")
    target = resolve_target(inference_url=None, provider=vendor, api_key=None, settings=settings)
    shaped = shape_chat_body(body, vendor)
    shaped.pop("stream", None)
    shaped.pop("stream_options", None)  # vendors refuse it on a non-streaming request
    shaped["messages"] = with_crafting_hint(shaped["messages"])
    started = anyio.current_time()
    status, answer = await _send(vendor, target, shaped, state)
    synthesised = synthesise_tool_call(answer, settings.max_actions_per_decision)
    logger.info(
        "proxy %s model=%s messages=%d tools=%d status=%d latency_ms=%.0f synthesised=%s",
        vendor, shaped.get("model"), len(shaped["messages"]), len(shaped.get("tools") or ()), status,
        (anyio.current_time() - started) * 1000, synthesised,
    )  # fmt: skip
    headers = {SYNTHESISED_HEADER: "interact_many"} if synthesised else None
    return JSONBytes(answer, status_code=status, headers=headers)


async def _send(
    vendor: str, target: InferenceTarget, body: dict[str, Any], state: AppState
) -> tuple[int, dict[str, Any]]:
    """One POST to the vendor: (status, JSON object), or the precise TaskAppError."""
    settings = state.settings
    limit = settings.inference_connect_timeout_s + settings.inference_read_timeout_s
    try:
        with anyio.fail_after(limit):
            async with state.http.stream("POST", target.url, json=body, headers=target.headers()) as response:
                status = response.status_code
                if not _HTTP_OK_MIN <= status <= _HTTP_OK_MAX:
                    raw = await _read(response, _ERROR_BODY_BYTES, vendor, truncate=True)
                    raise _vendor_error(vendor, status, raw, response.headers.get("retry-after"), settings)
                raw = await _read(response, settings.inference_max_response_bytes, vendor, truncate=False)
    except (TimeoutError, httpx.TimeoutException) as exc:
        raise UpstreamTimeout(
            f"{vendor} did not answer within the time limit", code=f"{vendor}_timeout", vendor=vendor
        ) from exc
    except httpx.ConnectError as exc:
        raise UpstreamError(f"cannot connect to {vendor}", code=f"{vendor}_unreachable", vendor=vendor) from exc
    except (httpx.TransportError, httpx.DecodingError) as exc:
        raise UpstreamError(
            f"the connection to {vendor} failed ({type(exc).__name__})",
            code=f"{vendor}_connection_error",
            vendor=vendor,
        ) from exc
    try:
        answer = json.loads(raw)
    except (ValueError, RecursionError):
        answer = None
    if not isinstance(answer, dict):
        raise UpstreamError(
            f"{vendor} answered with something other than a JSON object",
            code=f"{vendor}_invalid_response",
            vendor=vendor,
            status=status,
        )
    return status, answer


def _vendor_error(vendor: str, status: int, raw: bytes, retry_after: str | None, settings: Settings) -> UpstreamError:
    details: dict[str, Any] = {
        "vendor": vendor,
        "status": status,
        "body": sanitised_error_body(raw, _known_secrets(settings)),
    }
    if retry_after and retry_after.strip().isdigit():
        details["retry_after_s"] = int(retry_after.strip())
    logger.warning("proxy %s: vendor answered HTTP %d", vendor, status)
    return UpstreamError(f"{vendor} answered HTTP {status}", code=f"{vendor}_error", **details)


async def _read(response: httpx.Response, limit: int, vendor: str, *, truncate: bool) -> bytes:
    """At most `limit` bytes of the body; beyond it an error body is cut, an answer is refused (502)."""
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(response.aiter_bytes()) as stream:  # closed at once when we stop early
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                if truncate:
                    chunks.append(chunk[: len(chunk) - (size - limit)])
                    break
                raise UpstreamError(
                    f"the {vendor} answer exceeded {limit} bytes",
                    code=f"{vendor}_response_too_large",
                    vendor=vendor,
                    limit=limit,
                )
            chunks.append(chunk)
    return b"".join(chunks)
