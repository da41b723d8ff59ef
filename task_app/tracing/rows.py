"""A v3 SessionTrace dict as rows of the seed's tables, and those rows back as a SessionTrace dict.

    trace dict ──session_rows()──► SessionRows ──(store: one transaction)──► SQLite
    decision records ──SessionRowsBuilder.add_decision()──► the same rows (a running rollout's)
    SQLite ──(store: queries)──► rows ──session_from_rows()──► trace dict (+ outcome, event rewards)

Prompt texts that repeat are stored once per session and referenced elsewhere (compact.py).
Column conventions follow the seed's manager: JSON columns hold compact JSON, datetimes are ISO 8601
strings, `events.cost_usd` is in cents, a message's `content` is its JSON payload (or its text when it
has none). `event_rewards` rows hang off the step's environment event; the outcome row's
`reward_metadata` holds the trace's `session_metadata`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..core import json_codec
from .calls import dumps_value, iso
from .compact import TextIndex, TextResolver
from .trace import (
    ENV_INSTANCE,
    env_event_metadata,
    epoch,
    json_payload,
    lm_call,
    lm_call_record,
    lm_event_metadata,
    message_metadata,
    message_specs,
    message_text,
    policy_instance,
    step_id,
    step_metadata,
    step_started,
)

if TYPE_CHECKING:
    from ..rollout.result import DecisionRecord, RolloutResult

CAIS, ENVIRONMENT = "cais", "environment"

# `OR ROLLBACK`: a row that breaks a constraint rolls the whole transaction back (the store then writes
# each rollout of the batch alone), so SQLite keeps no statement journal for the multi-row inserts. With
# the default ABORT it copied every page a statement changed first, spilling to a temp file created and
# deleted each transaction: half of the writer's pwrite calls (docs/decisions/trace-writer.md).
_INSERT = "INSERT OR ROLLBACK INTO"
INSERT_SESSION = (
    f"{_INSERT} session_traces (session_id, created_at, num_timesteps, num_events, num_messages, metadata) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
INSERT_TIMESTEP = (
    f"{_INSERT} session_timesteps (session_id, step_id, step_index, turn_number, started_at, completed_at, "
    "num_events, num_messages, step_metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_TIMESTEP_ID = "(SELECT id FROM session_timesteps WHERE session_id = ? AND step_id = ?)"
INSERT_EVENT = (
    f"{_INSERT} events (session_id, timestep_id, event_type, system_instance_id, event_time, message_time, "
    "created_at, model_name, provider, input_tokens, output_tokens, total_tokens, cost_usd, latency_ms, span_id, "
    "trace_id, call_records, reward, terminated, truncated, system_state_before, system_state_after, metadata, "
    f"event_metadata) VALUES (?, {_TIMESTEP_ID}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_MESSAGE = (
    f"{_INSERT} messages (session_id, timestep_id, message_type, content, timestamp, event_time, message_time, "
    f"metadata) VALUES (?, {_TIMESTEP_ID}, ?, ?, ?, ?, ?, ?)"
)
INSERT_OUTCOME = (
    f"{_INSERT} outcome_rewards (session_id, total_reward, achievements_count, total_steps, created_at, "
    "reward_metadata) VALUES (?, ?, ?, ?, ?, ?)"
)
# Joined on (session_id, timestep_id) so SQLite finds the step's events through idx_event_session_step;
# the unary `+` keeps it off idx_event_type (in a file that still has it: schema migration 3 drops
# it), which made every event reward scan every environment event ever stored (inserts slowed down
# as the database grew, repetition after repetition of a benchmark).
_ENV_EVENT_ID = (
    "(SELECT e.id FROM events e JOIN session_timesteps t ON e.session_id = t.session_id AND e.timestep_id = t.id "
    f"WHERE t.session_id = ? AND t.step_id = ? AND +e.event_type = '{ENVIRONMENT}' ORDER BY e.id LIMIT 1)"
)
INSERT_EVENT_REWARD = (
    f'{_INSERT} event_rewards (event_id, session_id, message_id, turn_number, reward_value, reward_type, "key", '
    f"annotation, source, created_at) VALUES ({_ENV_EVENT_ID}, ?, NULL, ?, ?, ?, ?, ?, ?, ?)"
)

Row = tuple[Any, ...]


@dataclass(slots=True)
class SessionRows:
    """Everything one rollout writes, ready for `executemany`; without a `session` row, a part of a
    running rollout's rows (readers see a session only once its session row is committed)."""

    session_id: str
    session: Row | None
    timesteps: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
    messages: list[Row] = field(default_factory=list)
    event_rewards: list[Row] = field(default_factory=list)
    outcome: Row | None = None

    @property
    def row_count(self) -> int:
        rows = (self.timesteps, self.events, self.messages, self.event_rewards)
        return (self.session is not None) + sum(len(group) for group in rows) + (self.outcome is not None)


def _json(value: Any) -> str | None:
    return None if value is None else dumps_value(value)


def _when(epoch: float | None) -> str | None:
    return _epoch_iso(epoch) if isinstance(epoch, int | float) else None


@lru_cache(maxsize=256)
def _epoch_iso(epoch: float) -> str | None:
    """Cached: a step's events and messages share two or three moments."""
    return iso(datetime.fromtimestamp(epoch, UTC))


def _cents(cost: Any) -> int | None:
    return round(cost * 100) if isinstance(cost, int | float) else None


# An environment event's columns from model_name to call_records: all null.
_NO_CALL: Row = (None,) * 10


def _event_row(session_id: str, step: str, event: Mapping[str, Any], texts: TextIndex) -> Row:
    time_record = event.get("time_record") or {}
    event_time = time_record.get("event_time")
    is_lm = "call_records" in event
    return (
        session_id,
        session_id,
        step,
        CAIS if is_lm else ENVIRONMENT,
        event.get("system_instance_id"),
        event_time,
        time_record.get("message_time"),
        _when(event_time),
        event.get("model_name"),
        event.get("provider"),
        event.get("input_tokens"),
        event.get("output_tokens"),
        event.get("total_tokens"),
        _cents(event.get("cost_usd")),
        event.get("latency_ms"),
        event.get("span_id"),
        event.get("trace_id"),
        _json(texts.call_records(step, event.get("call_records"))) if is_lm else None,
        None if is_lm else event.get("reward"),
        None if is_lm else event.get("terminated"),
        None if is_lm else event.get("truncated"),
        _json(event.get("system_state_before")),
        _json(event.get("system_state_after")),
        _json(event.get("metadata")),
        _json(event.get("event_metadata")),
    )


def _message_row(session_id: str, step: str, message: Mapping[str, Any], texts: TextIndex) -> Row:
    content = message.get("content") or {}
    time_record = message.get("time_record") or {}
    event_time = time_record.get("event_time")
    body = content.get("json_payload") or content.get("text") or ""
    if content.get("json_payload"):
        body = texts.message_body(step, message.get("message_type"), body, content.get("text"))
    return (
        session_id,
        session_id,
        step,
        message.get("message_type"),
        body,
        _when(event_time),
        event_time,
        time_record.get("message_time"),
        _json(message.get("metadata")),
    )


class SessionRowsBuilder:
    """The rows of one session, a step at a time: a rollout adds each decision as it completes, so
    only the session and outcome rows are left for its end. Repeated prompt texts are stored once per
    session (`compact.TextIndex`). `take` hands out the rows added since the last take, so a running
    rollout's rows can be written while it runs; `finish` always returns all of them."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._rows = SessionRows(session_id=session_id, session=None)
        self._texts = TextIndex()
        self._steps = self._events = self._messages = 0
        self._taken: tuple[int, ...] = (0, 0, 0, 0)  # timesteps, events, messages, event rewards taken

    @property
    def steps(self) -> int:
        return self._steps

    def add_step(self, step: Mapping[str, Any]) -> None:
        session_id, rows, texts = self.session_id, self._rows, self._texts
        sid = str(step["step_id"])
        events, messages = step.get("events") or [], step.get("markov_blanket_messages") or []
        step_metadata = dict(step.get("step_metadata") or {})
        rows.timesteps.append(
            (
                session_id,
                sid,
                step["step_index"],
                step.get("turn_number"),
                step.get("timestamp"),
                step.get("completed_at"),
                len(events),
                len(messages),
                _json(step_metadata),
            )
        )
        # Messages first: the step's call record refers to the texts of its messages.
        rows.messages.extend(_message_row(session_id, sid, message, texts) for message in messages)
        rows.events.extend(_event_row(session_id, sid, event, texts) for event in events)
        self._add_rewards(sid, step_metadata.get("event_rewards"), step.get("completed_at"))
        self._steps += 1
        self._events += len(events)
        self._messages += len(messages)

    def add_decision(self, result: RolloutResult, record: DecisionRecord) -> None:
        """The rows `add_step` adds for the decision's step of the structured trace, straight from the record.

        A running rollout adds each decision's rows on the event loop, where building the structured
        step's dicts first and reading them back cost more (docs/decisions/trace-writer.md). The two
        must agree: tests/test_trace_compact.py compares them over every kind of decision.
        """
        session_id, rows, texts = self.session_id, self._rows, self._texts
        sid, index = step_id(record.index), record.index
        completed_at = iso(record.finished_at)
        metadata = step_metadata(record)
        specs = list(message_specs(record, raw=False))
        call = lm_call(record)
        rows.timesteps.append(
            (
                session_id,
                sid,
                index,
                index,
                iso(step_started(record)),
                completed_at,
                2 if call is not None else 1,
                len(specs),
                _json(metadata),
            )
        )
        for spec in specs:  # before the call record, which refers to their texts
            event_time = epoch(spec.moment)
            body = texts.message_body(sid, spec.message_type, json_payload(spec), message_text(spec))
            message_row = (session_id, session_id, sid, spec.message_type, body, _when(event_time), event_time, index)
            rows.messages.append((*message_row, _json(message_metadata(spec, record))))
        if call is not None:
            llm_record = lm_call_record(result, record, call, raw=False)
            usage, event_time = llm_record["usage"], epoch(call.started_at)
            rows.events.append(
                (
                    session_id,
                    session_id,
                    sid,
                    CAIS,
                    policy_instance(result),
                    event_time,
                    index,
                    _when(event_time),
                    call.model,
                    call.provider,
                    usage["input_tokens"],
                    usage["output_tokens"],
                    usage["total_tokens"],
                    _cents(usage["cost_usd"]),
                    llm_record["latency_ms"],
                    None,
                    result.plan.trace_correlation_id,
                    _json(texts.call_records(sid, [llm_record])),
                    None,
                    None,
                    None,
                    None,
                    None,
                    _json(lm_event_metadata(result, record, call)),
                    None,
                )
            )
        event_time = epoch(record.started_at)
        rows.events.append(
            (
                session_id,
                session_id,
                sid,
                ENVIRONMENT,
                ENV_INSTANCE,
                event_time,
                index,
                _when(event_time),
                *_NO_CALL,
                float(record.outcome.reward),
                bool(record.outcome.terminated),
                bool(record.truncated),
                _json({"text": record.obs_text}),
                _json({"text": record.obs_after_text}),
                _json(env_event_metadata(result, record)),
                None,
            )
        )
        self._add_rewards(sid, metadata["event_rewards"], completed_at)
        self._steps += 1
        self._events += 2 if call is not None else 1
        self._messages += len(specs)

    def _add_rewards(self, sid: str, rewards: Any, completed_at: str | None) -> None:
        session_id = self.session_id
        for reward in rewards or []:
            self._rows.event_rewards.append(
                (
                    session_id,
                    sid,
                    session_id,
                    reward.get("turn_number"),
                    reward["reward_value"],
                    reward.get("reward_type"),
                    reward.get("key"),
                    _json(reward.get("annotation")),
                    reward.get("source"),
                    reward.get("created_at") or completed_at,
                )
            )

    def take(self, header: Mapping[str, Any] | None = None) -> SessionRows:
        """The rows added since the last take; with `header`, the session's end: its session and
        outcome rows too (as `finish` builds them)."""
        rows = self._rows
        groups = (rows.timesteps, rows.events, rows.messages, rows.event_rewards)
        timesteps, events, messages, rewards = (group[start:] for group, start in zip(groups, self._taken, strict=True))
        self._taken = tuple(map(len, groups))
        part = SessionRows(self.session_id, None, timesteps, events, messages, rewards)
        if header is not None:
            whole = self.finish(header)
            part.session, part.outcome = whole.session, whole.outcome
        return part

    def finish(self, header: Mapping[str, Any]) -> SessionRows:
        """All rows, with the session and outcome rows from the trace's session-level keys
        (`created_at`, `metadata`, `session_metadata`)."""
        session_id, rows = self.session_id, self._rows
        metadata = dict(header.get("metadata") or {})
        rows.session = (
            session_id,
            header["created_at"],
            self._steps,
            self._events,
            self._messages,
            _json(metadata),
        )
        outcome = metadata.get("outcome_reward")
        if isinstance(outcome, Mapping):
            rows.outcome = (
                session_id,
                float(outcome.get("total_reward") or 0.0),
                int(outcome.get("achievements_count") or 0),
                int(outcome.get("total_steps") or self._steps),
                header.get("created_at"),
                _json(header.get("session_metadata")),
            )
        return rows


def session_rows(trace: Mapping[str, Any]) -> SessionRows:
    """A full/structured SessionTrace dict as table rows (the caller writes them in one transaction)."""
    builder = SessionRowsBuilder(str(trace["session_id"]))
    steps: Sequence[Mapping[str, Any]] = trace.get("session_time_steps") or []
    for step in steps:
        builder.add_step(step)
    return builder.finish(trace)


# --- rows back to a trace --------------------------------------------------------------------------


def load_json(value: Any) -> Any:
    """A JSON column's value (text that is not JSON comes back as it is)."""
    if not isinstance(value, str):
        return value
    try:
        return json_codec.loads(value)
    except ValueError:
        return value


def event_from_row(row: Mapping[str, Any], texts: TextResolver | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "system_instance_id": row["system_instance_id"],
        "time_record": {"event_time": row["event_time"], "message_time": row["message_time"]},
        "metadata": load_json(row["metadata"]) or {},
        "event_metadata": load_json(row["event_metadata"]),
    }
    if row["event_type"] == CAIS:
        cost = row["cost_usd"]
        event.update(
            model_name=row["model_name"],
            provider=row["provider"],
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            total_tokens=row["total_tokens"],
            cost_usd=cost / 100 if cost is not None else None,
            latency_ms=row["latency_ms"],
            span_id=row["span_id"],
            trace_id=row["trace_id"],
        )
    else:
        event.update(
            reward=row["reward"],
            terminated=None if row["terminated"] is None else bool(row["terminated"]),
            truncated=None if row["truncated"] is None else bool(row["truncated"]),
        )
    event["system_state_before"] = load_json(row["system_state_before"])
    event["system_state_after"] = load_json(row["system_state_after"])
    if row["event_type"] == CAIS:
        records = load_json(row["call_records"]) or []
        event["call_records"] = texts.call_records(records) if texts is not None else records
    return event


def message_from_row(
    row: Mapping[str, Any], texts: TextResolver | None = None, step_id: str | None = None
) -> dict[str, Any]:
    body = row["content"]
    payload = load_json(body)
    if texts is not None:
        body, payload = texts.message_body(step_id, row["message_type"], body, payload)
    if isinstance(payload, dict):
        text = payload.get("text")
        content = {"text": text if isinstance(text, str) else None, "json_payload": body}
    else:
        content = {"text": body, "json_payload": None}
    return {
        "content": content,
        "message_type": row["message_type"],
        "time_record": {"event_time": row["event_time"], "message_time": row["message_time"]},
        "metadata": load_json(row["metadata"]) or {},
    }


def session_from_rows(
    session: Mapping[str, Any],
    timesteps: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
    outcome: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The stored session as a SessionTrace dict, plus `outcome_reward` (or None) for convenience."""
    steps: dict[int, dict[str, Any]] = {}
    for row in timesteps:
        steps[row["id"]] = {
            "step_id": row["step_id"],
            "step_index": row["step_index"],
            "timestamp": row["started_at"],
            "turn_number": row["turn_number"],
            "events": [],
            "markov_blanket_messages": [],
            "step_metadata": load_json(row["step_metadata"]) or {},
            "completed_at": row["completed_at"],
        }
    # Messages first: call records refer to their texts (compact rows).
    texts, step_ids = TextResolver(), {key: step["step_id"] for key, step in steps.items()}
    message_history = []
    for row in messages:
        message = message_from_row(row, texts, step_ids.get(row["timestep_id"]))
        message_history.append(message)
        if row["timestep_id"] in steps:
            steps[row["timestep_id"]]["markov_blanket_messages"].append(message)
    event_history = []
    for row in events:
        event = event_from_row(row, texts)
        event_history.append(event)
        if row["timestep_id"] in steps:
            steps[row["timestep_id"]]["events"].append(event)
    outcome_reward = None
    if outcome is not None:
        outcome_reward = {
            "total_reward": outcome["total_reward"],
            "achievements_count": outcome["achievements_count"],
            "total_steps": outcome["total_steps"],
        }
    return {
        "session_id": session["session_id"],
        "created_at": session["created_at"],
        "session_time_steps": list(steps.values()),
        "event_history": event_history,
        "markov_blanket_message_history": message_history,
        "metadata": load_json(session["metadata"]) or {},
        "session_metadata": load_json(outcome["reward_metadata"]) if outcome is not None else None,
        "outcome_reward": outcome_reward,
    }
