"""`Client` and `Env`: the blocking API. Each method runs one flow of `_base.py` (`_run` is the only
I/O); `AsyncClient` mirrors every method (tests/test_api.py checks the two stay alike)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx

from ._base import BaseClient, BaseEnv, RolloutRequestLike
from ._config import RetryPolicy, Timeout
from ._errors import TaskAppClientError
from ._flow import Flow, Sleep
from ._requests import ObservationFormat
from ._results import (
    AbortResult,
    AppInfo,
    EnvState,
    RolloutResult,
    RunStatus,
    Snapshot,
    StepResult,
    SubmittedRun,
    TaskInfo,
    TaskSet,
)

T = TypeVar("T")
# A trainer keeps many envs and rollouts in flight at once (TRL one per rollout slot, a thousand in an
# async trainer): as many connections as calls in flight, each kept open for the next call rather than
# closed and opened again (docs/client.md, "Many calls in flight"). The async client shards them.
DEFAULT_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)


class Client(BaseClient):
    """A connection pool to one task app. Use one per process, as a context manager (or `close()` it).

    `base_url` and `api_key` default to `TASK_APP_URL` and `ENVIRONMENT_API_KEY`; `timeout` is a
    `Timeout` or the total seconds of a call; `retry` a `RetryPolicy`. `transport` and `limits` go to
    the underlying `httpx.Client`.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: Timeout | float | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(base_url, api_key, timeout, retry)
        self._http = httpx.Client(
            base_url=self._config.base_url, headers=self._headers(), transport=transport, limits=limits
        )

    def _run(self, flow: Flow[T]) -> T:
        reply: httpx.Response | None = None
        failure: httpx.TransportError | None = None
        while True:
            try:
                step = flow.throw(failure) if failure is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, failure = None, None
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            call = step.call
            try:
                reply = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, timeout=step.timeout
                )
            except httpx.TransportError as exc:
                failure = exc

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- env sessions -----------------------------------------------------------------------------

    def env(
        self,
        seed: int | None = None,
        *,
        task_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        rl_run_id: str | None = None,
        observation: ObservationFormat | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Env:
        """Create an env session (`POST /create`) on world `seed` (random when None) or task `task_id`;
        `observation` is the format of its observation text ("full" or "compact"; None: the server's default)."""
        state = self._run(self._create(seed, task_id, config, rl_run_id, observation, extra_body, timeout))
        return Env(self, state, observation)

    def restore(
        self, snapshot_id: str, *, observation: ObservationFormat | None = None, timeout: float | None = None
    ) -> Env:
        """A new env session in the state of a snapshot (`POST /restore`)."""
        return Env(self, self._run(self._restore(snapshot_id, observation, timeout)), observation)

    # --- rollouts ---------------------------------------------------------------------------------

    def rollout(self, request: RolloutRequestLike, *, timeout: float | None = None) -> RolloutResult:
        """Run one rollout on the server and wait for its result (`POST /rollout`)."""
        return self._run(self._rollout(request, timeout))

    def submit(
        self, requests: RolloutRequestLike | Sequence[RolloutRequestLike], *, timeout: float | None = None
    ) -> list[SubmittedRun]:
        """Hand one rollout or a group to the server to run in the background (`POST /rollouts`, 202)."""
        return self._run(self._submit(requests, timeout))

    def result(self, run_id: str, *, timeout: float | None = None) -> RolloutResult:
        """Wait for a submitted run's result (polls `GET /runs/{run_id}/result` as its Retry-After says)."""
        return self._run(self._result(run_id, timeout))

    def group(self, requests: Sequence[RolloutRequestLike], *, timeout: float | None = None) -> list[RolloutResult]:
        """Submit the rollouts as one group and wait for all their results (in request order)."""
        return self._run(self._group(requests, timeout))

    def status(self, run_id: str, *, timeout: float | None = None) -> RunStatus:
        """A run's status, from any process of the fleet (`GET /runs/{run_id}`)."""
        return self._run(self._status(run_id, timeout))

    def abort(self, run_id: str, *, timeout: float | None = None) -> AbortResult:
        """Abort a run wherever it runs (`POST /run/abort`); a finished run is reported as it is."""
        return self._run(self._abort(run_id, timeout))

    # --- the task ---------------------------------------------------------------------------------

    def info(self, *, timeout: float | None = None) -> AppInfo:
        """The service, dataset, rubrics, tool and limits (`GET /info`)."""
        return self._run(self._info(timeout))

    @overload
    def task_info(self, *, timeout: float | None = None) -> TaskSet: ...
    @overload
    def task_info(self, *, seed: int, timeout: float | None = None) -> TaskInfo: ...
    @overload
    def task_info(self, *, task_id: str, timeout: float | None = None) -> TaskInfo: ...
    @overload
    def task_info(
        self, *, seeds: Sequence[int], task_ids: Sequence[str] = ..., timeout: float | None = None
    ) -> list[TaskInfo]: ...
    @overload
    def task_info(self, *, task_ids: Sequence[str], timeout: float | None = None) -> list[TaskInfo]: ...
    def task_info(
        self,
        *,
        seed: int | None = None,
        task_id: str | None = None,
        seeds: Sequence[int] | None = None,
        task_ids: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> TaskSet | TaskInfo | list[TaskInfo]:
        """The task set (no arguments), or one world by `seed` or `task_id` (`crafter/eval/17`), or
        several (`seeds`, `task_ids`; seeds first) (`GET /task_info`)."""
        return self._run(self._task_info(seed, task_id, seeds, task_ids, timeout))


class Env(BaseEnv[Client]):
    """An env session: `observation`, `done`, `reward`, `step_idx` and `info` are its latest state.

    As a context manager it terminates the session on leaving the block, also when the block raised.
    """

    def step(
        self,
        actions: str | Sequence[str] | None = None,
        *,
        tool_calls: Iterable[Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> StepResult:
        """Act: crafter action names, or a model's tool calls (OpenAI chat or Responses `function_call`)."""
        return self._client._run(self._step(actions, tool_calls, extra_body, timeout))

    def reset(
        self,
        seed: int | None = None,
        *,
        task_id: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> EnvState:
        """A new episode in this session: on world `seed` or task `task_id`, or the session's own world."""
        return self._client._run(self._reset(seed, task_id, extra_body, timeout))

    def snapshot(self, *, timeout: float | None = None) -> Snapshot:
        """Save the env's state in the store; `Client.restore(snapshot.snapshot_id)` continues from it."""
        return self._client._run(self._snapshot(timeout))

    def branch(self, num_children: int = 1, *, timeout: float | None = None) -> list[Env]:
        """`num_children` new sessions, each a copy of this one as it is now."""
        states = self._client._run(self._branch(num_children, timeout))
        return [Env(self._client, state, self.observation_format) for state in states]

    def terminate(self, *, timeout: float | None = None) -> None:
        """End the session (idempotent: an env that is already gone counts as terminated)."""
        self._client._run(self._terminate(timeout))

    def __enter__(self) -> Env:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.terminate()
        except TaskAppClientError:
            if self._exit_failed(exc is not None):
                raise
