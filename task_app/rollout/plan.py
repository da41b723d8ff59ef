"""Turn a validated RolloutRequest into a RolloutPlan: every default, cap and alias resolved once.

All client mistakes surface here as `InvalidRequest` with a precise code, before any world is built.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from ..core.contracts import OpSpec, RolloutRequest
from ..core.errors import InvalidRequest, UnknownName
from ..core.settings import Settings
from ..game.bounds import MAX_AREA_SIDE, MAX_EPISODE_LENGTH, MIN_AREA_SIDE, valid_area
from ..policy.config import PolicyConfig
from .rewards import StepRewardConfig

logger = logging.getLogger(__name__)

ENV_NAMES = frozenset({"crafter"})
REACT, SCRIPTED = "crafter-react", "crafter-scripted"
POLICY_NAMES = {"crafter-react": REACT, "crafter": REACT, "crafter-scripted": SCRIPTED}
AGENT, ENV = "agent", "env"
_OP_ALIASES = {"agent": AGENT, "policy": AGENT, "model": AGENT, "env": ENV, "environment": ENV, "step": ENV}
_TRACE_PARAMS = ("cid", "trace", "trace_correlation_id")
_NOT_IN_URL = re.compile(r"[\s\x00-\x1f\x7f]")  # whitespace and control characters (header injection, typos)


class EnvParams(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_steps_per_episode: StrictInt | None = Field(default=None, ge=1, le=MAX_EPISODE_LENGTH)


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="allow")

    env_params: EnvParams = Field(default_factory=EnvParams)
    difficulty: str | None = None
    area: tuple[StrictInt, StrictInt] | None = None
    length: StrictInt | None = Field(default=None, ge=1, le=MAX_EPISODE_LENGTH)
    step_rewards: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    run_id: str
    mode: str
    env_name: str
    policy_name: str
    seed: int
    area: tuple[int, int]
    length: int
    difficulty: str | None
    policy: PolicyConfig
    ops: tuple[str, ...]
    ops_dropped: int
    decision_cap: int
    max_steps_per_episode: int
    on_done: str
    max_ops: int
    max_time_s: float
    max_actions: int
    image_size: int | None
    step_rewards: StepRewardConfig
    trace_correlation_id: str
    inference_url: str | None
    return_trace: bool
    trace_format: str
    record_trajectories: bool
    training_session_id: str | None
    synth_base_url: str | None
    alias_applied: bool


def _invalid(exc: ValidationError, where: str, code: str) -> InvalidRequest:
    errors = [{"loc": [where, *error["loc"]], "msg": error["msg"], "type": error["type"]} for error in exc.errors()]
    first = errors[0]
    location = ".".join(str(part) for part in first["loc"])
    return InvalidRequest(f"{location}: {first['msg']}", code=code, errors=errors)


def apply_math_alias(request: RolloutRequest) -> tuple[RolloutRequest, bool]:
    """The seed system's math→crafter remap for old trainer configs (seed-behaviour §11)."""
    names = (request.env.env_name, request.env.env_id, request.policy.policy_name, request.policy.policy_id)
    if not any(isinstance(name, str) and name.strip().lower().startswith("math") for name in names):
        return request, False
    shaping = {"enabled": True, "mode": "decision_stepwise", "indicator_lambda": 1.0, "step_beta": 0.0}
    env_config = {
        "difficulty": "normal",
        "step_rewards": shaping,
        "env_params": {"max_steps_per_episode": 200},
    }
    env_config.update(request.env.config)
    policy_config = {
        "max_llm_calls": 10,
        "max_completion_tokens": 1024,
        "temperature": 0.2,
        "step_rewards": shaping,
    }
    policy_config.update(request.policy.config)
    ops = request.ops if len(request.ops) >= 20 else [AGENT, ENV] * 10  # noqa: PLR2004 - seed's rule
    remapped = request.model_copy(
        update={
            "env": request.env.model_copy(update={"env_name": "crafter", "env_id": None, "config": env_config}),
            "policy": request.policy.model_copy(
                update={"policy_name": REACT, "policy_id": None, "config": policy_config}
            ),
            "ops": ops,
        }
    )
    logger.info("remapped math request to crafter", extra={"run_id": request.run_id})
    return remapped, True


def normalise_ops(raw_ops: list[str | OpSpec]) -> list[str]:
    ops = []
    for index, raw in enumerate(raw_ops):
        name = raw if isinstance(raw, str) else (raw.type or raw.op)
        op = _OP_ALIASES.get(name.strip().lower()) if isinstance(name, str) else None
        if op is None:
            raise InvalidRequest(f"ops[{index}]: unknown op {name!r}; use 'agent' or 'env'", code="invalid_op")
        ops.append(op)
    return ops


def check_inference_url(url: str, allowed_hosts: list[str]) -> None:
    not_http = InvalidRequest("policy.config.inference_url must be an http(s) URL", code="invalid_inference_url")
    url = url.strip()  # surrounding whitespace is forgiven, as chat_completions_url does
    if _NOT_IN_URL.search(url):
        raise not_http
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:  # e.g. "http://[::1/v1" (unbalanced IPv6 bracket), "http://h:99999"
        raise not_http from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise not_http
    if parts.username or parts.password:
        raise InvalidRequest(
            "policy.config.inference_url must not carry credentials; use policy.config.api_key",
            code="invalid_inference_url",
        )
    if allowed_hosts and parts.hostname not in {host.strip().lower() for host in allowed_hosts}:
        raise InvalidRequest(
            f"inference host {parts.hostname!r} is not in the allowed list", code="inference_host_not_allowed"
        )


def trace_correlation_id(config: PolicyConfig, mode: str, run_id: str) -> str:
    for value in (config.trace_correlation_id, config.trace):
        if value and value.strip():
            return value.strip()
    if config.inference_url:
        query = parse_qs(urlsplit(config.inference_url).query)
        for key in _TRACE_PARAMS:
            for value in query.get(key, []):
                if value.strip():
                    return value.strip()
    if mode == "rl":
        raise InvalidRequest(
            "rl mode needs a trace correlation id: policy.config.trace_correlation_id or ?cid= on inference_url",
            code="missing_trace_correlation_id",
        )
    return f"trace_{run_id}"


def seed_from_run_id(run_id: str, max_seed: int) -> int:
    """A stable seed for requests without one (the seed system always played world 0)."""
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big") % (max_seed + 1)


def _names(request: RolloutRequest) -> tuple[str, str]:
    env_name = (request.env.env_name or request.env.env_id or "").strip().lower()
    if env_name not in ENV_NAMES:
        raise UnknownName(f"unknown env_name {env_name or None!r}; this app serves 'crafter'", code="unknown_env")
    raw_policy = (request.policy.policy_name or request.policy.policy_id or "").strip().lower()
    policy_name = POLICY_NAMES.get(raw_policy)
    if policy_name is None:
        raise UnknownName(
            f"unknown policy_name {raw_policy or None!r}; use one of {sorted(set(POLICY_NAMES.values()))}",
            code="unknown_policy",
        )
    return env_name, policy_name


def _seed(request: RolloutRequest, settings: Settings) -> int:
    seed = request.env.seed
    if seed is None:
        return seed_from_run_id(request.run_id, settings.max_seed)
    if not 0 <= seed <= settings.max_seed:
        raise InvalidRequest(f"env.seed must be in [0, {settings.max_seed}]", code="seed_out_of_range")
    return seed


def _area(env_config: EnvConfig, settings: Settings) -> tuple[int, int]:
    area = env_config.area or settings.area
    if not valid_area(area):
        raise InvalidRequest(
            f"env.config.area sides must be in [{MIN_AREA_SIDE}, {MAX_AREA_SIDE}]", code="invalid_env_config"
        )
    return (int(area[0]), int(area[1]))


def build_plan(request: RolloutRequest, settings: Settings) -> RolloutPlan:
    alias_applied = False
    if settings.math_alias_enabled:
        request, alias_applied = apply_math_alias(request)
    env_name, policy_name = _names(request)
    try:
        policy = PolicyConfig.model_validate(request.policy.config)
    except ValidationError as exc:
        raise _invalid(exc, "policy.config", "invalid_policy_config") from exc
    try:
        env_config = EnvConfig.model_validate(request.env.config)
    except ValidationError as exc:
        raise _invalid(exc, "env.config", "invalid_env_config") from exc

    cap = policy.max_llm_calls
    if cap > settings.max_decisions:
        raise InvalidRequest(
            f"policy.config.max_llm_calls must be at most {settings.max_decisions}",
            code="invalid_policy_config",
        )
    steps_per_episode = max(cap, env_config.env_params.max_steps_per_episode or cap)
    if policy_name == REACT:
        if not policy.model:
            raise InvalidRequest("crafter-react needs policy.config.model", code="missing_model")
        if not policy.inference_url and not policy.provider:
            raise InvalidRequest(
                "crafter-react needs policy.config.inference_url or policy.config.provider",
                code="missing_inference_url",
            )
    if policy.inference_url:
        check_inference_url(policy.inference_url, settings.inference_allowed_hosts)

    if not request.ops:
        raise InvalidRequest("ops must not be empty", code="empty_ops")
    if len(request.ops) > settings.max_ops_length:
        raise InvalidRequest(f"ops has more than {settings.max_ops_length} items", code="too_many_ops")
    ops = normalise_ops(request.ops)
    kept = ops[: 2 * cap]
    step_rewards_raw = policy.step_rewards or env_config.step_rewards or {}
    try:
        step_rewards = StepRewardConfig.model_validate(step_rewards_raw)
    except ValidationError as exc:
        raise _invalid(exc, "step_rewards", "invalid_step_rewards") from exc

    return RolloutPlan(
        run_id=request.run_id,
        mode=request.mode,
        env_name=env_name,
        policy_name=policy_name,
        seed=_seed(request, settings),
        area=_area(env_config, settings),
        length=env_config.length or settings.episode_length,
        difficulty=env_config.difficulty,
        policy=policy,
        ops=tuple(kept),
        ops_dropped=len(ops) - len(kept),
        decision_cap=cap,
        max_steps_per_episode=steps_per_episode,
        on_done=request.on_done,
        max_ops=request.safety.max_ops,
        max_time_s=min(request.safety.max_time_s, settings.max_time_s),
        max_actions=settings.max_actions_per_decision,
        image_size=policy.image_size if (policy.use_vision or policy.image_only_mode) else None,
        step_rewards=step_rewards,
        trace_correlation_id=trace_correlation_id(policy, request.mode, request.run_id),
        inference_url=policy.inference_url,
        return_trace=request.record.return_trace,
        trace_format=request.record.trace_format,
        record_trajectories=request.record.trajectories,
        training_session_id=request.training_session_id,
        synth_base_url=request.synth_base_url,
        alias_applied=alias_applied,
    )
