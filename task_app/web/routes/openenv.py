"""OpenEnv under `/openenv`: two doors onto the same server, and the session tokens.

    /openenv/...                  the key in a header (X-API-Key or Authorization: Bearer; openenv >= 0.9)
    /openenv/t/<token>/...        a session token in the path (clients that cannot send headers)
        reset, step, state, health, metadata, schema, mcp, ws (?session_id= attaches to a session),
        the Task API: list_environments, {env}/splits, {env}/tasks, {env}/num_tasks, {env}/task, {env}/task_range
    POST /openenv/tokens          {"ttl_s"?, "seed"?, "task_id"?, "config"?} → {"token", "expires_at", "base_url"}
    POST /openenv/tokens/revoke   {"token"} → {"ok": true}; the token's own session is closed

A key in a URL would sit in access logs, so the key mints a token and the token, in the path, is the
credential of everything under `base_url` (ready to hand to an OpenEnv client: `GenericEnvClient(base_url=...)`
connects to `<base_url>/ws`). The token door is a FastAPI sub-application mounted at `/openenv/t/{token}`:
its own `/openapi.json` lists exactly OpenEnv's paths, which is what `openenv validate` reads. Bodies are
parsed after the credential is checked, so a caller without one learns nothing from a 400.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import HTTPConnection

from ...core.env_contracts import OkResponse, RevokeRequest, TokenRequest, TokenResponse
from ...core.errors import BadRequest, Gone, InvalidRequest, NotFound, TaskAppError, Unauthorized
from ...core.json_codec import dumps, loads
from ...core.tasks import ENV_NAME
from ...sessions import build_spec
from ...sessions.openenv import (
    METADATA,
    PROTOCOL_VERSION,
    CrafterAction,
    ResetRequest,
    StepRequest,
    WsConnection,
    WSErrorCode,
    schemas,
    ws_error,
)
from ...sessions.openenv_http import http_reset, http_state, http_step
from ...sessions.openenv_mcp import Door, answer_rpc, parse_rpc
from ...sessions.openenv_tokens import TokenInfo, TokenRegistry
from ...sessions.tools import KEY_SCOPE
from ..auth import check_api_key
from ..deps import AuthDep, StateDep
from ..handlers import install_error_handlers
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute

MOUNT = "/openenv/t/{token}"
POLICY_VIOLATION = 1008  # WebSocket close code: the credential is not (or no longer) valid
TRY_AGAIN_LATER = 1013
SESSION_QUERY = Query(max_length=64, description="the session (openenv/session/create, reset)")

router = APIRouter(
    prefix="/openenv",
    tags=["openenv"],
    dependencies=[AuthDep],
    route_class=StrictJSONRoute,
    responses=errors(*PROTECTED, *BODY),
)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


@router.post("/tokens", responses=ok(TokenResponse))
async def mint_token(
    request: Request, state: StateDep, body: Annotated[TokenRequest, Body(default_factory=TokenRequest)]
) -> JSONBytes:
    spec = build_spec("crafter", body.config, body.seed, None, state.settings, body.task_id)  # a bad config: 422 now
    seed = spec.seed if body.task_id is not None else body.seed  # a token without a world draws one per session
    token, expires_at = await state.sessions.tokens.mint(body.ttl_s, seed, body.config)
    base_url = f"{str(request.base_url).rstrip('/')}/openenv/t/{token}"
    return JSONBytes({"token": token, "expires_at": _iso(expires_at), "base_url": base_url})


@router.post("/tokens/revoke", responses={**ok(OkResponse), **errors(404)})
async def revoke_token(body: RevokeRequest, state: StateDep) -> JSONBytes:
    tokens = state.sessions.tokens
    info = await tokens.verify(body.token)
    bound = await tokens.bound_session(info) if info is not None else None
    if info is None or not await tokens.revoke(body.token):
        raise NotFound("no such token (it may have expired)", code="token_not_found")
    if bound is not None:
        with suppress(NotFound, Gone):  # already ended or expired: nothing left to stop
            await state.sessions.tools.close(TokenRegistry.scope(info), bound)
    return JSONBytes({"ok": True})


# --- who is asking: the key or a token ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    door: Door
    token: TokenInfo | None  # None: the API key


def app_state(connection: HTTPConnection) -> AppState:
    """The app's shared objects (a mounted app has no lifespan of its own: its parent's)."""
    parent = getattr(connection.app.state, "parent", None)
    state: AppState = (parent or connection.app).state.task_app
    return state


def _token_caller(info: TokenInfo) -> Caller:
    return Caller(Door(TokenRegistry.scope(info), info.seed, info.config), info)


async def _by_token(connection: HTTPConnection) -> Caller:
    info = await app_state(connection).sessions.tokens.verify(str(connection.path_params.get("token", "")))
    if info is None:
        raise Unauthorized("session token missing, invalid, expired or revoked")
    return _token_caller(info)


async def _by_key(connection: HTTPConnection) -> Caller:
    check_api_key(connection, app_state(connection).settings)
    return Caller(Door(KEY_SCOPE), None)


def _validated(model: type[BaseModel], data: Any, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            {"loc": [where, *error["loc"]], "msg": error["msg"], "type": error["type"]} for error in exc.errors()
        ]
        first = problems[0]
        raise InvalidRequest(f"{'.'.join(map(str, first['loc']))}: {first['msg']}", errors=problems) from exc


async def _json(request: Request, *, optional: bool = False) -> Any:
    raw = await request.body()
    if optional and not raw.strip():
        return {}
    try:
        return loads(raw)
    except ValueError as exc:
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from exc


# --- the Task API (openenv >= 0.4.1, ORS-compatible) ----------------------------------------------------


class _TaskApiRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    split: str = Field(max_length=32)


class _TaskRequest(_TaskApiRequest):
    index: int


class _TaskRangeRequest(_TaskApiRequest):
    start: int | None = None
    stop: int | None = None


def _env(env_name: str) -> None:
    if env_name.lower() != ENV_NAME:
        raise NotFound(f"unknown environment {env_name!r}; this server has {ENV_NAME!r}", code="unknown_env")


def openenv_routes(caller: Callable[[HTTPConnection], Awaitable[Caller]]) -> APIRouter:
    """OpenEnv's HTTP routes, for the callers `caller` admits (one door)."""
    routes = APIRouter(responses=errors(401, 503))
    door = Depends(caller)

    @routes.post(
        "/reset", tags=["Environment Control"], responses={**ok(dict[str, Any]), **errors(*BODY, 404, 409, 429)}
    )
    async def reset(request: Request, who: Caller = door) -> JSONBytes:
        body = _validated(ResetRequest, await _json(request, optional=True), "body")
        services = app_state(request).sessions
        return JSONBytes(await http_reset(services.tools, services.tokens, who.door, who.token, body))

    @routes.post(
        "/step", tags=["Environment Control"], responses={**ok(dict[str, Any]), **errors(*BODY, 404, 409, 410, 429)}
    )
    async def step(request: Request, who: Caller = door) -> JSONBytes:
        body = _validated(StepRequest, await _json(request), "body")
        action = _validated(CrafterAction, body.action, "action")
        services = app_state(request).sessions
        answer = await http_step(services.tools, services.tokens, who.door, who.token, action, body.session_id)
        return JSONBytes(answer)

    @routes.get("/state", tags=["State Management"], responses={**ok(dict[str, Any]), **errors(404, 410, 422, 429)})
    async def get_state(
        request: Request, who: Caller = door, session_id: Annotated[str | None, SESSION_QUERY] = None
    ) -> JSONBytes:
        services = app_state(request).sessions
        return JSONBytes(await http_state(services.tools, services.tokens, who.door, who.token, session_id))

    @routes.get("/health", tags=["Health"], responses=ok(dict[str, str]))
    async def health(who: Caller = door) -> JSONBytes:
        return JSONBytes({"status": "healthy"})

    @routes.get("/metadata", tags=["Environment Info"], responses=ok(dict[str, Any]))
    async def metadata(who: Caller = door) -> JSONBytes:
        return JSONBytes(METADATA)

    @routes.get("/schema", tags=["Schema"], responses=ok(dict[str, Any]))
    async def schema(who: Caller = door) -> JSONBytes:
        return JSONBytes(schemas())

    @routes.post("/mcp", tags=["MCP"], responses={**ok(dict[str, Any]), **errors(429)})
    async def mcp(request: Request, who: Caller = door) -> JSONBytes:
        """JSON-RPC 2.0: tools/list, tools/call, openenv/session/create, openenv/session/close."""
        parsed, problem = parse_rpc(await request.body())
        if parsed is None:
            return JSONBytes(problem)
        answer, refused = await answer_rpc(app_state(request).sessions.tools, who.door, parsed)
        if refused is not None:
            return JSONBytes(answer, status_code=429, headers=refused.headers)
        return JSONBytes(answer)

    routes.include_router(task_api_routes(caller))
    return routes


def task_api_routes(caller: Callable[[HTTPConnection], Awaitable[Caller]]) -> APIRouter:
    """OpenEnv's Task API (openenv >= 0.4.1, ORS-compatible), for one door's callers."""
    routes = APIRouter()
    door = Depends(caller)

    @routes.get("/list_environments", tags=["Task API"], responses=ok(list[str]))
    async def list_environments(who: Caller = door) -> JSONBytes:
        return JSONBytes([ENV_NAME])

    @routes.get("/{env_name}/splits", tags=["Task API"], responses={**ok(list[dict[str, Any]]), **errors(404)})
    async def splits(request: Request, env_name: str, who: Caller = door) -> JSONBytes:
        _env(env_name)
        return JSONBytes([split.as_dict() for split in app_state(request).taskset.tasks.splits.values()])

    @routes.post("/{env_name}/tasks", tags=["Task API"], responses={**ok(dict[str, Any]), **errors(*BODY, 404)})
    async def list_tasks(request: Request, env_name: str, who: Caller = door) -> JSONBytes:
        """The split's first tasks (at most TASKAPP_TASK_INFO_MAX_SEEDS; page with task_range)."""
        _env(env_name)
        body = _validated(_TaskApiRequest, await _json(request), "body")
        state = app_state(request)
        tasks, limit = state.taskset.tasks, state.settings.task_info_max_seeds
        page = tasks.page(body.split, 0, min(limit, tasks.split(body.split).size), limit)
        return JSONBytes({"tasks": [task.as_dict() for task in page], "env_name": ENV_NAME})

    @routes.post("/{env_name}/num_tasks", tags=["Task API"], responses={**ok(dict[str, int]), **errors(*BODY, 404)})
    async def num_tasks(request: Request, env_name: str, who: Caller = door) -> JSONBytes:
        _env(env_name)
        body = _validated(_TaskApiRequest, await _json(request), "body")
        return JSONBytes({"num_tasks": app_state(request).taskset.tasks.split(body.split).size})

    @routes.post("/{env_name}/task", tags=["Task API"], responses={**ok(dict[str, Any]), **errors(*BODY, 404)})
    async def task(request: Request, env_name: str, who: Caller = door) -> JSONBytes:
        _env(env_name)
        body = _validated(_TaskRequest, await _json(request), "body")
        return JSONBytes({"task": app_state(request).taskset.tasks.task(body.split, body.index).as_dict()})

    @routes.post("/{env_name}/task_range", tags=["Task API"], responses={**ok(dict[str, Any]), **errors(*BODY, 404)})
    async def task_range(request: Request, env_name: str, who: Caller = door) -> JSONBytes:
        """Tasks split[start:stop] (Python slice bounds), at most TASKAPP_TASK_INFO_MAX_SEEDS."""
        _env(env_name)
        body = _validated(_TaskRangeRequest, await _json(request), "body")
        state = app_state(request)
        page = state.taskset.tasks.page(body.split, body.start, body.stop, state.settings.task_info_max_seeds)
        return JSONBytes({"tasks": [task.as_dict() for task in page]})

    return routes


token_routes = openenv_routes(_by_token)
key_routes = openenv_routes(_by_key)


@token_routes.websocket("/ws")
async def token_websocket(socket: WebSocket) -> None:
    await _serve_websocket(socket, _by_token)


@key_routes.websocket("/ws")
async def key_websocket(socket: WebSocket) -> None:
    await _serve_websocket(socket, _by_key)


def token_app(parent: FastAPI) -> FastAPI:
    """The OpenEnv server of one token (the token is the mount's path parameter)."""
    # root_path_in_servers=False: FastAPI would otherwise add each request's root path, which holds the
    # token, to the one shared schema, so every client's /openapi.json would list other clients' tokens.
    app = FastAPI(
        title="Crafter (OpenEnv)",
        version=PROTOCOL_VERSION,
        docs_url=None,
        redoc_url=None,
        root_path_in_servers=False,
        default_response_class=JSONBytes,
    )
    app.state.settings = parent.state.settings
    app.state.parent = parent
    install_error_handlers(app)
    app.include_router(token_routes)
    return app


async def _send(socket: WebSocket, reply: dict[str, Any]) -> None:
    await socket.send_text(dumps(reply))


async def _serve_websocket(socket: WebSocket, caller: Callable[[HTTPConnection], Awaitable[Caller]]) -> None:
    """OpenEnv's session protocol: capped connections per process; each plays its own env until it
    attaches to a tool session (`?session_id=` or its first tool call)."""
    state = app_state(socket)
    services = state.sessions
    try:
        who = await caller(socket)
    except TaskAppError:
        await socket.close(code=POLICY_VIOLATION)  # before the handshake: the client sees 403
        return
    await socket.accept()
    capacity = services.websockets
    if not capacity.try_open():
        reply = ws_error(
            WSErrorCode.CAPACITY_REACHED,
            f"this server holds {capacity.active} WebSocket sessions, its limit",
            active_sessions=capacity.active,
            max_sessions=capacity.limit,
        )
        await _send(socket, reply)
        await socket.close(code=TRY_AGAIN_LATER)
        return
    connection: WsConnection | None = None
    try:
        attach = socket.query_params.get("session_id")
        if attach is not None:
            await services.tools.env_of(who.door.scope, attach)  # unknown: SESSION_ERROR below
        spec = build_spec("crafter", who.door.config, who.door.seed, None, state.settings)
        connection = WsConnection(spec, who.door, services.tools, state.worlds, state.offload, attach)
        while True:
            text = await socket.receive_text()
            if who.token is not None and await services.tokens.verify(str(socket.path_params.get("token"))) is None:
                await _send(socket, ws_error(WSErrorCode.SESSION_ERROR, "the session token expired or was revoked"))
                await socket.close(code=POLICY_VIOLATION)
                return
            answer, close = await connection.handle(text)
            if close:
                await socket.close()
                return
            if answer is not None:
                await _send(socket, answer)
    except WebSocketDisconnect:
        return
    except TaskAppError as exc:
        with anyio.CancelScope(shield=True):
            await _send(socket, ws_error(WSErrorCode.SESSION_ERROR, exc.message, error_code=exc.code))
            await socket.close()
    finally:
        capacity.close()
        if connection is not None:
            with anyio.CancelScope(shield=True):
                await connection.close()


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.include_router(key_routes, prefix="/openenv", tags=["openenv (header auth)"])
    app.mount(MOUNT, token_app(app))
