"""The Crafter env in OpenEnv's protocol (openenv-core 0.3.0, `openenv/core/env_server`), HTTP-free.

    HTTP   reset / step / state: the token's one env, an env session like any other (in the state store,
           so any process serves it); health, metadata, schema; mcp: JSON-RPC (tools/list only)
    WS     one env per connection, kept in the process holding the connection (Modal pins a WebSocket
           to one container): messages reset / step / state / close, answered with observation / state
           / error messages carrying OpenEnv's error codes; a capped number of connections per process,
           beyond it one CAPACITY_REACHED error and the close.

Shapes as openenv-core's server writes them: an observation reply is `{"observation": {...}, "reward",
"done"}` (its `serialize_observation`), an error `{"type": "error", "data": {"message", "code", ...}}`.
An action is `{"actions": [...]}` (names or ids, executed in order), `{"action": name}` or
`{"tool_calls": [...]}` in any shape CONTRACT §5 accepts.
"""

from __future__ import annotations

import secrets
from enum import StrEnum
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.offload import Offload
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
from .env_spec import EnvSpec, SessionLimits
from .live import Episode
from .manager import EnvView, view_of
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


class ResetRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = Field(default=None, gt=0)
    request_id: str | None = Field(default=None, max_length=255)


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


def observation_payload(view: EnvView, *, stepped: bool) -> dict[str, Any]:
    """`{"observation", "reward", "done"}` as OpenEnv's serialize_observation writes it."""
    observation = observation_body(view)
    observation.update(step_idx=view.step_idx, episode=view.episode)
    if view.outcome is not None:
        observation.update(achievements_added=list(view.outcome.unlocked), actions=view.outcome.actions)
    if view.plan is not None:
        observation["rejected"] = [rejection.as_dict() for rejection in view.plan.rejected]
    return {"observation": observation, "reward": view.reward if stepped else None, "done": view.done}


def state_payload(view: EnvView | None) -> dict[str, Any]:
    """OpenEnv's State: `step_count` counts step calls in the episode (not crafter steps, `step_idx`)."""
    if view is None:
        return CrafterState().model_dump()
    achievements = [name for name, unlocked in view.observation.data["achievements_status"].items() if unlocked]
    return CrafterState(
        episode_id=view.episode_id,
        step_count=view.calls,
        seed=view.seed,
        done=view.done,
        achievements=achievements,
        env_id=view.env_id,
        episode=view.episode,
    ).model_dump()


def mcp_reply(body: bytes) -> dict[str, Any]:
    """POST /mcp: JSON-RPC 2.0. `tools/list` names the one tool; calls go through /step or the WebSocket."""

    def error(code: int, message: str, request_id: Any = None) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}

    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return error(-32700, "Parse error")
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or not isinstance(request.get("method"), str):
        return error(-32600, "Invalid Request")
    request_id = request.get("id")
    if not isinstance(request_id, str | int | None) or isinstance(request_id, bool):
        return error(-32600, "Invalid Request")
    if request["method"] != "tools/list":
        return error(-32601, "Method not found: this env is stepped through /step or the WebSocket", request_id)
    tool = {"name": TOOL_NAME, "description": METADATA["description"], "inputSchema": CrafterAction.model_json_schema()}
    return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": [tool]}}


def ws_error(code: WSErrorCode, message: str, **details: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code.value, **details}}


class WsSession:
    """One WebSocket connection's env: `handle(text)` answers one message (and says whether to close)."""

    def __init__(self, spec: EnvSpec, worlds: WorldFactory, limits: SessionLimits, offload: Offload) -> None:
        self.spec = spec
        self.worlds = worlds
        self.limits = limits
        self.offload = offload
        self.session_id = secrets.token_urlsafe(16)
        self.game: Game | None = None
        self.episode = Episode(number=0)
        self.last: EnvView | None = None

    async def handle(self, text: str) -> tuple[dict[str, Any] | None, bool]:
        try:
            message = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            return ws_error(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}"), False
        kind = message.get("type", "") if isinstance(message, dict) else ""
        data = message.get("data", {}) if isinstance(message, dict) else {}
        if kind == "close":
            return None, True
        handlers = {"reset": self._reset, "step": self._step, "state": self._state}
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
            errors = [{"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]} for error in exc.errors()]
            return ws_error(WSErrorCode.VALIDATION_ERROR, "Invalid message", errors=errors), False

    async def _reset(self, data: dict[str, Any]) -> dict[str, Any]:
        request = ResetRequest.model_validate(data)
        seed = request.seed if request.seed is not None else self.spec.seed
        if seed > self.limits.max_seed:
            return ws_error(WSErrorCode.VALIDATION_ERROR, f"seed must be in [0, {self.limits.max_seed}]")

        def start() -> Game:
            return Game(self.worlds.world(seed, self.spec.area, self.spec.length), image_size=self.spec.image_size)

        replaced, self.game = self.game, await self.offload(start)
        if replaced is not None:
            replaced.close()
        self.episode = self.episode.next(request.episode_id)
        self.last = self._view(await self.offload(self.game.observe))
        return {"type": "observation", "data": observation_payload(self.last, stepped=False)}

    async def _step(self, data: dict[str, Any]) -> dict[str, Any]:
        action = CrafterAction.model_validate(data)
        game = self.game
        if game is None:
            return ws_error(WSErrorCode.EXECUTION_ERROR, "no episode yet: send a reset first")
        plan = normalise_tool_calls(action.tool_calls_for_env(), self.limits.max_actions)
        outcome, observation = await self.offload(lambda: game.step(plan))
        self.episode = self.episode.stepped()
        self.last = self._view(observation, outcome, plan)
        return {"type": "observation", "data": observation_payload(self.last, stepped=True)}

    def close(self) -> None:
        """The connection is over: its world's memory returns now (`Game.close`)."""
        if self.game is not None:
            self.game.close()
            self.game = None

    async def _state(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"type": "state", "data": state_payload(self.last)}

    def _view(
        self, observation: Observation, outcome: DecisionOutcome | None = None, plan: ActionPlan | None = None
    ) -> EnvView:
        if self.game is None:  # pragma: no cover - only called after a reset
            raise RuntimeError("no game")
        return view_of(self.session_id, self.game, self.episode, observation, outcome, plan)


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
