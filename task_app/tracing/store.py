"""The durable trace store: one SQLite file, one writer task with a connection in a thread of its own.

    rollout ──write(result)──► build rows (worker thread) ──► bounded queue ──► writer task
        ▲                                                                       │ one transaction
        └──────────── {"stored": true} once COMMIT returned ◄───────────────────┘ per batch queued

- `write` returns only after the rollout's transaction committed, so the HTTP layer can answer after it:
  a process killed after answering has lost nothing (WAL + `synchronous=NORMAL` survives a process
  crash; only an OS crash or power loss can drop the last commits).
- Group commit: the writer takes every job queued when it comes round (up to `MAX_BATCH` rollouts or
  `MAX_BATCH_ROWS` rows) into one transaction, so rollouts that end together pay one commit instead
  of one each, and the last of them no longer waits behind every other one's commit
  (docs/decisions/trace-writer.md). If the batch fails, each job is retried alone, so one bad job or
  a full disk gets its own precise status and never fails the others. Parts of running rollouts, which
  nobody waits for, wait up to `PART_GATHER_S` for company (an end, a whole trace, a full queue or a
  batch's worth of rows ends the wait): fewer, fuller transactions write far fewer pages.
- The writer's connection is plain `sqlite3`, owned by one thread: a whole transaction (BEGIN, the
  deletes, an `executemany` per table, COMMIT) is one call into that thread, so it costs one wake-up
  of the event loop, where a statement at a time through aiosqlite cost one each; with the loop
  busy, each of those waited behind every other ready callback (the rollouts' ends). The writer also
  migrates the file when the store starts.
- A run_id written again REPLACES its session: the transaction deletes every row of that session_id,
  then inserts the new ones. A replayed run never duplicates rows, and a re-run with a different trace
  never merges with the old one (the old system merged them: docs/compatibility.md).
- A running rollout's rows can go in ahead of its end: `append` queues a part without waiting (the
  first part replaces the session, later ones add to it), and the end is then `write(...,
  replace=False)` with the rest and the session row, queued behind the parts without waiting for
  them: the writer keeps the queue's order, a part and a later non-replacing job of its session may
  share a transaction, and an end whose session lost a part is refused unwritten (the caller then
  writes the whole trace again, replacing). Readers see a session only once its session row is
  committed, so a part is invisible until the end lands; `discard` deletes the parts of a rollout
  that never ends, and a process killed mid-rollout leaves its parts to the run_id's next attempt,
  which replaces them (tests/test_crash_storage.py). The writer then spends a rollout's idle time
  (its model calls) on its rows, instead of every rollout that ends together waiting behind every
  other one's rows.
- Storage trouble (unwritable path, not a database, disk full, locked) never raises into the rollout:
  `write` logs a WARNING with the run_id, counts the failure, and returns `{"stored": false, "error"}`
  for the response metadata; `health()` says "degraded" until a write succeeds again.
- Reads (`list_sessions`, `get_session`) go through a connection of their own (aiosqlite): WAL lets
  them run while the writer writes, and they never see a transaction that has not committed.
  `TraceStore(path, readonly=True)` opens only that one, on an existing file, for the CLI; it never
  migrates or writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ..core.sqlite_open import open_retrying
from .calls import iso
from .rows import (
    INSERT_EVENT,
    INSERT_EVENT_REWARD,
    INSERT_MESSAGE,
    INSERT_OUTCOME,
    INSERT_SESSION,
    INSERT_TIMESTEP,
    Row,
    SessionRows,
    load_json,
    session_from_rows,
)
from .schema import MIGRATIONS, SESSION_TABLES, Migration, migrate, transaction

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_WRITE_TIMEOUT_S = 60.0
DEFAULT_BUSY_TIMEOUT_MS = 5000
# SQLite's page cache. Every rollout inserts at random places in the session-keyed indexes; with
# SQLite's default 2 MB those pages fell out of the cache as the file grew, and each commit cost more
# (throughput fell over a few hundred rollouts). A cap, not an allocation.
DEFAULT_CACHE_MB = 64
DEFAULT_LIST_LIMIT = 100
# A batch stops at either bound, so one transaction (and the WAL it appends) stays ~10-20 MB whether
# the rollouts are short or long (~140 rows for 20 decisions).
MAX_BATCH = 1024
MAX_BATCH_ROWS = 20_000
# How long parts (no rollout waits for them) wait for company before the writer commits them. A
# commit writes every page it touched, and each session's rows land on pages of their own in the
# session-keyed indexes: committed as they came, a few parts a transaction, a thousand rollouts'
# parts took thousands of transactions, each writing pages of its own; gathered, a few dozen
# (docs/decisions/trace-writer.md). An end, a whole trace, a full queue or a batch's worth of rows queued ends the wait.
PART_GATHER_S = 1.0
# The page size of a file the store creates (an existing file keeps its own). A decision adds ~8 rows
# and ~30 index entries; with SQLite's default 4 KiB pages the writer's thread spent more CPU on them
# (8 and 32 KiB in between; docs/decisions/trace-writer.md).
PAGE_SIZE = 16384
_STORAGE_ERRORS = (sqlite3.Error, OSError)


@dataclass(slots=True)
class _Job:
    rows: SessionRows
    done: asyncio.Future[dict[str, Any]]  # always a status, never an exception
    replace: bool = True  # delete the session's stored rows first


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class TraceStore:
    """Durable SQLite trace storage for one process. Create in the lifespan; `start()`, then `close()`."""

    def __init__(
        self,
        path: str | Path,
        queue_size: int = 1024,
        *,
        readonly: bool = False,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        migrations: tuple[Migration, ...] = MIGRATIONS,
        cache_mb: int = DEFAULT_CACHE_MB,
        part_gather_s: float = PART_GATHER_S,
    ) -> None:
        self.path = Path(path)
        self.cache_mb = cache_mb
        self.readonly = readonly
        self.write_timeout_s = write_timeout_s
        self.busy_timeout_ms = busy_timeout_ms
        self.migrations = migrations
        self.part_gather_s = part_gather_s
        self.schema_version: int | None = None
        self.journal_mode: str | None = None
        self._queue_size = queue_size
        self._queue: asyncio.Queue[_Job | None] | None = None
        self._conn: aiosqlite.Connection | None = None  # reads
        self._writer: asyncio.Task[None] | None = None
        self._write_thread: ThreadPoolExecutor | None = None  # owns `_write_conn`: every call to it runs there
        self._write_conn: sqlite3.Connection | None = None
        self._closing = False
        self._written = 0
        self._transactions = 0  # commits that wrote rollouts: fewer than `written` when grouped
        self._failures = 0
        self._last_error: str | None = None
        self._degraded = False
        self._awaited = asyncio.Event()  # a job someone waits for is queued: commit without gathering
        self._queued_rows = 0
        self._lost_parts: set[str] = set()  # sessions with a part not stored since they were last replaced

    # --- lifecycle ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._conn is not None and not self._closing

    async def start(self) -> None:
        """Open the file, apply pragmas and migrations, start the writer. Never raises on storage errors."""
        if self._conn is not None:
            return
        try:
            if not self.readonly:  # first: it creates and migrates the file the reads then open
                self._write_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-store-writer")
                self._write_conn = await self._in_writer_thread(lambda: open_retrying(self._open_writer))
            self._conn = await self._open()
        except _STORAGE_ERRORS as exc:
            await self._close_writer()
            self._count_failure(f"cannot open trace database {self.path}: {_error_text(exc)}")
            logger.warning("trace store unavailable, rollouts will not be stored: %s", self._last_error)
            return
        if not self.readonly:
            self._queue = asyncio.Queue(maxsize=self._queue_size)
            self._writer = asyncio.create_task(self._write_loop(), name="trace-store-writer")
        logger.info(
            "trace store open: %s (schema %s, journal %s%s)",
            self.path,
            self.schema_version,
            self.journal_mode,
            ", read-only" if self.readonly else "",
        )

    def _pragmas(self) -> tuple[str, ...]:
        """Both connections'."""
        return (
            f"PRAGMA busy_timeout = {int(self.busy_timeout_ms):d}",
            f"PRAGMA cache_size = {-1024 * int(self.cache_mb):d}",  # negative: KiB
        )

    async def _open(self) -> aiosqlite.Connection:
        """The connection the reads use."""
        if self.readonly:
            conn = await aiosqlite.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
        else:
            conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = aiosqlite.Row
        try:
            for pragma in self._pragmas():
                await conn.execute(pragma)
            if self.readonly:
                self.schema_version = await _scalar(conn, "PRAGMA user_version")
                self.journal_mode = await _scalar(conn, "PRAGMA journal_mode")
        except BaseException:
            await conn.close()
            raise
        return conn

    def _open_writer(self) -> sqlite3.Connection:
        """The writer's connection (in its thread): created, in WAL mode, migrated (`open_retrying`:
        the other processes of `--processes N` may be setting the same file up)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE:d}")  # before anything creates the file
            for pragma in self._pragmas():
                conn.execute(pragma)
            # Not enforced: a running rollout's parts go in before its session row, which they reference
            # (the order of a single write keeps the references whole; `append`).
            conn.execute("PRAGMA foreign_keys = OFF")
            self.journal_mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if self.journal_mode.lower() != "wal":
                logger.warning("trace database %s could not use WAL (journal_mode=%s)", self.path, self.journal_mode)
            conn.execute("PRAGMA synchronous = NORMAL")
            self.schema_version = migrate(conn, self.migrations)
        except BaseException:
            conn.close()
            raise
        return conn

    async def _in_writer_thread(self, fn: Callable[[], T]) -> T:
        if self._write_thread is None:
            raise RuntimeError(f"trace store {self.path} has no writer ({self._last_error or 'not started'})")
        return await asyncio.get_running_loop().run_in_executor(self._write_thread, fn)

    async def _close_writer(self) -> None:
        conn, thread = self._write_conn, self._write_thread
        self._write_conn = self._write_thread = None
        if thread is None:
            return
        try:
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        except _STORAGE_ERRORS:
            logger.warning("closing the trace database failed", exc_info=True)
        finally:
            thread.shutdown(wait=False)

    async def close(self) -> None:
        """Write everything queued, stop the writer, close the connection. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._writer is not None and self._queue is not None:
            self._awaited.set()
            await self._queue.put(None)
            await self._writer
        conn, self._conn, self._writer = self._conn, None, None
        if conn is not None:
            try:
                await conn.close()
            except _STORAGE_ERRORS:
                logger.warning("closing the trace database failed", exc_info=True)
        await self._close_writer()

    async def __aenter__(self) -> TraceStore:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- health ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """`{"status": "ok"|"degraded", "failures", "last_error", ...}`; degraded from a failed start or
        write until the next successful write."""
        ok = self._conn is not None and not self._degraded and not self._closing
        return {
            "status": "ok" if ok else "degraded",
            "failures": self._failures,
            "last_error": self._last_error,
            "written": self._written,
            "transactions": self._transactions,
            "queued": self._queue.qsize() if self._queue is not None else 0,
            "schema_version": self.schema_version,
            "journal_mode": self.journal_mode,
        }

    def _count_failure(self, message: str) -> None:
        self._failures += 1
        self._last_error = message
        self._degraded = True

    def _mark_failure(self, run_id: str, message: str) -> dict[str, Any]:
        self._count_failure(message)
        logger.warning("trace not stored for run %s: %s", run_id, message, extra={"run_id": run_id})
        return {"stored": False, "error": message}

    # --- writing --------------------------------------------------------------------------------

    @property
    def has_room(self) -> bool:
        """Whether `append` would take a part now (the store runs and its queue is not full)."""
        return self._queue is not None and not self._closing and not self._queue.full()

    def append(self, rows: SessionRows, *, replace: bool) -> asyncio.Future[dict[str, Any]] | None:
        """Queue a part of a running rollout's rows (no session row) without waiting; the future
        resolves to its status once committed. None when not taken (see `has_room`)."""
        if not self.has_room or self._queue is None:
            return None
        job = _Job(rows, asyncio.get_running_loop().create_future(), replace)
        self._queue.put_nowait(job)
        self._queued_rows += rows.row_count
        if self._queue.full() or self._queued_rows >= MAX_BATCH_ROWS:
            self._awaited.set()
        return job.done

    def discard(self, session_id: str) -> None:
        """Delete the appended parts of a rollout that will not end (queued; best effort)."""
        if self.append(SessionRows(session_id, None), replace=True) is None:
            logger.warning("could not queue the removal of run %s's partial trace", session_id)

    async def write(
        self, run_id: str, rows: SessionRows | Callable[[], SessionRows], *, replace: bool = True
    ) -> dict[str, Any]:
        """Store one rollout's rows and wait for their commit: `{"stored": true}` or `{"stored": false, "error"}`.

        `rows` may be a function that builds them; it runs in a worker thread, and a bug in it is a
        storage failure like any other (logged, counted), never an exception. Never raises for storage
        problems. `replace=False` adds to the parts `append` stored (the end of a rollout).
        """
        if self.readonly:
            return self._mark_failure(run_id, "trace store is read-only")
        if self._closing or self._queue is None:
            return self._mark_failure(run_id, self._last_error or "trace store is not running")
        if callable(rows):
            try:
                rows = await asyncio.to_thread(rows)
            except Exception as exc:  # a trace-building bug must not fail the rollout; logged, counted
                logger.warning("building the trace rows failed", exc_info=True, extra={"run_id": run_id})
                return self._mark_failure(run_id, f"trace rows: {_error_text(exc)}")
        job = _Job(rows, asyncio.get_running_loop().create_future(), replace)
        self._awaited.set()  # before `put`: with the queue full, the writer must not sit out its gathering
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await self._queue.put(job)
                self._queued_rows += rows.row_count
                # shield: a caller that gives up (timeout, cancelled request) leaves the job to the writer
                return await asyncio.shield(job.done)
        except TimeoutError:
            return self._mark_failure(run_id, f"trace writer did not commit within {self.write_timeout_s:g} s")

    async def _write_loop(self) -> None:
        queue = self._queue
        if queue is None:  # pragma: no cover - start() sets it before creating this task
            return
        closing = False
        while not closing:
            batch: list[_Job] = []
            rows = 0
            job = await queue.get()
            if job is not None and not self._awaited.is_set() and self._queued_rows < MAX_BATCH_ROWS:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.part_gather_s):
                        await self._awaited.wait()
            self._awaited.clear()
            while job is not None:
                batch.append(job)
                rows += job.rows.row_count
                self._queued_rows -= job.rows.row_count
                if len(batch) >= MAX_BATCH or rows >= MAX_BATCH_ROWS or queue.empty():
                    break
                job = queue.get_nowait()
            closing = job is None
            for group in _replacing_once(batch):
                await self._run_batch(group)

    async def _run_batch(self, batch: list[_Job]) -> None:
        """Commit the jobs in one transaction; if that fails, each alone (its own status)."""
        batch = [job for job in batch if not self._refused(job)]
        if len(batch) > 1:
            try:
                await self._commit(batch)
            except Exception:  # retried one by one below, where each failure is reported
                logger.debug("group commit of %d traces failed; writing them one by one", len(batch), exc_info=True)
            else:
                self._stored(batch)
                for job in batch:  # parts: no rollout waits for them, so they take no turn
                    if job.rows.session is None:
                        _resolve(job, {"stored": True})
                _resolve_in_turn([job for job in batch if job.rows.session is not None], {"stored": True})
                return
        for job in batch:
            if not self._refused(job):
                _resolve(job, await self._run_job(job))

    def _refused(self, job: _Job) -> bool:
        """Resolve, unwritten, a job that adds to a session one of whose parts was not stored: its
        writer rewrites the whole trace (replacing) instead."""
        if job.replace or job.rows.session_id not in self._lost_parts:
            return False
        _resolve(job, {"stored": False, "error": "an earlier part of this trace was not stored"})
        return True

    def _stored(self, jobs: list[_Job]) -> None:
        self._written += sum(job.rows.session is not None for job in jobs)
        self._degraded = False
        self._lost_parts.difference_update(job.rows.session_id for job in jobs if job.replace)

    async def _run_job(self, job: _Job) -> dict[str, Any]:
        session_id = job.rows.session_id
        try:
            await self._commit([job])
        except _STORAGE_ERRORS as exc:
            return self._not_stored(job, _error_text(exc))
        except Exception as exc:  # the one writer must outlive any bad job; logged, counted, returned
            logger.warning("trace writer failed on one job", exc_info=True, extra={"run_id": session_id})
            return self._not_stored(job, _error_text(exc))
        self._stored([job])
        return {"stored": True}

    def _not_stored(self, job: _Job, message: str) -> dict[str, Any]:
        if job.rows.session is None:  # a part: the end of its rollout must not add to what is left
            self._lost_parts.add(job.rows.session_id)
        return self._mark_failure(job.rows.session_id, message)

    async def _commit(self, batch: list[_Job]) -> None:
        """Write the jobs of `batch` in one transaction (a session replaced at most once, by its first
        job there): the old rows of each session it replaces go first, then every table's rows
        (timesteps before the events and messages that look their ids up), all of it one call into
        the writer's thread."""
        conn = self._write_conn
        if conn is None:
            raise RuntimeError(f"trace store {self.path} has no writer")
        replaced = [(job.rows.session_id,) for job in batch if job.replace]
        parts = [job.rows for job in batch]
        inserts = (
            (INSERT_SESSION, [rows.session for rows in parts if rows.session is not None]),
            (INSERT_TIMESTEP, [row for rows in parts for row in rows.timesteps]),
            (INSERT_EVENT, [row for rows in parts for row in rows.events]),
            (INSERT_MESSAGE, [row for rows in parts for row in rows.messages]),
            (INSERT_EVENT_REWARD, [row for rows in parts for row in rows.event_rewards]),
            (INSERT_OUTCOME, [rows.outcome for rows in parts if rows.outcome is not None]),
        )

        def write() -> None:
            with transaction(conn):
                if replaced:
                    for table in SESSION_TABLES:
                        conn.executemany(f"DELETE FROM {table} WHERE session_id = ?", replaced)  # fixed names
                for sql, rows in inserts:
                    _insert(conn, sql, rows)

        await self._in_writer_thread(write)
        self._transactions += 1

    # --- reading --------------------------------------------------------------------------------

    def _connection(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError(f"trace store {self.path} is not open ({self._last_error or 'not started'})")
        return self._conn

    async def _fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        async with self._connection().execute(sql, params) as cursor:
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


def _insert(conn: sqlite3.Connection, sql: str, rows: list[Row]) -> None:
    """`executemany(sql, rows)` as a few multi-row statements: sqlite3 takes the GIL back after each
    statement it steps, and the loop holds it for up to the switch interval whenever it is busy, so a
    row a statement is a wait a row (docs/decisions/trace-writer.md)."""
    start = 0
    for size in _CHUNKS:
        while len(rows) - start >= size:
            chunk = rows[start : start + size]
            conn.execute(_statement(sql, size), list(itertools.chain.from_iterable(chunk)))
            start += size


_CHUNKS = (64, 16, 4, 1)  # a few statement sizes: each is prepared once and cached by the connection


@lru_cache(maxsize=64)
def _statement(sql: str, rows: int) -> str:
    """The INSERT `sql` (one VALUES tuple) for `rows` rows."""
    head, values = sql.split(" VALUES ", 1)
    return f"{head} VALUES {', '.join([values] * rows)}"


def _replacing_once(batch: list[_Job]) -> list[list[_Job]]:
    """`batch` cut, in order, into groups where no job replaces a session an earlier job of its group
    wrote: a run written twice must still be replaced, not merged, since a transaction deletes before
    it inserts. A running rollout's parts and its end add to their session, so they share one."""
    groups: list[list[_Job]] = [[]]
    seen: set[str] = set()
    for job in batch:
        if job.replace and job.rows.session_id in seen:
            groups.append([])
            seen.clear()
        groups[-1].append(job)
        seen.add(job.rows.session_id)
    return [group for group in groups if group]


def _resolve(job: _Job, status: dict[str, Any]) -> None:
    if not job.done.done():
        job.done.set_result(status)


def _resolve_in_turn(jobs: list[_Job], status: dict[str, Any]) -> None:
    """Resolve the jobs of one commit one per loop iteration. Resolved at once, every rollout that
    waited for the commit would resume in the same iteration, and a group of 64 ends (each encoding
    its response on the loop) held it for tens of milliseconds, a lag every rollout felt."""
    pending = iter(jobs)

    def next_one() -> None:
        job = next(pending, None)
        if job is not None:
            _resolve(job, status)
            asyncio.get_running_loop().call_soon(next_one)

    next_one()


async def _scalar(conn: aiosqlite.Connection, sql: str) -> Any:
    async with conn.execute(sql) as cursor:
        row = await cursor.fetchone()
    return row[0] if row else None


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    summary = dict(row)
    metadata = summary.pop("metadata")
    try:
        meta = json.loads(metadata) if isinstance(metadata, str) else {}
    except ValueError:
        meta = {}
    summary.update(
        model=meta.get("model"),
        policy_name=meta.get("policy_name"),
        seed=meta.get("seed"),
        achievements=meta.get("final_achievements") or [],
        stop_reason=meta.get("stop_reason"),
    )
    return summary
