"""`policy.config.history: "messages"`: one growing chat per episode, within a turn and a byte budget.

    system
    user        observation 0 (and the answer format)
    assistant   the model's answer: its interact_many call                 ┐ turn 0
    tool        what ran, what it unlocked, then observation 1             ┘
    assistant   ...                                                        ┐ turn 1
    tool        ... observation 2          ← the request of decision 2 ends here

A turn is an answer and the prompt it answered. The result of an answer goes back as a `tool` message
for each of its tool call ids (the first carries the text), or as a `user` message when the answer had
no tool call (a text answer). Earlier answers are sent back as the model gave them, content and tool
calls; their reasoning (the server's `reasoning_content` or `reasoning` field) only with
`history_reasoning: true`, under the field name the server used, so that a chat template which
renders earlier reasoning re-renders the turn as the model produced it (docs/episode-sequences.md).
An answer that never came (the server's reply was not JSON) leaves its prompt unanswered: the next
prompt is appended to it, so roles still alternate.

Budget: when the request would hold more than `max_turns` earlier turns or more than `max_bytes` bytes
of JSON messages, the oldest turns are dropped for good; the first kept prompt then opens the chat as
the user message, with a line saying how many turns were dropped. `reset()` starts a new conversation
(a new episode).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.json_codec import dumps, dumps_bytes

DROPPED_NOTE = "({n} earlier turn(s) of this episode were dropped to fit the conversation budget.)"
REASONING_FIELDS = ("reasoning_content", "reasoning")  # vLLM and SGLang name it either way


@dataclass(slots=True)
class _Turn:
    prompt: str
    answer: dict[str, Any]
    call_ids: list[str]
    size: int = 0  # JSON bytes of the answer and its prompt


@dataclass(slots=True)
class Trim:
    """What the budget did to one request (the step's `info.meta.history`)."""

    turns: int  # earlier turns in the request
    bytes: int  # JSON bytes of the request's messages
    dropped_turns: int  # dropped for this request
    dropped_turns_total: int  # dropped so far this episode

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": "messages",
            "turns": self.turns,
            "bytes": self.bytes,
            "dropped_turns": self.dropped_turns,
            "dropped_turns_total": self.dropped_turns_total,
        }


def _size(message: Mapping[str, Any]) -> int:
    return len(dumps_bytes(message))


def assistant_message(
    message: Mapping[str, Any], turn: int, *, reasoning: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """The model's answer as it goes back into the chat: content and tool calls (ids and JSON-string
    arguments filled in where the server left them out), its reasoning with `reasoning`, and the call ids."""
    content = message.get("content")
    answer: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    if reasoning:
        for name in REASONING_FIELDS:
            if isinstance(message.get(name), str):
                answer[name] = message[name]
                break
    calls, ids = [], []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        arguments = function.get("arguments")
        call_id = str(call.get("id") or f"call_{turn}_{index}")
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": str(function.get("name") or ""),
                    "arguments": arguments if isinstance(arguments, str) else dumps(arguments or {}),
                },
            }
        )
        ids.append(call_id)
    if calls:
        answer["tool_calls"] = calls
    return answer, ids


def _prompt_messages(text: str, call_ids: list[str]) -> list[dict[str, Any]]:
    """The prompt after an answer: a tool message per call id (the first with the text), or a user message."""
    if not call_ids:
        return [{"role": "user", "content": text}]
    first, *rest = call_ids
    return [
        {"role": "tool", "tool_call_id": first, "content": text},
        *({"role": "tool", "tool_call_id": call_id, "content": "(see the first call's result)"} for call_id in rest),
    ]


@dataclass(slots=True)
class Conversation:
    system: str
    max_turns: int
    max_bytes: int
    reasoning: bool = False  # send each answer's reasoning back (policy.config.history_reasoning)
    turns: list[_Turn] = field(default_factory=list)
    dropped: int = 0
    unanswered: str | None = None
    answers: int = 0  # answers this episode (tool call ids made up for them are numbered by it)

    def reset(self) -> None:
        self.turns.clear()
        self.dropped, self.unanswered, self.answers = 0, None, 0

    @property
    def started(self) -> bool:
        return bool(self.turns) or self.unanswered is not None

    def _build(self, prompt: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system}]
        previous_ids: list[str] | None = None
        for turn in self.turns:
            if previous_ids is None:
                note = DROPPED_NOTE.format(n=self.dropped) + "\n\n" if self.dropped else ""
                messages.append({"role": "user", "content": note + turn.prompt})
            else:
                messages.extend(_prompt_messages(turn.prompt, previous_ids))
            messages.append(turn.answer)
            previous_ids = turn.call_ids
        if previous_ids is None:
            note = DROPPED_NOTE.format(n=self.dropped) + "\n\n" if self.dropped else ""
            messages.append({"role": "user", "content": note + prompt})
        else:
            messages.extend(_prompt_messages(prompt, previous_ids))
        return messages

    def request(self, text: str) -> tuple[list[dict[str, Any]], Trim]:
        """The messages for the next request, whose prompt is `text`; drops the oldest turns over budget."""
        prompt = f"{self.unanswered}\n\n{text}" if self.unanswered is not None else text
        self.unanswered = prompt
        dropped_now = 0
        fixed = _size({"role": "system", "content": self.system}) + _size({"role": "tool", "content": prompt})
        while self.turns and (
            len(self.turns) > self.max_turns or fixed + sum(turn.size for turn in self.turns) > self.max_bytes
        ):
            self.turns.pop(0)
            self.dropped += 1
            dropped_now += 1
        messages = self._build(prompt)
        size = sum(_size(message) for message in messages)
        return messages, Trim(len(self.turns), size, dropped_now, self.dropped)

    def answered(self, message: Mapping[str, Any] | None) -> None:
        """Record the model's answer to the last request (None: no answer came; its prompt stays open)."""
        if message is None or self.unanswered is None:
            return
        answer, ids = assistant_message(message, self.answers, reasoning=self.reasoning)
        self.answers += 1
        prompt = self.unanswered
        size = _size(answer) + _size({"role": "tool", "content": prompt})
        self.turns.append(_Turn(prompt, answer, ids, size))
        self.unanswered = None
