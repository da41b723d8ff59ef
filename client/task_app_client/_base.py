"""What `Client` and `AsyncClient` (and `Env` and `AsyncEnv`) share: the configuration and every
operation as a flow (`_flow.py`). The four public classes only run these flows, each with its own I/O.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from . import _calls as calls
from . import _flow as flow
from ._calls import Call
from ._config import KEY_HEADER, Config, RetryPolicy, Timeout
from ._errors import GoneError, NotFoundError
from ._flow import Deadline, Flow
from ._requests import RolloutRequest, rollout_body, tool_calls_of
from ._results import (
    AbortResult,
    AppInfo,
    EnvInfo,
    EnvState,
    Observation,
    RolloutResult,
    RunStatus,
    Snapshot,
    StepResult,
    SubmittedRun,
    TaskInfo,
    TaskSet,
)
from ._version import VERSION

T = TypeVar("T")
logger = logging.getLogger("task_app_client")
USER_AGENT = f"task-app-client/{VERSION}"
RolloutRequestLike = RolloutRequest | Mapping[str, Any]


class BaseClient:
    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        timeout: Timeout | float | None,
        retry: RetryPolicy | None,
    ) -> None:
        self._config = Config.resolve(base_url, api_key, timeout, retry)
        self._random = random.Random()  # the retries' jitter; never the process-global generator

    @property
    def base_url(self) -> str:
        return self._config.base_url

    @property
    def timeout(self) -> Timeout:
        return self._config.timeout

    @property
    def retry(self) -> RetryPolicy:
        return self._config.retry

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}(base_url={self._config.base_url!r})"

    def _headers(self) -> dict[str, str]:
        return {KEY_HEADER: self._config.api_key, "User-Agent": USER_AGENT}

    def _deadline(self, timeout: float | None, *, waits: bool = False) -> Deadline:
        default = self._config.timeout.rollout if waits else self._config.timeout.total
        return Deadline(default if timeout is None else timeout)

    def _send(self, call: Call[T], timeout: float | None, *, waits: bool = False) -> Flow[T]:
        return flow.exchange(call, self._config, self._deadline(timeout, waits=waits), self._random)

    # --- the operations, as flows -----------------------------------------------------------------

    def _create(
        self,
        seed: int | None,
        task_id: str | None,
        config: Mapping[str, Any] | None,
        rl_run_id: str | None,
        extra_body: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> Flow[EnvState]:
        return self._send(calls.create_env(seed, task_id, config, rl_run_id, extra_body), timeout)

    def _restore(self, snapshot_id: str, timeout: float | None) -> Flow[EnvState]:
        return self._send(calls.restore(snapshot_id), timeout)

    def _rollout(self, request: RolloutRequestLike, timeout: float | None) -> Flow[RolloutResult]:
        return self._send(calls.rollout(rollout_body(request)), timeout, waits=True)

    def _submit(
        self, requests: RolloutRequestLike | Sequence[RolloutRequestLike], timeout: float | None
    ) -> Flow[list[SubmittedRun]]:
        return self._send(calls.submit(_bodies(requests)), timeout)

    def _result(self, run_id: str, timeout: float | None) -> Flow[RolloutResult]:
        deadline = self._deadline(timeout, waits=True)
        return (yield from flow.wait_for_results([run_id], self._config, deadline, self._random))[0]

    def _group(self, requests: Sequence[RolloutRequestLike], timeout: float | None) -> Flow[list[RolloutResult]]:
        return flow.group(_bodies(requests), self._config, self._deadline(timeout, waits=True), self._random)

    def _status(self, run_id: str, timeout: float | None) -> Flow[RunStatus]:
        return self._send(calls.status(run_id), timeout)

    def _abort(self, run_id: str, timeout: float | None) -> Flow[AbortResult]:
        return self._send(calls.abort(run_id), timeout)

    def _info(self, timeout: float | None) -> Flow[AppInfo]:
        return self._send(calls.info(), timeout)

    def _task_info(
        self,
        seed: int | None,
        task_id: str | None,
        seeds: Sequence[int] | None,
        task_ids: Sequence[str] | None,
        timeout: float | None,
    ) -> Flow[TaskSet | TaskInfo | list[TaskInfo]]:
        one = [value for value in (seed, task_id) if value is not None]
        if len(one) > 1 or (one and (seeds is not None or task_ids is not None)):
            raise ValueError("pass one seed or one task_id, or lists of seeds and task_ids")
        if seed is not None or task_id is not None:
            single = calls.task_infos([seed] if seed is not None else [], [task_id] if task_id is not None else [])
            return (yield from self._send(single, timeout))[0]
        if seeds is not None or task_ids is not None:
            return (yield from self._send(calls.task_infos(seeds or [], task_ids or []), timeout))
        return (yield from self._send(calls.taskset(), timeout))


def _bodies(requests: RolloutRequestLike | Sequence[RolloutRequestLike]) -> list[dict[str, Any]]:
    if isinstance(requests, RolloutRequest | Mapping):
        return [rollout_body(requests)]
    return [rollout_body(request) for request in requests]


ClientT = TypeVar("ClientT", bound=BaseClient)


class BaseEnv(Generic[ClientT]):
    """An env session's id and latest state, and its operations as flows that keep that state."""

    def __init__(self, client: ClientT, state: EnvState) -> None:
        if state.env_id is None:
            raise ValueError("an env needs its env_id")
        self._client = client
        self.env_id: str = state.env_id
        self.observation: Observation = state.observation
        self.info: EnvInfo = state.info
        self.step_idx: int = state.step_idx
        self.done: bool = state.info.done
        self.reward: float | None = None  # of the latest step
        self.terminated = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env_id={self.env_id!r}, step_idx={self.step_idx}, done={self.done})"

    def _keep(self, state: EnvState) -> EnvState:
        self.observation, self.info, self.step_idx = state.observation, state.info, state.step_idx
        self.done, self.reward = state.info.done, None
        return state

    def _step(
        self,
        actions: str | Sequence[str] | None,
        tool_calls: Iterable[Any] | None,
        extra_body: Mapping[str, Any] | None,
        timeout: float | None,
    ) -> Flow[StepResult]:
        call = calls.step(self.env_id, tool_calls_of(actions, tool_calls), extra_body)
        result = yield from self._client._send(call, timeout)
        self.observation, self.info, self.step_idx = result.observation, result.info, result.step_idx
        self.done, self.reward = result.done, result.reward
        return result

    def _reset(
        self, seed: int | None, task_id: str | None, extra_body: Mapping[str, Any] | None, timeout: float | None
    ) -> Flow[EnvState]:
        call = calls.reset(self.env_id, seed, task_id, extra_body)
        return self._keep((yield from self._client._send(call, timeout)))

    def _snapshot(self, timeout: float | None) -> Flow[Snapshot]:
        return self._client._send(calls.snapshot(self.env_id), timeout)

    def _branch(self, num_children: int, timeout: float | None) -> Flow[list[EnvState]]:
        """The children's ids; each starts where this env is now."""
        branches = yield from self._client._send(calls.branch([self.env_id], num_children), timeout)
        state = {"observation": self.observation, "info": self.info, "step_idx": self.step_idx}
        return [EnvState(env_id=child, **state) for child in branches.get(self.env_id, [])]

    def _terminate(self, timeout: float | None) -> Flow[None]:
        if self.terminated:
            return
        try:
            yield from self._client._send(calls.terminate(self.env_id), timeout)
        except (NotFoundError, GoneError) as exc:  # ended already: terminated, expired or evicted
            logger.debug("env %s was already gone: %s", self.env_id, exc.code)
        self.terminated = True

    def _exit_failed(self, body_failed: bool) -> bool:
        """After a failed terminate on leaving the `with` block: re-raise it, unless the block itself
        failed (whose exception must not be masked: the terminate's is logged)."""
        if body_failed:
            logger.warning("env %s was not terminated on leaving its block", self.env_id, exc_info=True)
        return not body_failed
