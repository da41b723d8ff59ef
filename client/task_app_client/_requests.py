"""What the client sends: rollout requests and a step's tool calls.

`RolloutRequest` mirrors the `/rollout` body (docs/contract.md); like the answers it keeps fields it
does not know, so a newer server's options can be set before the client learns their names.
`rollout_request()` builds the common case.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TOOL_NAME = "interact_many"
ENV_NAME = "crafter"
SCRIPTED_POLICY = "crafter-scripted"
# Items of a model's output that are tool calls: OpenAI chat `tool_calls` entries ("function") and
# Responses-API output items ("function_call"); other output items (reasoning, messages) are not sent.
TOOL_CALL_TYPES = frozenset({"function", "function_call"})


def new_run_id() -> str:
    return f"client-{uuid.uuid4().hex}"


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class EnvSpec(_Request):
    """The world: a `seed`, or a `task_id` (`crafter/eval/17`: a split's task), or neither (a random one)."""

    env_name: str = ENV_NAME
    seed: int | None = None
    task_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class PolicySpec(_Request):
    policy_name: str = SCRIPTED_POLICY
    config: dict[str, Any] = Field(default_factory=dict)


class RolloutRequest(_Request):
    """A `/rollout` body. `run_id` identifies the run: the server answers a repeated run_id with the
    first run's response, which is what makes retrying a rollout safe."""

    run_id: str = Field(default_factory=new_run_id, min_length=1, max_length=200)
    mode: Literal["rl", "eval"] = "eval"
    env: EnvSpec = Field(default_factory=EnvSpec)
    policy: PolicySpec = Field(default_factory=PolicySpec)
    ops: list[Any] = Field(default_factory=lambda: ["agent", "env"] * 10)
    record: dict[str, Any] = Field(default_factory=dict)
    on_done: Literal["reset", "terminate"] = "reset"
    safety: dict[str, Any] = Field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def rollout_request(
    *,
    seed: int | None = None,
    task_id: str | None = None,
    policy: str = SCRIPTED_POLICY,
    policy_config: Mapping[str, Any] | None = None,
    decisions: int = 10,
    run_id: str | None = None,
    mode: Literal["rl", "eval"] = "eval",
    env_config: Mapping[str, Any] | None = None,
    record: Mapping[str, Any] | None = None,
    **fields: Any,
) -> RolloutRequest:
    """A rollout of `decisions` agent/env turns of `policy` on world `seed` or task `task_id` (a fresh
    run_id unless given).

    `policy_config` is the policy's config (for `crafter-react`: `model`, `inference_url`, ...); its
    `max_llm_calls` defaults to `decisions`. `fields` are further body fields (`safety`, `on_done`, ...).
    """
    config = dict(policy_config or {})
    if policy != SCRIPTED_POLICY:
        config.setdefault("max_llm_calls", decisions)
    return RolloutRequest(
        run_id=run_id or new_run_id(),
        mode=mode,
        env=EnvSpec(seed=seed, task_id=task_id, config=dict(env_config or {})),
        policy=PolicySpec(policy_name=policy, config=config),
        ops=["agent", "env"] * decisions,
        record=dict(record or {}),
        **fields,
    )


def rollout_body(request: RolloutRequest | Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body of a request; a mapping is sent as it is, with a fresh `run_id` if it has none
    (every attempt of the call then carries the same one)."""
    if isinstance(request, RolloutRequest):
        return request.body()
    body = dict(request)
    body.setdefault("run_id", new_run_id())
    return body


def _as_dict(item: Any) -> dict[str, Any]:
    """A tool call as a dict: a mapping, or an SDK object (pydantic's `model_dump`, e.g. openai's)."""
    if isinstance(item, Mapping):
        return dict(item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, dict):
            return dumped
    raise TypeError(f"a tool call must be a mapping or an SDK object with model_dump(), got {type(item).__name__}")


def tool_calls_of(
    actions: str | Sequence[str] | None = None, tool_calls: Iterable[Any] | None = None
) -> list[dict[str, Any]]:
    """A step's `tool_calls`: action names as one `interact_many` call, or a model's tool calls as it
    gave them (OpenAI chat `tool_calls`, Responses-API `function_call` items, or the seed's shapes);
    items of a Responses output that are not calls (reasoning, messages) are left out."""
    if (actions is None) == (tool_calls is None):
        raise ValueError("pass either actions or tool_calls")
    if actions is not None:
        names = [actions] if isinstance(actions, str) else list(actions)
        return [{"tool_name": TOOL_NAME, "arguments": {"actions": names}}]
    calls = [_as_dict(item) for item in tool_calls or ()]
    return [call for call in calls if call.get("type") is None or call.get("type") in TOOL_CALL_TYPES]
