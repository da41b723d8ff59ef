"""Wire models of the env-session routes: the old system's shapes (docs/compatibility.md, "Env-session
routes") and OpenEnv's.

Requests ignore unknown keys, as the old system's did; handlers answer with bytes, and these response models
document what they hold (OpenAPI).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .tasks import TASK_ID_MAX_LENGTH

MAX_TOOL_CALLS = 64  # tool calls in one step request (each may name several actions)
TASK_ID_FIELD = Field(
    default=None,
    max_length=TASK_ID_MAX_LENGTH,
    description="the world by task id (e.g. crafter/eval/17) instead of, or agreeing with, `seed`",
)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EnvCreateRequest(_Lenient):
    """`POST /create`: a new env, named by `seed` or `task_id`; neither draws a random train world
    (`info.seed` and `info.task_id` say which)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"env_name": "crafter", "seed": 3, "config": {}, "rl_run_id": "run-1"}]},
    )
    env_name: str
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    task_id: str | None = TASK_ID_FIELD
    parent_env_id: str | None = None  # accepted and ignored, as in the seed
    rl_run_id: str | None = Field(default=None, max_length=200)


class EnvResetRequest(_Lenient):
    env_id: str
    seed: int | None = None
    task_id: str | None = TASK_ID_FIELD


class EnvStepRequest(_Lenient):
    """`tool_calls` in any shape docs/contract.md ("The tool") accepts (e.g. `{"tool": "interact_many",
    "args": {"actions": [...]}}`)."""

    env_id: str
    tool_calls: list[Any] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)


class EnvIdRequest(_Lenient):
    env_id: str


class EnvRestoreRequest(_Lenient):
    snapshot_id: str


class BranchRequest(_Lenient):
    env_ids: list[str] | None = None
    policy_ids: list[str] | None = None
    num_children: int = Field(default=1, ge=1)
    max_branches: int = Field(default=10, ge=1)


class ClassicAction(_Lenient):
    tool_calls: list[Any] | None = Field(default=None, max_length=MAX_TOOL_CALLS)
    actions: list[Any] | None = Field(default=None, max_length=MAX_TOOL_CALLS)


class ClassicStepRequest(_Lenient):
    """`POST /CrafterClassic/step`: `action.tool_calls`, or `action.actions` (names or ids)."""

    env_id: str
    action: ClassicAction = Field(default_factory=ClassicAction)


class EnvCreatedResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    env_id: str
    observation: dict[str, Any]
    info: dict[str, Any] | None
    step_idx: int


class EnvResetResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    observation: dict[str, Any]
    info: dict[str, Any] | None
    step_idx: int


class EnvStepResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    observation: dict[str, Any]
    done: bool
    info: dict[str, Any]
    reward: float | None
    truncated: bool | None
    step_idx: int


class SnapshotResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    snapshot_id: str
    path: str
    rl_run_id: str | None
    size: int


class OkResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    ok: bool


class BranchResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    env_branches: dict[str, list[str]]
    policy_branches: dict[str, list[str]]


class TokenRequest(_Lenient):
    """`POST /openenv/tokens`: a session token for OpenEnv clients (which cannot send headers)."""

    ttl_s: float | None = Field(default=None, gt=0, description="lifetime; at most TASKAPP_OPENENV_TOKEN_TTL_S")
    seed: int | None = Field(default=None, description="the world of the token's HTTP env (random when null)")
    task_id: str | None = TASK_ID_FIELD
    config: dict[str, Any] = Field(default_factory=dict, description="env config, as for /create")


class TokenResponse(BaseModel):
    token: str
    expires_at: str
    base_url: str


class RevokeRequest(_Lenient):
    token: str = Field(max_length=256)
