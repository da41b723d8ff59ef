"""Run state: admission (the per-process cap), idempotency by run_id, status and abort.

One object owns the concurrency cap. Every map is bounded: finished runs are kept for status and
replay up to `keep_finished` entries and `keep_bytes` bytes of cached responses, oldest first out.
Single-threaded by design: only the event loop touches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..core.errors import CapacityExceeded, Conflict, NotFound
from ..core.lru import LruMap
from .control import RunControl, RunStatus


@dataclass(slots=True)
class RunEntry:
    run_id: str
    started_at: datetime
    status: RunStatus = RunStatus.RUNNING
    control: RunControl = field(default_factory=RunControl)
    finished_at: datetime | None = None
    response: bytes | None = None  # the serialised response, replayed for a repeated run_id

    def status_body(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status.value,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "progress": dict(self.control.progress),
        }


class RunRegistry:
    def __init__(self, max_active: int, keep_finished: int, keep_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_active = max_active
        self._active: dict[str, RunEntry] = {}
        # oldest finished first out: reads do not refresh an entry (touch=False)
        self._finished: LruMap[str, RunEntry] = LruMap(
            keep_finished, max_weight=keep_bytes, weight=lambda entry: len(entry.response or b"")
        )

    @property
    def active(self) -> int:
        return len(self._active)

    def admit(self, run_id: str) -> RunEntry:
        """A new running entry, or the finished entry to replay. Raises Conflict / CapacityExceeded."""
        if run_id in self._active:
            raise Conflict(f"run {run_id!r} is still running", code="run_in_progress", run_id=run_id)
        finished = self._finished.get(run_id, touch=False)
        if finished is not None and finished.response is not None:
            return finished
        if len(self._active) >= self.max_active:
            raise CapacityExceeded(len(self._active), self.max_active)
        entry = RunEntry(run_id=run_id, started_at=datetime.now(UTC))
        self._active[run_id] = entry
        return entry

    def finish(self, entry: RunEntry, status: RunStatus, response: bytes | None) -> None:
        self._active.pop(entry.run_id, None)
        entry.status = status
        entry.finished_at = datetime.now(UTC)
        entry.response = response
        self._finished.put(entry.run_id, entry)

    def get(self, run_id: str) -> RunEntry:
        entry = self._active.get(run_id) or self._finished.get(run_id, touch=False)
        if entry is None:
            raise NotFound(f"run {run_id!r} not found", code="run_not_found", run_id=run_id)
        return entry

    def abort(self, run_id: str) -> RunEntry:
        """Abort a running rollout; a finished one is returned as it is (abort is idempotent)."""
        entry = self.get(run_id)
        if entry.status is RunStatus.RUNNING:
            entry.control.abort()
        return entry
