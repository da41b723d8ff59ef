"""Trace payloads built from a `RolloutResult` (docs/contract.md, "Trace payload"): pure functions, no I/O.

    RolloutResult.records ──► per decision k (0-based, step_id "decision_<k>", turn_number k):
        events:   [LM call event (policy:<name>)]? + environment event (environment:crafter)
        messages: system, user (or the tool result of history "messages"), assistant, assistant tool call (LLM)
                  user, assistant tool call (scripted policy) | none (injected noop)
        step_metadata: episode, decision_rewards, event_rewards
    ──► compact | structured | full

Formats:
- `compact`: counts, one line per LM call and per decision reward; no prompts, no observations.
- `structured`: the v3 `SessionTrace` dict. Call records keep the prompt messages and the answer, but
  images are references (mime type, size, sha256) and the raw server response is dropped.
- `full`: the same shape with image base64 data and each call's raw response JSON.

Timestamps (`created_at`, step `timestamp`/`completed_at`, call record times) are ISO 8601 UTC strings.
`time_record.event_time` stays a float of epoch seconds, as in the v3 data model and the `events.event_time`
column. Event rewards (zero rewards are never recorded) and the outcome reward (total_reward as a float)
travel in `step_metadata.event_rewards` and `metadata.outcome_reward`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..core.json_codec import dumps
from ..policy.base import content_text
from .calls import call_record, iso, strip_images
from .compact import SYSTEM, system_body
from .reward_rows import decision_rewards, event_rewards, outcome_reward

if TYPE_CHECKING:
    from ..policy.base import LMCall
    from ..rollout.result import DecisionRecord, RolloutResult

COMPACT, STRUCTURED, FULL = "compact", "structured", "full"
TRACE_FORMATS = (COMPACT, STRUCTURED, FULL)
TRACE_SCHEMA = "tracing_v3"
ENV_INSTANCE = "environment:crafter"
_PROMPT_TYPES = {"user": "user", "tool": "tool_result"}  # a prompt's role -> its `messages.message_type`


def step_id(index: int) -> str:
    return f"decision_{index}"


def policy_instance(result: RolloutResult) -> str:
    return f"policy:{result.plan.policy_name}"


def epoch(moment: datetime) -> float:
    return moment.timestamp()


# --- metadata --------------------------------------------------------------------------------------


def session_metadata(result: RolloutResult) -> dict[str, Any]:
    """`SessionTrace.metadata`: the old system's keys, then what a reader of one trace wants at hand."""
    plan = result.plan
    return {
        "run_id": plan.run_id,
        "policy_name": plan.policy_name,
        "policy_id": result.policy_id,
        "env_name": plan.env_name,
        "env_id": result.env_id,
        "seed": plan.seed,
        "training_session_id": plan.training_session_id,
        "synth_base_url": plan.synth_base_url,
        "env_seed": plan.seed,
        "final_achievements": list(result.final_achievements),
        "mode": plan.mode,
        "model": plan.policy.model,
        "trace_correlation_id": plan.trace_correlation_id,
        "stop_reason": result.stop_reason.value,
        "aborted": result.aborted,
        "outcome_reward": outcome_reward(result),
        "replay": replay_settings(result),
    }


def replay_settings(result: RolloutResult) -> dict[str, Any]:
    """What rebuilding the episodes needs besides the seed and each decision's executed actions
    (`task-app replay`, the episode viewer): the world and the episode rules of the plan."""
    plan = result.plan
    return {
        "area": list(plan.area),
        "length": plan.length,
        "max_steps_per_episode": plan.max_steps_per_episode,
        "on_done": plan.on_done,
        "max_actions": plan.max_actions,
    }


def _session_details(result: RolloutResult, trace_format: str) -> dict[str, Any]:
    return {
        "trace_format": trace_format,
        "trace_schema": TRACE_SCHEMA,
        "finished_at": iso(result.finished_at),
        "decisions": result.decisions,
        "lm_calls": sum(1 for record in result.records if lm_call(record) is not None),
        "episodes": [episode.as_dict() for episode in result.episodes],
        "stepwise": result.stepwise_summary,
        "error": result.failure(),
        "rubrics": result.rubric_scores.details() if result.rubric_scores is not None else None,
        **({"episode_sequences": result.episode_sequences} if result.episode_sequences is not None else {}),
    }


# --- messages --------------------------------------------------------------------------------------


@dataclass(slots=True)
class MessageSpec:
    message_type: str
    payload: dict[str, Any]
    moment: datetime
    is_tool_call: bool = False


def lm_call(record: DecisionRecord) -> LMCall | None:
    return record.decision.lm_call if record.decision is not None else None


def message_specs(record: DecisionRecord, *, raw: bool) -> Iterator[MessageSpec]:
    decision = record.decision
    if decision is None:
        return
    call = decision.lm_call
    if call is None:
        yield MessageSpec(
            "user", {"role": "user", "text": record.obs_text, "content": record.obs_text}, record.started_at
        )
        yield MessageSpec(
            "assistant", {"role": "assistant", "tool_calls": decision.tool_calls}, record.started_at, is_tool_call=True
        )
        return
    system = next((message for message in call.messages if message.get("role") == "system"), None)
    # the decision's own prompt: the last user message, or (history "messages") the tool result after it
    prompt = next((message for message in reversed(call.messages) if message.get("role") in _PROMPT_TYPES), None)
    for message_type, message in (("system", system), (_PROMPT_TYPES.get(str((prompt or {}).get("role"))), prompt)):
        if message is not None and message_type is not None:
            role = str(message.get("role"))
            content = message.get("content") if raw else strip_images(message.get("content"))
            yield MessageSpec(
                message_type, {"role": role, "text": content_text(content), "content": content}, call.started_at
            )
    assistant = call.assistant_message
    if assistant is None:
        return
    payload: dict[str, Any] = {
        "role": "assistant",
        "content": assistant.get("content"),
        "text": content_text(assistant.get("content")),
    }
    for key in ("tool_calls", "reasoning", "reasoning_content", "thinking"):
        if assistant.get(key):
            payload[key] = assistant[key]
    yield MessageSpec("assistant", payload, call.finished_at)
    if assistant.get("tool_calls"):
        yield MessageSpec(
            "assistant",
            {"role": "assistant", "tool_calls": assistant["tool_calls"]},
            call.finished_at,
            is_tool_call=True,
        )


def json_payload(spec: MessageSpec) -> str:
    content = spec.payload.get("content")
    if spec.message_type == SYSTEM and isinstance(content, str):
        return system_body(content)  # the same prompt every decision: encoded once
    return dumps(spec.payload)


def message_text(spec: MessageSpec) -> str | None:
    text = spec.payload.get("text")
    return text if isinstance(text, str) else None


def message_metadata(spec: MessageSpec, record: DecisionRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {"turn": record.index, "step_id": step_id(record.index)}
    if spec.is_tool_call:
        metadata["is_tool_call"] = True
    return metadata


def _message(spec: MessageSpec, record: DecisionRecord) -> dict[str, Any]:
    return {
        "content": {"text": message_text(spec), "json_payload": json_payload(spec)},
        "message_type": spec.message_type,
        "time_record": {"event_time": epoch(spec.moment), "message_time": record.index},
        "metadata": message_metadata(spec, record),
    }


# --- events ----------------------------------------------------------------------------------------


def _tool_results(record: DecisionRecord, call_id: str | None) -> list[dict[str, Any]]:
    output = {
        "actions": record.outcome.actions,
        "achievements_added": list(record.outcome.unlocked),
        "rejected": [rejection.as_dict() for rejection in record.plan.rejected],
    }
    return [
        {
            "call_id": call_id,
            "output_text": dumps(output),
            "exit_code": None,
            "status": "error" if record.plan.fallback_noop else "ok",
            "error_message": "no valid action; played noop" if record.plan.fallback_noop else None,
            "started_at": iso(record.started_at),
            "completed_at": iso(record.finished_at),
            "duration_ms": round(record.env_ms),
            "metadata": {},
        }
    ]


def lm_call_record(result: RolloutResult, record: DecisionRecord, call: LMCall, *, raw: bool) -> dict[str, Any]:
    """The decision's `LLMCallRecord`, with its tool results (what the game did with the answer)."""
    assistant = call.assistant_message or {}
    tool_calls = assistant.get("tool_calls") if isinstance(assistant.get("tool_calls"), list) else []
    first_id = tool_calls[0].get("id") if tool_calls and isinstance(tool_calls[0], Mapping) else None
    record_id = f"{result.plan.run_id}:{step_id(record.index)}"
    tool_results = _tool_results(record, first_id)
    return call_record(
        call, call_id=record_id, trace_id=result.plan.trace_correlation_id, raw=raw, tool_results=tool_results
    )


def lm_event_metadata(result: RolloutResult, record: DecisionRecord, call: LMCall) -> dict[str, Any]:
    decision = record.decision
    return {
        "run_id": result.plan.run_id,
        "policy_id": result.policy_id,
        "turn": record.index,
        "step_id": step_id(record.index),
        "usable": bool(decision and decision.usable),
        "attempts": call.attempts,
    }


def _lm_event(result: RolloutResult, record: DecisionRecord, call: LMCall, *, raw: bool) -> dict[str, Any]:
    llm_record = lm_call_record(result, record, call, raw=raw)
    usage = llm_record["usage"]  # the call's token counts and cost, worked out once
    return {
        "system_instance_id": policy_instance(result),
        "time_record": {"event_time": epoch(call.started_at), "message_time": record.index},
        "metadata": lm_event_metadata(result, record, call),
        "event_metadata": None,
        "model_name": call.model,
        "provider": call.provider,
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "cost_usd": usage["cost_usd"],
        "latency_ms": llm_record["latency_ms"],
        "span_id": None,
        "trace_id": result.plan.trace_correlation_id,
        "system_state_before": None,
        "system_state_after": None,
        "call_records": [llm_record],
    }


def env_event_metadata(result: RolloutResult, record: DecisionRecord) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "run_id": result.plan.run_id,
        "turn": record.index,
        "step_id": step_id(record.index),
        "episode": record.episode,
        "actions": record.outcome.actions,
        "achievements_added": list(record.outcome.unlocked),
    }
    if record.plan.rejected:
        metadata["rejected"] = [rejection.as_dict() for rejection in record.plan.rejected]
    if record.decision is None:
        metadata["injected_noop"] = True
    return metadata


def _env_event(result: RolloutResult, record: DecisionRecord) -> dict[str, Any]:
    return {
        "system_instance_id": ENV_INSTANCE,
        "time_record": {"event_time": epoch(record.started_at), "message_time": record.index},
        "metadata": env_event_metadata(result, record),
        "event_metadata": None,
        "reward": float(record.outcome.reward),
        "terminated": bool(record.outcome.terminated),
        "truncated": bool(record.truncated),
        "system_state_before": {"text": record.obs_text},
        "system_state_after": {"text": record.obs_after_text},
    }


# --- payloads --------------------------------------------------------------------------------------


def step_metadata(record: DecisionRecord) -> dict[str, Any]:
    return {
        "episode": record.episode,
        "decision_rewards": decision_rewards(record),
        "event_rewards": event_rewards(record),
    }


def step_started(record: DecisionRecord) -> datetime:
    """The step's `timestamp`: its model call's start, or the env step's without one."""
    call = lm_call(record)
    return call.started_at if call is not None else record.started_at


def _time_step(result: RolloutResult, record: DecisionRecord, *, raw: bool) -> dict[str, Any]:
    call = lm_call(record)
    events = [_lm_event(result, record, call, raw=raw)] if call is not None else []
    events.append(_env_event(result, record))
    return {
        "step_id": step_id(record.index),
        "step_index": record.index,
        "timestamp": iso(step_started(record)),
        "turn_number": record.index,
        "events": events,
        "markov_blanket_messages": [_message(spec, record) for spec in message_specs(record, raw=raw)],
        "step_metadata": step_metadata(record),
        "completed_at": iso(record.finished_at),
    }


def session_header(result: RolloutResult, trace_format: str = STRUCTURED) -> dict[str, Any]:
    """The session-level keys of the SessionTrace, known once the rollout is over."""
    return {
        "session_id": result.plan.run_id,
        "created_at": iso(result.started_at),
        "metadata": session_metadata(result),
        "session_metadata": _session_details(result, trace_format),
    }


def build_session_trace(result: RolloutResult, trace_format: str = STRUCTURED) -> dict[str, Any]:
    """The v3 `SessionTrace` dict (`structured`, or `full` with images and raw responses)."""
    if trace_format not in (STRUCTURED, FULL):
        raise ValueError(f"not a session trace format: {trace_format!r}")
    raw = trace_format == FULL
    steps = [_time_step(result, record, raw=raw) for record in result.records]
    header = session_header(result, trace_format)
    return {
        "session_id": header["session_id"],
        "created_at": header["created_at"],
        "session_time_steps": steps,
        "event_history": [event for step in steps for event in step["events"]],
        "markov_blanket_message_history": [message for step in steps for message in step["markov_blanket_messages"]],
        "metadata": header["metadata"],
        "session_metadata": header["session_metadata"],
    }


def build_compact_trace(result: RolloutResult) -> dict[str, Any]:
    """The small summary (the old system's `compact` keys): per-call token/latency lines and per-decision rewards."""
    lm_calls = []
    events = messages = 0
    for record in result.records:
        call = lm_call(record)
        events += 1 if call is None else 2
        messages += sum(1 for _ in message_specs(record, raw=False))
        if call is None:
            continue
        assistant = call.assistant_message or {}
        lm_calls.append(
            {
                "turn": record.index,
                "model": call.model,
                "provider": call.provider,
                "total_tokens": call.total_tokens,
                "input_tokens": call.input_tokens,
                "output_tokens": call.output_tokens,
                "latency_ms": round(call.latency_ms),
                "tool_calls": assistant.get("tool_calls") or [],
            }
        )
    return {
        "session_id": result.plan.run_id,
        "created_at": iso(result.started_at),
        "metadata": session_metadata(result),
        "events_count": events,
        "messages_count": messages,
        "lm_calls": lm_calls,
        "decision_rewards": [decision_rewards(record) for record in result.records],
    }


def build_trace_payload(result: RolloutResult, trace_format: str = COMPACT) -> dict[str, Any]:
    """The response's `trace` for `record.trace_format` (an unknown format is a ValueError)."""
    if trace_format == COMPACT:
        return build_compact_trace(result)
    return build_session_trace(result, trace_format)
