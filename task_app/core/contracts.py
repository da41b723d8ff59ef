"""Wire models of docs/contract.md: what trainers send and what they get back (pydantic v2).

Request models ignore unknown keys (trainers built for the old system send extra fields); the
free-form `config` dicts are parsed into typed configs by `rollout.plan`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from .tasks import TASK_ID_MAX_LENGTH

# Letters, digits and `._:-`, with no two dots in a row and at least one character that is not a dot:
# "." and ".." are path names, and a run id ends up in URLs and file names (no lookahead: the pattern
# is checked by pydantic-core's regex engine and published in the OpenAPI schema).
RUN_ID_PATTERN = r"^\.?(?:[A-Za-z0-9_:-]+\.)*[A-Za-z0-9_:-]+\.?$"
RUN_ID_MAX_LENGTH = 200


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContinueFrom(_Lenient):
    """Where a rollout continues instead of starting a seed's world: one of the two (docs/rollouts.md)."""

    env_id: str | None = Field(default=None, max_length=200, description="an env session, its current state")
    snapshot_id: str | None = Field(default=None, max_length=200, description="a snapshot (or a rollout's)")


class EnvSpec(_Lenient):
    env_id: str | None = None
    env_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    task_id: str | None = Field(
        default=None, max_length=TASK_ID_MAX_LENGTH, description="the world by task id, e.g. crafter/eval/17"
    )
    observation: Literal["full", "compact"] = Field(
        default="full", description='the observation text the policy reads: "full" or "compact"'
    )
    continue_from: ContinueFrom | None = None


class PolicySpec(_Lenient):
    policy_id: str | None = None
    policy_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class RecordSpec(_Lenient):
    trajectories: bool = True
    logprobs: bool = False
    tokens: Literal["decision", "episode"] | None = Field(
        default=None,
        description='"decision": exact tokens per decision (as logprobs: true); '
        '"episode": also one token sequence per episode (docs/episode-sequences.md)',
    )
    value: bool = False
    return_trace: bool = False
    trace_format: Literal["compact", "full", "structured"] = "compact"
    snapshot: bool = Field(default=False, description="snapshot the last state: trajectories[0].final.snapshot_id")


class SafetySpec(_Lenient):
    max_ops: int = Field(default=100_000, ge=1)
    max_time_s: float = Field(default=3600.0, gt=0)


# One op: "agent" / "env" (or an alias), or {"type": ...} / {"op": ...}. Typed loosely on purpose:
# `rollout.plan.normalise_ops` checks every item cheaply and names the first bad one by index. The
# pydantic union `str | OpSpec` it replaces took ~0.6 s to validate 100000 object ops and over 2 s to
# refuse 100000 numbers (two errors per item, all returned), on the event loop.
Op = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "examples": ["agent", "env"]},
                {"type": "object", "properties": {"type": {"type": "string"}, "op": {"type": "string"}}},
            ]
        }
    ),
]


class RolloutRequest(_Lenient):
    """POST /rollout body (docs/contract.md, "The rollout request")."""

    # The OpenAPI example: the built-in scripted policy, no model needed (the fuzz test sends it).
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "run_id": "example-scripted-1",
                    "mode": "eval",
                    "env": {"env_name": "crafter", "seed": 1},
                    "policy": {"policy_name": "crafter-scripted"},
                    "ops": ["agent", "env", "agent", "env"],
                }
            ]
        },
    )

    run_id: str = Field(min_length=1, max_length=RUN_ID_MAX_LENGTH, pattern=RUN_ID_PATTERN)
    mode: Literal["rl", "eval"]
    env: EnvSpec
    policy: PolicySpec
    ops: list[Op]
    record: RecordSpec = Field(default_factory=RecordSpec)
    on_done: Literal["reset", "terminate"] = "reset"
    safety: SafetySpec = Field(default_factory=SafetySpec)
    training_session_id: str | None = None
    synth_base_url: str | None = None


class AsyncRolloutRequest(RolloutRequest):
    """One rollout of `POST /rollouts`: a RolloutRequest, and where to send its response when it ends."""

    model_config = ConfigDict(extra="ignore")

    callback_url: str | None = Field(default=None, max_length=2048)


class AbortRequest(_Lenient):
    run_id: str = Field(min_length=1, max_length=RUN_ID_MAX_LENGTH, pattern=RUN_ID_PATTERN)


# --- responses (docs/contract.md, "The rollout response"), as synth-ai 0.2.x trainers validate them -----


class RolloutStep(BaseModel):
    obs: dict[str, Any]
    tool_calls: list[dict[str, Any]]
    reward: float | None = None
    done: bool
    truncated: bool | None = None
    info: dict[str, Any] | None = None
    # Only with exact tokens (record.logprobs): the completion's log-probability, the sum of its token
    # logprobs; info.tokens holds the ids and per-token logprobs. synth-ai 0.2.x's RolloutStep has no
    # such field (its validation drops it; info.tokens survives).
    logprob: float | None = None


class RolloutTrajectory(BaseModel):
    env_id: str
    policy_id: str
    steps: list[RolloutStep]
    final: dict[str, Any] | None = None
    length: int
    inference_url: str  # the policy's chat-completions URL (with its ?cid=); empty when it calls no model
    decision_samples: list[dict[str, Any]] | None = None
    # record.tokens "episode": one token sequence per episode (rollout/episode_sequences.py)
    episode_sequences: list[dict[str, Any]] | None = None


class RolloutMetrics(BaseModel):
    episode_returns: list[float]
    mean_return: float
    num_steps: int
    num_episodes: int = 0
    outcome_score: float | None = None
    events_score: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class PipelineMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    trace_correlation_id: str
    inference_url: str | None = None


class RolloutResponse(BaseModel):
    run_id: str
    trajectories: list[RolloutTrajectory]
    branches: dict[str, list[str]] = Field(default_factory=dict)
    metrics: RolloutMetrics
    aborted: bool = False
    ops_executed: int = 0
    trace_correlation_id: str
    trace: dict[str, Any] | None = None
    pipeline_metadata: PipelineMetadata


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody
    detail: str


# --- the other endpoints' answers (OpenAPI documentation; handlers return the bytes directly) ------


class RootResponse(BaseModel):
    """`GET /`."""

    model_config = ConfigDict(extra="allow")
    status: Literal["ok"]
    service: str


class HealthResponse(BaseModel):
    """`GET /health` (200 when ready; 503 with the same shape and a `detail` when no API key is configured)."""

    model_config = ConfigDict(extra="allow")
    healthy: bool
    service: str
    auth: dict[str, bool]
    storage: dict[str, Any]
    rollouts: dict[str, int]
    detail: str | None = None


RunStatusName = Literal["queued", "running", "completed", "aborted", "failed", "lost"]


class RunStatusResponse(BaseModel):
    """`GET /run/status/{run_id}` and `GET /runs/{run_id}`: the run as any process of the fleet sees it."""

    model_config = ConfigDict(extra="allow")
    run_id: str
    status: RunStatusName
    attempt: int
    started_at: str | None
    finished_at: str | None
    progress: dict[str, Any]
    status_url: str
    result_url: str
    callback: dict[str, Any] | None = None


class SubmittedRun(BaseModel):
    """One run of a `POST /rollouts` answer; `accepted` false: the run_id was taken, as `status` says."""

    model_config = ConfigDict(extra="allow")
    run_id: str
    attempt: int
    status: RunStatusName
    accepted: bool
    status_url: str
    result_url: str


class SubmitResponse(BaseModel):
    """`POST /rollouts` (202)."""

    runs: list[SubmittedRun]


class AbortResponse(BaseModel):
    """`POST /run/abort`: the run's status after the abort was requested."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    run_id: str
    status: RunStatusName


class DoneResponse(BaseModel):
    """`POST /done`."""

    model_config = ConfigDict(extra="allow")
    ok: bool
    service: str
