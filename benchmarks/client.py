"""The trainer side of a benchmark: rollout requests and one pooled aiohttp session that sends them.

A benchmark rollout is `crafter-react` against the fake model, `ops = [agent, env] * decisions`,
`on_done = reset` (the default), the decision cap equal to `decisions`. The model name tells the
fake model how many actions to answer and how long to wait (`bench-a<actions>-l<ms>`).

The load generator is aiohttp, not httpx: with 256 rollouts in flight httpx's pool cost the client
0.07 cores (aiohttp: 0.005) and delayed the answers, which B3 then counted against the server (B3 at
256 x 1 s went from 89 % to 92 % of the ideal with the switch alone).
"""

from __future__ import annotations

import gzip as gzip_module
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import aiohttp
import anyio

from .processes import API_KEY

HEADERS = {"X-API-Key": API_KEY}
ROLLOUT_TIMEOUT_S = 600.0
_run_ids = itertools.count(1)


def model_name(actions: int = 1, latency_ms: int = 0) -> str:
    return f"bench-a{actions}-l{latency_ms}"


def rollout_body(
    model_url: str,
    seed: int,
    decisions: int,
    *,
    actions: int = 1,
    latency_ms: int = 0,
    trace_format: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """A /rollout request; `trace_format=None` asks for no trace in the response (tracing to storage
    does not depend on it)."""
    return {
        "run_id": run_id or f"bench-{seed}-{next(_run_ids)}-{time.monotonic_ns()}",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": seed, "config": {}},
        "policy": {
            "policy_name": "crafter-react",
            "config": {
                "inference_url": model_url + "/v1/chat/completions",
                "model": model_name(actions, latency_ms),
                "max_llm_calls": decisions,
            },
        },
        "ops": ["agent", "env"] * decisions,
        "record": {"return_trace": trace_format is not None, "trace_format": trace_format or "compact"},
    }


def client(concurrency: int = 16, *, gzip: bool = False) -> aiohttp.ClientSession:
    """A pooled session; bodies are read as sent (`auto_decompress=False`) so B5 can count wire bytes."""
    headers = {**HEADERS, "Accept-Encoding": "gzip" if gzip else "identity"}
    return aiohttp.ClientSession(
        headers=headers,
        connector=aiohttp.TCPConnector(limit=concurrency + 8),
        timeout=aiohttp.ClientTimeout(total=ROLLOUT_TIMEOUT_S, connect=30.0),
        auto_decompress=False,
        trust_env=False,
    )


@dataclass(slots=True)
class Outcome:
    """One finished rollout as the trainer saw it."""

    wall_s: float
    decisions: int
    status: int
    wire_bytes: int  # response body bytes as sent (compressed when gzip was negotiated)
    body_bytes: int  # decoded body bytes
    stop_reason: str | None


async def post_rollout(http: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> Outcome:
    started = time.perf_counter()
    async with http.post(base_url + "/rollout", json=body) as response:
        wire = await response.read()
        wall = time.perf_counter() - started
        encoding = response.headers.get("Content-Encoding", "identity")
    content = gzip_module.decompress(wire) if encoding == "gzip" else wire
    if response.status != HTTPStatus.OK:
        raise RuntimeError(f"rollout failed: HTTP {response.status}: {content[:500]!r}")
    data = json.loads(content)
    details = data["metrics"]["details"]
    return Outcome(
        wall, int(data["metrics"]["num_steps"]), response.status, len(wire), len(content), details.get("stop_reason")
    )


async def run_all(base_url: str, bodies: Sequence[dict[str, Any]], concurrency: int) -> tuple[list[Outcome], float]:
    """Send every body, at most `concurrency` at once; the outcomes in order, and the total wall time."""
    outcomes: list[Outcome | None] = [None] * len(bodies)
    limiter = anyio.CapacityLimiter(concurrency)
    async with client(concurrency) as http:

        async def one(index: int) -> None:
            async with limiter:
                outcomes[index] = await post_rollout(http, base_url, bodies[index])

        started = time.perf_counter()
        async with anyio.create_task_group() as group:
            for index in range(len(bodies)):
                group.start_soon(one, index)
        wall = time.perf_counter() - started
    return [outcome for outcome in outcomes if outcome is not None], wall


def run_sync(base_url: str, bodies: Sequence[dict[str, Any]], concurrency: int = 1) -> tuple[list[Outcome], float]:
    return anyio.run(run_all, base_url, bodies, concurrency)


async def get_json(http: aiohttp.ClientSession, url: str, params: Any = None) -> Any:
    async with http.get(url, params=params) as response:
        wire = await response.read()
        if response.status != HTTPStatus.OK:
            raise RuntimeError(f"GET {url}: HTTP {response.status}")
        encoding = response.headers.get("Content-Encoding", "identity")
    return json.loads(gzip_module.decompress(wire) if encoding == "gzip" else wire)
