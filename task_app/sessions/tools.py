"""The tools every standard door serves on env sessions: start, interact_many, observe, snapshot, restore.

    open(scope, task_id | seed)  ─► an env session (EnvSessions.create) and a tool session naming it
    call(scope, session_id, tool, arguments) ─► the session's env ─► EnvSessions ─► a ToolResult
    close(scope, session_id)     ─► the env terminated, the session forgotten

A tool session is a record in the state store, `tool-sessions/<id>` → `{"env", "scope", "at"}` (idle TTL
as env sessions, refreshed while used), so every call works on any process. It names the env the
session plays now: `restore` makes a new env from the snapshot, points the session at it and ends the
old one. `scope` keeps sessions apart: a session opened with one OpenEnv token is not found with
another (`KEY_SCOPE`, the API key, reaches every session).

A ToolResult carries what an agent reads (`text`: what the call did, then the observation) and what a
trainer scores (`reward`: crafter's reward over the call's actions, `done`, `achievements_added`: the
unlocks), plus the structured state; `mcp()` is the MCP `CallToolResult` shape, `data` included for
OpenEnv's MCPToolClient (which returns it from call_tool).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from ..core.errors import Gone, InvalidRequest, NotFound
from ..core.json_codec import dumps_bytes, loads
from ..core.settings import Settings
from ..core.tasks import TASK_ID_MAX_LENGTH, Tasks
from ..game import ACTIONS, TOOL_NAME
from .env_spec import build_spec
from .manager import REFRESH_FRACTION, EnvSessions, EnvView
from .records import new_id, valid_id

KEY_SCOPE = "key"
START, OBSERVE, SNAPSHOT, RESTORE = "start", "observe", "snapshot", "restore"
MAX_ACTIONS_IN_CALL = 64  # items one interact_many call may send (past the per-step cap they are rejected)


def session_key(session_id: str) -> str:
    return f"tool-sessions/{session_id}"


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartArguments(_Arguments):
    task_id: str | None = Field(
        default=None, max_length=TASK_ID_MAX_LENGTH, description="the task to play, e.g. crafter/eval/17"
    )
    seed: StrictInt | None = Field(default=None, ge=0, description="the world's seed (instead of a task id)")


class InteractArguments(_Arguments):
    actions: list[str | StrictInt] = Field(
        min_length=1, max_length=MAX_ACTIONS_IN_CALL, description="actions to execute in order"
    )


class NoArguments(_Arguments):
    pass


class RestoreArguments(_Arguments):
    snapshot_id: str = Field(max_length=64, description="what the snapshot tool returned")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    arguments: type[_Arguments]

    def input_schema(self, max_actions: int) -> dict[str, Any]:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        if self.name == TOOL_NAME:  # the one the model mostly calls: names, not ids, and the per-step cap
            schema["properties"]["actions"] = {
                "type": "array",
                "description": f"1 to {max_actions} actions, executed in order",
                "items": {"type": "string", "enum": list(ACTIONS)},
                "minItems": 1,
                "maxItems": max_actions,
            }
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema

    def as_mcp(self, max_actions: int) -> dict[str, Any]:
        """The MCP `Tool` (tools/list)."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema(max_actions)}


TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            START,
            "Start a new episode: of a task (task_id, e.g. crafter/eval/17), of a world (seed), or of the "
            "current world when neither is given. Returns the first observation.",
            StartArguments,
        ),
        ToolSpec(
            TOOL_NAME,
            "Act in the Crafter world: a list of actions executed in order. Returns what ran, the reward, "
            "the achievements unlocked and the new observation.",
            InteractArguments,
        ),
        ToolSpec(OBSERVE, "The current observation, without acting.", NoArguments),
        ToolSpec(SNAPSHOT, "Save the current state; returns a snapshot_id for restore.", NoArguments),
        ToolSpec(RESTORE, "Go back to a saved state (snapshot_id from the snapshot tool).", RestoreArguments),
    )
}


@dataclass(frozen=True, slots=True)
class ToolResult:
    session_id: str
    tool: str
    text: str
    reward: float
    done: bool
    achievements_added: list[str]
    data: dict[str, Any] = field(default_factory=dict)

    def structured(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "tool": self.tool,
            "reward": self.reward,
            "done": self.done,
            "achievements_added": self.achievements_added,
            **self.data,
        }

    def mcp(self) -> dict[str, Any]:
        """MCP's CallToolResult; `data` is what OpenEnv's MCPToolClient.call_tool returns."""
        structured = self.structured()
        return {
            "content": [{"type": "text", "text": self.text}],
            "structuredContent": structured,
            "isError": False,
            "data": structured,
        }


def view_data(view: EnvView) -> dict[str, Any]:
    """The structured state a tool result carries (the text holds the rest)."""
    data = view.observation.data
    outcome, plan = view.outcome, view.plan
    return {
        "env_id": view.env_id,
        "task_id": view.task_id,
        "seed": view.seed,
        "episode": view.episode,
        "episode_id": view.episode_id,
        "step_count": view.calls,
        "step_idx": view.step_idx,
        "truncated": view.truncated,
        "inventory": data.get("inventory", {}),
        "achievements": sorted(name for name, got in data.get("achievements_status", {}).items() if got),
        "actions": outcome.actions if outcome else [],
        "rejected": [rejection.as_dict() for rejection in plan.rejected] if plan else [],
    }


def _act_text(view: EnvView) -> str:
    if view.episode_over:
        return "The episode is over; nothing ran. Call start for a new one."
    outcome = view.outcome
    ran = ", ".join(outcome.actions) if outcome and outcome.actions else "nothing"
    lines = [f"Ran: {ran}."]
    if view.plan is not None and view.plan.rejected:
        lines.append("Rejected: " + "; ".join(f"{r.item} ({r.reason})" for r in view.plan.rejected) + ".")
    if outcome and outcome.unlocked:
        lines.append(f"Unlocked: {', '.join(outcome.unlocked)}.")
    lines.append(f"Reward: {view.reward:+g}.")
    return " ".join(lines)


def result_of(session_id: str, tool: str, view: EnvView, headline: str, **extra: Any) -> ToolResult:
    text = f"{headline}\n\n{view.observation.text}"
    if view.done:
        text += "\n\nThe episode is over" + (" (its length was reached)." if view.truncated else ".")
    unlocked = list(view.outcome.unlocked) if view.outcome else []
    return ToolResult(session_id, tool, text, view.reward, view.done, unlocked, {**view_data(view), **extra})


class ToolSessions:
    """One per process (the lifespan's, beside EnvSessions); every method may run concurrently."""

    def __init__(self, envs: EnvSessions, settings: Settings) -> None:
        self.envs = envs
        self.settings = settings
        self.tasks = Tasks(settings)
        self.max_actions = envs.limits.max_actions
        self._tools: dict[str, Callable[[str, str, Any], Awaitable[ToolResult]]] = {
            START: self._start,
            TOOL_NAME: self._interact,
            OBSERVE: self._observe,
            SNAPSHOT: self._snapshot,
            RESTORE: self._restore,
        }

    def tool_list(self) -> list[dict[str, Any]]:
        return [spec.as_mcp(self.max_actions) for spec in TOOLS.values()]

    # --- sessions -----------------------------------------------------------------------------------

    async def open(
        self,
        scope: str,
        *,
        task_id: str | None = None,
        seed: int | None = None,
        config: dict[str, Any] | None = None,
        episode_id: str | None = None,
    ) -> tuple[str, EnvView]:
        """A new session on a new env (a random train world when neither task nor seed is named)."""
        spec = build_spec("crafter", config or {}, seed, None, self.settings, task_id)
        view = await self.envs.create(spec)
        if episode_id is not None:
            view = await self.envs.reset(view.env_id, None, episode_id=episode_id)
        session_id = new_id()
        await self._bind(session_id, view.env_id, scope)
        return session_id, view

    async def adopt(self, scope: str, view: EnvView) -> str:
        """A session on an env that already exists (made by `EnvSessions.adopt` or `create`)."""
        session_id = new_id()
        await self._bind(session_id, view.env_id, scope)
        return session_id

    async def close(self, scope: str, session_id: str) -> None:
        env_id = await self.env_of(scope, session_id)
        await self.envs.store.delete([session_key(session_id)])
        with suppress(NotFound, Gone):  # already ended or expired: nothing left to stop
            await self.envs.terminate(env_id)

    async def env_of(self, scope: str, session_id: str) -> str:
        """The env the session plays now; 404 `session_not_found` (also for another scope's session)."""
        store = self.envs.store
        raw = await store.get(session_key(session_id)) if valid_id(session_id) else None
        record = loads(raw) if raw is not None else None
        if record is None or (scope != KEY_SCOPE and record.get("scope") != scope):
            raise NotFound(f"session {session_id!r} not found (it may have expired)", code="session_not_found")
        now = store.clock()
        if now - float(record.get("at", 0.0)) >= self.envs.limits.ttl_s * REFRESH_FRACTION:
            await self._bind(session_id, str(record["env"]), str(record["scope"]))
        return str(record["env"])

    async def _bind(self, session_id: str, env_id: str, scope: str) -> None:
        record = {"env": env_id, "scope": scope, "at": self.envs.store.clock()}
        await self.envs.store.put(session_key(session_id), dumps_bytes(record), ttl_s=self.envs.limits.ttl_s)

    # --- the operations the doors share -------------------------------------------------------------

    async def reset(
        self,
        scope: str,
        session_id: str,
        *,
        task_id: str | None = None,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> EnvView:
        task = self.tasks.resolve(task_id, seed)
        return await self.envs.reset(await self.env_of(scope, session_id), seed, task=task, episode_id=episode_id)

    async def step(self, scope: str, session_id: str, tool_calls: list[Any]) -> EnvView:
        return await self.envs.step(await self.env_of(scope, session_id), tool_calls)

    async def state(self, scope: str, session_id: str) -> EnvView:
        return await self.envs.state(await self.env_of(scope, session_id))

    # --- tools --------------------------------------------------------------------------------------

    async def call(self, scope: str, session_id: str, name: object, arguments: object) -> ToolResult:
        """One tool call; 422 `unknown_tool` / `invalid_tool_arguments`, and the env sessions' errors."""
        spec = TOOLS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise InvalidRequest(f"unknown tool {name!r}; the tools are {', '.join(TOOLS)}", code="unknown_tool")
        try:
            parsed = spec.arguments.model_validate(arguments if arguments is not None else {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in ("arguments", *first["loc"]))
            raise InvalidRequest(f"{spec.name}: {where}: {first['msg']}", code="invalid_tool_arguments") from exc
        return await self._tools[spec.name](scope, session_id, parsed)

    async def _start(self, scope: str, session_id: str, arguments: StartArguments) -> ToolResult:
        view = await self.reset(scope, session_id, task_id=arguments.task_id, seed=arguments.seed)
        world = view.task_id or f"seed {view.seed}"
        return result_of(session_id, START, view, f"Episode {view.episode} started: {world}.")

    async def _interact(self, scope: str, session_id: str, arguments: InteractArguments) -> ToolResult:
        call = {"tool_name": TOOL_NAME, "arguments": {"actions": list(arguments.actions)}}
        view = await self.step(scope, session_id, [call])
        return result_of(session_id, TOOL_NAME, view, _act_text(view), episode_over=view.episode_over)

    async def _observe(self, scope: str, session_id: str, arguments: NoArguments) -> ToolResult:
        view = await self.state(scope, session_id)
        return result_of(session_id, OBSERVE, view, f"Episode {view.episode}, step {view.calls}.")

    async def _snapshot(self, scope: str, session_id: str, arguments: NoArguments) -> ToolResult:
        env_id = await self.env_of(scope, session_id)
        snapshot = await self.envs.snapshot(env_id)
        view = await self.envs.state(env_id)
        headline = f"Saved snapshot {snapshot.snapshot_id}: restore goes back to this state."
        return result_of(session_id, SNAPSHOT, view, headline, snapshot_id=snapshot.snapshot_id)

    async def _restore(self, scope: str, session_id: str, arguments: RestoreArguments) -> ToolResult:
        old = await self.env_of(scope, session_id)
        view = await self.envs.restore(arguments.snapshot_id)
        await self._bind(session_id, view.env_id, scope)
        with suppress(NotFound, Gone):
            await self.envs.terminate(old)
        headline = f"Restored snapshot {arguments.snapshot_id}."
        return result_of(session_id, RESTORE, view, headline, snapshot_id=arguments.snapshot_id)
