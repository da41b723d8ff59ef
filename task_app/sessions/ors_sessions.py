"""Open Reward Standard sessions on the doors' tool sessions: an ORS session id names one tool session.

    ors/<sid>             {"session": tool session id, "task": the task, "at": when written}   TTL: the env TTL
    ors-call/<task_id>    the answer of one tool call, kept for a client that reconnects with its task_id

The client draws its session id from `/create_session` before it says which task it wants, so the id
cannot be the tool session's own: `/create` opens the tool session (`sessions/tools.py`) and records it
under the id (`put_if_absent`: a second `/create` for one id is refused, and the session it opened is
closed). Every process reads the record,
so any process answers any session, and none holds ORS state in memory. The record lives as long as
its env would idle: each use past a tenth of the TTL writes it again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core import json_codec
from ..core.errors import Conflict, NotFound
from ..store import StateStore
from .records import new_id, valid_id

REFRESH_FRACTION = 0.1
CALL_RESULT_TTL_S = 120.0  # the openreward client retries a dropped /call within seconds


def session_key(sid: str) -> str:
    return f"ors/{sid}"


def call_key(task_id: str) -> str:
    return f"ors-call/{task_id}"


def unknown_session() -> NotFound:
    return NotFound(
        "no such ORS session (create it with /create_session and /create; it may have been deleted)",
        code="ors_session_not_found",
    )


@dataclass(frozen=True, slots=True)
class OrsSession:
    sid: str
    session_id: str  # the tool session (sessions/tools.py)
    task: dict[str, Any]


class OrsSessions:
    """One per process; stateless beyond the store."""

    def __init__(self, store: StateStore, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    @staticmethod
    def new_sid() -> str:
        return new_id()

    def _record(self, session_id: str, task: Mapping[str, Any]) -> bytes:
        return json_codec.dumps_bytes({"session": session_id, "task": dict(task), "at": self.store.clock()})

    async def bind(self, sid: str, session_id: str, task: Mapping[str, Any]) -> bool:
        """Record the tool session under `sid`; False when the id already names one (nothing written)."""
        if not valid_id(sid):
            raise unknown_session()
        return await self.store.put_if_absent(session_key(sid), self._record(session_id, task), ttl_s=self.ttl_s)

    async def get(self, sid: str) -> OrsSession:
        """The session `sid` names (404 `ors_session_not_found` if none); refreshes its record's TTL."""
        raw = await self.store.get(session_key(sid)) if valid_id(sid) else None
        if raw is None:
            raise unknown_session()
        value = json_codec.loads(raw)
        session = OrsSession(sid, str(value["session"]), dict(value.get("task") or {}))
        if self.store.clock() - float(value.get("at", 0.0)) > self.ttl_s * REFRESH_FRACTION:
            await self.store.put(session_key(sid), self._record(session.session_id, session.task), ttl_s=self.ttl_s)
        return session

    async def unbind(self, sid: str) -> OrsSession | None:
        """Forget `sid`; the session it named, if any (closing it is the caller's)."""
        try:
            session = await self.get(sid)
        except NotFound:
            return None
        await self.store.delete([session_key(sid)])
        return session

    # --- tool-call answers, for reconnecting clients ------------------------------------------------

    @staticmethod
    def new_call_id() -> str:
        return new_id()

    async def keep_answer(self, task_id: str, answer: bytes) -> None:
        await self.store.put(call_key(task_id), answer, ttl_s=CALL_RESULT_TTL_S)

    async def answer(self, task_id: str) -> bytes | None:
        if not valid_id(task_id):
            raise NotFound("unknown task_id", code="ors_call_not_found")
        return await self.store.get(call_key(task_id))


def already_created() -> Conflict:
    return Conflict(
        "this ORS session already has an episode; create a new session",
        code="ors_session_exists",
        headers={"x-should-retry": "false"},
    )
