"""`policy.config` of a rollout request, typed: what a policy is configured with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictInt, field_validator

from ..game.bounds import MAX_IMAGE_SIZE, MIN_IMAGE_SIZE

DEFAULT_DECISIONS = 10
HISTORY_TURNS, MAX_HISTORY_TURNS = 32, 1000
HISTORY_BYTES, MAX_HISTORY_BYTES = 128 * 1024, 16 * 1024 * 1024
# What the app itself builds into every request: extra_body cannot replace them.
APP_FIELDS = frozenset(
    {"messages", "model", "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call", "stream"}
)
History = Literal["summary", "messages"]


class PolicyConfig(BaseModel):
    """`policy.config`, typed. Unknown keys are kept (vendor extras pass through)."""

    model_config = ConfigDict(extra="allow")

    inference_url: str | None = None
    model: str | None = None
    provider: Literal["openai", "groq"] | None = None
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=0.2, ge=0, le=2)
    top_p: float | None = Field(default=0.95, gt=0, le=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    max_llm_calls: StrictInt = Field(default=DEFAULT_DECISIONS, ge=1)
    use_vision: bool = False
    image_only_mode: bool = False
    image_size: StrictInt = Field(default=64, ge=MIN_IMAGE_SIZE, le=MAX_IMAGE_SIZE)
    trace_correlation_id: str | None = None
    trace: str | None = None
    step_rewards: dict[str, Any] | None = None
    # exact tokens (policy/sampled_tokens.py); `record.logprobs: true` sets it too
    logprobs: bool = False
    # merged verbatim into every request to the trainer's own server, last (docs/training-data.md)
    extra_body: dict[str, Any] | None = None
    # "summary": [system, user] with the last decisions summarised; "messages": one conversation per episode
    history: History = "summary"
    history_max_turns: StrictInt = Field(default=HISTORY_TURNS, ge=1, le=MAX_HISTORY_TURNS)
    history_max_bytes: StrictInt = Field(default=HISTORY_BYTES, ge=1024, le=MAX_HISTORY_BYTES)
    # the weights' version when no answer names one (policy/versions.py), and how many versions apart a
    # rollout's decisions may be before it stops (stop_reason "version_lag")
    policy_version: StrictInt | None = Field(default=None, ge=0)
    max_version_lag: StrictInt | None = Field(default=None, ge=0)
    # history "messages": send each answer's reasoning (`reasoning_content` / `reasoning`) back with it
    history_reasoning: bool = False

    @field_validator("extra_body")
    @classmethod
    def _no_app_fields(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(APP_FIELDS & set(value or {}))
        if taken:
            raise ValueError(f"extra_body cannot set {', '.join(taken)}: the task app builds those")
        return value
