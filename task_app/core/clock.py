"""The event loop's clock: what `anyio.current_time()` reads on asyncio (deadlines, cancel scopes),
without its look-up of the running backend on every call. A decision reads it five or six times
(docs/performance.md)."""

from __future__ import annotations

import asyncio


def loop_time() -> float:
    """Seconds on the running loop's clock, comparable with anyio's deadlines."""
    return asyncio.get_running_loop().time()
