"""Opening a SQLite file that another process is setting up: real locks, real "database is locked"."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from task_app.core.sqlite_open import is_busy, open_retrying
from task_app.store import sqlite as sqlite_store
from task_app.store.sqlite import SqliteStore
from task_app.tracing import TraceStore

pytestmark = pytest.mark.anyio

HELD_S = 0.3


@contextmanager
def locked_for(path: Path, seconds: float) -> Iterator[None]:
    """Another connection holds `path`'s exclusive lock for `seconds` (from another thread)."""
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")
    timer = threading.Timer(seconds, lambda: blocker.execute("COMMIT"))
    timer.start()
    try:
        yield
    finally:
        timer.join()
        blocker.close()


def _connect_without_waiting(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    except BaseException:
        conn.close()
        raise
    return conn


def test_a_busy_setup_is_retried_until_the_lock_is_released(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    attempts = 0

    def open_once() -> sqlite3.Connection:
        nonlocal attempts
        attempts += 1
        return _connect_without_waiting(path)

    with locked_for(path, HELD_S):
        started = time.monotonic()
        conn = open_retrying(open_once)
    conn.close()
    assert attempts > 1
    assert HELD_S * 0.9 <= time.monotonic() - started < HELD_S + 2


def test_retrying_stops_at_its_bound_and_other_errors_are_not_retried(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with locked_for(path, HELD_S), pytest.raises(sqlite3.OperationalError) as busy:
        open_retrying(lambda: _connect_without_waiting(path), timeout_s=0.05)
    assert is_busy(busy.value)
    attempts = 0

    def not_a_database() -> sqlite3.Connection:
        nonlocal attempts
        attempts += 1
        return sqlite3.connect(tmp_path / "missing" / "x.db")

    with pytest.raises(sqlite3.OperationalError) as refused:
        open_retrying(not_a_database)
    assert not is_busy(refused.value) and attempts == 1


async def test_both_stores_open_a_file_another_connection_has_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No busy handler (timeout 0): every setup statement fails at once while the lock is held, as in
    # the deadlock SQLite breaks between two processes setting one new file up.
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_MS", 0)
    with locked_for(tmp_path / "state.db", HELD_S):
        state = await SqliteStore(tmp_path / "state.db").open()
    await state.put("k", b"v")
    assert await state.get("k") == b"v"
    await state.close()
    traces = TraceStore(tmp_path / "traces.db", busy_timeout_ms=0)
    with locked_for(tmp_path / "traces.db", HELD_S):
        await traces.start()
    assert traces.health()["status"] == "ok", traces.health()
    await traces.close()
