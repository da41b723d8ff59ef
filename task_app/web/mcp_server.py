"""MCP for agents at `/mcp`: the official `mcp` SDK's server over streamable HTTP, behind the app's key.

    start_episode(task_id? | seed?)     a new episode: its id, its task and the first observation
    interact_many(episode_id, actions)  the actions, in order: reward, done, the achievements unlocked, what is seen
    observe(episode_id)                 where the episode stands; nothing runs
    snapshot(episode_id)                a snapshot id, to branch from later
    restore(snapshot_id)                a new episode from a snapshot
    end_episode(episode_id)             the episode ends and its env is freed

Stateless streamable HTTP (the SDK's `stateless=True`, JSON answers): every request stands alone and no
MCP session is kept in memory. An episode is an env session, named by its id in every call and kept in
the state store, so any process of a fleet answers any call. Each tool answers with text for the model
(what ran and what is seen) and the same facts as `structuredContent` for programs. A failure is a tool
error (`isError`) whose structured content is the app's error (`code`, `message`, `retryable`, and
`retry_after_s` at a cap, e.g. `too_many_live_envs`). Before the SDK sees a request: a missing or wrong
key gets 401, and more than `TASKAPP_MCP_MAX_IN_FLIGHT` requests at once in a process get 429 with
`Retry-After`.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from fastapi import FastAPI
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..core.errors import InvalidRequest, NotFound, RateLimited, StoreUnavailable, TaskAppError, error_body
from ..core.settings import Settings
from ..game import ACTIONS, TOOL_NAME
from ..policy.prompts import system_prompt, turn_text
from ..sessions import EnvView
from . import episodes
from .auth import check_api_key
from .responses import JSONBytes
from .state import AppState

PATH = "/mcp"
SERVER_NAME = "crafter"
MAX_ID = 64  # episode and snapshot ids are 22 characters; anything longer names nothing
USAGE = (
    "\n\nTOOLS\nCall start_episode once; pass the episode_id it returns to every other tool. "
    f"Play with {TOOL_NAME} until it answers done: true, then call end_episode."
)


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartEpisode(_Args):
    task_id: str | None = Field(
        default=None, max_length=128, description="a task id such as crafter/train/7 (from the task list)"
    )
    seed: int | None = Field(default=None, ge=0, description="a world seed, instead of a task id")

    @model_validator(mode="after")
    def _one_source(self) -> StartEpisode:
        if self.task_id is not None and self.seed is not None:
            raise ValueError("give task_id or seed, not both")
        return self


class EpisodeRef(_Args):
    episode_id: str = Field(max_length=MAX_ID, description="the id start_episode or restore returned")


class Interact(EpisodeRef):
    actions: list[str] = Field(min_length=1, max_length=64, description="Crafter actions, executed in order")


class Restore(_Args):
    snapshot_id: str = Field(max_length=MAX_ID, description="the id snapshot returned")


def _observed(view: EnvView) -> dict[str, Any]:
    status = view.observation.data.get("achievements_status") or {}
    return {
        "episode_id": view.env_id,
        "observation": view.observation.text,
        "done": view.done,
        "truncated": view.truncated,
        "step_idx": view.step_idx,
        "achievements": sorted(name for name, unlocked in status.items() if unlocked),
    }


Answer = tuple[str, dict[str, Any]]


async def _start(state: AppState, args: StartEpisode) -> Answer:
    settings = state.settings
    if args.task_id is not None:
        chosen = episodes.task_of_id(settings, args.task_id)
    else:
        seed = args.seed if args.seed is not None else secrets.randbelow(settings.max_seed + 1)
        chosen = episodes.task_of_seed(settings, seed)
    view = await episodes.start(state, chosen)
    facts = {**_observed(view), "task_id": chosen["task_id"], "seed": view.seed, "reward": 0.0, "unlocks": []}
    text = f"Episode {view.env_id} started on task {chosen['task_id']}.\n\n"
    return text + turn_text(view.observation.text, settings.max_actions_per_decision), facts


async def _interact(state: AppState, args: Interact) -> Answer:
    view = await state.sessions.envs.step(args.episode_id, [{"tool": TOOL_NAME, "args": {"actions": args.actions}}])
    if view.episode_over:
        raise InvalidRequest("the episode is over: end it, or start or restore another", code="episode_over")
    facts = {**_observed(view), **episodes.step_facts(view)}
    return episodes.result_text(view, state.settings.max_actions_per_decision), facts


async def _observe(state: AppState, args: EpisodeRef) -> Answer:
    view = await state.sessions.envs.state(args.episode_id)
    return view.observation.text, _observed(view)


async def _snapshot(state: AppState, args: EpisodeRef) -> Answer:
    info = await state.sessions.envs.snapshot(args.episode_id)
    facts = {"episode_id": args.episode_id, "snapshot_id": info.snapshot_id}
    return f"Snapshot {info.snapshot_id} taken; restore it to branch from here.", facts


async def _restore(state: AppState, args: Restore) -> Answer:
    view = await state.sessions.envs.restore(args.snapshot_id)
    text = f"Episode {view.env_id} restored from snapshot {args.snapshot_id}.\n\n"
    return text + turn_text(view.observation.text, state.settings.max_actions_per_decision), _observed(view)


async def _end(state: AppState, args: EpisodeRef) -> Answer:
    await state.sessions.envs.terminate(args.episode_id)
    return f"Episode {args.episode_id} ended.", {"episode_id": args.episode_id, "ended": True}


Handler = Callable[[AppState, Any], Awaitable[Answer]]
_TOOLS: dict[str, tuple[type[_Args], Handler, str, bool]] = {
    "start_episode": (
        StartEpisode,
        _start,
        "Start a new Crafter episode on a task (task_id) or a world seed; neither: a random world. "
        "Returns the episode_id every other tool takes, and the first observation.",
        False,
    ),
    TOOL_NAME: (
        Interact,
        _interact,
        "Execute a short sequence of Crafter actions in order. Returns the reward they earned, whether the "
        "episode is done, the achievements they unlocked and the new observation.",
        False,
    ),
    "observe": (EpisodeRef, _observe, "The episode's current observation and status; no action runs.", True),
    "snapshot": (EpisodeRef, _snapshot, "Snapshot the episode, to restore (branch) from this point later.", True),
    "restore": (Restore, _restore, "Start a new episode from a snapshot; the snapshot stays usable.", False),
    "end_episode": (EpisodeRef, _end, "End the episode and free its environment.", False),
}


def tool_definitions(settings: Settings) -> list[types.Tool]:
    tools = []
    for name, (model, _, description, read_only) in _TOOLS.items():
        schema = model.model_json_schema()
        schema.pop("title", None)
        for field in schema.get("properties", {}).values():
            field.pop("title", None)
        if model is Interact:
            schema["properties"]["actions"].update(
                items={"type": "string", "enum": list(ACTIONS)}, maxItems=settings.max_actions_per_decision
            )
        annotations = types.ToolAnnotations(readOnlyHint=read_only, openWorldHint=False)
        tools.append(types.Tool(name=name, description=description, inputSchema=schema, annotations=annotations))
    return tools


def _error(exc: TaskAppError) -> types.CallToolResult:
    error = error_body(exc.code, exc.message, retryable=exc.retryable, **exc.details)["error"]
    if isinstance(exc, RateLimited):
        error["retry_after_s"] = exc.retry_after_s
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"Error ({exc.code}): {exc.message}")],
        structuredContent={"error": error},
        isError=True,
    )


def _invalid(exc: ValidationError) -> InvalidRequest:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return InvalidRequest(f"{where}: {first['msg']}" if where else str(first["msg"]), code="invalid_arguments")


def build_server(get_state: Callable[[], AppState], settings: Settings) -> Server[Any, Any]:
    """The SDK's low-level server with the episode tools; `get_state` gives the app's shared objects."""
    server: Server[Any, Any] = Server(
        SERVER_NAME, instructions=f"{system_prompt(settings.max_actions_per_decision)}{USAGE}"
    )
    tools = tool_definitions(settings)

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return tools

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        entry = _TOOLS.get(name)
        try:
            if entry is None:
                raise NotFound(f"unknown tool {name!r}; the tools are {', '.join(_TOOLS)}", code="unknown_tool")
            model, handler, _, _ = entry
            try:
                args = model.model_validate(arguments)
            except ValidationError as exc:
                raise _invalid(exc) from None
            text, facts = await handler(get_state(), args)
        except TaskAppError as exc:
            return _error(exc)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structuredContent=facts)

    return server


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
            body = error_body(exc.code, exc.message, retryable=exc.retryable, **exc.details)
            await JSONBytes(body, status_code=exc.status, headers=exc.headers or None)(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.manager.handle_request(scope, receive, send)
        finally:
            self.in_flight -= 1


def install(app: FastAPI) -> None:
    """Serve MCP at `/mcp` of `app`; the SDK's session manager runs while the app's lifespan does."""
    settings: Settings = app.state.settings
    server = build_server(lambda: app.state.task_app, settings)
    manager = StreamableHTTPSessionManager(app=server, json_response=True, stateless=True)
    app.router.routes.append(Route(PATH, McpEndpoint(app, manager), include_in_schema=False))  # every method
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with manager.run(), inner(application) as state:
            yield state

    app.router.lifespan_context = lifespan
