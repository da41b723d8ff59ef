"""Post rollouts from a process of its own with plain aiohttp, as a trainer's script would (B8).

    python -m benchmarks.rollout_driver APP_URL MODEL_URL --first-seed S --rollouts N --decisions D --latency-ms L

Every rollout is sent at once on one session whose pool holds them all; prints one JSON line: the
wall time from the go to the last answer, each rollout's wall time and decisions, failures, and
this process's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

from .client import HEADERS, ROLLOUT_TIMEOUT_S, rollout_body
from .driver import wait_for_go


async def _drive(app_url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    walls: list[float] = []
    decisions, failures = 0, []
    connector = aiohttp.TCPConnector(limit=len(bodies))
    timeout = aiohttp.ClientTimeout(total=ROLLOUT_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=HEADERS, connector=connector, timeout=timeout) as http:

        async def one(body: dict[str, Any]) -> None:
            nonlocal decisions
            started = time.perf_counter()
            try:
                async with http.post(app_url + "/rollout", json=body) as response:
                    data = await response.json()
                    if response.status != 200:
                        failures.append(f"HTTP {response.status}: {str(data)[:300]}")
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures.append(repr(exc))
                return
            walls.append(time.perf_counter() - started)
            decisions += int(data["metrics"]["num_steps"])

        await asyncio.to_thread(wait_for_go)
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(body) for body in bodies))
        wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu,
        "rollout_s": walls,
        "decisions": decisions,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("app_url")
    parser.add_argument("model_url")
    parser.add_argument("--first-seed", type=int, required=True)
    parser.add_argument("--rollouts", type=int, required=True)
    parser.add_argument("--decisions", type=int, required=True)
    parser.add_argument("--latency-ms", type=int, required=True)
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.rollouts)
    bodies = [rollout_body(args.model_url, seed, args.decisions, latency_ms=args.latency_ms) for seed in seeds]
    print(json.dumps(asyncio.run(_drive(args.app_url, bodies))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
