"""Event-loop lag probe: how late the loop wakes a task that asked to sleep `interval` seconds.

Lag is the time the loop spent on other work (or blocked) beyond the requested sleep: a handler that
blocks shows up as that much lag, and every request in flight waits that long too. Enabled by
`TASKAPP_LOOP_LAG_PROBE_S` (the interval; 0 = off); `/health` then reports it under `event_loop`.

Two views, both bounded:
- `recent`: p50 / p99 / max over the last `RECENT_SAMPLES` samples;
- `buckets_ms`: cumulative counts per upper bound since start, like a Prometheus histogram, so a
  reader that polls twice can compute the lag distribution of exactly the window in between.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections import deque
from typing import Any

from ..core.stats import percentile

logger = logging.getLogger(__name__)

RECENT_SAMPLES = 1024  # sorted on every /health call: keep it cheap
# Upper bounds of the histogram buckets, in milliseconds (the last bucket is everything above).
BUCKETS_MS: tuple[float, ...] = (0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 200, 500, 1000, 5000)


class LoopLagProbe:
    """A task that sleeps `interval_s` in a loop and records how late each wake-up was."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._recent: deque[float] = deque(maxlen=RECENT_SAMPLES)  # milliseconds
        self._counts = [0] * (len(BUCKETS_MS) + 1)
        self._samples = 0
        self._max_ms = 0.0
        self._task: asyncio.Task[None] | None = None

    def record(self, lag_ms: float) -> None:
        lag_ms = max(0.0, lag_ms)
        self._recent.append(lag_ms)
        self._counts[bisect.bisect_left(BUCKETS_MS, lag_ms)] += 1
        self._samples += 1
        self._max_ms = max(self._max_ms, lag_ms)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            self.record((loop.time() - start - self.interval_s) * 1000)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag-probe")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def snapshot(self) -> dict[str, Any]:
        recent = sorted(self._recent)
        cumulative, buckets = 0, {}
        for bound, count in zip((*BUCKETS_MS, float("inf")), self._counts, strict=True):
            cumulative += count
            buckets["+Inf" if bound == float("inf") else f"{bound:g}"] = cumulative
        return {
            "interval_ms": round(self.interval_s * 1000, 3),
            "samples": self._samples,
            "max_ms": round(self._max_ms, 3),
            "recent": {
                "samples": len(recent),
                "p50_ms": round(percentile(recent, 50), 3) if recent else None,
                "p99_ms": round(percentile(recent, 99), 3) if recent else None,
                "max_ms": round(recent[-1], 3) if recent else None,
            },
            "buckets_ms": buckets,
        }
