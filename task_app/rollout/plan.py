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

from ..core.contracts import RolloutRequest
from ..core.errors import InvalidRequest, UnknownName, json_kind, quoted
from ..core.settings import Settings
from ..core.tasks import TRAIN, Tasks, check_area
from ..game.bounds import MAX_AREA_SIDE, MAX_EPISODE_LENGTH, MIN_AREA_SIDE, valid_area
from ..game.compact_text import TextFormat
from ..policy.inference import chat_completions_url, provider_of, vendor_url
from ..policy.policy_config import PolicyConfig
from ..policy.providers import PROVIDER_CUSTOM
from .step_rewards import StepRewardConfig

logger = logging.getLogger(__name__)

ENV_NAMES = frozenset({"crafter"})
REACT, SCRIPTED = "crafter-react", "crafter-scripted"
# Accepted names (case-insensitive) → the policy; "react" is `synth-ai smoke`'s default --policy-name.
POLICY_NAMES = {"crafter-react": REACT, "crafter": REACT, "react": REACT, "crafter-scripted": SCRIPTED}
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
    text_format: TextFormat  # the observation text the policy reads: "full" or "compact"
    step_rewards: StepRewardConfig
    trace_correlation_id: str
    inference_url: str | None  # the chat-completions URL the policy calls, its query (?cid=) kept; None: no model
    return_trace: bool
    trace_format: str
    record_trajectories: bool
    record_episodes: bool  # record.tokens "episode": one token sequence per episode (episode_sequences.py)
    training_session_id: str | None
    synth_base_url: str | None
    alias_applied: bool
    continue_from: tuple[str, str] | None = None  # ("env_id" | "snapshot_id", its id): rollout/continuation.py
    record_snapshot: bool = False  # `record.snapshot`: the last state as a snapshot

    @property
    def record_tokens(self) -> bool:
        """Exact tokens per decision (`record.logprobs` or `policy.config.logprobs`)."""
        return self.policy.logprobs


def _invalid(exc: ValidationError, where: str, code: str) -> InvalidRequest:
    errors = [{"loc": [where, *error["loc"]], "msg": error["msg"], "type": error["type"]} for error in exc.errors()]
    first = errors[0]
    location = ".".join(str(part) for part in first["loc"])
    return InvalidRequest(f"{location}: {first['msg']}", code=code, errors=errors)


def apply_math_alias(request: RolloutRequest) -> tuple[RolloutRequest, bool]:
    """The old system's math→crafter remap for old trainer configs (docs/compatibility.md, "Compatibility shims")."""
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
    ops = request.ops if len(request.ops) >= 20 else [AGENT, ENV] * 10  # the old system's rule
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


def _op_name(raw: Any) -> str | None:
    name = raw.get("type") or raw.get("op") if isinstance(raw, dict) else raw
    return name if isinstance(name, str) else None


def _op_error(index: int, raw: Any) -> InvalidRequest:
    name = _op_name(raw)
    if name is not None:
        problem = f"unknown op {quoted(name)}"
    elif isinstance(raw, dict):
        problem = "an op object needs a string 'type' (or 'op')"
    else:
        problem = f"an op is a string or an object, not {json_kind(raw)}"
    aliases = "aliases: policy, model / environment, step"
    return InvalidRequest(f"ops[{index}]: {problem}; use 'agent' or 'env' ({aliases})", code="invalid_op", index=index)


def normalise_ops(raw_ops: list[Any], keep: int) -> tuple[str, ...]:
    """The first `keep` ops as `agent` / `env`. Every op is checked (a bad one anywhere is a 422 naming
    the first by index), resolving each distinct spelling once: `["agent", "env"] * 50000` costs a
    set() of the list, not 100000 alias lookups (docs/performance.md has what a long list costs)."""
    try:
        names: list[Any] = raw_ops
        distinct = set(raw_ops)  # strings, the usual form (and other scalars, which are refused)
    except TypeError:  # op objects are not hashable: take each one's name
        names = [_op_name(raw) for raw in raw_ops]
        distinct = set(names)
    canonical: dict[Any, str] = {}
    bad = []
    for name in distinct:
        op = _OP_ALIASES.get(name.strip().lower()) if isinstance(name, str) else None
        if op is None:
            bad.append(name)
        else:
            canonical[name] = op
    if bad:
        index = min(names.index(name) for name in bad)
        raise _op_error(index, raw_ops[index])
    return tuple(canonical[name] for name in names[:keep])


def check_outbound_url(
    url: str, allowed_hosts: list[str], *, field: str, kind: str, credentials_hint: str = ""
) -> None:
    """An http(s) URL this app may call (a model server, a callback receiver): no credentials in it, and
    its host in TASKAPP_INFERENCE_ALLOWED_HOSTS when that is set. 422 `invalid_<kind>_url` or
    `<kind>_host_not_allowed`."""
    not_http = InvalidRequest(f"{field} must be an http(s) URL", code=f"invalid_{kind}_url")
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
        raise InvalidRequest(f"{field} must not carry credentials{credentials_hint}", code=f"invalid_{kind}_url")
    if allowed_hosts and parts.hostname not in {host.strip().lower() for host in allowed_hosts}:
        raise InvalidRequest(
            f"{kind} host {parts.hostname!r} is not in the allowed list", code=f"{kind}_host_not_allowed"
        )


def _policy_options(policy: PolicyConfig, request: RolloutRequest, settings: Settings) -> PolicyConfig:
    """extra_body goes only to the trainer's own server; the conversation mode is text-only;
    `record.logprobs` or `record.tokens` turns exact tokens on."""
    if policy.extra_body:
        vendor = (
            policy.provider
            if not policy.inference_url
            else provider_of(chat_completions_url(policy.inference_url), settings)
        )
        if vendor and vendor != PROVIDER_CUSTOM:
            raise InvalidRequest(
                f"policy.config.extra_body is forwarded only to your own inference server, not to {vendor} "
                "(vendor routes apply the vendor's parameter rules)",
                code="extra_body_not_forwarded",
            )
    if policy.history == "messages" and (policy.use_vision or policy.image_only_mode):
        raise InvalidRequest(
            'policy.config.history "messages" is text-only; it cannot be combined with use_vision or image_only_mode',
            code="invalid_policy_config",
        )
    if policy.history_reasoning and policy.history != "messages":
        raise InvalidRequest(
            'policy.config.history_reasoning sends reasoning back in the conversation: it needs history "messages"',
            code="invalid_policy_config",
        )
    record = request.record
    return policy.model_copy(update={"logprobs": True}) if record.logprobs or record.tokens else policy


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


def _accepted_policy_names(math_alias: bool) -> str:
    """Every policy name this app accepts, aliases included, for messages."""
    accepted = []
    for policy in dict.fromkeys(POLICY_NAMES.values()):
        aliases = ", ".join(f"'{name}'" for name, target in POLICY_NAMES.items() if target == policy and name != policy)
        accepted.append(f"'{policy}'" + (f" (or {aliases})" if aliases else ""))
    text = " or ".join(accepted) + ", in any case"
    return text + ("; names starting with 'math' are remapped to 'crafter-react'" if math_alias else "")


def _names(request: RolloutRequest, math_alias: bool) -> tuple[str, str]:
    given_env = request.env.env_name or request.env.env_id or ""
    env_name = given_env.strip().lower()
    if env_name not in ENV_NAMES:
        problem = f"unknown env_name {quoted(given_env)}" if env_name else "env.env_name (or env.env_id) is missing"
        raise UnknownName(f"{problem}; this app serves 'crafter'", code="unknown_env")
    given_policy = request.policy.policy_name or request.policy.policy_id or ""
    policy_name = POLICY_NAMES.get(given_policy.strip().lower())
    if policy_name is None:
        problem = (
            f"unknown policy_name {quoted(given_policy)}"
            if given_policy.strip()
            else "policy.policy_name (or policy.policy_id) is missing"
        )
        raise UnknownName(f"{problem}; use {_accepted_policy_names(math_alias)}", code="unknown_policy")
    return env_name, policy_name


def _seed(request: RolloutRequest, area: tuple[int, int], settings: Settings) -> int:
    """The world: `env.seed` or `env.task_id` (422 when they disagree); with neither, a train seed
    derived from the run id."""
    tasks = Tasks(settings)
    task = tasks.resolve(request.env.task_id, request.env.seed, where="env.")
    check_area(task, area, where="env.config.area")
    if task is not None:
        return task.seed
    seed = request.env.seed
    if seed is None:
        return seed_from_run_id(request.run_id, tasks.splits[TRAIN].size - 1)
    if not 0 <= seed <= settings.max_seed:
        raise InvalidRequest(f"env.seed must be in [0, {settings.max_seed}]", code="seed_out_of_range")
    return seed


def _continue_from(request: RolloutRequest) -> tuple[str, str] | None:
    """`env.continue_from`: exactly one of env_id / snapshot_id, and no seed or task id beside it."""
    start = request.env.continue_from
    if start is None:
        return None
    given = [(name, value) for name, value in (("env_id", start.env_id), ("snapshot_id", start.snapshot_id)) if value]
    if len(given) != 1:
        raise InvalidRequest(
            "env.continue_from needs exactly one of env_id and snapshot_id", code="invalid_continue_from"
        )
    if request.env.seed is not None or request.env.task_id is not None:
        raise InvalidRequest(
            "env.continue_from replaces env.seed and env.task_id: send one or the other", code="invalid_continue_from"
        )
    return given[0]


def _area(env_config: EnvConfig, settings: Settings) -> tuple[int, int]:
    area = env_config.area or settings.area
    if not valid_area(area):
        raise InvalidRequest(
            f"env.config.area sides must be in [{MIN_AREA_SIDE}, {MAX_AREA_SIDE}]", code="invalid_env_config"
        )
    return (int(area[0]), int(area[1]))


def _policy_url(policy_name: str, policy: PolicyConfig, settings: Settings) -> str | None:
    if policy_name != REACT:
        return None
    if policy.inference_url:
        return chat_completions_url(policy.inference_url)
    return vendor_url(policy.provider, settings) if policy.provider else None


def build_plan(request: RolloutRequest, settings: Settings) -> RolloutPlan:
    alias_applied = False
    if settings.math_alias_enabled:
        request, alias_applied = apply_math_alias(request)
    env_name, policy_name = _names(request, settings.math_alias_enabled)
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
        check_outbound_url(
            policy.inference_url,
            settings.inference_allowed_hosts,
            field="policy.config.inference_url",
            kind="inference",
            credentials_hint="; use policy.config.api_key",
        )
    policy = _policy_options(policy, request, settings)

    if not request.ops:
        raise InvalidRequest("ops must not be empty", code="empty_ops")
    # Any length the body limit admits (the old system's trainers send up to safety.max_ops, 100000): ops
    # beyond 2 x cap are dropped, and safety.max_ops stops the rollout once that many have run.
    kept = normalise_ops(request.ops, 2 * cap)
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
        seed=_seed(request, _area(env_config, settings), settings),
        area=_area(env_config, settings),
        length=env_config.length or settings.episode_length,
        difficulty=env_config.difficulty,
        policy=policy,
        ops=kept,
        ops_dropped=len(request.ops) - len(kept),
        decision_cap=cap,
        max_steps_per_episode=steps_per_episode,
        on_done=request.on_done,
        max_ops=request.safety.max_ops,
        max_time_s=min(request.safety.max_time_s, settings.max_time_s),
        max_actions=settings.max_actions_per_decision,
        image_size=policy.image_size if (policy.use_vision or policy.image_only_mode) else None,
        text_format=request.env.observation,
        step_rewards=step_rewards,
        trace_correlation_id=trace_correlation_id(policy, request.mode, request.run_id),
        inference_url=_policy_url(policy_name, policy, settings),
        return_trace=request.record.return_trace,
        trace_format=request.record.trace_format,
        record_trajectories=request.record.trajectories,
        record_episodes=request.record.tokens == "episode",
        training_session_id=request.training_session_id,
        synth_base_url=request.synth_base_url,
        alias_applied=alias_applied,
        continue_from=_continue_from(request),
        record_snapshot=request.record.snapshot,
    )
