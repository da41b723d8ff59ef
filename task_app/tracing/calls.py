"""One chat-completions exchange (`LMCall`) as a tracing_v3 `LLMCallRecord` dict, plus message helpers.

The record keeps all 34 keys of synth-ai's `LLMCallRecord` so tooling that rebuilds the dataclass with
`LLMCallRecord(**record)` keeps working. Two levels of detail:

- `raw=True` (trace format `full`): image parts carry their base64 data and `response_raw_json` holds
  the model server's whole answer.
- `raw=False` (`structured`, and what the SQLite store keeps): image parts keep only their mime type,
  size and sha256 (no base64), and `response_raw_json` is null.

`request_raw_json` is always null: `input_messages` plus `request_params` already say what was sent,
and repeating the prompt would double every trace. `token_traces` holds the decision's exact tokens
(`[TokenData.as_dict()]`: prompt and completion ids, logprobs, ...) when the rollout asked for them,
else null.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..core import json_codec
from ..policy.base import LMCall, content_text

API_TYPE = "chat_completions"
CALL_RECORD_SCHEMA = "1.0"
_PARAM_KEYS = ("temperature", "top_p", "stop", "seed", "n", "top_k", "presence_penalty", "frequency_penalty")
_TOOL_KEYS = ("tool_choice", "parallel_tool_calls")
_SKIPPED_PARAMS = frozenset({"messages", "tools", "model", *_PARAM_KEYS, *_TOOL_KEYS, "max_tokens"})
_IMAGE_TYPES = frozenset({"image_url", "input_image", "image"})
IMAGE_REF = "image_ref"  # an image part whose data was left out of a structured trace


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC (`2025-01-02T03:04:05.123456+00:00`); naive datetimes are taken as UTC."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return _utc_iso(moment.astimezone(UTC))


@lru_cache(maxsize=256)
def _utc_iso(moment: datetime) -> str:
    """Cached: each of a decision's four moments is written two or three times (step, call record,
    tool result, and the rows, which turn epochs back into equal datetimes), and `isoformat` is not
    free."""
    return moment.isoformat(timespec="microseconds")


def dumps(value: Any) -> str:
    """Compact JSON; anything JSON cannot hold becomes its `str` (datetimes become ISO strings)."""
    return json_codec.dumps(value, default=_json_default)


def dumps_value(value: Any) -> str:
    """JSON for columns that are only read back as JSON: `dumps`' values at orjson's speed."""
    return json_codec.dumps_value(value, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    return str(value)


# --- message content ------------------------------------------------------------------------------


def content_has_image(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and (part.get("type") in _IMAGE_TYPES or part.get("type") == IMAGE_REF)
        for part in content
    )


def strip_images(content: Any) -> Any:
    """`content` with every image part replaced by a small reference (no base64)."""
    if not content_has_image(content):
        return content
    return [
        _image_reference(part) if isinstance(part, Mapping) and part.get("type") in _IMAGE_TYPES else part
        for part in content
    ]


def _image_url(part: Mapping[str, Any]) -> str:
    url = part.get("image_url")
    if isinstance(url, Mapping):
        url = url.get("url")
    return url if isinstance(url, str) else ""


def _image_part(part: Mapping[str, Any], *, raw: bool) -> dict[str, Any]:
    url = _image_url(part)
    out: dict[str, Any] = {"type": "image"}
    if url.startswith("data:") and "," in url:
        header, data = url.split(",", 1)
        out["mime_type"] = header[5:].split(";", 1)[0] or None
        try:
            decoded = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            decoded = data.encode()
        out["size_bytes"] = len(decoded)
        out["sha256"] = hashlib.sha256(decoded).hexdigest()
        if raw:
            out["base64_data"] = data
    elif url:
        out["uri"] = url
    return out


def _image_reference(part: Mapping[str, Any]) -> dict[str, Any]:
    ref = _image_part(part, raw=False)
    return {"type": IMAGE_REF, **{key: value for key, value in ref.items() if key != "type"}}


def message_parts(content: Any, *, raw: bool) -> list[dict[str, Any]]:
    """OpenAI `content` as `LLMContentPart` dicts (only the keys that carry a value)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        return [{"type": "text", "text": str(content)}]
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            parts.append({"type": "text", "text": str(part)})
        elif part.get("type") in _IMAGE_TYPES:
            parts.append(_image_part(part, raw=raw))
        elif "text" in part:
            parts.append({"type": "text", "text": str(part["text"])})
        else:
            parts.append({"type": str(part.get("type", "unknown")), "data": dict(part)})
    return parts


def llm_message(message: Mapping[str, Any], *, raw: bool) -> dict[str, Any]:
    """An OpenAI chat message as an `LLMMessage` dict; assistant tool calls go to `metadata`."""
    metadata: dict[str, Any] = {}
    if message.get("tool_calls"):
        metadata["tool_calls"] = message["tool_calls"]
    return {
        "role": str(message.get("role", "user")),
        "parts": message_parts(message.get("content"), raw=raw),
        "name": message.get("name"),
        "tool_call_id": message.get("tool_call_id"),
        "metadata": metadata,
    }


def openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `llm_message` (used to export stored traces): parts back to OpenAI content."""
    parts = message.get("parts") or []
    content: Any
    if all(part.get("type") == "text" for part in parts):
        content = "\n".join(str(part.get("text", "")) for part in parts) if parts else ""
    else:
        content = [_openai_part(part) for part in parts]
    out: dict[str, Any] = {"role": message.get("role", "user"), "content": content}
    if message.get("name"):
        out["name"] = message["name"]
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    tool_calls = (message.get("metadata") or {}).get("tool_calls")
    if tool_calls:
        out["tool_calls"] = tool_calls
    return out


def _openai_part(part: Mapping[str, Any]) -> dict[str, Any]:
    if part.get("type") == "text":
        return {"type": "text", "text": part.get("text", "")}
    if part.get("type") == "image":
        if part.get("base64_data"):
            url = f"data:{part.get('mime_type') or 'image/png'};base64,{part['base64_data']}"
            return {"type": "image_url", "image_url": {"url": url}}
        if part.get("uri"):
            return {"type": "image_url", "image_url": {"url": part["uri"]}}
        return {"type": IMAGE_REF, **{key: value for key, value in part.items() if key != "type"}}
    return dict(part.get("data") or part)


# --- the call record ------------------------------------------------------------------------------


def tool_call_specs(tool_calls: Any) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` as `ToolCallSpec` dicts."""
    specs = []
    for index, call in enumerate(tool_calls if isinstance(tool_calls, list) else []):
        if not isinstance(call, Mapping):
            continue
        function: Mapping[str, Any] = call["function"] if isinstance(call.get("function"), Mapping) else call
        arguments = function.get("arguments")
        parsed: Any = arguments
        if isinstance(arguments, str):
            try:
                parsed = json_codec.loads(arguments)
            except ValueError:
                parsed = None
        specs.append(
            {
                "name": str(function.get("name") or call.get("tool_name") or ""),
                "arguments_json": arguments if isinstance(arguments, str) else dumps(arguments),
                "arguments": parsed if isinstance(parsed, dict) else None,
                "call_id": call.get("id"),
                "index": index,
                "parent_call_id": None,
                "metadata": {},
            }
        )
    return specs


@lru_cache(maxsize=64)
def public_url(url: str) -> str:
    """The inference URL without query or fragment (a `?cid=` or a vendor key never reaches a trace).
    Cached: a rollout calls the same URL every decision."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))


def cost_usd(usage: Mapping[str, Any]) -> float | None:
    for key in ("cost_usd", "cost", "total_cost"):
        value = usage.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _request_params(params: Mapping[str, Any]) -> dict[str, Any]:
    tool_choice = params.get("tool_choice")
    tools: list[Any] = params["tools"] if isinstance(params.get("tools"), list) else []
    tool_names = [str((tool.get("function") or {}).get("name", "")) for tool in tools if isinstance(tool, Mapping)]
    return {
        **{key: params.get(key) for key in _PARAM_KEYS},
        "max_tokens": params.get("max_tokens", params.get("max_completion_tokens")),
        "repetition_penalty": params.get("repetition_penalty"),
        "best_of": params.get("best_of"),
        "response_format": params.get("response_format"),
        "json_mode": None,
        "tool_config": {
            "tool_choice": tool_choice,
            "parallel_tool_calls": params.get("parallel_tool_calls"),
            "tools": tool_names,
        },
        "raw_params": {key: value for key, value in params.items() if key not in _SKIPPED_PARAMS},
    }


def _tool_choice_name(choice: Any) -> str | None:
    if isinstance(choice, str) or choice is None:
        return choice
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if isinstance(function, Mapping) and function.get("name"):
            return str(function["name"])
        return dumps(choice)
    return str(choice)


def _usage(call: LMCall) -> dict[str, Any]:
    details = call.usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
    prompt_details = call.usage.get("prompt_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, Mapping) else None
    return {
        "input_tokens": call.input_tokens,
        "output_tokens": call.output_tokens,
        "total_tokens": call.total_tokens,
        "reasoning_tokens": reasoning,
        "reasoning_input_tokens": None,
        "reasoning_output_tokens": None,
        "cache_write_tokens": None,
        "cache_read_tokens": cached,
        "billable_input_tokens": None,
        "billable_output_tokens": None,
        "cost_usd": cost_usd(call.usage),
    }


def call_record(
    call: LMCall,
    *,
    call_id: str,
    trace_id: str | None,
    raw: bool,
    tool_results: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`LLMCallRecord` as a dict (all 34 keys, in the dataclass's order)."""
    assistant = call.assistant_message or {}
    output_messages = [llm_message({"role": "assistant", **assistant}, raw=raw)] if call.assistant_message else []
    response = call.response or {}
    return {
        "call_id": call_id,
        "api_type": API_TYPE,
        "provider": call.provider,
        "model_name": call.model,
        "schema_version": CALL_RECORD_SCHEMA,
        "started_at": iso(call.started_at),
        "completed_at": iso(call.finished_at),
        "latency_ms": round(call.latency_ms),
        "request_params": _request_params(call.request_params),
        "input_messages": [llm_message(message, raw=raw) for message in call.messages],
        "input_text": None,
        "tool_choice": _tool_choice_name(call.request_params.get("tool_choice")),
        "output_messages": output_messages,
        "outputs": [],
        "output_text": content_text(assistant.get("content")) or None,
        "output_tool_calls": tool_call_specs(assistant.get("tool_calls")),
        "usage": _usage(call),
        "finish_reason": call.finish_reason,
        "choice_index": 0 if call.assistant_message else None,
        "tool_results": tool_results or [],
        "chunks": None,
        "request_raw_json": None,
        "response_raw_json": dumps(call.response) if raw and call.response is not None else None,
        "span_id": None,
        "trace_id": trace_id,
        "provider_request_id": response.get("id") if isinstance(response.get("id"), str) else None,
        "request_server_timing": None,
        "metadata": {"url": public_url(call.url), "attempts": call.attempts},
        "outcome": "error" if call.error else "success",
        "error": {"message": call.error} if call.error else None,
        "token_traces": [call.tokens.as_dict()] if call.tokens is not None else None,
        "safety": None,
        "refusal": {"message": assistant["refusal"]} if assistant.get("refusal") else None,
        "redactions": None,
    }
