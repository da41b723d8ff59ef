"""`AsyncClient` and `AsyncEnv`: `Client` and `Env` for asyncio, method for method (tests/test_api.py
checks it). `_run` is the only I/O; the logic is the flows' (`_base.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, overload

import httpx

from ._base import BaseClient, BaseEnv, RolloutRequestLike
from ._client import DEFAULT_LIMITS, Client, Env
from ._config import RetryPolicy, Timeout
from ._errors import TaskAppClientError
from ._flow import Flow, Sleep
from ._pool import ShardedPool
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


class AsyncClient(BaseClient):
    """`Client` for asyncio: the same arguments, every method a coroutine; `async with` or `aclose()`."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: Timeout | float | None = None,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(base_url, api_key, timeout, retry)
        self._http = ShardedPool(self._config.base_url, self._headers(), limits, transport)

    async def _run(self, flow: Flow[T]) -> T:
        reply: httpx.Response | None = None
        failure: httpx.TransportError | None = None
        while True:
            try:
                step = flow.throw(failure) if failure is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            reply, failure = None, None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            try:
                reply = await self._http.send(step)
            except httpx.TransportError as exc:
                failure = exc

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

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
    ) -> EnvOpening:
        """Create an env session: `env = await client.env(...)`, or `async with client.env(...) as env`."""
        flow = self._create(seed, task_id, config, rl_run_id, observation, extra_body, timeout)
        return EnvOpening(self._opened(flow, observation))

    def restore(
        self, snapshot_id: str, *, observation: ObservationFormat | None = None, timeout: float | None = None
    ) -> EnvOpening:
        """A new env session in the state of a snapshot: awaitable, or an async context manager."""
        return EnvOpening(self._opened(self._restore(snapshot_id, observation, timeout), observation))

    async def _opened(self, flow: Flow[EnvState], observation: ObservationFormat | None) -> AsyncEnv:
        return AsyncEnv(self, await self._run(flow), observation)

    # --- rollouts ---------------------------------------------------------------------------------

    async def rollout(self, request: RolloutRequestLike, *, timeout: float | None = None) -> RolloutResult:
        return await self._run(self._rollout(request, timeout))

    async def submit(
        self, requests: RolloutRequestLike | Sequence[RolloutRequestLike], *, timeout: float | None = None
    ) -> list[SubmittedRun]:
        return await self._run(self._submit(requests, timeout))

    async def result(self, run_id: str, *, timeout: float | None = None) -> RolloutResult:
        return await self._run(self._result(run_id, timeout))

    async def group(
        self, requests: Sequence[RolloutRequestLike], *, timeout: float | None = None
    ) -> list[RolloutResult]:
        return await self._run(self._group(requests, timeout))

    async def status(self, run_id: str, *, timeout: float | None = None) -> RunStatus:
        return await self._run(self._status(run_id, timeout))

    async def abort(self, run_id: str, *, timeout: float | None = None) -> AbortResult:
        return await self._run(self._abort(run_id, timeout))

    # --- the task ---------------------------------------------------------------------------------

    async def info(self, *, timeout: float | None = None) -> AppInfo:
        return await self._run(self._info(timeout))

    @overload
    async def task_info(self, *, timeout: float | None = None) -> TaskSet: ...
    @overload
    async def task_info(self, *, seed: int, timeout: float | None = None) -> TaskInfo: ...
    @overload
    async def task_info(self, *, task_id: str, timeout: float | None = None) -> TaskInfo: ...
    @overload
    async def task_info(
        self, *, seeds: Sequence[int], task_ids: Sequence[str] = ..., timeout: float | None = None
    ) -> list[TaskInfo]: ...
    @overload
    async def task_info(self, *, task_ids: Sequence[str], timeout: float | None = None) -> list[TaskInfo]: ...
    async def task_info(
        self,
        *,
        seed: int | None = None,
        task_id: str | None = None,
        seeds: Sequence[int] | None = None,
        task_ids: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> TaskSet | TaskInfo | list[TaskInfo]:
        return await self._run(self._task_info(seed, task_id, seeds, task_ids, timeout))


class AsyncEnv(BaseEnv[AsyncClient]):
    """`Env` for asyncio; `async with` terminates the session on leaving the block, also on error."""

    async def step(
        self,
        actions: str | Sequence[str] | None = None,
        *,
        tool_calls: Iterable[Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> StepResult:
        return await self._client._run(self._step(actions, tool_calls, extra_body, timeout))

    async def reset(
        self,
        seed: int | None = None,
        *,
        task_id: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> EnvState:
        return await self._client._run(self._reset(seed, task_id, extra_body, timeout))

    async def snapshot(self, *, timeout: float | None = None) -> Snapshot:
        return await self._client._run(self._snapshot(timeout))

    async def branch(self, num_children: int = 1, *, timeout: float | None = None) -> list[AsyncEnv]:
        states = await self._client._run(self._branch(num_children, timeout))
        return [AsyncEnv(self._client, state, self.observation_format) for state in states]

    async def terminate(self, *, timeout: float | None = None) -> None:
        await self._client._run(self._terminate(timeout))

    async def __aenter__(self) -> AsyncEnv:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.terminate()
        except TaskAppClientError:
            if self._exit_failed(exc is not None):
                raise


class EnvOpening(Awaitable[AsyncEnv]):
    """An env being created: await it for the `AsyncEnv`, or enter it to have it terminated on exit."""

    def __init__(self, opening: Awaitable[AsyncEnv]) -> None:
        self._opening = opening
        self._env: AsyncEnv | None = None

    def __await__(self) -> Generator[Any, None, AsyncEnv]:
        return self._opening.__await__()

    async def __aenter__(self) -> AsyncEnv:
        self._env = await self._opening
        return self._env

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._env is not None:
            await self._env.__aexit__(exc_type, exc, tb)


def _share_docstrings(sync: type, mirror: type) -> None:
    """The async methods say what their sync twins say (written once, in `_client.py`)."""
    for name, method in vars(mirror).items():
        twin = getattr(sync, name, None)
        if callable(method) and not name.startswith("_") and method.__doc__ is None and twin is not None:
            method.__doc__ = twin.__doc__


_share_docstrings(Client, AsyncClient)
_share_docstrings(Env, AsyncEnv)
