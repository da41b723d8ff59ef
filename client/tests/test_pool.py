"""The async client's connections at a trainer's fan-out: calls beyond its connections wait for one (until
their deadline, not failing), connections are kept and reused, and no httpx pool holds more than a shard."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from stub_server import Reply, StubServer

from task_app_client import APITimeoutError, AsyncClient, RetryPolicy, RunStatus
from task_app_client._pool import SHARD_CONNECTIONS, ShardedPool

KEY = "client-pool-test-key"

pytestmark = pytest.mark.e2e

RUNNING = {"run_id": "r1", "status": "running"}


def test_calls_beyond_the_connections_wait_for_one_and_all_succeed() -> None:
    connections, calls = 40, 200
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)

    async def main(base_url: str) -> list[RunStatus]:
        async with AsyncClient(base_url, KEY, retry=RetryPolicy.never(), limits=limits, timeout=30.0) as client:
            return await asyncio.gather(*(client.status("r1") for _ in range(calls)))

    with StubServer(Reply(200, RUNNING, delay_s=0.02)) as stub:
        statuses = asyncio.run(main(stub.base_url))
        assert [status.status for status in statuses] == ["running"] * calls
        assert stub.peak_connections <= connections
        assert stub.connections <= connections  # each kept for the next call, none opened twice over


def test_a_call_waits_for_a_connection_until_its_deadline_only() -> None:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

    async def main(base_url: str) -> float:
        async with AsyncClient(base_url, KEY, retry=RetryPolicy.never(), limits=limits, timeout=30.0) as client:
            holder = asyncio.create_task(client.status("r1"))
            await asyncio.sleep(0.2)  # the one connection is taken
            started = time.monotonic()
            with pytest.raises(APITimeoutError, match="PoolTimeout"):
                await client.status("r1", timeout=0.5)
            waited = time.monotonic() - started
            holder.cancel()
            return waited

    with StubServer(Reply(200, RUNNING, stall=True)) as stub:
        waited = asyncio.run(main(stub.base_url))
    assert 0.5 <= waited < 0.5 + 1.0
    assert len(stub.arrivals) == 1  # the second call was never sent


@pytest.mark.parametrize(("connections", "shards"), [(1, 1), (SHARD_CONNECTIONS, 1), (1024, 1024 // SHARD_CONNECTIONS)])
def test_no_httpx_pool_holds_more_than_a_shard(connections: int, shards: int) -> None:
    async def main() -> None:
        pool = ShardedPool("http://127.0.0.1:9", {}, httpx.Limits(max_connections=connections))
        try:
            assert len(pool._shards) == shards
            sizes = [shard._transport._pool._max_connections for shard in pool._shards]  # type: ignore[attr-defined]
            assert max(sizes) <= SHARD_CONNECTIONS and sum(sizes) == connections
        finally:
            await pool.aclose()

    asyncio.run(main())
