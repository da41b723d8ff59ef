"""B4 memory: the server process's resident memory (VmRSS) at idle, per rollout in flight, and over time.

    idle        RSS of a freshly started server after one warm-up rollout (imports, numba, caches)
    in flight   N rollouts of D decisions start together against a slow model on a *fresh* server
                (Python rarely returns freed memory, so a second batch on the same process would reuse
                the first batch's and look free); RSS sampled every 20 ms, (peak - baseline) / N. The
                SQLite page cache (a 64 MB cap, filled by the commits) is held at 2 MB here: a bounded
                cache, not memory a rollout in flight needs
    1000 runs   1000 sequential 5-decision rollouts over 32 seeds on a server whose caches are small
                (16 worlds, 16 traits, 16 completed runs kept for replay, 2 MB of SQLite page cache), so
                they are full after the first few dozen rollouts: RSS growth from rollout 200 to the end
                is what a leak would add

Baselines are taken after the worlds the window uses are generated (B2 measures that).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio

from .client import client, post_rollout, rollout_body
from .processes import Served, app_server, fake_model
from .report import Figure

BENCH = "B4"
MB = 1024 * 1024
SAMPLE_S = 0.02
SMALL_CACHES = {"world_cache_size": 16, "traits_cache_size": 16, "run_registry_size": 16, "traces_cache_mb": 2}
SEQUENTIAL_SEEDS = 32
SEQUENTIAL_DECISIONS = 5


class _Sampler:
    """Samples a process's RSS in a background thread; `peak` is the largest seen."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.peak = served.rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak = max(self.peak, self.served.rss_bytes())

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


async def _prepare(app: Served, model_url: str, seeds: list[int]) -> None:
    async with client(4) as http:
        for start in range(0, len(seeds), 64):
            response = await http.get(app.url + "/task_info", params=[("seed", s) for s in seeds[start : start + 64]])
            response.raise_for_status()
        for seed in seeds[:4]:
            await post_rollout(http, app.url, rollout_body(model_url, seed, 3))


def _in_flight(model_url: str, concurrency: int, decisions: int, latency_ms: int) -> tuple[float, float]:
    """(idle RSS MB, MB per in-flight rollout) on a fresh server."""
    seeds = [4_000_000 + index for index in range(concurrency // 4)]
    bodies = [
        rollout_body(model_url, seeds[index % len(seeds)], decisions, latency_ms=latency_ms)
        for index in range(concurrency)
    ]
    with app_server(traces_cache_mb=SMALL_CACHES["traces_cache_mb"]) as app:
        anyio.run(_prepare, app, model_url, seeds)
        time.sleep(0.5)
        baseline = app.rss_bytes()

        async def run() -> None:
            async with client(concurrency + 4) as http, anyio.create_task_group() as group:
                for body in bodies:
                    group.start_soon(post_rollout, http, app.url, body)

        with _Sampler(app) as sampler:
            anyio.run(run)
    return baseline / MB, (sampler.peak - baseline) / MB / concurrency


def _sequential(model_url: str, rollouts: int) -> dict[str, Any]:
    seeds = [5_000_000 + index for index in range(SEQUENTIAL_SEEDS)]
    checkpoints: dict[int, float] = {}
    with app_server(**SMALL_CACHES) as app:

        async def run() -> None:
            async with client(2) as http:
                for index in range(rollouts):
                    body = rollout_body(model_url, seeds[index % len(seeds)], SEQUENTIAL_DECISIONS)
                    await post_rollout(http, app.url, body)
                    if (index + 1) % 100 == 0:
                        checkpoints[index + 1] = app.rss_bytes() / MB

        anyio.run(run)
    return checkpoints


def run(repetitions: int, quick: bool) -> list[Figure]:
    concurrency, decisions, latency_ms = (64, 30, 100) if quick else (128, 50, 100)
    rollouts = 300 if quick else 1000
    start = 100 if quick else 200  # the small caches are full long before this
    idle = Figure(BENCH, "rss_idle_mb", "RSS at idle (started, one rollout done)", "MB", digits=1)
    per = Figure(
        BENCH,
        "rss_per_inflight_mb",
        f"RSS per in-flight rollout ({concurrency} x {decisions} decisions)",
        "MB",
        target=("<=", 2.0),
        digits=3,
    )
    after = Figure(BENCH, f"rss_after_{rollouts}_mb", f"RSS after {rollouts} sequential rollouts", "MB", digits=1)
    growth = Figure(BENCH, "rss_growth_mb", f"RSS growth, rollout {start} -> {rollouts} (small caches)", "MB", digits=1)
    with fake_model() as model:
        for _ in range(repetitions):
            idle_mb, per_mb = _in_flight(model.url, concurrency, decisions, latency_ms)
            idle.values.append(idle_mb)
            per.values.append(per_mb)
        for _ in range(1 if quick else min(repetitions, 3)):
            marks = _sequential(model.url, rollouts)
            after.values.append(marks[rollouts])
            growth.values.append(marks[rollouts] - marks[start])
    return [idle, per, after, growth]
