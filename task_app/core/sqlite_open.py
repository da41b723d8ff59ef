"""Opening a SQLite file that other processes open at the same moment (`task-app serve --processes N`).

Two connections that set up one new file together can get "database is locked" at once, without
SQLite's busy handler: each holds the read lock the other's switch to WAL (or its first schema write)
waits for, and SQLite breaks that deadlock by refusing one of them. Retrying the whole setup for a
while lets every process open the file.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from .backoff import Backoff

T = TypeVar("T")

_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
OPEN_TIMEOUT_S = 10.0  # how long an opener keeps retrying
_BACKOFF = Backoff(base_s=0.005, cap_s=0.05)  # random pauses between attempts, so the processes fall out of step


def is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (any of their extended codes)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.OperationalError) and isinstance(code, int) and code & 0xFF in _BUSY_CODES


def open_retrying(open_once: Callable[[], T], timeout_s: float = OPEN_TIMEOUT_S) -> T:
    """`open_once()`, again while it fails busy, for up to `timeout_s`; it must close what it opened
    when it fails."""
    retry = _BACKOFF.start(time.monotonic() + timeout_s, clock=time.monotonic)  # in a worker thread: no event loop
    while True:
        try:
            return open_once()
        except sqlite3.OperationalError as exc:
            wait = retry.next_wait() if is_busy(exc) else None
            if wait is None:
                raise
        time.sleep(wait)


async def open_retrying_async(open_once: Callable[[], Awaitable[T]], timeout_s: float = OPEN_TIMEOUT_S) -> T:
    """`open_retrying` for an async `open_once`."""
    retry = _BACKOFF.start(anyio.current_time() + timeout_s)
    while True:
        try:
            return await open_once()
        except sqlite3.OperationalError as exc:
            wait = retry.next_wait() if is_busy(exc) else None
            if wait is None:
                raise
        await anyio.sleep(wait)
