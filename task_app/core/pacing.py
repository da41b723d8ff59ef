"""How a wave of decisions shares the event loop: `LoopPacer` lets one loop iteration run about
`budget_s` of them and queues the rest, in order, for the iterations that follow.

A thousand rollouts against one model answer in waves: dozens of answers arrive in one poll, and
asyncio runs every woken rollout's decision (the answer's parsing, the step, the trace rows, the
next request) in the one iteration that follows, while timers, `/health` and new connections wait for
all of them (docs/decisions/pacer.md). Paced, the same work
runs in more, shorter iterations; nothing is added to a decision but a clock read and, in a wave,
one wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from time import perf_counter


class LoopPacer:
    """`await pacer.turn()` before a stretch of loop work that may come in waves."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self.cost_s = budget_s / 8  # loop time between two turns of one iteration, moving average
        self._queue: deque[asyncio.Future[None]] = deque()
        self._window_start: float | None = None  # the iteration's first turn, until the next iteration
        self._last_turn = 0.0
        self._draining = False

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def turn(self) -> None:
        now = perf_counter()
        if not self._queue and (self._window_start is None or now - self._window_start < self.budget_s):
            self._admit(now)
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._queue.append(waiter)
        if not self._draining:
            self._draining = True
            loop.call_soon(self._drain)
        await waiter  # cancelled while queued: the drain skips it
        self._admit(perf_counter())

    def _admit(self, now: float) -> None:
        if self._window_start is None:
            self._window_start = now
            asyncio.get_running_loop().call_soon(self._close_window)
        else:
            self.cost_s += 0.1 * ((now - self._last_turn) - self.cost_s)
        self._last_turn = now

    def _close_window(self) -> None:
        self._window_start = None

    def _drain(self) -> None:
        """Once per iteration while turns wait: release as many as the budget holds at their cost."""
        release = max(1, int(self.budget_s / self.cost_s))  # the average stays > 0: it starts there
        while self._queue and release:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(None)
                release -= 1
        if self._queue:
            asyncio.get_running_loop().call_soon(self._drain)
        else:
            self._draining = False
