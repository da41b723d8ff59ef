"""OpenEnv's MCP methods (JSON-RPC 2.0) on tool sessions: what HTTP `/mcp` and the WebSocket `mcp` frame answer.

    tools/list                 the tools (`tools.py`)
    tools/call                 {name, arguments, session_id}: the tool's CallToolResult (`ToolResult.mcp()`)
    openenv/session/create     {task_id?, seed?}: a new session {session_id} (a token's seed and config apply)
    openenv/session/close      {session_id}: {session_id, closed: true}

A `Door` is who asks: its scope (the API key, or one OpenEnv token) and the env config new sessions get.
Errors are JSON-RPC errors: -32602 for a client mistake (422s, an unknown session), -32000 for the rest,
each with `data` {code, status} and, for a cap, `retry_after_s` (the HTTP route then answers 429 with
Retry-After).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InvalidRequest, NotFound, RateLimited, TaskAppError
from ..core.json_codec import loads
from .tools import ToolSessions

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, SERVER_ERROR = -32700, -32600, -32601, -32602, -32000
SESSION_CREATE, SESSION_CLOSE = "openenv/session/create", "openenv/session/close"


@dataclass(frozen=True, slots=True)
class Door:
    scope: str  # tools.KEY_SCOPE, or "token:<digest prefix>"
    seed: int | None = None  # a token's world for the sessions it creates (None: a random train world)
    config: dict[str, Any] = field(default_factory=dict)


def rpc_error(code: int, message: str, request_id: Any = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def parse_rpc(raw: bytes | str | dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The request, or None and the error reply (parse error, invalid request)."""
    if isinstance(raw, dict):
        request: Any = raw
    else:
        try:
            request = loads(raw)
        except ValueError:
            return None, rpc_error(PARSE_ERROR, "Parse error")
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
        return None, rpc_error(INVALID_REQUEST, "Invalid Request")
    request_id = request.get("id")
    if not isinstance(request_id, str | int | None) or isinstance(request_id, bool):
        return None, rpc_error(INVALID_REQUEST, "Invalid Request")
    return request, {}


def _text(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"params.{name} must be a string", code="invalid_params")
    return value


async def _result(tools: ToolSessions, door: Door, method: str, params: dict[str, Any], session_id: str | None) -> Any:
    if method == "tools/list":
        return {"tools": tools.tool_list()}
    if method == SESSION_CREATE:
        seed = params.get("seed", door.seed)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidRequest("params.seed must be an integer", code="invalid_params")
        task_id = _text(params, "task_id")
        created, _ = await tools.open(
            door.scope, task_id=task_id, seed=None if task_id and "seed" not in params else seed, config=door.config
        )
        return {"session_id": created}
    if method == SESSION_CLOSE:
        target = _text(params, "session_id")
        if not target:
            raise InvalidRequest("params.session_id is required", code="invalid_params")
        await tools.close(door.scope, target)
        return {"session_id": target, "closed": True}
    if method == "tools/call":
        name = params.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("params.name (the tool) is required", code="invalid_params")
        target = _text(params, "session_id") or session_id
        if not target:
            raise InvalidRequest(
                f"params.session_id is required: create one with {SESSION_CREATE}", code="missing_session_id"
            )
        return (await tools.call(door.scope, target, name, params.get("arguments") or {})).mcp()
    raise LookupError(method)


async def answer_rpc(
    tools: ToolSessions, door: Door, request: dict[str, Any], *, session_id: str | None = None
) -> tuple[dict[str, Any], RateLimited | None]:
    """The JSON-RPC response to a parsed request (`session_id`: the session a WebSocket is attached to),
    and the cap that refused it, if one did."""
    request_id = request.get("id")
    params = request.get("params", {})
    if not isinstance(params, dict):
        return rpc_error(INVALID_PARAMS, "Params must be an object", request_id), None
    try:
        result = await _result(tools, door, request["method"], params, session_id)
    except LookupError:
        return rpc_error(METHOD_NOT_FOUND, f"Method not found: {request['method']}", request_id), None
    except RateLimited as exc:
        data = {"code": exc.code, "status": exc.status, "retry_after_s": exc.retry_after_s}
        return rpc_error(SERVER_ERROR, exc.message, request_id, data), exc
    except TaskAppError as exc:
        code = INVALID_PARAMS if isinstance(exc, InvalidRequest | NotFound) else SERVER_ERROR
        return rpc_error(code, exc.message, request_id, {"code": exc.code, "status": exc.status}), None
    return {"jsonrpc": "2.0", "id": request_id, "result": result}, None
