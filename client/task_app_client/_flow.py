"""The client's logic without I/O: retries, deadlines and polling, written once for both clients.

A flow is a generator that yields what to do next and is sent back what came of it:

    Send(call, timeout)  ─► the client sends the request; sends the flow the response, or throws the
                             httpx.TransportError in
    Sleep(seconds)       ─► the client sleeps (time.sleep or asyncio.sleep); sends None

and returns the call's result (or raises the error). `Client` and `AsyncClient` each hold one short
loop that runs flows (`_run`); everything else (what to retry, how long to wait, when to give up,
how to poll a run) is here, so the two clients cannot drift apart.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from . import _calls as calls
from ._calls import Call, Pending
from ._config import Config, RetryPolicy, Timeout
from ._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    RunNotFinished,
    TaskAppClientError,
    error_from_response,
)
from ._results import RolloutResult, RunStatus

T = TypeVar("T")
logger = logging.getLogger("task_app_client")

RETRY_STATUSES = frozenset({429, 503})
# The request never left: no connection was made (or none was free in the pool), so even a call
# that must not run twice can be sent again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
POLL_S = 1.0  # between polls of a run's result when the server sends no Retry-After


@dataclass(frozen=True, slots=True)
class Send:
    call: Call[Any]
    timeout: httpx.Timeout


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Flow = Generator[Send | Sleep, httpx.Response | None, T]


class Deadline:
    """The end of one call (its retries and waits included), on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()


def attempt_timeout(timeout: Timeout, remaining: float) -> httpx.Timeout:
    """httpx's per-phase timeouts for one attempt: no phase may outlast the call's deadline."""
    return httpx.Timeout(remaining, connect=min(timeout.connect, remaining))


def should_retry(error: TaskAppClientError, cause: Exception | None, idempotent: bool) -> bool:
    """The retry rule (RetryPolicy's docstring): for an answer, the status and the server's verdict;
    for no answer, whether the request could have been acted on."""
    if isinstance(error, APIStatusError):
        if error.status not in RETRY_STATUSES or error.retryable is False:
            return False
        return idempotent or error.retryable is True
    return isinstance(cause, NOT_SENT) or (idempotent and isinstance(cause, httpx.TransportError))


def _no_answer(call: Call[Any], exc: httpx.TransportError, deadline: Deadline) -> APIConnectionError:
    what = f"{call.method} {call.path}"
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"{what}: {type(exc).__name__} (the call's deadline is {deadline.seconds:g} s)")
    return APIConnectionError(f"{what}: {type(exc).__name__}: {exc}")


def exchange(call: Call[T], config: Config, deadline: Deadline, rng: random.Random) -> Flow[T]:
    """Send `call` until it succeeds, fails for good, runs out of attempts or would outlast `deadline`."""
    policy: RetryPolicy = config.retry
    attempt = 0
    while True:
        remaining = deadline.remaining()
        if remaining <= 0:
            raise APITimeoutError(f"{call.method} {call.path}: the call's {deadline.seconds:g} s passed")
        cause: httpx.TransportError | None = None
        try:
            response = yield Send(call, attempt_timeout(config.timeout, remaining))
        except httpx.TransportError as exc:
            cause = exc
            error: TaskAppClientError = _no_answer(call, exc, deadline)
            retry_after = None
        else:
            if response is None:  # pragma: no cover - a driver bug
                raise RuntimeError("a Send step needs a response")
            if response.status_code in call.accept:
                return call.read(response)
            error = error_from_response(response)
            retry_after = error.retry_after
        attempt += 1
        delay = policy.delay(attempt - 1, retry_after, rng.random())
        if (
            attempt >= policy.attempts
            or not should_retry(error, cause, call.idempotent)
            or delay >= deadline.remaining()
        ):
            raise error from cause
        logger.info("%s %s failed (%s); retry %d in %.2f s", call.method, call.path, error, attempt, delay)
        yield Sleep(delay)


def wait_for_results(
    run_ids: list[str], config: Config, deadline: Deadline, rng: random.Random
) -> Flow[list[RolloutResult]]:
    """Poll each run's result until all are there (honouring the server's Retry-After), in order."""
    results: dict[str, RolloutResult] = {}
    last: dict[str, RunStatus] = {}
    while True:
        waits = []
        for run_id in run_ids:
            if run_id in results:
                continue
            outcome = yield from exchange(calls.result(run_id), config, deadline, rng)
            if isinstance(outcome, Pending):
                last[run_id] = outcome.run
                waits.append(outcome.retry_after or POLL_S)
            else:
                results[run_id] = outcome
        if not waits:
            return [results[run_id] for run_id in run_ids]
        delay = min(waits)
        if delay >= deadline.remaining():
            waiting = next(run_id for run_id in run_ids if run_id not in results)
            run = last[waiting]
            raise RunNotFinished(
                f"run {waiting!r} is still {run.status} after {deadline.seconds:g} s ({len(waits)} of "
                f"{len(run_ids)} runs unfinished)",
                run,
            )
        yield Sleep(delay)


def group(
    bodies: list[dict[str, Any]], config: Config, deadline: Deadline, rng: random.Random
) -> Flow[list[RolloutResult]]:
    """Submit the rollouts as one group, then wait for every result."""
    yield from exchange(calls.submit(bodies), config, deadline, rng)
    return (yield from wait_for_results([body["run_id"] for body in bodies], config, deadline, rng))
