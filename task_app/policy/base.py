"""What the rollout engine needs from a policy, what a policy hands back, and the text of a chat message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from ..game import ActionPlan, Observation

if TYPE_CHECKING:
    from .sampled_tokens import TokenData
    from .versions import PolicyVersion


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One earlier decision of this rollout, as a policy may want to recall it."""

    decision_index: int
    actions: tuple[str, ...]
    achievements_added: tuple[str, ...]
    reward: float
    rejected: int = 0


@dataclass(slots=True)
class LMCall:
    """One chat-completions exchange, kept for traces and SFT export."""

    model: str
    provider: str
    url: str
    messages: list[dict[str, Any]]
    request_params: dict[str, Any]
    started_at: datetime
    finished_at: datetime
    latency_ms: float
    attempts: int = 1
    response: dict[str, Any] | None = None
    assistant_message: dict[str, Any] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    tokens: TokenData | None = None  # exact tokens, when the rollout asked for them (policy/sampled_tokens.py)
    # the parsed `arguments` of each of `assistant_message["tool_calls"]` (parsed once, by the policy)
    tool_arguments: list[Any] | None = None

    @property
    def input_tokens(self) -> int | None:
        value = self.usage.get("prompt_tokens", self.usage.get("input_tokens"))
        return int(value) if isinstance(value, int | float) else None

    @property
    def output_tokens(self) -> int | None:
        value = self.usage.get("completion_tokens", self.usage.get("output_tokens"))
        return int(value) if isinstance(value, int | float) else None

    @property
    def total_tokens(self) -> int | None:
        value = self.usage.get("total_tokens")
        if isinstance(value, int | float):
            return int(value)
        prompt, completion = self.input_tokens, self.output_tokens
        return prompt + completion if prompt is not None and completion is not None else None


def content_text(content: Any) -> str:
    """The plain text of an OpenAI message `content`: a string, or the text parts of a list joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


@dataclass(slots=True)
class PolicyDecision:
    """A policy's answer for one decision.

    `tool_calls` are the calls as the policy (or model) produced them; the game layer normalises
    them into actions, unless the policy already did: then `plan` holds its `ActionPlan` and the engine
    plays it. `usable` is False when the answer had nothing executable (it then plays a `noop`, and
    `meta["unusable_reason"]` says why).
    """

    tool_calls: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    usable: bool = True
    lm_call: LMCall | None = None
    plan: ActionPlan | None = None
    version: PolicyVersion | None = None  # the weights that answered (policy/versions.py)


class Policy(Protocol):
    """A decision maker for one rollout. Instances are per rollout and never shared."""

    name: str

    async def decide(self, observation: Observation, history: Sequence[HistoryEntry]) -> PolicyDecision: ...

    async def aclose(self) -> None: ...


class PolicyError(Exception):
    """The policy could not produce a decision at all (e.g. the model server kept failing).

    Carries a machine-readable `code` that becomes the rollout's `stop_reason` detail.
    """

    def __init__(self, message: str, *, code: str = "policy_error", status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
