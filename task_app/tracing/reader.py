"""Reading the trace database: stored sessions listed, and one read back as a SessionTrace dict.

    SQLite ──(aiosqlite, read-only)──► rows ──session_from_rows()──► trace dict (+ outcome, event rewards)

A reader opens the file with SQLite's `mode=ro`: it never creates, migrates or writes a database, so
it is safe beside the file's writer (WAL: a reader never blocks the writer, and never sees a
transaction that has not committed) and against the file a live server is writing (`task-app traces`).
The server's own reads (the episode viewer) go through one too, beside its writer (writer.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiosqlite

from ..core.json_codec import loads
from .calls import iso
from .compact import TextResolver
from .rows import CAIS
from .writer import DEFAULT_BUSY_TIMEOUT_MS, DEFAULT_CACHE_MB, pragmas

DEFAULT_LIST_LIMIT = 100


class TraceReader:
    """Read-only access to one trace database. `start()` (or `async with`) raises the storage error
    when the file cannot be opened; `close()` is idempotent."""

    def __init__(
        self, path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, cache_mb: int = DEFAULT_CACHE_MB
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.cache_mb = cache_mb
        self.schema_version: int | None = None
        self.journal_mode: str | None = None
        self._conn: aiosqlite.Connection | None = None

    @property
    def running(self) -> bool:
        return self._conn is not None

    async def start(self) -> None:
        if self._conn is not None:
            return
        if not self.path.is_file():  # checked here: aiosqlite's thread outlives a failed connect
            raise FileNotFoundError(f"no trace database at {self.path}")
        conn = await aiosqlite.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        conn.row_factory = aiosqlite.Row
        try:
            for pragma in pragmas(self.busy_timeout_ms, self.cache_mb):
                await conn.execute(pragma)
            self.schema_version = await _scalar(conn, "PRAGMA user_version")
            self.journal_mode = await _scalar(conn, "PRAGMA journal_mode")
        except BaseException:
            await conn.close()
            raise
        self._conn = conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def __aenter__(self) -> TraceReader:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        if self._conn is None:
            raise RuntimeError(f"trace database {self.path} is not open")
        async with self._conn.execute(sql, params) as cursor:
            return [dict(row) for row in await cursor.fetchall()]

    async def list_sessions(
        self,
        since: datetime | str | None = None,
        min_achievements: int | None = None,
        model: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
    ) -> list[dict[str, Any]]:
        """Stored sessions, newest first, with their outcome. `since` compares with `created_at` (UTC)."""
        where: list[str] = []
        params: list[Any] = []
        if since is not None:
            where.append("s.created_at >= ?")
            params.append(iso(since) if isinstance(since, datetime) else since)
        if min_achievements is not None:
            where.append("COALESCE(o.achievements_count, 0) >= ?")
            params.append(min_achievements)
        if model is not None:
            where.append("EXISTS (SELECT 1 FROM events e WHERE e.session_id = s.session_id AND e.model_name = ?)")
            params.append(model)
        sql = (
            "SELECT s.session_id, s.created_at, s.num_timesteps, s.num_events, s.num_messages, s.metadata, "
            "o.total_reward, o.achievements_count, o.total_steps "
            "FROM session_traces s LEFT JOIN outcome_rewards o ON o.session_id = s.session_id "
            + (f"WHERE {' AND '.join(where)} " if where else "")
            + "ORDER BY s.created_at DESC, s.session_id LIMIT ?"
        )
        rows = await self._fetch(sql, (*params, int(limit)))
        return [_summary(row) for row in rows]

    async def get_session(self, run_id: str) -> dict[str, Any] | None:
        """One stored session as a SessionTrace dict (+ `outcome_reward`, `event_rewards`), or None."""
        key = (run_id,)
        sessions = await self._fetch("SELECT * FROM session_traces WHERE session_id = ?", key)
        if not sessions:
            return None
        timesteps = await self._fetch("SELECT * FROM session_timesteps WHERE session_id = ? ORDER BY step_index", key)
        events = await self._fetch("SELECT * FROM events WHERE session_id = ? ORDER BY id", key)
        messages = await self._fetch("SELECT * FROM messages WHERE session_id = ? ORDER BY id", key)
        outcomes = await self._fetch("SELECT * FROM outcome_rewards WHERE session_id = ? ORDER BY id DESC", key)
        rewards = await self._fetch(
            'SELECT turn_number, reward_value, reward_type, "key", annotation, source, created_at '
            "FROM event_rewards WHERE session_id = ? ORDER BY id",
            key,
        )
        trace = session_from_rows(sessions[0], timesteps, events, messages, outcomes[0] if outcomes else None)
        for reward in rewards:
            reward["annotation"] = load_json(reward["annotation"])
        trace["event_rewards"] = rewards
        return trace


async def _scalar(conn: aiosqlite.Connection, sql: str) -> Any:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return row[0] if row else None


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    summary = dict(row)
    meta = load_json(summary.pop("metadata"))
    if not isinstance(meta, dict):
        meta = {}
    summary.update(
        model=meta.get("model"),
        policy_name=meta.get("policy_name"),
        seed=meta.get("seed"),
        achievements=meta.get("final_achievements") or [],
        stop_reason=meta.get("stop_reason"),
    )
    return summary


# --- rows back to a trace --------------------------------------------------------------------------


def load_json(value: Any) -> Any:
    """A JSON column's value (text that is not JSON comes back as it is)."""
    if not isinstance(value, str):
        return value
    try:
        return loads(value)
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
