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

import json
import logging
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body

from ...core.errors import BadRequest, InvalidRequest, UpstreamError, UpstreamTimeout
from ...core.json_codec import dumps_bytes
from ...core.outbound import AnswerTooLarge, SendFailure, post
from ...core.settings import Settings
from ...policy.inference import PROVIDER_GROQ, PROVIDER_OPENAI, InferenceTarget, resolve_target
from ...policy.vendors import sanitised_error_body, shape_chat_body, synthesise_tool_call, with_crafting_hint
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute

logger = logging.getLogger(__name__)

router = APIRouter(
    prefix="/proxy",
    tags=["proxy"],
    dependencies=[AuthDep],
    route_class=StrictJSONRoute,
    responses=errors(*PROTECTED, *BODY, 502, 504),
)

SYNTHESISED_HEADER = "X-Task-App-Synthesised-Tool-Call"
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
            connect_timeout_s=settings.inference_connect_timeout_s,
            read_timeout_s=settings.inference_read_timeout_s,
            total_timeout_s=settings.inference_connect_timeout_s + settings.inference_read_timeout_s,
            max_bytes=settings.inference_max_response_bytes,
        )
    except AnswerTooLarge as exc:
        raise UpstreamError(
            f"the {vendor} answer exceeded {exc.limit} bytes",
            code=f"{vendor}_response_too_large",
            vendor=vendor,
            limit=exc.limit,
        ) from exc
    except SendFailure as exc:
        if exc.kind == SendFailure.TIMEOUT:
            raise UpstreamTimeout(
                f"{vendor} did not answer within the time limit", code=f"{vendor}_timeout", vendor=vendor
            ) from exc
        if exc.kind == SendFailure.CONNECT:
            raise UpstreamError(f"cannot connect to {vendor}", code=f"{vendor}_unreachable", vendor=vendor) from exc
        raise UpstreamError(
            f"the connection to {vendor} failed ({exc})", code=f"{vendor}_connection_error", vendor=vendor
        ) from exc
    if not answer.ok:
        raise _vendor_error(vendor, answer.status, answer.body, answer.retry_after, settings)
    try:
        parsed = json.loads(answer.body)
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
