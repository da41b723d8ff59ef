"""MCP for agents at `/mcp`: the official `mcp` SDK's server over streamable HTTP, behind the app's key.

    start(session_id?, task_id? | seed?)   a new episode: in a new session when no session_id is given
    interact_many(session_id, actions)     the actions, in order: reward, done, the achievements unlocked, what is seen
    observe(session_id)                    where the episode stands; nothing runs
    snapshot(session_id)                   a snapshot id, to come back to
    restore(session_id, snapshot_id)       the session goes back to a snapshot (any session's)
    end(session_id)                        the session ends and its env is freed

The tools are the env-session tool layer every door shares (`sessions/tools.py`), with the session named in
every call: the server is stateless (the SDK's `stateless=True`, JSON answers), no MCP session is kept in
memory, and a tool session lives in the state store, so any process of a fleet answers any call. Each tool
answers with text for the model (what ran, then what is seen) and the facts as `structuredContent` for
programs. A failure is a tool error (`isError`) whose structured content is the app's error (`code`,
`message`, `retryable`, and `retry_after_s` at a cap, e.g. `too_many_live_envs`). Before the SDK sees a
request: a missing or wrong key gets 401, and more than `TASKAPP_MCP_MAX_IN_FLIGHT` requests at once in a
process get 429 with `Retry-After`.

A `tools/call` alone (a JSON-RPC request, JSON answer, no `_meta`) is answered here without the SDK's
transport: in stateless mode the SDK builds a transport, a task group and memory streams per request, which
cost more than the step itself (docs/performance.md). The answer is the one the SDK gives (the result
through its `CallToolResult`); anything else, or anything malformed, goes to the SDK as sent.

Both lines of the SDK run it (1.x registers handlers with decorators, 2.x takes them in the constructor;
the wire types are built from their JSON form, which both lines share).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import mcp.types as types
from fastapi import FastAPI
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..core.errors import InvalidRequest, RateLimited, StoreUnavailable, TaskAppError, error_body
from ..core.json_codec import dumps_bytes, loads
from ..core.settings import Settings
from ..game import TOOL_NAME
from ..policy.prompts import system_prompt
from ..sessions.tools import KEY_SCOPE, START, TOOLS, StartArguments, ToolResult, result_of
from .auth import check_api_key
from .handlers import error_response
from .request_body import read_body
from .responses import JSONBytes
from .state import AppState

PATH = "/mcp"
SERVER_NAME = "crafter"
END = "end"
SDK_MAJOR = int(version("mcp").split(".")[0])
# The protocol revisions of the `initialize` handshake, whose plain `tools/call` both SDK lines answer in the
# same JSON-RPC shape, so it is answered here. Any other revision (mcp 2.x's per-request envelope) goes to
# the SDK. Written out: the SDK's own list moved between lines (`mcp.shared.version`, `mcp.types.version`).
HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
USAGE = (
    "\n\nTOOLS\nCall start once; pass the session_id it returns to every other tool. "
    f"Play with {TOOL_NAME} until it answers done: true, then call start again or end."
)
_SESSION = {"type": "string", "maxLength": 64, "description": "the session_id start returned"}
_DESCRIPTIONS = {
    START: "Start a new episode: of a task (task_id, e.g. crafter/eval/17), of a world (seed), or a random "
    "training world. Without session_id it opens a new session and returns its session_id; with one, the "
    "session plays the new episode. Returns the first observation.",
    END: "End the session and free its environment.",
}


def tool_definitions(settings: Settings) -> list[dict[str, Any]]:
    """The tools, as MCP `Tool` JSON: the shared layer's, each taking the session it acts on."""
    max_actions = settings.max_actions_per_decision
    tools = []
    for name, spec in TOOLS.items():
        schema = spec.input_schema(max_actions)
        schema["properties"] = {"session_id": _SESSION, **schema.get("properties", {})}
        if name != START:
            schema["required"] = ["session_id", *schema.get("required", [])]
        read_only = name == "observe"
        tools.append(
            {
                "name": name,
                "description": _DESCRIPTIONS.get(name, spec.description),
                "inputSchema": schema,
                "annotations": {"readOnlyHint": read_only, "openWorldHint": False},
            }
        )
    end_schema = {"type": "object", "properties": {"session_id": _SESSION}, "required": ["session_id"]}
    tools.append({"name": END, "description": _DESCRIPTIONS[END], "inputSchema": end_schema})
    return tools


def _answer(result: ToolResult) -> dict[str, Any]:
    return _text(result.text, result.structured())


def _error(exc: TaskAppError) -> dict[str, Any]:
    error = error_body(exc.code, exc.message, retryable=exc.retryable, **exc.details)["error"]
    if isinstance(exc, RateLimited):
        error["retry_after_s"] = exc.retry_after_s
    text = f"Error ({exc.code}): {exc.message}"
    return {"content": [{"type": "text", "text": text}], "structuredContent": {"error": error}, "isError": True}


def _session_id(arguments: dict[str, Any]) -> str:
    session_id = arguments.pop("session_id", None)
    if not isinstance(session_id, str) or not session_id:
        raise InvalidRequest("arguments.session_id: a session_id from start is required", code="invalid_tool_arguments")
    return session_id


def _text(text: str, facts: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "structuredContent": facts}


async def _open(state: AppState, arguments: dict[str, Any]) -> dict[str, Any]:
    """`start` without a session: a new session on the task's (or seed's) world."""
    try:
        parsed = StartArguments.model_validate(arguments)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in ("arguments", *first["loc"]))
        raise InvalidRequest(f"{START}: {where}: {first['msg']}", code="invalid_tool_arguments") from None
    session_id, view = await state.sessions.tools.open(KEY_SCOPE, task_id=parsed.task_id, seed=parsed.seed)
    world = view.task_id or f"seed {view.seed}"
    return _answer(result_of(session_id, START, view, f"Session {session_id}: episode started, {world}."))


async def call_tool(state: AppState, name: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """One MCP tool call, as the JSON of a `CallToolResult`."""
    tools = state.sessions.tools
    arguments = dict(given or {})
    try:
        if name == START and "session_id" not in arguments:
            return await _open(state, arguments)
        session_id = _session_id(arguments)
        if name != END:
            return _answer(await tools.call(KEY_SCOPE, session_id, name, arguments))
        if arguments:
            raise InvalidRequest(f"{END} takes only session_id, not {sorted(arguments)}", code="invalid_tool_arguments")
        await tools.close(KEY_SCOPE, session_id)
        return _text(f"Session {session_id} ended.", {"session_id": session_id, "ended": True})
    except TaskAppError as exc:
        return _error(exc)


def build_server(get_state: Callable[[], AppState], settings: Settings) -> Any:
    """The SDK's low-level server with the tools; `get_state` gives the app's shared objects."""
    instructions = f"{system_prompt(settings.max_actions_per_decision)}{USAGE}"
    tools = [types.Tool.model_validate(tool) for tool in tool_definitions(settings)]

    async def answer(name: str, arguments: dict[str, Any] | None) -> Any:
        return types.CallToolResult.model_validate(await call_tool(get_state(), name, arguments))

    server_class: Any = Server
    if SDK_MAJOR >= 2:

        async def on_list_tools(ctx: Any, params: Any) -> Any:
            return types.ListToolsResult.model_validate(
                {"tools": [tool.model_dump(by_alias=True, exclude_none=True) for tool in tools]}
            )

        async def on_call_tool(ctx: Any, params: Any) -> Any:
            return await answer(params.name, params.arguments)

        return server_class(
            SERVER_NAME, instructions=instructions, on_list_tools=on_list_tools, on_call_tool=on_call_tool
        )

    server = server_class(SERVER_NAME, instructions=instructions)

    @server.list_tools()  # type: ignore[untyped-decorator]
    async def list_tools() -> list[Any]:
        return tools

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call(name: str, arguments: dict[str, Any]) -> Any:
        return await answer(name, arguments)

    return server


def _tool_call(message: Any) -> tuple[int | str, str, dict[str, Any] | None] | None:
    """(id, name, arguments) of a plain `tools/call` request, else None (the SDK handles it)."""
    if not isinstance(message, dict) or message.keys() - {"jsonrpc", "id", "method", "params"}:
        return None
    request_id, params = message.get("id"), message.get("params")
    if message.get("jsonrpc") != "2.0" or message.get("method") != "tools/call" or not isinstance(params, dict):
        return None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str) or params.keys() - {"name", "arguments"}:
        return None
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    return request_id, name, arguments


def _plain_json_post(scope: Scope) -> bool:
    """A POST the SDK would take as a JSON-RPC message with a JSON answer."""
    headers = HTTPConnection(scope).headers
    content_type = headers.get("content-type", "").split(";")[0].strip()
    accepts = [part.strip() for part in headers.get("accept", "").split(",")]
    version_ok = headers.get("mcp-protocol-version", HANDSHAKE_VERSIONS[-1]) in HANDSHAKE_VERSIONS
    return (
        scope["method"] == "POST"
        and content_type == "application/json"
        and any(part.startswith("application/json") for part in accepts)
        and version_ok
    )


class McpEndpoint:
    """The ASGI app at `/mcp`: the key, then the in-flight cap, then the SDK's transport."""

    def __init__(self, app: FastAPI, manager: StreamableHTTPSessionManager) -> None:
        self.app = app
        self.manager = manager
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            state: AppState | None = getattr(self.app.state, "task_app", None)
            if state is None:
                raise StoreUnavailable("the task app is starting; retry in a moment", code="starting")
            check_api_key(HTTPConnection(scope), state.settings)
            limit = state.settings.mcp_max_in_flight
            if self.in_flight >= limit:
                raise RateLimited(f"{limit} MCP requests are in flight here, the limit", code="mcp_busy")
        except TaskAppError as exc:
            await error_response(exc)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            if _plain_json_post(scope):
                raw, receive = await read_body(receive)
                call = _tool_call(_parsed(raw)) if raw is not None else None
                if call is not None:
                    await _answer_tool_call(state, call, scope, receive, send)
                    return
            await self.manager.handle_request(scope, receive, send)
        finally:
            self.in_flight -= 1


def _parsed(body: bytes) -> Any:
    try:
        return loads(body, strict=True)
    except ValueError:
        return None  # the SDK answers it with its parse error


async def _answer_tool_call(
    state: AppState, call: tuple[int | str, str, dict[str, Any] | None], scope: Scope, receive: Receive, send: Send
) -> None:
    request_id, name, arguments = call
    result = types.CallToolResult.model_validate(await call_tool(state, name, arguments))
    answer = {
        "jsonrpc": "2.0",
        "id": request_id,
        "result": result.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    await JSONBytes(dumps_bytes(answer))(scope, receive, send)


def install(app: FastAPI) -> None:
    """Serve MCP at `/mcp` of `app`; the SDK's session manager runs while the app's lifespan does."""
    settings: Settings = app.state.settings
    server = build_server(lambda: app.state.task_app, settings)
    manager = StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)
    # Every method; first in the route list: FastAPI matches a path against its routes in order, and a
    # `tools/call` would otherwise first be tried against every route of the app (docs/decisions/step-path.md).
    app.router.routes.insert(0, Route(PATH, McpEndpoint(app, manager), include_in_schema=False))
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        # The app's resources first: a failed start-up (a broken rubric) raises as itself, not inside the
        # manager's task group; at shutdown the manager stops before the resources close.
        async with inner(application) as state, manager.run():
            yield state

    app.router.lifespan_context = lifespan
