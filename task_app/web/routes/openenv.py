"""OpenEnv under `/openenv`: session tokens (behind the API key) and the token-scoped OpenEnv server.

    POST /openenv/tokens          {"ttl_s"?, "seed"?, "config"?} → {"token", "expires_at", "base_url"}
    POST /openenv/tokens/revoke   {"token"} → {"ok": true}; the token's HTTP env is terminated
    /openenv/t/<token>/...        reset, step, state, health, metadata, schema, mcp, openapi.json, ws

Stock OpenEnv clients cannot send headers and a key in a URL would sit in access logs, so the key
mints a token and the token, in the path, is the credential of everything under `base_url` (which is
ready to hand to an OpenEnv client: `GenericEnvClient(base_url=...)` connects to `<base_url>/ws`).
The token-scoped server is a FastAPI sub-application mounted at `/openenv/t/{token}`: its own
`/openapi.json` lists exactly OpenEnv's paths, which is what `openenv validate` reads. Bodies there
are parsed after the token is checked, so a caller without a valid token learns nothing from a 400.
"""

from __future__ import annotations

from contextlib import suppress
from datetime import UTC, datetime
from typing import Annotated, Any

import anyio
import orjson
from fastapi import APIRouter, Body, Depends, FastAPI, Request, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from ...core.env_contracts import OkResponse, RevokeRequest, TokenRequest, TokenResponse
from ...core.errors import BadRequest, Gone, InvalidRequest, NotFound, TaskAppError, Unauthorized
from ...sessions import build_spec
from ...sessions.openenv import (
    METADATA,
    PROTOCOL_VERSION,
    CrafterAction,
    ResetRequest,
    StepRequest,
    WSErrorCode,
    WsSession,
    mcp_reply,
    schemas,
    ws_error,
)
from ...sessions.openenv_http import http_reset, http_state, http_step
from ...sessions.openenv_tokens import TokenInfo
from ..deps import AuthDep, StateDep
from ..handlers import install_error_handlers
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..state import AppState
from ..strict_json import StrictJSONRoute

MOUNT = "/openenv/t/{token}"
POLICY_VIOLATION = 1008  # WebSocket close code: the token is not (or no longer) valid
TRY_AGAIN_LATER = 1013

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
    seed = spec.seed if body.task_id is not None else body.seed  # a token without a world draws one per env
    token, expires_at = await state.sessions.tokens.mint(body.ttl_s, seed, body.config)
    base_url = f"{str(request.base_url).rstrip('/')}/openenv/t/{token}"
    return JSONBytes({"token": token, "expires_at": _iso(expires_at), "base_url": base_url})


@router.post("/tokens/revoke", responses={**ok(OkResponse), **errors(404)})
async def revoke_token(body: RevokeRequest, state: StateDep) -> JSONBytes:
    tokens = state.sessions.tokens
    info = await tokens.verify(body.token)
    bound = await tokens.bound_env(info) if info is not None else None
    if info is None or not await tokens.revoke(body.token):
        raise NotFound("no such token (it may have expired)", code="token_not_found")
    if bound is not None:
        with suppress(NotFound, Gone):  # already ended or expired: nothing left to stop
            await state.sessions.envs.terminate(bound)
    return JSONBytes({"ok": True})


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
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from exc


def _state(connection: HTTPConnection) -> AppState:
    """The parent app's shared objects (a mounted app has no lifespan of its own)."""
    state: AppState = connection.app.state.parent.state.task_app
    return state


async def _token(request: Request) -> TokenInfo:
    info = await _state(request).sessions.tokens.verify(str(request.path_params.get("token", "")))
    if info is None:
        raise Unauthorized("session token missing, invalid, expired or revoked")
    return info


Token = Annotated[TokenInfo, Depends(_token)]
token_routes = APIRouter(responses=errors(401, 503))


@token_routes.post("/reset", tags=["Environment Control"], responses={**ok(dict[str, Any]), **errors(*BODY, 409, 429)})
async def reset(request: Request, info: Token) -> JSONBytes:
    body = _validated(ResetRequest, await _json(request, optional=True), "body")
    state = _state(request)
    return JSONBytes(await http_reset(state.sessions.envs, state.sessions.tokens, state.settings, info, body))


@token_routes.post(
    "/step", tags=["Environment Control"], responses={**ok(dict[str, Any]), **errors(*BODY, 404, 409, 410, 429)}
)
async def step(request: Request, info: Token) -> JSONBytes:
    body = _validated(StepRequest, await _json(request), "body")
    action = _validated(CrafterAction, body.action, "action")
    state = _state(request)
    return JSONBytes(await http_step(state.sessions.envs, state.sessions.tokens, info, action))


@token_routes.get("/state", tags=["State Management"], responses={**ok(dict[str, Any]), **errors(404, 410, 429)})
async def get_state(request: Request, info: Token) -> JSONBytes:
    state = _state(request)
    return JSONBytes(await http_state(state.sessions.envs, state.sessions.tokens, info))


@token_routes.get("/health", tags=["Health"], responses=ok(dict[str, str]))
async def health(info: Token) -> JSONBytes:
    return JSONBytes({"status": "healthy"})


@token_routes.get("/metadata", tags=["Environment Info"], responses=ok(dict[str, Any]))
async def metadata(info: Token) -> JSONBytes:
    return JSONBytes(METADATA)


@token_routes.get("/schema", tags=["Schema"], responses=ok(dict[str, Any]))
async def schema(info: Token) -> JSONBytes:
    return JSONBytes(schemas())


@token_routes.post("/mcp", tags=["MCP"], responses=ok(dict[str, Any]))
async def mcp(request: Request, info: Token) -> JSONBytes:
    return JSONBytes(mcp_reply(await request.body()))


@token_routes.websocket("/ws")
async def websocket(socket: WebSocket) -> None:
    await _serve_websocket(socket, _state(socket))


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


async def _serve_websocket(socket: WebSocket, state: AppState) -> None:
    """OpenEnv's session protocol: one env per connection, in this process; capped connections."""
    services = state.sessions
    raw_token = str(socket.path_params.get("token", ""))
    if await services.tokens.verify(raw_token) is None:
        await socket.close(code=POLICY_VIOLATION)
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
        await socket.send_text(orjson.dumps(reply).decode())
        await socket.close(code=TRY_AGAIN_LATER)
        return
    session: WsSession | None = None
    try:
        info = await services.tokens.verify(raw_token)
        spec = build_spec("crafter", info.config if info else {}, info.seed if info else None, None, state.settings)
        session = WsSession(spec, state.worlds, services.envs.limits, state.offload)
        while True:
            text = await socket.receive_text()
            if await services.tokens.verify(raw_token) is None:
                reply = ws_error(WSErrorCode.SESSION_ERROR, "the session token expired or was revoked")
                await socket.send_text(orjson.dumps(reply).decode())
                await socket.close(code=POLICY_VIOLATION)
                return
            answer, close = await session.handle(text)
            if close:
                await socket.close()
                return
            if answer is not None:
                await socket.send_text(orjson.dumps(answer).decode())
    except WebSocketDisconnect:
        return
    except TaskAppError as exc:
        with anyio.CancelScope(shield=True):
            await socket.send_text(orjson.dumps(ws_error(WSErrorCode.SESSION_ERROR, exc.message)).decode())
            await socket.close()
    finally:
        if session is not None:
            session.close()
        capacity.close()


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount(MOUNT, token_app(app))
