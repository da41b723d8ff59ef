"""The handle through which a running rollout can be watched and aborted."""

from __future__ import annotations

import enum
from typing import Any

import anyio


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"


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
