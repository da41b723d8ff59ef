"""The Crafter env in OpenEnv's protocol (openenv 0.3-0.10, `openenv/core/env_server`), HTTP-free.

    HTTP   reset / step / state: a tool session (`tools.py`: in the state store, so any process serves
           it); health, metadata, schema; mcp: JSON-RPC (`mcp.py`)
    WS     messages reset / step / state / mcp / close, answered with observation / state / mcp / error
           messages carrying OpenEnv's error codes. A connection plays its own env in the process holding
           it (Modal pins a WebSocket to one container, and this keeps the state store off the step path)
           until it attaches to a tool session: at connect (`?session_id=`, what MCPToolClient opens) or
           on its first tool call (its game moves into the store). A capped number of connections per
           process; beyond it one CAPACITY_REACHED error and the close.

Shapes as openenv-core's server writes them: an observation reply is `{"observation": {...}, "reward",
"done"}` (its `serialize_observation`), an error `{"type": "error", "data": {"message", "code", ...}}`.
An action is `{"actions": [...]}` (names or ids, executed in order), `{"action": name}` or
`{"tool_calls": [...]}` in any shape docs/contract.md ("The tool") accepts; or an MCP-style action
(`{"type": "list_tools"}`, `{"type": "call_tool", "tool_name", "arguments"}`: what openenv < 0.5's
MCPToolClient steps with). Replies carry `metadata` (openenv >= 0.4): the session, the task, what ran,
what was rejected, what was unlocked.
"""

from __future__ import annotations

import secrets
from contextlib import suppress
from dataclasses import replace
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.errors import Gone, InvalidRequest, NotConfigured, NotFound, RateLimited, TaskAppError, Unauthorized
from ..core.json_codec import JSONDecodeError, loads
from ..core.offload import Offload
from ..core.tasks import TASK_ID_MAX_LENGTH, check_area
from ..game import (
    ACTIONS,
    TOOL_NAME,
    ActionPlan,
    DecisionOutcome,
    Game,
    Observation,
    WorldFactory,
    normalise_tool_calls,
)
from ..game.checkpoint import dump_game
from .env_spec import EnvSpec
from .live import Episode
from .manager import EnvView, view_of
from .openenv_mcp import Door, answer_rpc, parse_rpc
from .tools import ToolSessions
from .views import observation_body

PROTOCOL_VERSION = "1.0.0"  # OpenEnv's runtime checks read the OpenAPI info.version ("openenv-http/1.x")


class WSErrorCode(StrEnum):
    """openenv-core's `WSErrorCode`, value for value."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


class CrafterAction(BaseModel):
    """One step: `actions` (1-8 names or ids, in order), or one `action`, or raw `tool_calls`."""

    model_config = ConfigDict(extra="forbid")

    actions: list[str | int] | None = Field(default=None, max_length=64, examples=[["move_left", "do"]])
    action: str | int | None = Field(default=None, examples=["noop"])
    tool_calls: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    metadata: dict[str, Any] = Field(default_factory=dict)

    def tool_calls_for_env(self) -> list[Any]:
        if self.tool_calls is not None:
            return list(self.tool_calls)
        if self.actions is not None:
            return [{"tool_name": TOOL_NAME, "arguments": {"actions": list(self.actions)}}]
        if self.action is not None:
            return [{"tool_name": "interact", "arguments": {"action": self.action}}]
        return []


class CrafterObservation(BaseModel):
    """The observation under `observation` (reward and done sit beside it, as in OpenEnv)."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(description="what a language model reads: vitals, inventory, map, nearby resources")
    inventory: dict[str, int]
    achievements_status: dict[str, bool]
    player_position: list[int]
    player_direction: list[int]
    semantic_map_patch7: list[list[int]]
    num_steps_taken: int
    terminated: bool
    truncated: bool
    step_idx: int
    episode: int
    achievements_added: list[str] = Field(default_factory=list)
    actions: list[str] = Field(default_factory=list, description="the actions this step executed")
    rejected: list[dict[str, str]] = Field(default_factory=list, description="what could not run, and why")


class CrafterState(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)
    seed: int | None = None
    done: bool = False
    achievements: list[str] = Field(default_factory=list)


SESSION_ID = Field(default=None, max_length=64, description="the session to drive (openenv/session/create, reset)")


class ResetRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    seed: int | None = Field(default=None, ge=0)
    task_id: str | None = Field(default=None, max_length=TASK_ID_MAX_LENGTH, description="e.g. crafter/eval/17")
    episode_id: str | None = Field(default=None, max_length=255)
    session_id: str | None = SESSION_ID


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)
    session_id: str | None = SESSION_ID


METADATA = {
    "name": "crafter",
    "description": (
        "Crafter (danijar/crafter): a 2-D survival game with 22 achievements. An action is a list of up to 8 "
        f"of the 17 actions ({', '.join(ACTIONS)}); the observation has the text a language model reads and "
        "the structured state; reward is crafter's own."
    ),
    "version": PROTOCOL_VERSION,
    "author": "crafter task app",
    "documentation_url": "https://github.com/danijar/crafter",
}


def schemas() -> dict[str, Any]:
    return {
        "action": CrafterAction.model_json_schema(),
        "observation": CrafterObservation.model_json_schema(),
        "state": CrafterState.model_json_schema(),
    }


def reply_metadata(view: EnvView, session_id: str | None) -> dict[str, Any]:
    """What a reply's `metadata` says: whose session, which task, what ran, was rejected, was unlocked."""
    outcome, plan = view.outcome, view.plan
    return {
        "session_id": session_id,
        "task_id": view.task_id,
        "seed": view.seed,
        "episode_id": view.episode_id,
        "step_count": view.calls,
        "achievements_added": list(outcome.unlocked) if outcome else [],
        "actions": outcome.actions if outcome else [],
        "rejected": [rejection.as_dict() for rejection in plan.rejected] if plan else [],
        "episode_over": view.episode_over,
    }


def observation_payload(view: EnvView, *, stepped: bool, session_id: str | None = None) -> dict[str, Any]:
    """`{"observation", "reward", "done", "metadata"}` as OpenEnv's serialize_observation writes it (the
    metadata both beside the observation and in it)."""
    observation = observation_body(view)
    observation.update(step_idx=view.step_idx, episode=view.episode)
    if view.outcome is not None:
        observation.update(achievements_added=list(view.outcome.unlocked), actions=view.outcome.actions)
    if view.plan is not None:
        observation["rejected"] = [rejection.as_dict() for rejection in view.plan.rejected]
    metadata = reply_metadata(view, session_id)
    observation["metadata"] = metadata
    reward = view.reward if stepped else None
    return {"observation": observation, "reward": reward, "done": view.done, "metadata": metadata}


def state_payload(view: EnvView | None, session_id: str | None = None) -> dict[str, Any]:
    """OpenEnv's State: `step_count` counts step calls in the episode (not crafter steps, `step_idx`)."""
    if view is None:
        return CrafterState().model_dump()
    achievements = [name for name, unlocked in view.observation.data["achievements_status"].items() if unlocked]
    extra = {"session_id": session_id} if session_id is not None else {}
    return CrafterState(
        episode_id=view.episode_id,
        step_count=view.calls,
        seed=view.seed,
        done=view.done,
        achievements=achievements,
        env_id=view.env_id,
        episode=view.episode,
        task_id=view.task_id,
        **extra,
    ).model_dump()


def ws_error(code: WSErrorCode, message: str, **details: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code.value, **details}}


def _ws_error_of(exc: TaskAppError) -> dict[str, Any]:
    code = WSErrorCode.VALIDATION_ERROR if exc.status == 422 else WSErrorCode.EXECUTION_ERROR
    details = {"error_code": exc.code, "status": exc.status}
    if isinstance(exc, RateLimited):
        details["retry_after_s"] = exc.retry_after_s
    return ws_error(code, exc.message, **details)


def _validation_errors(exc: ValidationError) -> dict[str, Any]:
    errors = [{"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]} for error in exc.errors()]
    return ws_error(WSErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors)


def mcp_style_step(data: dict[str, Any]) -> bool:
    """openenv < 0.5's MCPToolClient steps with `{"type": "list_tools"}` / `{"type": "call_tool", ...}`."""
    return data.get("type") in ("list_tools", "call_tool")


class WsConnection:
    """One WebSocket connection: `handle(text)` answers one message (and says whether to close)."""

    def __init__(
        self,
        spec: EnvSpec,
        door: Door,
        tools: ToolSessions,
        worlds: WorldFactory,
        offload: Offload,
        session_id: str | None = None,
    ) -> None:
        self.spec = spec
        self.door = door
        self.tools = tools
        self.worlds = worlds
        self.limits = tools.envs.limits
        self.offload = offload
        self.session_id = session_id  # attached: every message goes to this tool session
        self.owns_session = False  # made by this connection (closed with it), not attached at connect
        self.local_id = secrets.token_urlsafe(16)
        self.game: Game | None = None
        self.episode = Episode(number=0)
        self.task_id: str | None = None  # the task whose world the local game plays (set at each reset)
        self.last: EnvView | None = None

    async def handle(self, text: str) -> tuple[dict[str, Any] | None, bool]:
        try:
            message = loads(text, strict=True)
        except JSONDecodeError as exc:
            return ws_error(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}"), False
        kind = message.get("type", "") if isinstance(message, dict) else ""
        data = message.get("data", {}) if isinstance(message, dict) else {}
        if kind == "close":
            return None, True
        handlers = {"reset": self._reset, "step": self._step, "state": self._state, "mcp": self._mcp}
        handler = handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return ws_error(WSErrorCode.UNKNOWN_TYPE, f"Unknown message type: {kind}"), False
        if not isinstance(data, dict) or set(message) - {"type", "data"}:
            return ws_error(
                WSErrorCode.VALIDATION_ERROR, "Invalid message", errors=["expected {type, data: {...}}"]
            ), False
        try:
            return await handler(data), False
        except ValidationError as exc:
            return _validation_errors(exc), False
        except TaskAppError as exc:
            if isinstance(exc, Unauthorized | NotConfigured):
                raise
            return _ws_error_of(exc), False

    async def _reset(self, data: dict[str, Any]) -> dict[str, Any]:
        request = ResetRequest.model_validate(data)
        if self.session_id is not None:
            view = await self.tools.reset(
                self.door.scope,
                self.session_id,
                task_id=request.task_id,
                seed=request.seed,
                episode_id=request.episode_id,
            )
            return {"type": "observation", "data": observation_payload(view, stepped=False, session_id=self.session_id)}
        task = self.tools.tasks.resolve(request.task_id, request.seed)
        check_area(task, self.spec.area)
        seed = task.seed if task is not None else request.seed if request.seed is not None else self.spec.seed
        if seed > self.limits.max_seed and task is None:
            return ws_error(WSErrorCode.VALIDATION_ERROR, f"seed must be in [0, {self.limits.max_seed}]")

        def start() -> Game:
            return Game(self.worlds.world(seed, self.spec.area, self.spec.length), image_size=self.spec.image_size)

        replaced, self.game = self.game, await self.offload(start)
        if replaced is not None:
            replaced.close()
        self.episode = self.episode.next(request.episode_id)
        self.task_id = self._task_of(seed)
        self.last = self._view(await self.offload(self.game.observe))
        return {"type": "observation", "data": observation_payload(self.last, stepped=False)}

    async def _step(self, data: dict[str, Any]) -> dict[str, Any]:
        if mcp_style_step(data):
            return await self._tool_step(data)
        action = CrafterAction.model_validate(data)
        if self.session_id is not None:
            view = await self.tools.step(self.door.scope, self.session_id, action.tool_calls_for_env())
            return {"type": "observation", "data": observation_payload(view, stepped=True, session_id=self.session_id)}
        game = self.game
        if game is None:
            return ws_error(WSErrorCode.EXECUTION_ERROR, "no episode yet: send a reset first")
        plan = normalise_tool_calls(action.tool_calls_for_env(), self.limits.max_actions)
        if self.spec.image_size is None:  # on the loop, as EnvSessions steps (manager.py)
            outcome, observation = game.step(plan)
        else:
            outcome, observation = await self.offload(lambda: game.step(plan))
        self.episode = self.episode.stepped()
        self.last = self._view(observation, outcome, plan)
        return {"type": "observation", "data": observation_payload(self.last, stepped=True)}

    async def _tool_step(self, data: dict[str, Any]) -> dict[str, Any]:
        """An MCP-style step: the tools as observations (OpenEnv's CallToolObservation / ListToolsObservation)."""
        if data.get("type") == "list_tools":
            return {"type": "observation", "data": {"observation": {"tools": self.tools.tool_list()}, "done": False}}
        name = data.get("tool_name")
        await self._attach()
        assert self.session_id is not None  # noqa: S101 - _attach sets it
        try:
            result = await self.tools.call(self.door.scope, self.session_id, name, data.get("arguments") or {})
        except InvalidRequest as exc:
            kind = "tool_not_found" if exc.code == "unknown_tool" else "invalid_args"
            observation = {"tool_name": name, "result": None, "error": {"error_type": kind, "message": exc.message}}
            return {"type": "observation", "data": {"observation": observation, "reward": None, "done": False}}
        metadata = result.structured()
        observation = {"tool_name": name, "result": result.mcp(), "error": None, "metadata": metadata}
        payload = {"observation": observation, "reward": result.reward, "done": result.done, "metadata": metadata}
        return {"type": "observation", "data": payload}

    async def _state(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.session_id is not None:
            view = await self.tools.state(self.door.scope, self.session_id)
            return {"type": "state", "data": state_payload(view, self.session_id)}
        return {"type": "state", "data": state_payload(self.last)}

    async def _mcp(self, data: dict[str, Any]) -> dict[str, Any]:
        """`{"type": "mcp", "data": <JSON-RPC request>}`: answered with `{"type": "mcp", "data": <response>}`;
        a tool call attaches the connection to a session first (its game moves into the state store)."""
        request, problem = parse_rpc(data)
        if request is None:
            return {"type": "mcp", "data": problem}
        params = request.get("params")
        if request["method"] == "tools/call" and not (isinstance(params, dict) and params.get("session_id")):
            await self._attach()
        answer, _ = await answer_rpc(self.tools, self.door, request, session_id=self.session_id)
        return {"type": "mcp", "data": answer}

    async def _attach(self) -> None:
        """Play on in a tool session from here on: the local game's state, or a new session without one."""
        if self.session_id is not None:
            return
        game = self.game
        if game is None:
            self.session_id, _ = await self.tools.open(self.door.scope, seed=self.spec.seed, config=self.door.config)
        else:
            checkpoint = await self.offload(lambda: dump_game(game, self.episode.as_extra()))
            spec = replace(self.spec, seed=int(game.env._seed))
            view = await self.tools.envs.adopt(spec, checkpoint, None)
            self.session_id = await self.tools.adopt(self.door.scope, view)
            self.close_local()
        self.owns_session = True

    def close_local(self) -> None:
        """The local game's memory returns now (`Game.close`)."""
        if self.game is not None:
            self.game.close()
            self.game = None

    async def close(self) -> None:
        """The connection is over: its local game freed; a session it made itself ends with it."""
        self.close_local()
        if self.owns_session and self.session_id is not None:
            with suppress(NotFound, Gone):
                await self.tools.close(self.door.scope, self.session_id)

    def _view(
        self, observation: Observation, outcome: DecisionOutcome | None = None, plan: ActionPlan | None = None
    ) -> EnvView:
        if self.game is None:  # pragma: no cover - only called after a reset
            raise RuntimeError("no game")
        return view_of(self.local_id, self.game, self.episode, observation, outcome, plan, task_id=self.task_id)

    def _task_of(self, seed: int) -> str | None:
        """The task a seed's world is (None: a seed in no split, or a world of another area)."""
        if self.spec.area != self.tools.tasks.area:
            return None
        with suppress(InvalidRequest):
            return self.tools.tasks.task_of_seed(seed).task_id
        return None


class WsCapacity:
    """Counts this process's WebSocket sessions against TASKAPP_OPENENV_MAX_SESSIONS."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def try_open(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        return True

    def close(self) -> None:
        self.active -= 1
