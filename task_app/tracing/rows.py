"""A rollout's trace as rows of the trace tables: one named type per table, one builder.

    RolloutResult ──SessionRowsBuilder.add(result, record) per decision──► SessionRows ──(writer)──► SQLite

The rows are exactly those of the structured `SessionTrace` (trace.py) of the same result: reading
them back (reader.py) gives `build_session_trace(result)` again, which the tests check for every kind
of decision. Prompt texts that repeat are stored once per session and referenced elsewhere
(compact.py). Column conventions are the old system's: JSON columns hold compact JSON, datetimes are
ISO 8601 strings, `events.cost_usd` is in cents, a message's `content` is its JSON payload.
`event_rewards` rows hang off the step's environment event; the outcome row's `reward_metadata` holds
the trace's `session_metadata`.

A row names its step by `step_id`; the INSERT looks the timestep's (or its environment event's) id up
from it, so a rollout's rows can be written before the rows they refer to get their ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.json_codec import dumps
from .calls import iso
from .compact import TextIndex
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
    session_header,
    step_id,
    step_metadata,
    step_started,
)

if TYPE_CHECKING:
    from ..rollout.result import DecisionRecord, RolloutResult

CAIS, ENVIRONMENT = "cais", "environment"  # `events.event_type`: a model call, a step of the game


class SessionRow(NamedTuple):
    session_id: str
    created_at: str | None
    num_timesteps: int
    num_events: int
    num_messages: int
    metadata: str | None


class TimestepRow(NamedTuple):
    session_id: str
    step_id: str
    step_index: int
    turn_number: int
    started_at: str | None
    completed_at: str | None
    num_events: int
    num_messages: int
    step_metadata: str | None


class EventRow(NamedTuple):
    session_id: str
    step_id: str  # its timestep's id is looked up from it
    event_type: str  # CAIS (a model call) or ENVIRONMENT
    system_instance_id: str
    event_time: float
    message_time: int
    created_at: str | None
    model_name: str | None = None
    provider: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: int | None = None  # cents
    latency_ms: int | None = None
    span_id: str | None = None
    trace_id: str | None = None
    call_records: str | None = None
    reward: float | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    system_state_before: str | None = None
    system_state_after: str | None = None
    metadata: str | None = None
    event_metadata: str | None = None


class MessageRow(NamedTuple):
    session_id: str
    step_id: str  # its timestep's id is looked up from it
    message_type: str
    content: str
    timestamp: str | None
    event_time: float
    message_time: int
    metadata: str | None


class EventRewardRow(NamedTuple):
    session_id: str
    step_id: str  # the id of its step's environment event is looked up from it
    turn_number: int | None
    reward_value: float
    reward_type: str | None
    key: str | None
    annotation: str | None
    source: str | None
    created_at: str | None


class OutcomeRow(NamedTuple):
    session_id: str
    total_reward: float
    achievements_count: int
    total_steps: int
    created_at: str | None
    reward_metadata: str | None


Row = SessionRow | TimestepRow | EventRow | MessageRow | EventRewardRow | OutcomeRow


@dataclass(slots=True)
class SessionRows:
    """Everything one rollout writes; without a `session` row, a part of a running rollout's rows
    (readers see a session only once its session row is committed)."""

    session_id: str
    session: SessionRow | None = None
    timesteps: list[TimestepRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    messages: list[MessageRow] = field(default_factory=list)
    event_rewards: list[EventRewardRow] = field(default_factory=list)
    outcome: OutcomeRow | None = None

    @property
    def row_count(self) -> int:
        rows = (self.timesteps, self.events, self.messages, self.event_rewards)
        return (self.session is not None) + sum(len(group) for group in rows) + (self.outcome is not None)


def _json(value: Any) -> str | None:
    return None if value is None else dumps(value)


def _cents(cost: float | None) -> int | None:
    return None if cost is None else round(cost * 100)


class SessionRowsBuilder:
    """The rows of one session, a decision at a time: a rollout adds each decision as it completes, so
    only the session and outcome rows are left for its end. Repeated prompt texts are stored once per
    session (`compact.TextIndex`). `take` hands out the rows added since the last take, so a running
    rollout's rows can be written while it runs; `finish` always returns all of them."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._rows = SessionRows(session_id)
        self._texts = TextIndex()
        self._events = self._messages = 0
        self._taken = (0, 0, 0, 0)  # timesteps, events, messages, event rewards taken

    @property
    def steps(self) -> int:
        return len(self._rows.timesteps)

    def add(self, result: RolloutResult, record: DecisionRecord) -> None:
        """The rows of the decision's step of the structured trace (trace.py: `_time_step`)."""
        session_id, rows, texts = self.session_id, self._rows, self._texts
        sid, index = step_id(record.index), record.index
        completed_at = iso(record.finished_at)
        metadata = step_metadata(record)
        specs = list(message_specs(record, raw=False))
        call = lm_call(record)
        events = 1 if call is None else 2
        rows.timesteps.append(
            TimestepRow(
                session_id,
                sid,
                index,
                index,
                iso(step_started(record)),
                completed_at,
                events,
                len(specs),
                _json(metadata),
            )
        )
        for spec in specs:  # before the call record, which refers to their texts
            body = texts.message_body(sid, spec.message_type, json_payload(spec), message_text(spec))
            rows.messages.append(
                MessageRow(
                    session_id,
                    sid,
                    spec.message_type,
                    body,
                    iso(spec.moment),
                    epoch(spec.moment),
                    index,
                    _json(message_metadata(spec, record)),
                )
            )
        if call is not None:
            llm_record = lm_call_record(result, record, call, raw=False)
            usage = llm_record["usage"]
            rows.events.append(
                EventRow(
                    session_id,
                    sid,
                    CAIS,
                    policy_instance(result),
                    epoch(call.started_at),
                    index,
                    iso(call.started_at),
                    model_name=call.model,
                    provider=call.provider,
                    input_tokens=usage["input_tokens"],
                    output_tokens=usage["output_tokens"],
                    total_tokens=usage["total_tokens"],
                    cost_usd=_cents(usage["cost_usd"]),
                    latency_ms=llm_record["latency_ms"],
                    trace_id=result.plan.trace_correlation_id,
                    call_records=_json(texts.call_records(sid, [llm_record])),
                    metadata=_json(lm_event_metadata(result, record, call)),
                )
            )
        rows.events.append(
            EventRow(
                session_id,
                sid,
                ENVIRONMENT,
                ENV_INSTANCE,
                epoch(record.started_at),
                index,
                iso(record.started_at),
                reward=float(record.outcome.reward),
                terminated=bool(record.outcome.terminated),
                truncated=bool(record.truncated),
                system_state_before=_json({"text": record.obs_text}),
                system_state_after=_json({"text": record.obs_after_text}),
                metadata=_json(env_event_metadata(result, record)),
            )
        )
        for reward in metadata["event_rewards"]:
            rows.event_rewards.append(
                EventRewardRow(
                    session_id,
                    sid,
                    reward["turn_number"],
                    reward["reward_value"],
                    reward["reward_type"],
                    reward["key"],
                    _json(reward["annotation"]),
                    reward["source"],
                    reward["created_at"],
                )
            )
        self._events += events
        self._messages += len(specs)

    def take(self, end: RolloutResult | None = None) -> SessionRows:
        """The rows added since the last take; with `end`, the finished rollout, its session and
        outcome rows too (as `finish` builds them)."""
        rows, (timesteps, events, messages, rewards) = self._rows, self._taken
        part = SessionRows(
            self.session_id,
            None,
            rows.timesteps[timesteps:],
            rows.events[events:],
            rows.messages[messages:],
            rows.event_rewards[rewards:],
        )
        self._taken = (len(rows.timesteps), len(rows.events), len(rows.messages), len(rows.event_rewards))
        if end is not None:
            whole = self.finish(end)
            part.session, part.outcome = whole.session, whole.outcome
        return part

    def finish(self, result: RolloutResult) -> SessionRows:
        """All rows, with the session and outcome rows of the finished rollout."""
        session_id, rows = self.session_id, self._rows
        header = session_header(result)
        metadata = header["metadata"]
        rows.session = SessionRow(
            session_id, header["created_at"], self.steps, self._events, self._messages, _json(metadata)
        )
        outcome = metadata["outcome_reward"]
        rows.outcome = OutcomeRow(
            session_id,
            outcome["total_reward"],
            outcome["achievements_count"],
            outcome["total_steps"],
            header["created_at"],
            _json(header["session_metadata"]),
        )
        return rows


def session_rows(result: RolloutResult) -> SessionRows:
    """All the rows of a finished rollout (the caller writes them in one transaction)."""
    builder = SessionRowsBuilder(result.plan.run_id)
    for record in result.records:
        builder.add(result, record)
    return builder.finish(result)


# --- the INSERT statements ---------------------------------------------------------------------------

_TIMESTEP_ID = "(SELECT id FROM session_timesteps WHERE session_id = {session_id} AND step_id = {step_id})"
# Joined on (session_id, timestep_id) so SQLite finds the step's events through idx_event_session_step;
# the unary `+` keeps it off idx_event_type (in a file that still has it: schema migration 3 drops it),
# which made every event reward scan every environment event ever stored.
_ENV_EVENT_ID = (
    "(SELECT e.id FROM events e JOIN session_timesteps t ON e.session_id = t.session_id AND e.timestep_id = t.id "
    f"WHERE t.session_id = {{session_id}} AND t.step_id = {{step_id}} AND +e.event_type = '{ENVIRONMENT}' "
    "ORDER BY e.id LIMIT 1)"
)


# `OR ROLLBACK`: a row that breaks a constraint rolls the whole transaction back (the writer then writes
# each rollout of the batch alone), so SQLite keeps no statement journal for the multi-row inserts.


@dataclass(frozen=True, slots=True)
class Insert:
    """The INSERT of one row type: each field is the column of its name, but for `looked_up` fields,
    which only feed `computed` columns (SQL over the fields, `{field}`)."""

    table: str
    fields: tuple[str, ...]
    looked_up: tuple[str, ...] = ()
    computed: tuple[tuple[str, str], ...] = ()

    def sql(self, rows: int = 1) -> str:
        """The statement for `rows` rows (numbered parameters: a field used twice is bound once)."""
        places = {name: f"{{{index}}}" for index, name in enumerate(self.fields)}
        columns = [name for name in self.fields if name not in self.looked_up]
        values = [places[name] for name in columns] + [sql.format(**places) for _, sql in self.computed]
        template, width = f"({', '.join(values)})", len(self.fields)
        tuples = [template.format(*(f"?{row * width + n + 1}" for n in range(width))) for row in range(rows)]
        names = ", ".join(f'"{name}"' for name in [*columns, *(column for column, _ in self.computed)])
        return f"INSERT OR ROLLBACK INTO {self.table} ({names}) VALUES {', '.join(tuples)}"


INSERTS = (  # in this order: a row's lookups find the rows inserted before it
    Insert("session_traces", SessionRow._fields),
    Insert("session_timesteps", TimestepRow._fields),
    Insert("events", EventRow._fields, ("step_id",), (("timestep_id", _TIMESTEP_ID),)),
    Insert("messages", MessageRow._fields, ("step_id",), (("timestep_id", _TIMESTEP_ID),)),
    Insert("event_rewards", EventRewardRow._fields, ("step_id",), (("event_id", _ENV_EVENT_ID),)),
    Insert("outcome_rewards", OutcomeRow._fields),
)
