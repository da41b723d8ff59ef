"""Every route the client calls, as data: method, path, body, whether repeating it is safe, how to read
the answer. No I/O here: the flows (`_flow.py`) send these through either client.

Idempotent calls (`idempotent=True`) may be sent again after a broken connection: GETs, `terminate`,
`abort`, and `/rollout` and `/rollouts`, which the server keys by `run_id` (a repeated run_id gets the
first run's response, or its status). Creating, stepping, resetting, snapshotting, restoring and
branching envs are not: each attempt would act again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from ._errors import APIResponseValidationError, retry_after_s
from ._requests import ENV_NAME
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
M = TypeVar("M", bound=BaseModel)
OK = frozenset({200})


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    idempotent: bool = False
    accept: frozenset[int] = OK


@dataclass(frozen=True, slots=True)
class Pending:
    """A run's result is not there yet (202): its status, and when to ask again."""

    run: RunStatus
    retry_after: float | None


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise APIResponseValidationError(
            f"{response.request.method} {response.request.url.path} answered {response.status_code} "
            "with a body that is not JSON",
            status=response.status_code,
        ) from exc


def _read(response: httpx.Response, validate: Callable[[Any], T]) -> T:
    """The answer's JSON, validated; a body that is not the documented shape is the server's fault."""
    body = _body(response)
    try:
        return validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise APIResponseValidationError(
            f"{response.request.method} {response.request.url.path}: {where}: {first['msg']}",
            status=response.status_code,
        ) from exc


def _field(body: Any, name: str) -> Any:
    return body.get(name) if isinstance(body, dict) else None


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: _read(response, cls.model_validate)


class _NewEnv(EnvState):
    """create's and restore's answer, which must name the env."""

    env_id: str


def _none(response: httpx.Response) -> None:
    return None


# --- env sessions -------------------------------------------------------------------------------


def create_env(
    seed: int | None,
    task_id: str | None,
    config: Mapping[str, Any] | None,
    rl_run_id: str | None,
    extra_body: Mapping[str, Any] | None,
) -> Call[EnvState]:
    body: dict[str, Any] = {"env_name": ENV_NAME, "seed": seed, "config": dict(config or {})}
    if task_id is not None:
        body["task_id"] = task_id
    if rl_run_id is not None:
        body["rl_run_id"] = rl_run_id
    return Call("POST", "/create", model(_NewEnv), {**body, **(extra_body or {})})


def reset(env_id: str, seed: int | None, task_id: str | None, extra_body: Mapping[str, Any] | None) -> Call[EnvState]:
    body: dict[str, Any] = {"env_id": env_id, "seed": seed}
    if task_id is not None:
        body["task_id"] = task_id
    return Call("POST", "/reset", model(EnvState), {**body, **(extra_body or {})})


def step(env_id: str, tool_calls: list[dict[str, Any]], extra_body: Mapping[str, Any] | None) -> Call[StepResult]:
    return Call("POST", "/step", model(StepResult), {"env_id": env_id, "tool_calls": tool_calls, **(extra_body or {})})


def snapshot(env_id: str) -> Call[Snapshot]:
    return Call("POST", "/snapshot", model(Snapshot), {"env_id": env_id})


def restore(snapshot_id: str) -> Call[EnvState]:
    return Call("POST", "/restore", model(_NewEnv), {"snapshot_id": snapshot_id})


_BRANCHES = TypeAdapter(dict[str, list[str]])


def branch(env_ids: Sequence[str], num_children: int) -> Call[dict[str, list[str]]]:
    def read(response: httpx.Response) -> dict[str, list[str]]:
        return _read(response, lambda body: _BRANCHES.validate_python(_field(body, "env_branches")))

    body = {"env_ids": list(env_ids), "num_children": num_children, "max_branches": max(num_children, 1)}
    return Call("POST", "/branch", read, body)


def terminate(env_id: str) -> Call[None]:
    return Call("POST", "/terminate", _none, {"env_id": env_id}, idempotent=True)


# --- rollouts and runs --------------------------------------------------------------------------


def rollout(body: dict[str, Any]) -> Call[RolloutResult]:
    return Call("POST", "/rollout", model(RolloutResult), body, idempotent=True)


_SUBMITTED = TypeAdapter(list[SubmittedRun])


def submit(bodies: list[dict[str, Any]]) -> Call[list[SubmittedRun]]:
    def read(response: httpx.Response) -> list[SubmittedRun]:
        return _read(response, lambda body: _SUBMITTED.validate_python(_field(body, "runs")))

    return Call("POST", "/rollouts", read, bodies, idempotent=True, accept=frozenset({202}))


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/runs/{quote(run_id, safe='')}{suffix}"


def result(run_id: str) -> Call[RolloutResult | Pending]:
    read_result, read_status = model(RolloutResult), model(RunStatus)

    def read(response: httpx.Response) -> RolloutResult | Pending:
        if response.status_code == httpx.codes.ACCEPTED:
            return Pending(read_status(response), retry_after_s(response.headers.get("retry-after")))
        return read_result(response)

    return Call("GET", _run_path(run_id, "/result"), read, idempotent=True, accept=frozenset({200, 202}))


def status(run_id: str) -> Call[RunStatus]:
    return Call("GET", _run_path(run_id), model(RunStatus), idempotent=True)


def abort(run_id: str) -> Call[AbortResult]:
    return Call("POST", "/run/abort", model(AbortResult), {"run_id": run_id}, idempotent=True)


# --- the task -----------------------------------------------------------------------------------


def info() -> Call[AppInfo]:
    return Call("GET", "/info", model(AppInfo), idempotent=True)


def taskset() -> Call[TaskSet]:
    def read(response: httpx.Response) -> TaskSet:
        return _read(response, lambda body: TaskSet.model_validate(_field(body, "taskset")))

    return Call("GET", "/task_info", read, idempotent=True)


_TASK_INFOS = TypeAdapter(list[TaskInfo])


def task_infos(seeds: Sequence[int], task_ids: Sequence[str]) -> Call[list[TaskInfo]]:
    def read(response: httpx.Response) -> list[TaskInfo]:
        return _read(response, lambda body: _TASK_INFOS.validate_python(body if isinstance(body, list) else [body]))

    params = {"seed": list(seeds), "task_id": list(task_ids)}  # the server answers seeds first
    return Call("GET", "/task_info", read, params=params, idempotent=True)
