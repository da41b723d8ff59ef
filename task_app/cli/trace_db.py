"""The trace database as the read-only commands open it (`task-app traces`, `task-app replay | view`).

`--db` is a file or a folder of them (every `*.db` below it, dot-files left out: one per container, as
`modal volume get` brings them), defaulting to `Settings().traces_db` (TASKAPP_TRACES_DB, else
./traces/task_app.db). A folder reads as one database (`TraceSet`): sessions listed from every file,
newest first; a run_id found in whichever file holds it (the newest session when several do, e.g. a
lost run that ran again on another container). Files are opened with SQLite's `mode=ro`: these
commands never create, migrate or write a database, so they are safe to run against the file a live
server is writing (WAL readers do not block the writer).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import anyio.to_thread
from rich.console import Console

from ..core.settings import Settings
from ..tracing import TraceReader

EXIT_USAGE = 2  # bad arguments, or no usable database
DB_HELP = "trace database, or a folder of them read as one (default: TASKAPP_TRACES_DB, else ./traces/task_app.db)"
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


class TraceSource(Protocol):
    """What the commands read: one database (`TraceReader`) or a folder of them (`TraceSet`)."""

    @property
    def paths(self) -> Sequence[Path]: ...

    async def list_sessions(
        self, since: datetime | str | None, min_achievements: int | None, model: str | None, limit: int
    ) -> list[dict[str, Any]]: ...

    async def get_session(self, run_id: str) -> dict[str, Any] | None: ...


class _File:
    """One database as a `TraceSource`."""

    def __init__(self, path: Path, reader: TraceReader) -> None:
        self.paths = [path]
        self.reader = reader

    async def list_sessions(
        self, since: datetime | str | None, min_achievements: int | None, model: str | None, limit: int
    ) -> list[dict[str, Any]]:
        return await self.reader.list_sessions(since, min_achievements, model, limit)

    async def get_session(self, run_id: str) -> dict[str, Any] | None:
        return await self.reader.get_session(run_id)


def _newest_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As one database lists them: newest first, then by run_id."""
    rows = sorted(rows, key=lambda row: str(row["session_id"]))
    return sorted(rows, key=lambda row: str(row.get("created_at") or ""), reverse=True)


class TraceSet:
    """Several databases read as one: every session once (the newest where a run_id is in two files)."""

    def __init__(self, files: Sequence[_File]) -> None:
        self.files = list(files)
        self.paths = [file.paths[0] for file in self.files]

    async def list_sessions(
        self, since: datetime | str | None, min_achievements: int | None, model: str | None, limit: int
    ) -> list[dict[str, Any]]:
        newest: dict[str, dict[str, Any]] = {}
        for file in self.files:
            for row in await file.list_sessions(since, min_achievements, model, limit):
                held = newest.get(str(row["session_id"]))
                if held is None or str(row.get("created_at") or "") > str(held.get("created_at") or ""):
                    newest[str(row["session_id"])] = row
        rows = _newest_first(list(newest.values()))
        return rows if limit < 0 else rows[:limit]

    async def get_session(self, run_id: str) -> dict[str, Any] | None:
        found = [trace for file in self.files if (trace := await file.get_session(run_id)) is not None]
        return max(found, key=lambda trace: str(trace.get("created_at") or ""), default=None)


def database_files(path: Path) -> list[Path] | None:
    """The trace databases of the folder `path`, at any depth (dot-files, e.g. a copy in progress, left
    out); None when `path` is not a folder."""
    if not path.is_dir():
        return None
    found = sorted(each for each in path.rglob("*.db") if not each.name.startswith(".") and each.is_file())
    if not found:
        raise CliError(f"no trace databases (*.db) in {path}")
    return found


@asynccontextmanager
async def _open(path: Path) -> AsyncIterator[_File]:
    """An open reader of `path`; any SQLite failure, opening or reading, becomes a `CliError`."""
    await anyio.to_thread.run_sync(_check_file, path)
    reader = TraceReader(path)
    try:
        await reader.start()
    except (sqlite3.Error, OSError) as exc:
        raise CliError(f"cannot open {path}: {type(exc).__name__}: {exc}") from exc
    try:
        yield _File(path, reader)
    except sqlite3.Error as exc:
        problem = "is not a trace database" if "no such" in str(exc) else "could not be read"  # table/column
        raise CliError(f"{path} {problem} ({exc})") from exc
    finally:
        await reader.close()


@asynccontextmanager
async def reading(path: Path) -> AsyncIterator[TraceSource]:
    """The database at `path`, or every database of the folder `path`, opened read-only."""
    folder = await anyio.to_thread.run_sync(database_files, path)
    if folder is None:
        async with _open(path) as file:
            yield file
        return
    async with AsyncExitStack() as stack:
        files = [await stack.enter_async_context(_open(each)) for each in folder]
        yield TraceSet(files)
