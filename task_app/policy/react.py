"""`crafter-react`: one chat-completions call per decision, answered through the `interact_many` tool.

    observation + history ─► prompts.build_messages ─► InferenceClient.chat (retries, deadline)
        ─► parse_answer: tool_calls | legacy function_call | text fallback ─► PolicyDecision

Each tool call's `arguments` text is parsed here, once a decision, and the game layer's
`normalise_tool_calls` (docs/contract.md, "The tool") turns the calls into actions, once: the decision
carries the parsed calls and their `ActionPlan` to the engine, and the parsed arguments to the trace
(`LMCall.tool_arguments`). An answer is usable when that normalisation yields at least one real
action. When the model wrote text instead of calling the tool (the old system then failed the whole
rollout), we look for a JSON object with `actions`, a JSON tool call (`{"name": ..., "arguments": ...}`,
as Hermes-style templates print it), or action names on an `actions:` line, and synthesise an
`interact_many` call (`meta["parsed_from"] = "text"`).
"""

from __future__ import annotations

import copy
import itertools
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ..core import json_codec
from ..core.settings import Settings
from ..game import ACTIONS, TOOL_NAME, ActionPlan, Observation, normalise_tool_calls
from .base import HistoryEntry, LMCall, PolicyDecision, PolicyError, content_text
from .conversation import Conversation
from .inference import RESPONSE_TOO_LARGE, ChatResult, InferenceClient, InferenceTarget, chat_params, resolve_target
from .policy_config import PolicyConfig
from .prompts import build_messages, result_text, system_prompt, tool_choice, tool_schema, turn_text
from .sampled_tokens import TokenData, missing, read_tokens, request_fields, unavailable_reason
from .versions import policy_version

logger = logging.getLogger(__name__)

POLICY_NAME = "crafter-react"
Deadline = float | Callable[[], float | None] | None

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
_FENCED = re.compile(r"```[A-Za-z]*\s*(.*?)```", re.S)
_TOOL_CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S | re.I)
_ACTION_WORD = re.compile(
    r"(?<![A-Za-z0-9_])(" + "|".join(name.replace("_", "[ _-]") for name in ACTIONS) + r")(?![A-Za-z0-9_])", re.I
)
_ACTION_LABEL = re.compile(r"^[\W_]*(?:final\s+|next\s+)?actions?\s*(\d+)?\s*[:=\-]\s*(.+)$", re.I | re.M)
_MAX_TEXT_CHARS = 20_000
_MAX_JSON_STARTS = 64
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")
ABORT = "abort"  # the finish_reason of a request vLLM's pause_generation aborted


# --- parsing ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class ParsedAnswer:
    """What a chat completion amounts to for one decision."""

    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usable: bool = False
    parsed_from: str | None = None  # "tool_calls" | "function_call" | "text"
    unusable_reason: str | None = None
    detail: str | None = None
    finish_reason: str | None = None
    message: dict[str, Any] | None = None
    plan: ActionPlan | None = None  # what `tool_calls` normalise to (usable answers)
    arguments: list[Any] | None = None  # the parsed arguments of each of `message["tool_calls"]`


def _executable(calls: list[dict[str, Any]], max_actions: int) -> bool:
    return bool(calls) and not normalise_tool_calls(calls, max_actions).fallback_noop


def _with_parsed_arguments(call: Any) -> tuple[Any, Any]:
    """(the call, its arguments parsed from their JSON text): an object replaces the text in the call, so
    nothing parses it again; text that is not a JSON object stays (the normalisation reports it)."""
    if not isinstance(call, Mapping):
        return call, None
    function = call.get("function")
    holder: Mapping[str, Any] = function if isinstance(function, Mapping) else call
    raw = holder.get("arguments")
    if not isinstance(raw, str):
        return dict(call), raw
    try:
        parsed = json_codec.loads(raw)
    except (ValueError, RecursionError):
        return dict(call), None
    if not isinstance(parsed, Mapping):
        return dict(call), parsed
    if holder is call:
        return {**call, "arguments": parsed}, parsed
    return {**call, "function": {**holder, "arguments": parsed}}, parsed


def _interact_many(actions: list[Any], max_actions: int) -> dict[str, Any]:
    return {
        "id": "text_fallback",
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": {"actions": actions[:max_actions]}},
    }


def _json_values(text: str) -> Iterator[Any]:
    """Every JSON value worth a look: tagged / fenced blocks, the whole text, each embedded object.

    Bounded: at most `_MAX_JSON_STARTS` embedded starts are tried, and deeply nested junk
    (RecursionError in the decoder) counts as not JSON.
    """
    blocks = [*_TOOL_CALL_TAG.findall(text), *_FENCED.findall(text), text]
    for block in blocks:
        stripped = block.strip()
        try:
            yield json_codec.loads(stripped)
            continue
        except (ValueError, RecursionError):
            pass
        for match in itertools.islice(re.finditer(r"[{\[]", stripped), _MAX_JSON_STARTS):
            try:
                value, _ = json_codec.raw_decode(stripped, match.start())
            except (ValueError, RecursionError):
                continue
            yield value


def _call_from_json(value: Any, max_actions: int) -> dict[str, Any] | None:
    if isinstance(value, list) and value:
        return _interact_many(value, max_actions)
    if not isinstance(value, Mapping):
        return None
    if isinstance(value.get("function"), Mapping):
        return {"id": "text_fallback", "type": "function", "function": dict(value["function"])}
    if isinstance(value.get("name"), str) and "arguments" in value:
        function = {"name": value["name"], "arguments": value["arguments"]}
        return {"id": "text_fallback", "type": "function", "function": function}
    for key in ("actions", "action"):
        found = value.get(key)
        if isinstance(found, str):
            found = [part for part in re.split(r"[\s,;]+", found) if part]
        if isinstance(found, int) and not isinstance(found, bool):
            found = [found]
        if isinstance(found, list) and found:
            return _interact_many(found, max_actions)
    return None


def _names(text: str) -> list[str]:
    return [match.group(1).lower().replace(" ", "_").replace("-", "_") for match in _ACTION_WORD.finditer(text)]


def _names_from_prose(text: str) -> list[str]:
    """Action names from `actions: a, b` lines (all numbered `Action 1:` lines, else the last one),
    or else from the last line that mentions any action."""
    labelled = [(number, _names(rest)) for number, rest in _ACTION_LABEL.findall(text)]
    labelled = [(number, names) for number, names in labelled if names]
    if labelled:
        numbered = [name for number, names in labelled if number for name in names]
        return numbered or labelled[-1][1]
    for line in reversed(text.splitlines()):
        names = _names(line)
        if names:
            return names
    return []


def calls_from_text(text: str, max_actions: int) -> list[dict[str, Any]]:
    """Synthesised tool calls from a text answer, or [] when it names no executable action."""
    # Answers come last: only the tail of a very long text is searched.
    visible = _THINK.sub("", text).strip()[-_MAX_TEXT_CHARS:]
    if not visible:
        return []
    for value in _json_values(visible):
        call = _call_from_json(value, max_actions)
        if call is not None and _executable([call], max_actions):
            return [call]
    names = _names_from_prose(visible)
    return [_interact_many(names, max_actions)] if names else []


def _first_rejection(plan: ActionPlan) -> str:
    rejected = plan.rejected
    return f"{rejected[0].item}: {rejected[0].reason}" if rejected else "no actions"


def parse_answer(body: Mapping[str, Any], max_actions: int) -> ParsedAnswer:
    """Usable tool calls from a chat-completions body, trying tool_calls, function_call, then text."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return ParsedAnswer(unusable_reason="no_choices", detail="the answer has no choices")
    choice = choices[0]
    finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    message = choice.get("message")
    if not isinstance(message, Mapping):
        return ParsedAnswer(
            unusable_reason="no_message", detail="the first choice has no message", finish_reason=finish
        )
    message = dict(message)
    raw_calls = message.get("tool_calls")
    parsed = [_with_parsed_arguments(call) for call in (raw_calls if isinstance(raw_calls, list) else [])]
    arguments = [value for _, value in parsed]
    calls: list[dict[str, Any]] = [call for call, _ in parsed if isinstance(call, dict)]
    source = "tool_calls"
    if not calls and isinstance(message.get("function_call"), Mapping):
        legacy, _ = _with_parsed_arguments({"type": "function", "function": message["function_call"]})
        calls, source = [legacy], "function_call"
    plan = normalise_tool_calls(calls, max_actions) if calls else None
    if plan is not None and not plan.fallback_noop:
        return ParsedAnswer(calls, True, source, finish_reason=finish, message=message, plan=plan, arguments=arguments)
    text = content_text(message.get("content"))
    synthesised = calls_from_text(text, max_actions)
    found = normalise_tool_calls(synthesised, max_actions) if synthesised else None
    if found is not None and not found.fallback_noop:
        return ParsedAnswer(
            synthesised, True, "text", finish_reason=finish, message=message, plan=found, arguments=arguments
        )
    if plan is not None:
        reason, detail = "invalid_tool_calls", _first_rejection(plan)
    elif text.strip():
        reason, detail = "no_actions_in_text", "the answer has no tool call and names no action"
    else:
        reason, detail = "empty_answer", "the answer has neither a tool call nor text"
    return ParsedAnswer(
        unusable_reason=reason, detail=detail, finish_reason=finish, message=message, arguments=arguments
    )


# --- the policy ------------------------------------------------------------------------------------


def _aborted(body: Mapping[str, Any] | None) -> bool:
    choices = body.get("choices") if body else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return isinstance(first, Mapping) and first.get("finish_reason") == ABORT


def _usage(body: Mapping[str, Any] | None) -> dict[str, int]:
    usage = body.get("usage") if body else None
    if not isinstance(usage, Mapping):
        return {}
    return {key: int(usage[key]) for key in _USAGE_KEYS if isinstance(usage.get(key), int | float)}


class _Budget:
    """A deadline `seconds` after its first use: the first decision is the rollout's start, give or take."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at: float | None = None

    def __call__(self) -> float:
        if self._at is None:
            self._at = anyio.current_time() + self.seconds
        return self._at


def request_params(config: PolicyConfig, target: InferenceTarget) -> dict[str, Any]:
    """Everything a request carries besides messages and tools, lowest precedence first
    (docs/training-data.md, "What the trainer sends goes through"): exact-token fields, then the typed
    sampling fields and the forwarded extras, then `extra_body` verbatim."""
    model = config.model or ""
    params = chat_params(
        model,
        provider=target.provider,
        temperature=config.temperature,
        top_p=config.top_p,
        max_tokens=config.max_tokens,
        max_completion_tokens=config.max_completion_tokens,
        extras=config.model_extra,
    )
    if config.logprobs:
        params = {**request_fields(target.provider, model), **params}
    if config.extra_body:
        params.update(copy.deepcopy(config.extra_body))
    return params


def _served_model(body: Mapping[str, Any] | None) -> str | None:
    model = body.get("model") if body else None
    return model if isinstance(model, str) else None


def _completion_limit(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class ReactPolicy:
    """The LLM policy of one rollout. Holds no connection of its own: the inference client is shared."""

    name = POLICY_NAME

    def __init__(
        self,
        config: PolicyConfig,
        client: InferenceClient,
        *,
        target: InferenceTarget,
        run_id: str,
        deadline: Deadline = None,
        max_actions: int = 8,
    ) -> None:
        self.config = config
        self.client = client
        self.target = target
        self.run_id = run_id
        self.max_actions = max_actions
        self._deadline = deadline
        self.model = config.model or ""
        self.params = request_params(config, target)
        self.tool = tool_schema(max_actions)
        self.tokens_unavailable = unavailable_reason(target.provider, self.model) if config.logprobs else None
        self.conversation = (
            Conversation(
                system_prompt(max_actions),
                config.history_max_turns,
                config.history_max_bytes,
                reasoning=config.history_reasoning,
            )
            if config.history == "messages"
            else None
        )
        self._reported = -1  # history: "messages": the last decision whose result the model was told

    def deadline(self) -> float | None:
        return self._deadline() if callable(self._deadline) else self._deadline

    def _messages(
        self, observation: Observation, history: Sequence[HistoryEntry]
    ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The request's messages, and (conversation mode) what the budget did."""
        if self.conversation is None:
            messages = build_messages(
                observation.text,
                history,
                image_data_url=observation.image_data_url
                if (self.config.use_vision or self.config.image_only_mode)
                else None,
                use_vision=self.config.use_vision,
                image_only=self.config.image_only_mode,
                max_actions=self.max_actions,
            )
            return messages, None
        if observation.data.get("num_steps_taken") == 0:  # an episode's first observation: a new chat
            self.conversation.reset()
        news = [entry for entry in history if entry.decision_index > self._reported]
        self._reported = max([self._reported, *(entry.decision_index for entry in history)])
        result = result_text(news) if self.conversation.started else None
        messages, trim = self.conversation.request(turn_text(observation.text, self.max_actions, result))
        return messages, trim.as_dict()

    def request_body(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **self.params,
            "messages": messages,
            "tools": [self.tool],
            "tool_choice": tool_choice(),
            "parallel_tool_calls": False,
        }

    def _tokens(self, body: dict[str, Any], answer: dict[str, Any] | None, parsed: ParsedAnswer) -> TokenData | None:
        if not self.config.logprobs:
            return None
        if self.tokens_unavailable is not None:
            return missing(self.tokens_unavailable, finish_reason=parsed.finish_reason)
        if answer is None:
            return missing(f"the answer was not read ({parsed.unusable_reason}): {parsed.detail}")
        return read_tokens(answer, max_completion_tokens=_completion_limit(body))

    def _unreadable(self, reason: str | None) -> ParsedAnswer:
        if reason == RESPONSE_TOO_LARGE:
            limit = self.client.limits.max_response_bytes
            detail = f"the model server's answer is longer than {limit} bytes (TASKAPP_INFERENCE_MAX_RESPONSE_BYTES)"
            return ParsedAnswer(unusable_reason=reason, detail=detail)
        return ParsedAnswer(
            unusable_reason=reason or "invalid_json", detail="the model server's answer is not a JSON object"
        )

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision:
        """One model call. Raises PolicyError when the model server cannot be reached or refuses."""
        messages, trim = self._messages(observation, history)
        body = self.request_body(messages)
        result, aborted = await self._chat(body)
        parsed = (
            self._unreadable(result.invalid_reason)
            if result.body is None
            else parse_answer(result.body, self.max_actions)
        )
        if self.conversation is not None:
            self.conversation.answered(parsed.message)
        usage = _usage(result.body)
        meta: dict[str, Any] = {
            "model": self.model,
            "provider": self.target.provider,
            "latency_ms": round(result.latency_ms, 1),
            "attempts": result.attempts,
            "aborted_answers": aborted,
            "usage": usage,
            "finish_reason": parsed.finish_reason,
            "parsed_from": parsed.parsed_from,
        }
        version = policy_version(result.policy_version, _served_model(result.body), self.config.policy_version)
        if version is not None:
            meta["policy_version"], meta["policy_version_source"] = version.version, version.source
        if trim is not None:
            meta["history"] = trim
        if not parsed.usable:
            meta["unusable_reason"] = parsed.unusable_reason
            meta["unusable_detail"] = parsed.detail
            logger.warning(
                "unusable model answer: %s (%s)", parsed.unusable_reason, parsed.detail, extra={"run_id": self.run_id}
            )
        lm_call = LMCall(
            model=self.model,
            provider=self.target.provider,
            url=self.target.url,
            messages=body["messages"],
            request_params={key: value for key, value in body.items() if key != "messages"},
            started_at=result.started_at,
            finished_at=result.finished_at,
            latency_ms=result.latency_ms,
            attempts=result.attempts,
            response=result.body,
            assistant_message=parsed.message,
            usage=usage,
            finish_reason=parsed.finish_reason,
            error=None if parsed.usable else parsed.unusable_reason,
            tokens=self._tokens(body, result.body, parsed),
            tool_arguments=parsed.arguments,
        )
        return PolicyDecision(
            tool_calls=parsed.tool_calls,
            meta=meta,
            usable=parsed.usable,
            lm_call=lm_call,
            plan=parsed.plan,
            version=version,
        )

    async def _chat(self, body: dict[str, Any]) -> tuple[ChatResult, int]:
        """The answer, and how many answers a paused server aborted before it (`finish_reason: "abort"`:
        vLLM's pause_generation during a weight update), each sent again after the backoff."""
        aborted = 0
        while True:
            result = await self.client.chat(self.target, body, deadline=self.deadline(), run_id=self.run_id)
            if not _aborted(result.body):
                return result, aborted
            if aborted >= self.client.limits.abort_retries:
                raise PolicyError(
                    f"the model server aborted the request {aborted + 1} times (finish_reason abort; "
                    "TASKAPP_INFERENCE_ABORT_RETRIES)",
                    code="inference_aborted",
                )
            aborted += 1
            logger.warning(
                "the model server aborted a request (a weight update?); sending it again", extra={"run_id": self.run_id}
            )
            await anyio.sleep(self.client.backoff.wait(aborted))

    async def aclose(self) -> None:
        """Nothing to release: the HTTP client belongs to the app."""


def build_react_policy(
    config: PolicyConfig,
    *,
    run_id: str,
    max_actions: int,
    max_time_s: float,
    client: InferenceClient,
    settings: Settings,
    deadline: Deadline = None,
) -> ReactPolicy:
    """The policy for one `crafter-react` rollout.

    Raises `NotConfigured` (503) for a provider route whose vendor key the app lacks. `deadline`
    should be the rollout's own (absolute, `anyio.current_time()` units, or a getter); without it the
    policy budgets `max_time_s` from its first decision.
    """
    target = resolve_target(
        inference_url=config.inference_url, provider=config.provider, api_key=config.api_key, settings=settings
    )
    return ReactPolicy(
        config,
        client,
        target=target,
        run_id=run_id,
        deadline=deadline if deadline is not None else _Budget(max_time_s),
        max_actions=max_actions,
    )
