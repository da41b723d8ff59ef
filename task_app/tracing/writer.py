"""The trace database's one writer: a `sqlite3` connection owned by a thread of its own, fed by a queue.

    rollout ──write(rows)──► bounded queue ──► writer task ──one call into the writer's thread──► COMMIT
        ▲                                                                                       │
        └──────────────── {"stored": true} once its transaction committed ◄─────────────────────┘

Why a thread and group commits rather than aiosqlite per statement: docs/decisions/trace-writer.md.

- `write` returns only after the rollout's transaction committed, so the HTTP layer can answer after it:
  a process killed after answering has lost nothing (WAL + `synchronous=NORMAL` survives a process
  crash; only an OS crash or power loss can drop the last commits).
- Group commit: the writer takes every job queued when it comes round (up to `MAX_BATCH` rollouts or
  `MAX_BATCH_ROWS` rows) into one transaction, so rollouts that end together pay one commit between
  them. If the batch fails, each job is retried alone, so one bad job or a full disk gets its own
  precise status and never fails the others. Parts of running rollouts, which nobody waits for, wait
  up to `PART_GATHER_S` for company (an end, a whole trace, a full queue or a batch's worth of rows
  ends the wait): fewer, fuller transactions write far fewer pages.
- A whole transaction (BEGIN, the deletes, the inserts of each table, COMMIT) is one call into the
  writer's thread: one wake-up of the event loop per batch, whatever its size.
- A run_id written again REPLACES its session: the transaction deletes every row of that session_id,
  then inserts the new ones. A replayed run never duplicates rows, and a re-run with a different trace
  never merges with the old one.
- A running rollout's rows can go in ahead of its end: `append` queues a part without waiting (the
  first part replaces the session, later ones add to it), and the end is then `write(...,
  replace=False)` with the rest and the session row, queued behind the parts without waiting for
  them: the writer keeps the queue's order, a part and a later non-replacing job of its session may
  share a transaction, and an end whose session lost a part is refused unwritten (the caller then
  writes the whole trace again, replacing). Readers see a session only once its session row is
  committed, so a part is invisible until the end lands; `discard` deletes the parts of a rollout
  that never ends, and a process killed mid-rollout leaves its parts to the run_id's next attempt,
  which replaces them (tests/test_crash_storage.py).
- Storage trouble (unwritable path, not a database, disk full, locked) never raises into the rollout:
  `write` logs a WARNING with the run_id, counts the failure, and returns `{"stored": false, "error"}`
  for the response metadata; `health()` says "degraded" until a write succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..core.sqlite_open import open_retrying
from .rows import INSERTS, Insert, Row, SessionRows
from .schema import MIGRATIONS, SESSION_TABLES, Migration, migrate, transaction

logger = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_WRITE_TIMEOUT_S = 60.0
DEFAULT_BUSY_TIMEOUT_MS = 5000
# SQLite's page cache (a cap, not an allocation): every rollout inserts at random places in the
# session-keyed indexes, and with SQLite's default 2 MB those pages fall out of the cache as the file grows.
DEFAULT_CACHE_MB = 64
# A batch stops at either bound, so one transaction (and the WAL it appends) stays ~10-20 MB whether
# the rollouts are short or long (~140 rows for 20 decisions).
MAX_BATCH = 1024
MAX_BATCH_ROWS = 20_000
# How long parts (no rollout waits for them) wait for company before the writer commits them: a
# commit writes every page it touched, and each session's rows land on pages of their own in the
# session-keyed indexes.
PART_GATHER_S = 1.0
# The page size of a file the writer creates (an existing file keeps its own): a decision adds ~8 rows
# and ~30 index entries, and with SQLite's default 4 KiB pages the writer's thread spent more CPU on them.
PAGE_SIZE = 16384
STORAGE_ERRORS = (sqlite3.Error, OSError)


@dataclass(slots=True)
class _Job:
    rows: SessionRows
    done: asyncio.Future[dict[str, Any]]  # always a status, never an exception
    replace: bool = True  # delete the session's stored rows first


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def pragmas(busy_timeout_ms: int, cache_mb: int) -> tuple[str, ...]:
    """What every connection to the trace database sets (the writer's and the readers')."""
    return (
        f"PRAGMA busy_timeout = {int(busy_timeout_ms):d}",
        f"PRAGMA cache_size = {-1024 * int(cache_mb):d}",  # negative: KiB
    )


class TraceWriter:
    """Writes rollouts' rows to one SQLite file. Create in the lifespan; `start()`, then `close()`."""

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
        self.write_timeout_s = write_timeout_s
        self.busy_timeout_ms = busy_timeout_ms
        self.cache_mb = cache_mb
        self.migrations = migrations
        self.part_gather_s = part_gather_s
        self.schema_version: int | None = None
        self.journal_mode: str | None = None
        self._queue: asyncio.Queue[_Job | None] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None
        self._thread: ThreadPoolExecutor | None = None  # owns `_conn`: every call to it runs there
        self._conn: sqlite3.Connection | None = None
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
        return self._task is not None and not self._closing

    async def start(self) -> None:
        """Create or open the file, migrate it, start the writer. Never raises on storage errors: a
        store that cannot open is degraded (`health`), and every write says so."""
        if self._thread is not None:
            return
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trace-writer")
        try:
            self._conn = await self._in_thread(lambda: open_retrying(self._open))
        except STORAGE_ERRORS as exc:
            await self._close_connection()
            self._count_failure(f"cannot open trace database {self.path}: {error_text(exc)}")
            logger.warning("trace store unavailable, rollouts will not be stored: %s", self._last_error)
            return
        self._task = asyncio.create_task(self._write_loop(), name="trace-writer")

    def _open(self) -> sqlite3.Connection:
        """The writer's connection (in its thread): created, in WAL mode, migrated (`open_retrying`:
        the other processes of `--processes N` may be setting the same file up)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE:d}")  # before anything creates the file
            for pragma in pragmas(self.busy_timeout_ms, self.cache_mb):
                conn.execute(pragma)
            # Not enforced: a running rollout's parts go in before its session row, which they reference
            # (the order of a single write keeps the references whole; `append`).
            conn.execute("PRAGMA foreign_keys = OFF")
            self.journal_mode = str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            if self.journal_mode.lower() != "wal":
                logger.warning("trace database %s could not use WAL (journal_mode=%s)", self.path, self.journal_mode)
            conn.execute("PRAGMA synchronous = NORMAL")
            self.schema_version = migrate(conn, self.migrations)
            # A file SQLite can only read (a read-only volume) opens without complaint: fail here, not
            # at the first rollout.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _in_thread(self, fn: Callable[[], T]) -> T:
        if self._thread is None:
            raise RuntimeError(f"trace writer {self.path} is not running ({self._last_error or 'not started'})")
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    async def _close_connection(self) -> None:
        conn, thread = self._conn, self._thread
        self._conn = self._thread = None
        if thread is None:
            return
        try:
            if conn is not None:
                await asyncio.get_running_loop().run_in_executor(thread, conn.close)
        except STORAGE_ERRORS:
            logger.warning("closing the trace database failed", exc_info=True)
        finally:
            thread.shutdown(wait=False)

    async def close(self) -> None:
        """Write everything queued, stop the writer, close the connection. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._task is not None:
            self._awaited.set()
            await self._queue.put(None)
            await self._task
        await self._close_connection()

    # --- health ---------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """`{"status": "ok"|"degraded", "failures", "last_error", ...}`; degraded from a failed start or
        write until the next successful write."""
        ok = self.running and not self._degraded
        return {
            "status": "ok" if ok else "degraded",
            "failures": self._failures,
            "last_error": self._last_error,
            "written": self._written,
            "transactions": self._transactions,
            "queued": self._queue.qsize(),
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
        """Whether `append` would take a part now (the writer runs and its queue is not full)."""
        return self.running and not self._queue.full()

    def append(self, rows: SessionRows, *, replace: bool) -> asyncio.Future[dict[str, Any]] | None:
        """Queue a part of a running rollout's rows (no session row) without waiting; the future
        resolves to its status once committed. None when not taken (see `has_room`)."""
        if not self.has_room:
            return None
        job = _Job(rows, asyncio.get_running_loop().create_future(), replace)
        self._queue.put_nowait(job)
        self._queued_rows += rows.row_count
        if self._queue.full() or self._queued_rows >= MAX_BATCH_ROWS:
            self._awaited.set()
        return job.done

    def discard(self, session_id: str) -> None:
        """Delete the appended parts of a rollout that will not end (queued; best effort)."""
        if self.append(SessionRows(session_id), replace=True) is None:
            logger.warning("could not queue the removal of run %s's partial trace", session_id)

    async def write(
        self, run_id: str, rows: SessionRows | Callable[[], SessionRows], *, replace: bool = True
    ) -> dict[str, Any]:
        """Store one rollout's rows and wait for their commit: `{"stored": true}` or `{"stored": false, "error"}`.

        `rows` may be a function that builds them; it runs in a worker thread, and a bug in it is a
        storage failure like any other (logged, counted), never an exception. Never raises for storage
        problems. `replace=False` adds to the parts `append` stored (the end of a rollout).
        """
        if not self.running:
            return self._mark_failure(run_id, self._last_error or "trace store is not running")
        if callable(rows):
            try:
                rows = await asyncio.to_thread(rows)
            except Exception as exc:  # a trace-building bug must not fail the rollout; logged, counted
                logger.warning("building the trace rows failed", exc_info=True, extra={"run_id": run_id})
                return self._mark_failure(run_id, f"trace rows: {error_text(exc)}")
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
        queue, closing = self._queue, False
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
        except STORAGE_ERRORS as exc:
            return self._not_stored(job, error_text(exc))
        except Exception as exc:  # the one writer must outlive any bad job; logged, counted, returned
            logger.warning("trace writer failed on one job", exc_info=True, extra={"run_id": session_id})
            return self._not_stored(job, error_text(exc))
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
        conn = self._conn
        if conn is None:
            raise RuntimeError(f"trace writer {self.path} has no connection")
        replaced = [(job.rows.session_id,) for job in batch if job.replace]
        parts = [job.rows for job in batch]
        tables: tuple[list[Row], ...] = (
            [rows.session for rows in parts if rows.session is not None],
            [row for rows in parts for row in rows.timesteps],
            [row for rows in parts for row in rows.events],
            [row for rows in parts for row in rows.messages],
            [row for rows in parts for row in rows.event_rewards],
            [rows.outcome for rows in parts if rows.outcome is not None],
        )

        def write() -> None:
            with transaction(conn):
                if replaced:
                    for table in SESSION_TABLES:
                        conn.executemany(f"DELETE FROM {table} WHERE session_id = ?", replaced)  # fixed names
                for insert, rows in zip(INSERTS, tables, strict=True):
                    _insert(conn, insert, rows)

        await self._in_thread(write)
        self._transactions += 1


def _insert(conn: sqlite3.Connection, insert: Insert, rows: list[Row]) -> None:
    """The rows as a few multi-row statements rather than one statement a row: sqlite3 takes the GIL
    back after each statement it steps, and waits for it whenever the event loop is busy, so a row a
    statement is a wait a row (docs/decisions/trace-writer.md)."""
    start = 0
    for size in _CHUNKS:
        while len(rows) - start >= size:
            chunk = rows[start : start + size]
            conn.execute(_STATEMENTS[insert, size], list(itertools.chain.from_iterable(chunk)))
            start += size


_CHUNKS = (64, 16, 4, 1)  # a few statement sizes: each is prepared once and cached by the connection
_STATEMENTS = {(insert, size): insert.sql(size) for insert in INSERTS for size in _CHUNKS}


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
    """Resolve the jobs of one commit one per loop iteration: resolved at once, every rollout that
    waited for the commit would resume in the same iteration, and a group of ends (each encoding its
    response on the loop) would hold it for tens of milliseconds."""
    pending = iter(jobs)

    def next_one() -> None:
        job = next(pending, None)
        if job is not None:
            _resolve(job, status)
            asyncio.get_running_loop().call_soon(next_one)

    next_one()
