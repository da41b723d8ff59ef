"""`TASKAPP_STATE_BACKEND=sqlite:PATH`: several app processes on one machine share one SQLite file.

One table, `kv(key, value, expires_at)`, WAL, `synchronous=NORMAL` (a committed write survives the
process being killed; only an OS crash can lose the last ones). Every operation is one statement in
autocommit mode, and one statement is atomic across every process on the file, so `put_if_absent` is
a single UPSERT that inserts, or overwrites only an expired row; its change count says who won.

Where the statements run. The writes of one key (`put`, `put_if_absent`: an env session's one write per
step) run on the event loop, on a connection of their own that never waits: a WAL commit at
`synchronous=NORMAL` does not sync, so it costs tens of microseconds, less than the handoff to a thread
and back. When another writer holds the file (busy), the write goes to aiosqlite's thread instead, which
waits up to `BUSY_TIMEOUT_MS`. That thread also runs everything else (reads, scans, deletes, purges), and
the WAL checkpoint, every `CHECKPOINT_EVERY` writes on the loop (the loop's connection never checkpoints:
a checkpoint syncs the file). Durability is unchanged: every write is committed before it returns.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import aiosqlite

from ..core.sqlite_open import is_busy, open_retrying_async
from .base import Clock, StateStore, StoreUnavailable, check_key, expiry

BUSY_TIMEOUT_MS = 5000
CHECKPOINT_EVERY = 1000  # writes on the loop between passive WAL checkpoints in the thread (SQLite's own default)
_CHUNK = 500  # keys per IN (...) list, below SQLite's limit on bound parameters
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires_at REAL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS kv_expires_at ON kv (expires_at) WHERE expires_at IS NOT NULL",
)
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_PUT = (
    "INSERT INTO kv (key, value, expires_at) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
)
_PUT_IF_ABSENT = _PUT + " WHERE kv.expires_at IS NOT NULL AND kv.expires_at <= ?"


def _prefix_end(prefix: str) -> str:
    """The smallest string above every string that starts with `prefix` (keys are ASCII)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class SqliteStore(StateStore):
    name = "sqlite"
    cheap_scan = True

    def __init__(self, path: str | Path, clock: Clock = time.time) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self._conn: aiosqlite.Connection | None = None
        self._loop_conn: sqlite3.Connection | None = None  # the writes on the event loop (module docstring)
        self._loop_writes = 0

    async def open(self) -> SqliteStore:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = await open_retrying_async(self._connect)
            self._loop_conn = self._connect_loop()
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open the state store {self.path}: {exc}") from exc
        return self

    def _connect_loop(self) -> sqlite3.Connection:
        """Opened after `_connect` set the file up (WAL, schema): only per-connection settings here."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await conn.execute("PRAGMA journal_mode = WAL")
            await conn.execute("PRAGMA synchronous = NORMAL")
            for statement in _SCHEMA:
                await conn.execute(statement)
        except BaseException:
            await conn.close()
            raise
        return conn

    @property
    def _db(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise StoreUnavailable("the state store is not open")
        return self._conn

    async def _rows(self, sql: str, params: Sequence[object]) -> list[sqlite3.Row]:
        try:
            return list(await self._db.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"state store read failed: {exc}") from exc

    async def _write(self, sql: str, params: Sequence[object]) -> int:
        try:
            async with self._db.execute(sql, params) as cursor:
                return cursor.rowcount
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"state store write failed: {exc}") from exc

    async def _write_one(self, sql: str, params: Sequence[object]) -> int:
        """A write of one key: on the loop unless the file is busy (module docstring)."""
        if self._loop_conn is None:
            raise StoreUnavailable("the state store is not open")
        try:
            changed = self._loop_conn.execute(sql, params).rowcount
        except sqlite3.Error as exc:
            if not is_busy(exc):
                raise StoreUnavailable(f"state store write failed: {exc}") from exc
            return await self._write(sql, params)
        self._loop_writes += 1
        if self._loop_writes % CHECKPOINT_EVERY == 0:
            await self._rows("PRAGMA wal_checkpoint(PASSIVE)", ())
        return changed

    async def get(self, key: str) -> bytes | None:
        rows = await self._rows(f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (check_key(key), self.clock()))
        return bytes(rows[0][0]) if rows else None

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        found: dict[str, bytes] = {}
        now = self.clock()
        for start in range(0, len(keys), _CHUNK):
            chunk = [check_key(key) for key in keys[start : start + _CHUNK]]
            marks = ", ".join("?" * len(chunk))
            rows = await self._rows(f"SELECT key, value FROM kv WHERE key IN ({marks}) AND {_LIVE}", (*chunk, now))
            found.update((row[0], bytes(row[1])) for row in rows)
        return [found.get(key) for key in keys]

    async def put(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        await self._write_one(_PUT, (check_key(key), bytes(value), expiry(ttl_s, self.clock)))

    async def put_if_absent(self, key: str, value: bytes, *, ttl_s: float | None = None) -> bool:
        params = (check_key(key), bytes(value), expiry(ttl_s, self.clock), self.clock())
        return await self._write_one(_PUT_IF_ABSENT, params) == 1

    async def delete(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), _CHUNK):
            chunk = [check_key(key) for key in keys[start : start + _CHUNK]]
            await self._write(f"DELETE FROM kv WHERE key IN ({', '.join('?' * len(chunk))})", chunk)

    async def scan(self, prefix: str) -> list[str]:
        check_key(prefix)
        rows = await self._rows(
            f"SELECT key FROM kv WHERE key >= ? AND key < ? AND {_LIVE} ORDER BY key",
            (prefix, _prefix_end(prefix), self.clock()),
        )
        return [row[0] for row in rows]

    async def purge(self) -> int:
        return await self._write("DELETE FROM kv WHERE expires_at IS NOT NULL AND expires_at <= ?", (self.clock(),))

    async def close(self) -> None:
        if self._loop_conn is not None:
            loop_conn, self._loop_conn = self._loop_conn, None
            loop_conn.close()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()
