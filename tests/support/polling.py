"""The one polling helper."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.005) -> None:
    """Poll `predicate` every `interval` seconds until it holds; fail the test if it does not within
    `timeout`. (An async test calls it through `anyio.to_thread.run_sync`.)"""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"condition not reached in {timeout} s"
        time.sleep(interval)  # the polling interval, not a wait for something to happen
