"""Retries, backoff, jitter and deadlines against a loopback stub server that answers 429 and 503 with
Retry-After, drops connections and stalls; every test runs the sync and the async client.

Lower bounds on waits are exact (a client never comes back sooner than it should); upper bounds
allow `SLACK_S` for a loaded machine.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import KEY
from stub_server import Reply, StubServer, app_error

from task_app_client import (
    APIConnectionError,
    APIResponseValidationError,
    APITimeoutError,
    AsyncClient,
    Client,
    RateLimitError,
    RetryPolicy,
    RunNotFinished,
    ServiceUnavailableError,
    StepResult,
    Timeout,
)

pytestmark = pytest.mark.e2e

SLACK_S = 1.0
ENV = {"env_id": "e1", "observation": {"text": "Step 0/10000"}, "info": {"seed": 1}, "step_idx": 0}
STEP = {"observation": {"text": "Step 1/10000"}, "done": False, "reward": 0.0, "info": {"actions": ["noop"]}}
RESULT = {"run_id": "r1", "trajectories": [], "metrics": {"num_steps": 1}}
RUNNING = {"run_id": "r1", "status": "running"}
QUICK = RetryPolicy(attempts=5, backoff=0.05, max_backoff=0.2, jitter=0.25)

Run = Callable[..., Any]


@pytest.fixture(params=["sync", "async"])
def run(request: pytest.FixtureRequest) -> Run:
    """`run(base_url, operation, **client_options)`: the operation (`lambda client: client.info()`) on a
    fresh `Client` or `AsyncClient` (whose coroutine it awaits)."""

    def runner(base_url: str, operation: Callable[[Any], Any], **options: Any) -> Any:
        if request.param == "sync":
            with Client(base_url, KEY, **options) as client:
                return operation(client)

        async def main() -> Any:
            async with AsyncClient(base_url, KEY, **options) as client:
                return await operation(client)

        return asyncio.run(main())

    return runner


def step_once(client: Client | AsyncClient) -> Any:
    """Create an env on the stub and step it once (a non-idempotent call)."""
    if isinstance(client, Client):
        return client.env(seed=1).step("noop")

    async def steps() -> StepResult:
        env = await client.env(seed=1)
        return await env.step("noop")

    return steps()


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with StubServer() as server:
        yield server


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.monotonic()
    return call(), time.monotonic() - started


def test_429_is_retried_after_retry_after_with_bounded_jitter(
    stub: StubServer, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    stub.script(Reply(429, app_error("capacity_exceeded", True), {"Retry-After": "1"}), Reply(200, {"limits": {}}))
    retry = RetryPolicy(backoff=0.05, jitter=0.25)
    with caplog.at_level(logging.INFO, logger="task_app_client"):
        info = run(stub.base_url, lambda client: client.info(), retry=retry)
    (logged,) = [record for record in caplog.records if record.name == "task_app_client"]
    assert "GET /info failed (429 capacity_exceeded" in logged.getMessage() and KEY not in caplog.text
    assert info.limits == {}
    assert [path for _, _, path in stub.arrivals] == ["/info", "/info"]
    (gap,) = stub.gaps()
    assert 1.0 <= gap <= 1.25 + SLACK_S


def test_an_idempotent_call_is_retried_after_a_proxys_503(stub: StubServer, run: Run) -> None:
    stub.script(Reply(503, b"<html>no healthy upstream</html>"), Reply(200, {}))
    run(stub.base_url, lambda client: client.info(), retry=QUICK)
    assert len(stub.arrivals) == 2


def test_a_503_the_server_calls_final_is_not_retried(stub: StubServer, run: Run) -> None:
    stub.default = Reply(503, app_error("not_configured", False))
    with pytest.raises(ServiceUnavailableError) as caught:
        run(stub.base_url, lambda client: client.info(), retry=QUICK)
    assert (caught.value.code, caught.value.retryable, caught.value.status) == ("not_configured", False, 503)
    assert len(stub.arrivals) == 1


def test_a_step_is_not_retried_without_the_servers_word(stub: StubServer, run: Run) -> None:
    stub.script(Reply(200, ENV), Reply(503, b"upstream connect error"))
    with pytest.raises(ServiceUnavailableError) as caught:
        run(stub.base_url, step_once, retry=QUICK)
    assert caught.value.retryable is None
    assert [path for _, _, path in stub.arrivals] == ["/create", "/step"]


def test_a_step_is_retried_when_the_server_says_retryable(stub: StubServer, run: Run) -> None:
    stub.script(
        Reply(429, app_error("too_many_live_envs", True), {"Retry-After": "0"}),  # on /create
        Reply(200, ENV),
        Reply(429, app_error("env_rate_limited", True), {"Retry-After": "0"}),
        Reply(200, STEP),
    )
    step = run(stub.base_url, step_once, retry=QUICK)
    assert step.info.actions == ["noop"]
    assert [path for _, _, path in stub.arrivals] == ["/create", "/create", "/step", "/step"]


def test_attempts_bound_the_retries(stub: StubServer, run: Run) -> None:
    stub.default = Reply(429, app_error("capacity_exceeded", True), {"Retry-After": "0"})
    with pytest.raises(RateLimitError) as caught:
        run(stub.base_url, lambda client: client.info(), retry=RetryPolicy(attempts=3, backoff=0.01))
    assert caught.value.code == "capacity_exceeded" and caught.value.retry_after == 0.0
    assert len(stub.arrivals) == 3


def test_backoff_doubles_within_its_jitter(stub: StubServer, run: Run) -> None:
    stub.default = Reply(503, app_error("state_store_unavailable", True))
    retry = RetryPolicy(attempts=4, backoff=0.2, max_backoff=10.0, jitter=0.5)
    with pytest.raises(ServiceUnavailableError):
        run(stub.base_url, lambda client: client.info(), retry=retry)
    gaps = stub.gaps()
    assert len(gaps) == 3
    for retry_index, gap in enumerate(gaps):
        base = 0.2 * 2**retry_index
        assert base <= gap <= base * 1.5 + SLACK_S, (retry_index, gaps)


def test_a_wait_past_the_deadline_is_not_taken(stub: StubServer, run: Run) -> None:
    """The server asks for 30 s, the call has 2: the 429 is raised at once rather than slept on."""
    stub.default = Reply(429, app_error("too_many_envs", True), {"Retry-After": "30"})
    with pytest.raises(RateLimitError) as caught:
        _, elapsed = timed(lambda: run(stub.base_url, lambda client: client.info(), timeout=2.0))
    assert caught.value.retry_after == 30.0
    assert len(stub.arrivals) == 1


def test_a_stalled_server_times_out_at_the_calls_deadline(stub: StubServer, run: Run) -> None:
    stub.default = Reply(stall=True)
    started = time.monotonic()
    with pytest.raises(APITimeoutError) as caught:
        run(stub.base_url, lambda client: client.info(), timeout=Timeout(connect=1.0, total=1.5), retry=QUICK)
    elapsed = time.monotonic() - started
    assert isinstance(caught.value, TimeoutError)  # the builtin, for callers that catch that
    assert 1.5 <= elapsed <= 1.5 + SLACK_S
    assert len(stub.arrivals) == 1  # no time was left for another attempt


def test_per_call_timeout_overrides_the_clients(stub: StubServer, run: Run) -> None:
    stub.script(Reply(200, ENV), Reply(stall=True))
    started = time.monotonic()
    with pytest.raises(APITimeoutError):
        run(stub.base_url, lambda client: _step_with_timeout(client, 0.5), timeout=30.0)
    assert time.monotonic() - started <= 0.5 + SLACK_S


def _step_with_timeout(client: Client | AsyncClient, seconds: float) -> Any:
    if isinstance(client, Client):
        return client.env(seed=1).step("noop", timeout=seconds)

    async def steps() -> StepResult:
        return await (await client.env(seed=1)).step("noop", timeout=seconds)

    return steps()


def test_a_dropped_rollout_is_sent_again_a_dropped_step_is_not(stub: StubServer, run: Run) -> None:
    """/rollout is keyed by run_id (a repeat gets the first run's answer); a step may have run."""
    stub.script(Reply(drop=True), Reply(200, RESULT))
    result = run(stub.base_url, lambda client: client.rollout({"run_id": "r1"}), retry=QUICK)
    assert result.run_id == "r1" and len(stub.arrivals) == 2

    stub.arrivals.clear()
    stub.script(Reply(200, ENV), Reply(drop=True))
    with pytest.raises(APIConnectionError) as caught:
        run(stub.base_url, step_once, retry=QUICK)
    assert not isinstance(caught.value, APITimeoutError)
    assert [path for _, _, path in stub.arrivals] == ["/create", "/step"]


def test_a_refused_connection_is_retried_then_reported(run: Run) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    retry = RetryPolicy(attempts=3, backoff=0.2, jitter=0.0)
    started = time.monotonic()
    with pytest.raises(APIConnectionError) as caught:
        run(url, lambda client: client.env(seed=1), retry=retry)  # not idempotent, but never sent
    assert "ConnectError" in str(caught.value)
    assert time.monotonic() - started >= 0.2 + 0.4


def test_result_polls_as_the_202s_retry_after_says(stub: StubServer, run: Run) -> None:
    stub.script(Reply(202, RUNNING, {"Retry-After": "1"}), Reply(200, RESULT))
    result = run(stub.base_url, lambda client: client.result("r1"))
    assert result.metrics.num_steps == 1
    assert [path for _, _, path in stub.arrivals] == ["/runs/r1/result"] * 2
    (gap,) = stub.gaps()
    assert 1.0 <= gap <= 1.0 + SLACK_S


def test_result_gives_up_at_its_deadline_with_the_runs_status(stub: StubServer, run: Run) -> None:
    stub.default = Reply(202, RUNNING, {"Retry-After": "1"})
    with pytest.raises(RunNotFinished) as caught:
        run(stub.base_url, lambda client: client.result("r1", timeout=2.5))
    assert caught.value.run.status == "running"
    assert 2 <= len(stub.arrivals) <= 3


def test_a_success_that_is_not_json_is_reported(stub: StubServer, run: Run) -> None:
    stub.default = Reply(200, b"<html>captive portal</html>")
    with pytest.raises(APIResponseValidationError, match="not JSON"):
        run(stub.base_url, lambda client: client.info())
    stub.default = Reply(200, {"observation": {"text": "Step 0/10000"}})
    with pytest.raises(APIResponseValidationError, match="env_id"):
        run(stub.base_url, lambda client: client.env(seed=1))
