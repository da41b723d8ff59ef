"""The sharded outbound transport: requests spread over pools, the total bounded, bodies released."""

from __future__ import annotations

import socket

import anyio
import httpx
import pytest
from fake_model import FakeModel, delay, tool_call

from task_app.http_pool import ShardedTransport

pytestmark = pytest.mark.anyio


def test_shards_split_the_connection_limit() -> None:
    transport = ShardedTransport(httpx.Limits(max_connections=512, max_keepalive_connections=512), per_shard=16)
    assert transport.shards == 32
    assert ShardedTransport(httpx.Limits(max_connections=10), per_shard=16).shards == 1
    assert ShardedTransport(httpx.Limits(max_connections=33), per_shard=16).shards == 3


async def test_requests_go_to_the_least_busy_shard_and_are_released(fake_model: FakeModel) -> None:
    model = fake_model
    model.default = delay(0.2, tool_call("noop"))
    transport = ShardedTransport(httpx.Limits(max_connections=8), per_shard=2)
    async with httpx.AsyncClient(transport=transport, timeout=10.0) as http:
        statuses: list[int] = []

        async def one() -> None:
            response = await http.post(model.url(), json={"messages": []})
            statuses.append(response.status_code)

        async with anyio.create_task_group() as group:
            for _ in range(8):
                group.start_soon(one)
            await anyio.sleep(0.1)
            assert transport._in_flight == [2, 2, 2, 2]  # every shard busy, none over its share
        assert statuses == [200] * 8
        assert transport._in_flight == [0, 0, 0, 0]  # each body closed -> its request left its shard
        async with http.stream("POST", model.url(), json={"messages": []}) as response:
            assert sum(transport._in_flight) == 1
            await response.aread()
        assert sum(transport._in_flight) == 0


async def test_a_failed_request_is_released() -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        transport = ShardedTransport(httpx.Limits(max_connections=4), per_shard=2)
        async with httpx.AsyncClient(transport=transport, timeout=2.0) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get(f"http://127.0.0.1:{port}/")
    assert transport._in_flight == [0, 0]
