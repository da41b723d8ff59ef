"""The outbound HTTP transport of the app's one `httpx.AsyncClient`: connection pools in shards.

httpcore's connection pool walks every connection of the pool twice per request (when it starts and
when its body is closed), checking each idle one with a socket poll, and counts idle connections once
per idle connection (quadratic). With a few connections that is nothing; with the 64-256 model calls
a busy task app keeps in flight it was 60 % of the server's CPU (benchmarks/, B3). So the connections
are split over shards of at most `per_shard` each, and each request goes to the shard with the fewest
requests in flight: the work per request stays constant, and `max_connections` still bounds the total.

    AsyncClient ──► ShardedTransport ──least busy──► AsyncHTTPTransport (its own pool) × N
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Callable

import httpx

DEFAULT_PER_SHARD = 16


class _CountedStream(httpx.AsyncByteStream):
    """A response body that tells its shard when it is closed (the request is then done)."""

    def __init__(self, stream: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()  # the shard's own iterator: no extra generator per chunk

    async def aclose(self) -> None:
        release, self._release = self._release, None
        try:
            await self._stream.aclose()
        finally:
            if release is not None:
                release()


class ShardedTransport(httpx.AsyncBaseTransport):
    """`httpx.AsyncHTTPTransport` semantics over `ceil(max_connections / per_shard)` pools."""

    def __init__(self, limits: httpx.Limits, *, per_shard: int = DEFAULT_PER_SHARD) -> None:
        total = limits.max_connections or per_shard
        count = max(1, math.ceil(total / per_shard))
        size = math.ceil(total / count)
        keepalive = limits.max_keepalive_connections
        shard_limits = httpx.Limits(
            max_connections=size,
            max_keepalive_connections=None if keepalive is None else math.ceil(keepalive / count),
            keepalive_expiry=limits.keepalive_expiry,
        )
        context = ssl.create_default_context()  # loading the CA bundle once, not once per shard
        self._shards = [httpx.AsyncHTTPTransport(verify=context, limits=shard_limits) for _ in range(count)]
        self._in_flight = [0] * count

    @property
    def shards(self) -> int:
        return len(self._shards)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        in_flight = self._in_flight
        index = in_flight.index(min(in_flight))
        in_flight[index] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                in_flight[index] -= 1

        try:
            response = await self._shards[index].handle_async_request(request)
        except BaseException:
            release()
            raise
        if not isinstance(response.stream, httpx.AsyncByteStream):  # pragma: no cover - httpx always streams
            release()
            return response
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CountedStream(response.stream, release),
            extensions=response.extensions,
        )

    async def __aenter__(self) -> ShardedTransport:
        for shard in self._shards:
            await shard.__aenter__()
        return self

    async def aclose(self) -> None:
        for shard in self._shards:
            await shard.aclose()
