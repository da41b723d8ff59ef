"""How blocking work leaves the event loop: an `Offload` runs a callable in a worker thread.

The engine, the trace recorder and the routes take one as a parameter; the lifespan builds the app's
own (anyio's threads behind one capacity limiter, `TASKAPP_WORKER_THREADS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import anyio

T = TypeVar("T")


class Offload(Protocol):
    """`await offload(fn)` runs `fn()` off the event loop and returns what it returned."""

    async def __call__(self, fn: Callable[[], T], /) -> T: ...


async def run_in_thread(fn: Callable[[], T], /) -> T:
    """The default: anyio's worker threads, unlimited beyond anyio's own pool."""
    return await anyio.to_thread.run_sync(fn)


def limited_offload(limiter: anyio.CapacityLimiter) -> Offload:
    """An offload whose calls share `limiter`: at most its tokens of them run at once."""

    async def offload(fn: Callable[[], T], /) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=limiter)

    return offload
