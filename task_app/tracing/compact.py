"""Compact rows: each long prompt text stored once per session, everything else by reference.

An LLM step of a structured trace carries the system prompt three times (the system message's
`text` and `content`, and the call record's input) and the user turn three times. Stored as they are,
most of a session's bytes would be one system prompt, repeated three times a decision.
The store keeps the old system's tables and columns, and the first system message of a session in full
(so the prompt is readable where a tool looks for it); later copies are references:

    messages.content (system, later steps)   {"role": "system", "text_ref": {"step_id": "decision_0"}}
    events.call_records[].input_messages[]   parts [{"type": "text", "text_ref": {"step_id": ...,
                                                      "message_type": "system" | "user"}}]
                                             (the text of that step's message of that type)

A reference replaces a value only where it is exactly what the trace builder produced from the text
it points to, so `get_session` (via `TextResolver`) rebuilds the trace byte for byte. Rows written
before this format (all in full) read back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ..core.json_codec import dumps

SYSTEM = "system"
_REF = "text_ref"
_REF_ROLES = frozenset({"system", "user"})


@lru_cache(maxsize=32)
def system_body(text: str) -> str:
    """The `json_payload` the trace builder writes for a system message whose content is `text`.

    Cached: every decision of a rollout carries the same prompt, so its body is encoded once, and
    the store's comparison with the first step's body is an identity check; kept by measurement
    (docs/decisions/trace-writer.md).
    """
    return dumps({"role": SYSTEM, "text": text, "content": text})


@lru_cache(maxsize=32)
def _system_ref(step_id: str) -> str:
    """A system message body that points at the step holding the text (nearly always `decision_0`)."""
    return dumps({"role": SYSTEM, _REF: {"step_id": step_id}})


def _single_text(parts: Any) -> str | None:
    if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], Mapping):
        part = parts[0]
        if part.get("type") == "text" and set(part) == {"type", "text"} and isinstance(part["text"], str):
            return str(part["text"])
    return None


class TextIndex:
    """Write side: remembers the texts already stored in full for one session."""

    def __init__(self) -> None:
        self._system: dict[str, tuple[str, str]] = {}  # text -> (its system body, step that holds it)
        self._step_texts: dict[tuple[str, str], str] = {}  # (step_id, message type) -> its message's text

    def message_body(self, step_id: str, message_type: str | None, body: str, text: Any) -> str:
        """The `messages.content` to store for one message."""
        if not isinstance(text, str) or message_type is None:
            return body
        self._step_texts.setdefault((step_id, message_type), text)
        if message_type != SYSTEM:
            return body
        known = self._system.get(text)
        if known is None:
            if body == system_body(text):
                self._system[text] = (body, step_id)
            return body
        full, first_step = known
        if body != full or first_step == step_id:
            return body
        return _system_ref(first_step)

    def call_records(self, step_id: str, records: Any) -> Any:
        """`call_records` with each input message that repeats a stored text replaced by a reference."""
        if not isinstance(records, list):
            return records
        return [self._record(step_id, record) for record in records]

    def _record(self, step_id: str, record: Any) -> Any:
        if not isinstance(record, Mapping) or not isinstance(record.get("input_messages"), list):
            return record
        inputs = [self._input(step_id, message) for message in record["input_messages"]]
        return {**record, "input_messages": inputs}

    def _input(self, step_id: str, message: Any) -> Any:
        if not isinstance(message, Mapping) or message.get("role") not in _REF_ROLES:
            return message
        role, text = str(message["role"]), _single_text(message.get("parts"))
        if text is None:
            return message
        target = self._target(step_id, role, text)
        if target is None:
            return message
        return {**message, "parts": [{"type": "text", _REF: {"step_id": target, "message_type": role}}]}

    def _target(self, step_id: str, role: str, text: str) -> str | None:
        if self._step_texts.get((step_id, role)) == text:
            return step_id
        if role == SYSTEM and text in self._system:
            return self._system[text][1]
        return None


class TextResolver:
    """Read side: resolves the references of one stored session."""

    def __init__(self) -> None:
        self._step_texts: dict[tuple[str, str], str] = {}

    def message_body(self, step_id: str | None, message_type: str, body: str, payload: Any) -> tuple[str, Any]:
        """The stored body and its parsed payload, with a reference replaced by the full message."""
        ref = payload.get(_REF) if isinstance(payload, dict) and set(payload) == {"role", _REF} else None
        if isinstance(ref, Mapping) and message_type == SYSTEM:
            text = self._step_texts.get((str(ref.get("step_id")), SYSTEM))
            if text is not None:
                body = system_body(text)
                payload = {"role": SYSTEM, "text": text, "content": text}
        text = payload.get("text") if isinstance(payload, dict) else None
        if step_id is not None and isinstance(text, str):
            self._step_texts.setdefault((step_id, message_type), text)
        return body, payload

    def call_records(self, records: Any) -> Any:
        if not isinstance(records, list):
            return records
        for record in records:
            inputs = record.get("input_messages") if isinstance(record, dict) else None
            for message in inputs if isinstance(inputs, list) else []:
                self._resolve_input(message)
        return records

    def _resolve_input(self, message: Any) -> None:
        parts = message.get("parts") if isinstance(message, dict) else None
        if not (isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict)):
            return
        ref = parts[0].get(_REF)
        if parts[0].get("type") != "text" or not isinstance(ref, Mapping):
            return
        text = self._step_texts.get((str(ref.get("step_id")), str(ref.get("message_type"))))
        if text is not None:
            parts[0] = {"type": "text", "text": text}
