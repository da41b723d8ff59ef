"""Wire models of CONTRACT.md: what trainers send and what they get back (pydantic v2).

Request models ignore unknown keys (trainers built for the seed system send extra fields); the
free-form `config` dicts are parsed into typed configs by `rollout.plan`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]+$"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EnvSpec(_Lenient):
    env_id: str | None = None
    env_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None


class PolicySpec(_Lenient):
    policy_id: str | None = None
    policy_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class RecordSpec(_Lenient):
    trajectories: bool = True
    logprobs: bool = False
    value: bool = False
    return_trace: bool = False
    trace_format: Literal["compact", "full", "structured"] = "compact"


class SafetySpec(_Lenient):
    max_ops: int = Field(default=100_000, ge=1)
    max_time_s: float = Field(default=3600.0, gt=0)


class OpSpec(_Lenient):
    type: str | None = None
    op: str | None = None


class RolloutRequest(_Lenient):
    """POST /rollout body (CONTRACT.md §2)."""

    run_id: str = Field(min_length=1, max_length=200, pattern=RUN_ID_PATTERN)
    mode: Literal["rl", "eval"]
    env: EnvSpec
    policy: PolicySpec
    ops: list[str | OpSpec]
    record: RecordSpec = Field(default_factory=RecordSpec)
    on_done: Literal["reset", "terminate"] = "reset"
    safety: SafetySpec = Field(default_factory=SafetySpec)
    training_session_id: str | None = None
    synth_base_url: str | None = None


class AbortRequest(_Lenient):
    run_id: str = Field(min_length=1, max_length=200, pattern=RUN_ID_PATTERN)


# --- responses (CONTRACT.md §3), as synth-ai 0.2.x trainers validate them ----------------------


class RolloutStep(BaseModel):
    obs: dict[str, Any]
    tool_calls: list[dict[str, Any]]
    reward: float | None = None
    done: bool
    truncated: bool | None = None
    info: dict[str, Any] | None = None


class RolloutTrajectory(BaseModel):
    env_id: str
    policy_id: str
    steps: list[RolloutStep]
    final: dict[str, Any] | None = None
    length: int
    inference_url: str | None = None
    decision_samples: list[dict[str, Any]] | None = None


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
