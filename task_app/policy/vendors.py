"""Vendor (OpenAI, Groq) request shaping and answer handling, shared by the proxy routes and provider routing.

    client body ─► shape_chat_body(body, provider) ─► vendor            (proxy: /proxy[/groq]/v1/chat/completions)
                     ├─ drops what vendors reject (self-hosted sampling knobs, the old system's thinking_* fields, ...)
                     ├─ token / sampling parameters by `inference.chat_params` (the one rule set: a
                     │  `policy.config.provider` rollout gets exactly the same parameters)
                     └─ legacy `function_call` → `tool_choice` when the body carries `tools`
    messages     ─► with_crafting_hint(messages)        (the crafting rules appended to / inserted as the system turn)
    vendor answer ─► synthesise_tool_call(body)         (a text answer naming actions becomes an `interact_many`
                                                         call, when offers_tool_call(request) says it may)
    vendor error  ─► sanitised_error_body(raw, secrets) (short, key-free: vendors echo pieces of the key they got)

The proxy routes (`task_app/web/routes/proxy.py`) use all five; a `policy.config.provider` rollout uses
`chat_params` directly, so both paths send a vendor the same token and sampling parameters.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import crafter.constants

from ..core.errors import InvalidRequest
from ..core.json_codec import dumps, loads
from ..game import TOOL_NAME, normalise_tool_calls
from .base import content_text
from .inference import PROVIDER_GROQ, PROVIDER_OPENAI, chat_params
from .react import calls_from_text

VENDORS = (PROVIDER_OPENAI, PROVIDER_GROQ)
HINT_TITLE = "Crafter crafting rules"
SYNTHESISED_CALL_ID = "call_text_fallback"
# Fields neither vendor accepts: the old system's private knobs and self-hosted (vLLM-like) sampling.
VENDOR_FOREIGN_KEYS = frozenset(
    {
        "stop_after_tool_calls",
        "thinking_mode",
        "thinking_budget",
        "extra_body",
        "reasoning",
        "chat_template_kwargs",
        "top_k",
        "min_p",
        "repetition_penalty",
    }
)
_PARAM_KEYS = ("max_tokens", "max_completion_tokens", "temperature", "top_p")
_SYSTEM_ROLES = ("system", "developer")
_ERROR_TEXT_CHARS = 500
_ERROR_TOKEN_CHARS = 64
_REDACTED = "[redacted]"
# Key-shaped text: vendor key prefixes (OpenAI `sk-...`, Groq `gsk_...`), bearer tokens, masked tails
# ("****abcd": vendors echo a masked key in 401 messages, and its tail is still key material) and long
# unbroken alphanumeric runs. Hyphenated names (models, parameters) stay readable.
_KEY_LIKE = re.compile(
    r"(?i)\b(?:sk|gsk|pk|rk)[-_][A-Za-z0-9_\-*.]{2,}|bearer\s+\S+|\*{3,}[A-Za-z0-9]*|[A-Za-z0-9]{24,}",
)


# --- the request -------------------------------------------------------------------------------------


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{key} must be a number", code="invalid_parameter", field=key)
    return float(value)


def _count(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"{key} must be a positive integer", code="invalid_parameter", field=key)
    return value


def _legacy_function_call(body: dict[str, Any]) -> None:
    """`function_call` next to `tools` is rejected by both vendors: turn it into the equivalent `tool_choice`."""
    if "function_call" not in body or "functions" in body or not body.get("tools"):
        return
    legacy = body.pop("function_call")
    if "tool_choice" in body:
        return
    if isinstance(legacy, Mapping) and isinstance(legacy.get("name"), str):
        body["tool_choice"] = {"type": "function", "function": {"name": legacy["name"]}}
    elif legacy in ("auto", "none"):
        body["tool_choice"] = legacy


def shape_chat_body(body: Mapping[str, Any], provider: str) -> dict[str, Any]:
    """The body as `provider` accepts it; the input is not modified.

    Token and sampling parameters come from `chat_params`, the rules a `provider` rollout uses:
    reasoning models (gpt-5*, o-series) get `max_completion_tokens` (the caller's value, never
    raised) and no temperature / top_p; other models get `max_tokens`. Anything else the caller sent
    (tools, tool_choice, response_format, seed, stop, ...) is kept.
    """
    if provider not in VENDORS:
        raise ValueError(f"unknown vendor {provider!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidRequest("model must be a non-empty string", code="missing_model")
    params = chat_params(
        model,
        provider=provider,
        temperature=_number(body, "temperature"),
        top_p=_number(body, "top_p"),
        max_tokens=_count(body, "max_tokens"),
        max_completion_tokens=_count(body, "max_completion_tokens"),
        extras=body,
    )
    shaped = {key: copy.deepcopy(value) for key, value in body.items() if key not in VENDOR_FOREIGN_KEYS}
    for key in _PARAM_KEYS:
        shaped.pop(key, None)
    shaped.update(params)
    _legacy_function_call(shaped)
    return shaped


@functools.cache
def crafting_hint() -> str:
    """What each `make_*` action needs, from the installed game's data (the old system's hint, made exact)."""
    lines = [f"{HINT_TITLE} (from the game's data):"]
    for name, recipe in crafter.constants.make.items():
        costs = ", ".join(f"{count} {item}" for item, count in recipe["uses"].items())
        lines.append(f"- make_{name}: needs a nearby {' and '.join(recipe['nearby'])}; uses {costs}")
    return "\n".join(lines)


def with_crafting_hint(messages: list[Any]) -> list[Any]:
    """The crafting rules appended to a string system message, or inserted as one when there is none.

    A system message with list content (multi-part) is left alone; so is one that has the hint already.
    """
    hint = crafting_hint()
    first = messages[0] if messages else None
    if isinstance(first, Mapping) and first.get("role") in _SYSTEM_ROLES:
        content = first.get("content")
        if not isinstance(content, str) or HINT_TITLE in content:
            return messages
        return [{**first, "content": f"{content.rstrip()}\n\n{hint}" if content.strip() else hint}, *messages[1:]]
    return [{"role": "system", "content": hint}, *messages]


# --- the answer --------------------------------------------------------------------------------------


def offers_tool_call(request: Mapping[str, Any]) -> bool:
    """True when the request offered the `interact_many` tool and left the model free to call it (no
    `tool_choice` of "none" or of another function): only then may a text answer become a call."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return False
    functions = [tool.get("function") for tool in tools if isinstance(tool, Mapping)]
    if not any(isinstance(function, Mapping) and function.get("name") == TOOL_NAME for function in functions):
        return False
    choice = request.get("tool_choice")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        return not isinstance(function, Mapping) or function.get("name") == TOOL_NAME
    return choice != "none"


def synthesise_tool_call(body: dict[str, Any], max_actions: int) -> bool:
    """Give a text-only first choice an `interact_many` tool call when its text names actions. In place.

    Uses the `crafter-react` text parser (JSON `actions`, JSON tool calls, `actions:` lines); the
    synthesised call carries only valid action names, its arguments a JSON string as vendors send
    them, and the choice's `finish_reason` becomes "tool_calls", as a vendor's own call would say.
    Returns True when a call was added. A message that has tool calls is never touched.
    """
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    message = choices[0].get("message")
    if not isinstance(message, dict) or message.get("tool_calls") or message.get("function_call"):
        return False
    calls = calls_from_text(content_text(message.get("content")), max_actions)
    plan = normalise_tool_calls(calls, max_actions)
    if not calls or plan.fallback_noop:
        return False
    arguments = dumps({"actions": list(plan.actions)})
    message["tool_calls"] = [
        {"id": SYNTHESISED_CALL_ID, "type": "function", "function": {"name": TOOL_NAME, "arguments": arguments}}
    ]
    choices[0]["finish_reason"] = "tool_calls"
    return True


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` without the given secrets and without anything shaped like a key or token."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, _REDACTED)
    return _KEY_LIKE.sub(_REDACTED, text)


def _short_token(value: Any) -> str | None:
    if isinstance(value, str) and len(value) <= _ERROR_TOKEN_CHARS and not _KEY_LIKE.search(value):
        return value
    return None


def sanitised_error_body(raw: bytes, secrets: Iterable[str]) -> dict[str, Any]:
    """A vendor's error body reduced to what helps and cannot leak a key.

    JSON `{"error": {...}}`: `type`, `code`, `param` when they are short tokens, and `message`
    redacted and cut to 500 characters. Anything else: its first 500 characters, redacted.
    """
    secrets = [secret for secret in secrets if secret]
    text = raw.decode("utf-8", "replace")
    try:
        data = loads(text)
    except (ValueError, RecursionError):
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        kept: dict[str, Any] = {}
        for key in ("type", "code", "param"):
            token = _short_token(error.get(key))
            if token is not None:
                kept[key] = token
        if isinstance(error.get("message"), str):
            kept["message"] = redact(error["message"], secrets)[:_ERROR_TEXT_CHARS]
        return {"error": kept}
    if isinstance(error, str):
        return {"error": {"message": redact(error, secrets)[:_ERROR_TEXT_CHARS]}}
    return {"text": redact(text, secrets)[:_ERROR_TEXT_CHARS]}
