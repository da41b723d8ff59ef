"""The async client's connections: a few small httpx pools ("shards") behind one gate.

httpcore's pool walks all its connections on every request and every release, and every waiting
request on top when requests queue for a connection, so one pool sized for a trainer's fan-out (a
thousand sessions in flight) costs tens of milliseconds of CPU a call. Here no httpx pool holds more
than `SHARD_CONNECTIONS` connections and none ever queues: a call first waits at the gate (an asyncio
semaphore of `max_connections` slots, first come first served, nothing done per waiter), then sends
on the shard with the fewest calls in flight. Waiting at the gate is bounded by the attempt's pool
timeout (the call's remaining time), and running out of it is httpx's own `PoolTimeout`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import httpx

from ._flow import Send

SHARD_CONNECTIONS = 8  # connections per httpx pool: its per-request walk stays short (docs/decisions/client-pool.md)


class ShardedPool:
    """Sends a flow's `Send` step over `ceil(max_connections / SHARD_CONNECTIONS)`
    clients. With a `transport` (which owns its connections) or no connection limit: one client."""

    def __init__(
        self,
        base_url: str,
        headers: Mapping[str, str],
        limits: httpx.Limits,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        total = limits.max_connections
        count = 1 if total is None or transport is not None else math.ceil(total / SHARD_CONNECTIONS)
        keepalive = limits.max_keepalive_connections
        shard_limits = httpx.Limits(
            max_connections=None if total is None else math.ceil(total / count),
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / count),
            keepalive_expiry=limits.keepalive_expiry,
        )
        verify = httpx.create_ssl_context()  # one for all: each of its own costs milliseconds to build
        self._shards = [
            httpx.AsyncClient(
                base_url=base_url, headers=headers, transport=transport, limits=shard_limits, verify=verify
            )
            for _ in range(count)
        ]
        self._in_flight = [0] * count
        self._gate = asyncio.Semaphore(total) if total is not None else None

    async def send(self, step: Send) -> httpx.Response:
        """The step's call on a free connection; waiting for one ends with the step's pool timeout."""
        if self._gate is None:
            return await self._on_a_shard(step)
        try:
            async with asyncio.timeout(step.timeout.pool):
                await self._gate.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout(f"no free connection within {step.timeout.pool:g} s") from None
        try:
            return await self._on_a_shard(step)
        finally:
            self._gate.release()

    async def _on_a_shard(self, step: Send) -> httpx.Response:
        index = self._in_flight.index(min(self._in_flight))
        self._in_flight[index] += 1
        call = step.call
        try:
            return await self._shards[index].request(
                call.method, call.path, json=call.json, params=call.params, timeout=step.timeout
            )
        finally:
            self._in_flight[index] -= 1

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
