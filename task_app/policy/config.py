"""`policy.config` of a rollout request, typed: what a policy is configured with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StrictInt

from ..game.bounds import MAX_IMAGE_SIZE, MIN_IMAGE_SIZE

DEFAULT_DECISIONS = 10


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
