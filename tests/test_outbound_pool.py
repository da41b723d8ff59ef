"""The pool of connections to model servers follows the rollout cap (TASKAPP_MAX_CONCURRENT_ROLLOUTS)
unless TASKAPP_INFERENCE_MAX_CONNECTIONS is set, and `/health` and the startup log say when a setting
makes it smaller than the cap. (A fixed pool of 512 held 1,024 rollouts of a slow model to two waves of
model calls: the issue that asked for this.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from fake_model import Exchange, FakeModel, tool_call

from task_app.core.outbound import open_session
from task_app.core.settings import Settings
from task_app.policy.inference import InferenceClient, InferenceLimits, resolve_target

CALLS = 600  # more than the 512 connections the pool had whatever the cap
WAVE_TIMEOUT_S = 20.0


class Wave:
    """A model server that answers nobody until `size` calls wait at once (then all): how many calls
    can be in flight together, whatever the machine's load."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.waiting = 0
        self.most = 0
        self._full: asyncio.Event | None = None  # made in the server's own loop

    async def __call__(self, exchange: Exchange) -> None:
        if self._full is None:
            self._full = asyncio.Event()
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= self.size:
            self._full.set()
        with anyio.move_on_after(WAVE_TIMEOUT_S):
            await self._full.wait()
        self.waiting -= 1
        await tool_call("noop")(exchange)


def test_the_pool_is_twice_the_cap_unless_set() -> None:
    assert Settings(max_concurrent_rollouts=2048).outbound_max_connections == 4096
    assert Settings().outbound_max_connections == 2 * Settings().max_concurrent_rollouts
    explicit = Settings(max_concurrent_rollouts=2048, inference_max_connections=100)
    assert explicit.outbound_max_connections == 100


@pytest.mark.e2e
@pytest.mark.anyio
async def test_model_calls_up_to_the_raised_cap_are_in_flight_at_once(fake_model: FakeModel) -> None:
    wave = Wave(CALLS)
    fake_model.default = wave
    settings = Settings(max_concurrent_rollouts=CALLS, inference_connect_timeout_s=WAVE_TIMEOUT_S)
    target = resolve_target(inference_url=fake_model.url(), provider=None, api_key=None, settings=settings)
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "Step 1/10"}]}
    results: list[Any] = []
    async with open_session(settings.outbound_max_connections) as http:
        client = InferenceClient(http, InferenceLimits.from_settings(settings))
        started = anyio.current_time()

        async def call() -> None:
            results.append(await client.chat(target, body, deadline=None))

        async with anyio.create_task_group() as calls:
            for _ in range(CALLS):
                calls.start_soon(call)
        took = anyio.current_time() - started
    assert wave.most == CALLS  # one wave: every call held a connection at once
    assert took < WAVE_TIMEOUT_S
    assert [result.attempts for result in results] == [1] * CALLS


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("overrides", "max_connections", "warned"),
    [({}, 128, False), ({"inference_max_connections": 16}, 16, True), ({"inference_max_connections": 64}, 64, False)],
    ids=["default", "smaller", "equal"],
)
def test_health_and_the_startup_log_report_the_pool(
    make_app_server: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
    overrides: dict[str, Any],
    max_connections: int,
    warned: bool,
) -> None:
    with caplog.at_level(logging.INFO, logger="task_app.core.outbound"):
        server = make_app_server(max_concurrent_rollouts=64, warm_up=False, **overrides)
        outbound = server.health()["outbound"]
    assert outbound["max_connections"] == max_connections and outbound["open"] >= outbound["idle"] >= 0
    lines = [record for record in caplog.records if record.name == "task_app.core.outbound"]
    assert len(lines) == 1
    if warned:
        assert (
            "TASKAPP_INFERENCE_MAX_CONNECTIONS (16) is below TASKAPP_MAX_CONCURRENT_ROLLOUTS (64)"
            in (outbound["warning"])
        )
        assert lines[0].levelno == logging.WARNING and outbound["warning"] in lines[0].getMessage()
    else:
        assert "warning" not in outbound and lines[0].levelno == logging.INFO
