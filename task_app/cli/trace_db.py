"""The trace database as the read-only commands open it (`task-app traces`, `task-app replay | view`).

`--db` defaults to `Settings().traces_db` (TASKAPP_TRACES_DB, else ./traces/task_app.db). The file is
opened with SQLite's `mode=ro`: these commands never create, migrate or write a database, so they are
safe to run against the file a live server is writing (WAL readers do not block the writer).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio.to_thread
from rich.console import Console

from ..core.settings import Settings
from ..tracing import TraceStore

EXIT_USAGE = 2  # bad arguments, or no usable database
DB_HELP = "trace database (default: TASKAPP_TRACES_DB, else ./traces/task_app.db)"
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file


class CliError(Exception):
    """A user-facing failure: printed as one line on stderr (`print_error`), then the process exits with `code`."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def print_error(error: CliError) -> int:
    """Print `error` on stderr; its exit code."""
    Console(stderr=True).print(f"error: {error}", style="red", markup=False, highlight=False)
    return error.code


def db_path(db: Path | None) -> Path:
    return Path(db) if db is not None else Settings().traces_db


def _check_file(path: Path) -> None:
    if not path.exists():
        raise CliError(f"no trace database at {path} (pass --db PATH or set TASKAPP_TRACES_DB)")
    if not path.is_file():
        raise CliError(f"{path} is not a file")
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    if magic != SQLITE_MAGIC:
        raise CliError(f"{path} is not an SQLite database" + (" (empty file)" if not magic else ""))


@asynccontextmanager
async def reading(path: Path) -> AsyncIterator[TraceStore]:
    """A started read-only store; any SQLite failure while it is used becomes a `CliError`."""
    await anyio.to_thread.run_sync(_check_file, path)
    store = TraceStore(path, readonly=True)
    await store.start()
    try:
        if not store.running:
            raise CliError(f"cannot open {path}: {store.health()['last_error']}")
        try:
            yield store
        except sqlite3.Error as exc:
            problem = "is not a trace database" if "no such" in str(exc) else "could not be read"  # table/column
            raise CliError(f"{path} {problem} ({exc})") from exc
    finally:
        await store.close()
