"""Where a B3 rollout's wall time goes: its start, its decisions, its end.

    python -m benchmarks.timeline [--concurrency 64] [--decisions 20] [--latency-ms 200] [--windows 3]

Starts the app and a fake model (as B3 does), runs a warm-up window, then `--windows` windows of N
concurrent rollouts on seeds never seen before, and splits each rollout's time with the stored
trace's step timestamps against the client's clock (one host, one clock):

    start    first request sent (the window's first) -> the rollout's first model call
    run      its first model call -> its last step done (ideal: decisions x latency)
    end      its last step done -> its response read by the client (trace commit, encoding, HTTP)

Printed per window with the share of the ideal throughput, as B3 computes it. A probe for looking
into B3's gap, not a target: its figures are not in the full run.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from .client import client, rollout_body
from .processes import Served, app_server, fake_model


async def _window(
    app: Served, model: Served, seeds: range, decisions: int, latency_ms: int
) -> tuple[dict[str, tuple[float, float]], float]:
    """Each rollout's (sent, answered) wall-clock times by run_id, and the window's wall time."""
    bodies = [rollout_body(model.url, seed, decisions, latency_ms=latency_ms) for seed in seeds]
    times: dict[str, tuple[float, float]] = {}
    async with client(len(bodies) + 4) as http:

        async def one(body: dict[str, Any]) -> None:
            sent = time.time()
            async with http.post(app.url + "/rollout", json=body) as response:
                await response.read()
                if response.status != 200:
                    raise aiohttp.ClientError(f"rollout answered HTTP {response.status}")
            times[body["run_id"]] = (sent, time.time())

        started = time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        return times, time.perf_counter() - started


def _steps(db: Path, run_ids: set[str]) -> dict[str, list[tuple[float, float]]]:
    """Each rollout's (started, completed) step times, in order."""
    steps: dict[str, list[tuple[float, float]]] = {}
    with sqlite3.connect(db) as conn:
        query = "SELECT session_id, started_at, completed_at FROM session_timesteps ORDER BY session_id, step_index"
        for session_id, started, completed in conn.execute(query):
            if session_id in run_ids:
                steps.setdefault(session_id, []).append(
                    (datetime.fromisoformat(started).timestamp(), datetime.fromisoformat(completed).timestamp())
                )
    return steps


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f} s, min {min(values):.3f}, max {max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="split B3 rollouts' wall time into start, run and end")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--decisions", type=int, default=20)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--windows", type=int, default=3)
    args = parser.parse_args(argv)
    n, decisions, latency_ms = args.concurrency, args.decisions, args.latency_ms
    ideal = n / (latency_ms / 1000)
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as directory:
        db = Path(directory) / "traces.db"
        with fake_model(latency_ms / 1000) as model, app_server(traces_dir=Path(directory)) as app:
            asyncio.run(_window(app, model, range(40_000_000, 40_000_000 + n), decisions, latency_ms))  # warm-up
            for index in range(args.windows):
                first = 41_000_000 + index * n
                times, wall = asyncio.run(_window(app, model, range(first, first + n), decisions, latency_ms))
                steps = _steps(db, set(times))  # committed before each answer
                origin = min(sent for sent, _ in times.values())
                starts = [steps[run][0][0] - origin for run in times]
                runs = [steps[run][-1][1] - steps[run][0][0] for run in times]
                ends = [answered - steps[run][-1][1] for run, (_, answered) in times.items()]
                print(f"window {index}: share of the ideal {n * decisions / wall / ideal:.3f} (wall {wall:.2f} s)")
                print(f"  start: {_spread(starts)}")
                print(f"  run:   {_spread(runs)} (ideal {decisions * latency_ms / 1000:g} s)")
                print(f"  end:   {_spread(ends)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
