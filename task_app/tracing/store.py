"""The server's trace database: one SQLite file, its writer (writer.py) and a reader beside it (reader.py).

The writer creates and migrates the file, so it starts first; the reader then opens it read-only. A
file that cannot be opened never fails the server: the store is degraded (`health`), writes return
`{"stored": false, "error"}`, and reads raise until it works again (after a restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from .reader import DEFAULT_LIST_LIMIT, TraceReader
from .rows import SessionRows
from .schema import MIGRATIONS, Migration
from .writer import (
    DEFAULT_BUSY_TIMEOUT_MS,
    DEFAULT_CACHE_MB,
    DEFAULT_WRITE_TIMEOUT_S,
    PART_GATHER_S,
    STORAGE_ERRORS,
    TraceWriter,
    error_text,
)

logger = logging.getLogger(__name__)


class TraceStore:
    """A trace database to write and read. Create in the lifespan; `start()`, then `close()`."""

    def __init__(
        self,
        path: str | Path,
        queue_size: int = 1024,
        *,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        migrations: tuple[Migration, ...] = MIGRATIONS,
        cache_mb: int = DEFAULT_CACHE_MB,
        part_gather_s: float = PART_GATHER_S,
    ) -> None:
        self.path = Path(path)
        self.writer = TraceWriter(
            path,
            queue_size,
            write_timeout_s=write_timeout_s,
            busy_timeout_ms=busy_timeout_ms,
            migrations=migrations,
            cache_mb=cache_mb,
            part_gather_s=part_gather_s,
        )
        self.reader = TraceReader(path, busy_timeout_ms=busy_timeout_ms, cache_mb=cache_mb)
        self._reader_error: str | None = None

    @property
    def running(self) -> bool:
        return self.writer.running and self.reader.running

    @property
    def schema_version(self) -> int | None:
        return self.writer.schema_version

    async def start(self) -> None:
        """Open the file (created and migrated by the writer), then the reader. Never raises on storage errors."""
        await self.writer.start()
        if not self.writer.running:
            return
        try:
            await self.reader.start()
        except STORAGE_ERRORS as exc:
            self._reader_error = f"cannot read trace database {self.path}: {error_text(exc)}"
            logger.warning("trace store cannot be read: %s", self._reader_error)
        else:
            logger.info(
                "trace store open: %s (schema %s, journal %s)", self.path, self.schema_version, self.writer.journal_mode
            )

    async def close(self) -> None:
        """Close the reader, then write everything queued and close the writer: the last connection to
        close checkpoints the WAL into the file and removes it, which a read-only one cannot. Idempotent."""
        await self.reader.close()
        await self.writer.close()

    async def __aenter__(self) -> TraceStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def health(self) -> dict[str, Any]:
        """The writer's `health()`; degraded too while the reader could not open."""
        health = self.writer.health()
        if self._reader_error is not None:
            health["status"] = "degraded"
            health["last_error"] = health["last_error"] or self._reader_error
        return health

    # --- writing (writer.py) --------------------------------------------------------------------

    @property
    def has_room(self) -> bool:
        return self.writer.has_room

    def append(self, rows: SessionRows, *, replace: bool) -> asyncio.Future[dict[str, Any]] | None:
        return self.writer.append(rows, replace=replace)

    def discard(self, session_id: str) -> None:
        self.writer.discard(session_id)

    async def write(
        self, run_id: str, rows: SessionRows | Callable[[], SessionRows], *, replace: bool = True
    ) -> dict[str, Any]:
        return await self.writer.write(run_id, rows, replace=replace)

    # --- reading (reader.py) --------------------------------------------------------------------

    async def list_sessions(
        self,
        since: datetime | str | None = None,
        min_achievements: int | None = None,
        model: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
    ) -> list[dict[str, Any]]:
        return await self.reader.list_sessions(since, min_achievements, model, limit)

    async def get_session(self, run_id: str) -> dict[str, Any] | None:
        return await self.reader.get_session(run_id)
