"""Env sessions with the old system's paths and shapes (docs/compatibility.md, "Env-session routes"),
all behind the key.

    /create /reset /step /snapshot /restore /terminate /branch      the old task app's mount (root)
    /CrafterClassic/initialize|step|terminate                        its compat routes
    /env/create ... /env/terminate                                   the hosted service's /env mount
    /env/{env_name}/initialize|step|terminate                        synth-ai's TaskAppClient.env helper

The handlers translate bodies into `EnvSessions` calls; the record, its ordering across processes and
every limit live there (`task_app/sessions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path

from ...core.env_contracts import (
    BranchRequest,
    BranchResponse,
    ClassicStepRequest,
    EnvCreatedResponse,
    EnvCreateRequest,
    EnvIdRequest,
    EnvResetRequest,
    EnvResetResponse,
    EnvRestoreRequest,
    EnvStepRequest,
    EnvStepResponse,
    OkResponse,
    SnapshotResponse,
)
from ...core.errors import InvalidRequest, NotFound
from ...game import TOOL_NAME
from ...sessions import build_spec
from ...sessions.env_spec import env_name as check_env_name
from ...sessions.views import created_body, reset_body, snapshot_body, step_body
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute

SESSION_ERRORS = (*PROTECTED, *BODY, 404, 409, 410, 429)
EnvName = Annotated[str, Path(max_length=64, description="crafter or CrafterClassic")]


async def create(body: EnvCreateRequest, state: StateDep) -> JSONBytes:
    spec = build_spec(body.env_name, body.config, body.seed, body.rl_run_id, state.settings, body.task_id)
    return JSONBytes(created_body(await state.sessions.envs.create(spec), body.observation))


async def reset(body: EnvResetRequest, state: StateDep) -> JSONBytes:
    task = state.taskset.tasks.resolve(body.task_id, body.seed)
    view = await state.sessions.envs.reset(body.env_id, body.seed, task=task)
    return JSONBytes(reset_body(view, body.observation))


async def answer_step(state: AppState, body: EnvStepRequest) -> JSONBytes:
    """`/step`'s answer: this route's and the step path's beside FastAPI (web/step_fast_path.py)."""
    return JSONBytes(step_body(await state.sessions.envs.step(body.env_id, body.tool_calls), body.observation))


async def step(body: EnvStepRequest, state: StateDep) -> JSONBytes:
    return await answer_step(state, body)


async def snapshot(body: EnvIdRequest, state: StateDep) -> JSONBytes:
    return JSONBytes(snapshot_body(await state.sessions.envs.snapshot(body.env_id)))


async def restore(body: EnvRestoreRequest, state: StateDep) -> JSONBytes:
    return JSONBytes(created_body(await state.sessions.envs.restore(body.snapshot_id), body.observation))


async def terminate(body: EnvIdRequest, state: StateDep) -> JSONBytes:
    await state.sessions.envs.terminate(body.env_id)
    return JSONBytes({"ok": True})


async def branch(body: BranchRequest, state: StateDep) -> JSONBytes:
    if body.num_children > body.max_branches:
        raise InvalidRequest(
            f"num_children ({body.num_children}) is more than max_branches ({body.max_branches})",
            code="too_many_branches",
        )
    if body.policy_ids:
        raise NotFound("this app has no policy sessions to branch", code="policy_not_found")
    children = await state.sessions.envs.branch(body.env_ids or [], body.num_children)
    return JSONBytes({"env_branches": children, "policy_branches": {}})


def _classic_seed(body: dict[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidRequest("seed must be an integer or null", code="invalid_request")
    return seed


def _classic_task_id(body: dict[str, Any]) -> str | None:
    task_id = body.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise InvalidRequest("task_id must be a string or null", code="invalid_task_id")
    return task_id


async def classic_initialize(state: StateDep, body: Annotated[dict[str, Any], Body()]) -> JSONBytes:
    """Free-form, as the seed's: `seed` or `task_id`, `config` (difficulty / world_config accepted, no effect)."""
    config = body.get("config") or {}
    if not isinstance(config, dict):
        raise InvalidRequest("config must be an object", code="invalid_env_config")
    spec = build_spec("crafter", config, _classic_seed(body), "eval", state.settings, _classic_task_id(body))
    return JSONBytes(created_body(await state.sessions.envs.create(spec)))


async def classic_step(body: ClassicStepRequest, state: StateDep) -> JSONBytes:
    tool_calls = body.action.tool_calls
    if tool_calls is None:
        tool_calls = [{"tool_name": TOOL_NAME, "arguments": {"actions": body.action.actions or []}}]
    return JSONBytes(step_body(await state.sessions.envs.step(body.env_id, tool_calls)))


async def named_initialize(env_name: EnvName, state: StateDep, body: Annotated[dict[str, Any], Body()]) -> JSONBytes:
    check_env_name(env_name)
    return await classic_initialize(state, body)


async def named_step(env_name: EnvName, body: ClassicStepRequest, state: StateDep) -> JSONBytes:
    check_env_name(env_name)
    return await classic_step(body, state)


async def named_terminate(env_name: EnvName, body: EnvIdRequest, state: StateDep) -> JSONBytes:
    check_env_name(env_name)
    return await terminate(body, state)


_ROUTES: tuple[tuple[str, Callable[..., Any], Any], ...] = (
    ("/create", create, EnvCreatedResponse),
    ("/reset", reset, EnvResetResponse),
    ("/step", step, EnvStepResponse),
    ("/snapshot", snapshot, SnapshotResponse),
    ("/restore", restore, EnvCreatedResponse),
    ("/terminate", terminate, OkResponse),
    ("/CrafterClassic/initialize", classic_initialize, EnvCreatedResponse),
    ("/CrafterClassic/step", classic_step, EnvStepResponse),
    ("/CrafterClassic/terminate", terminate, OkResponse),
)


def _router(prefix: str) -> APIRouter:
    router = APIRouter(
        prefix=prefix,
        tags=["env sessions"],
        dependencies=[AuthDep],
        route_class=StrictJSONRoute,
        responses=errors(*SESSION_ERRORS),
    )
    for path, handler, answer in _ROUTES:
        router.add_api_route(path, handler, methods=["POST"], responses=ok(answer))
    return router


root = _router("")
root.add_api_route("/branch", branch, methods=["POST"], responses=ok(BranchResponse))
hosted = _router("/env")
for _action, _handler, _answer in (
    ("initialize", named_initialize, EnvCreatedResponse),
    ("step", named_step, EnvStepResponse),
    ("terminate", named_terminate, OkResponse),
):
    hosted.add_api_route(f"/{{env_name}}/{_action}", _handler, methods=["POST"], responses=ok(_answer))
