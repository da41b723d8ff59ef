"""The handle through which a running rollout can be watched and aborted."""

from __future__ import annotations

import enum
from typing import Any

import anyio


class RunStatus(enum.StrEnum):
    QUEUED = "queued"  # accepted (POST /rollouts), waiting for a slot or for the process that runs it
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    LOST = "lost"  # its process stopped without finishing it (rollout/fleet.py): it may be submitted again

    @property
    def finished(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.ABORTED, RunStatus.FAILED)


class RunControl:
    """Abort flag plus live progress of one rollout.

    `abort()` sets the flag and cancels the op in progress (a model call stops at once; a crafter
    step in a worker thread finishes first), so the rollout returns what it has right away.
    """

    def __init__(self) -> None:
        self.aborted = False
        self.progress: dict[str, Any] = {"ops_executed": 0, "decisions": 0, "episodes": 0, "achievements": []}
        self._scope: anyio.CancelScope | None = None

    def bind(self, scope: anyio.CancelScope | None) -> None:
        self._scope = scope

    def abort(self) -> None:
        self.aborted = True
        if self._scope is not None:
            self._scope.cancel()
