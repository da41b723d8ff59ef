"""Env sessions as a trainer runs them, through the client library, from a process of its own (B10).

    python -m benchmarks.session_driver APP_URL --first-seed S --sessions N --steps K --think-s T

N sessions start together, each on a new seed: `client.env(seed)`, then K times a think time of T
seconds (the model's turn) and one `step`, then `terminate` (`async with`). One `AsyncClient` with
its default pool, and no retries (`RetryPolicy.never()`), so every 429 the server answers is counted.
Prints one JSON line: the wall time from the go to the last session's end, steps, calls, the
sessions' stepping time (from each create's answer to its last step, summed), each step's latency,
the errors by kind, and this process's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from typing import Any

import httpx
from task_app_client import APIStatusError, AsyncClient, RetryPolicy, TaskAppClientError
from task_app_client._client import DEFAULT_LIMITS

from .driver import wait_for_go
from .processes import API_KEY

ACTIONS = ("noop", "move_left")


async def _drive(app_url: str, seeds: range, steps: int, think_s: float, pool: int | None) -> dict[str, Any]:
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    done = calls = 0
    stepping = 0.0  # summed over sessions: from the create's answer to the session's end
    limits = DEFAULT_LIMITS if pool is None else httpx.Limits(max_connections=pool, max_keepalive_connections=pool)
    async with AsyncClient(app_url, API_KEY, retry=RetryPolicy.never(), limits=limits) as client:

        async def session(seed: int) -> None:
            nonlocal done, calls, stepping
            try:
                async with client.env(seed) as env:
                    opened = time.perf_counter()
                    calls += 2  # the create and the terminate
                    for index in range(steps):
                        await asyncio.sleep(think_s)
                        started = time.perf_counter()
                        result = await env.step(ACTIONS[index % 2])
                        latencies.append(time.perf_counter() - started)
                        done += 1
                        calls += 1
                        if result.done:
                            await env.reset()
                            calls += 1
                    stepping += time.perf_counter() - opened
            except APIStatusError as exc:
                errors[f"HTTP {exc.status} {exc.code}"] += 1
            except TaskAppClientError as exc:
                errors[type(exc).__name__] += 1
                if sum(errors.values()) == 1:
                    print(f"session {seed}: {exc!r}", file=sys.stderr)

        await asyncio.to_thread(wait_for_go)
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(session(seed) for seed in seeds))
        wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "steps": done,
        "calls": calls,
        "stepping_s": stepping,
        "step_s": latencies,
        "errors": dict(errors),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("app_url")
    parser.add_argument("--first-seed", type=int, required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--think-s", type=float, required=True)
    parser.add_argument("--pool", type=int, default=None, help="the client's connections (default: its own)")
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.sessions)
    print(json.dumps(asyncio.run(_drive(args.app_url, seeds, args.steps, args.think_s, args.pool))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
