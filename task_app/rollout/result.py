"""What a rollout produced, and its RolloutResponse (docs/contract.md, "The rollout response").

The engine appends one `DecisionRecord` per env op; tracing builds traces from the same records, so
the response and the stored trace can never disagree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from statistics import fmean
from typing import Any

from ..core.json_codec import dumps_bytes
from ..game import ActionPlan, DecisionOutcome
from ..policy.base import PolicyDecision
from ..policy.sampled_tokens import TokenData
from .continuation import RolloutEnd
from .failures import ErrorClass, exclusion, failure, policy_failure, storage_failure
from .plan import RolloutPlan
from .scores import RolloutScores
from .step_rewards import StepwiseResult


class StopReason(enum.StrEnum):
    """Why a rollout stopped (`metrics.details.stop_reason`); all but the first two set `aborted`."""

    COMPLETED = "completed"  # every op ran
    EPISODE_DONE = "episode_done"  # on_done=terminate and the episode ended
    MAX_OPS = "max_ops"
    DEADLINE = "deadline"
    ABORTED = "aborted"
    POLICY_UNUSABLE = "policy_unusable"
    POLICY_ERROR = "policy_error"
    VERSION_LAG = "version_lag"  # policy.config.max_version_lag: the decisions spanned too many versions
    INTERNAL = "internal_error"  # a bug in the task app stopped the rollout (logged with its traceback)

    @property
    def aborts(self) -> bool:
        return self not in (StopReason.COMPLETED, StopReason.EPISODE_DONE)


@dataclass(slots=True)
class DecisionRecord:
    """One env op: the observation the policy saw, what it decided and what happened."""

    index: int  # 0-based over the whole rollout; also the trace's turn number
    episode: int  # 0-based
    obs_text: str  # observation BEFORE the action
    decision: PolicyDecision | None  # None when an env op ran without a preceding agent op
    plan: ActionPlan
    outcome: DecisionOutcome
    obs_after_text: str
    done: bool
    truncated: bool
    started_at: datetime
    finished_at: datetime
    env_ms: float
    stepwise: StepwiseResult | None = None
    event_values: dict[str, float] | None = None  # each event criterion's value (rubric_scores.py)
    event_scores: dict[str, Any] | None = None  # the step's info.event_scores: the event rubric over this decision

    @property
    def reward(self) -> float | None:
        """The step reward on the wire: achievements unlocked, or null when none (as the old system sent it)."""
        return self.outcome.reward or None

    def step_info(self, inference_url: str | None = None) -> dict[str, Any]:
        """The step's `info`; `meta` carries the old system's per-step fields that trainers read
        (docs/compatibility.md, "Per-step fields"): `inference_url` (the policy's URL, which synth-ai's
        RL validation requires on every step), `turn_index`, `inference_ms`, `usage` and `timing`. The
        request sent and the raw answer stay in the trace."""
        meta: dict[str, Any] = {
            "decision_index": self.index,
            "episode": self.episode,
            "actions": self.outcome.actions,
            "env_ms": round(self.env_ms, 3),
        }
        if self.plan.rejected:
            meta["rejected"] = [rejection.as_dict() for rejection in self.plan.rejected]
        if self.plan.fallback_noop:
            meta["fallback_noop"] = True
        call = self.decision.lm_call if self.decision is not None else None
        if self.decision is None:
            meta["injected_noop"] = True
        else:
            meta.update(self.decision.meta)
        if inference_url:
            meta["inference_url"] = inference_url
        meta["turn_index"] = self.index
        if call is not None:
            meta["inference_ms"] = round(call.latency_ms, 1)
            meta.setdefault("usage", call.usage)
        meta["timing"] = self.timing()
        info: dict[str, Any] = {"achievements_added": list(self.outcome.unlocked), "meta": meta}
        if self.stepwise is not None:
            meta["decision_rewards"] = self.stepwise.decision_rewards
            info["stepwise"] = self.stepwise.info
        if self.event_scores is not None:
            info["event_scores"] = self.event_scores
        return info

    @property
    def tokens(self) -> TokenData | None:
        """The decision's exact tokens (None without a model call or when they were not asked for)."""
        call = self.decision.lm_call if self.decision is not None else None
        return call.tokens if call is not None else None

    def timing(self) -> dict[str, float]:
        """Where the decision's time went. `*_s` are Unix times (the old system's were perf_counter values,
        meaningless outside its process); `decision_ms` runs from the model request to the end of the
        env step, `overhead_ms` is what neither the model nor the game took (parsing, hand-offs)."""
        env_end = self.finished_at.timestamp()
        timing = {"env_step_ms": round(self.env_ms, 3), "env_step_end_s": round(env_end, 6)}
        call = self.decision.lm_call if self.decision is not None else None
        if call is not None:
            start = call.started_at.timestamp()
            decision_ms = (env_end - start) * 1000
            timing.update(
                agent_request_start_s=round(start, 6),
                agent_response_s=round(call.finished_at.timestamp(), 6),
                inference_ms=round(call.latency_ms, 3),
                decision_ms=round(decision_ms, 3),
                overhead_ms=round(max(0.0, decision_ms - call.latency_ms - self.env_ms), 3),
            )
        return timing

    def step(self, inference_url: str | None = None, *, tokens: bool = False) -> dict[str, Any]:
        """The trajectory step; with `tokens`, the step's `logprob` (the completion's summed logprobs) and
        `info.tokens` (policy/sampled_tokens.py; null for a decision without a model call)."""
        info = self.step_info(inference_url)
        step: dict[str, Any] = {
            "obs": {"text": self.obs_text},
            "tool_calls": [self.plan.tool_call()],
            "reward": self.reward,
            "done": self.done,
            "truncated": self.truncated,
            "info": info,
        }
        if tokens:
            data = self.tokens
            step["logprob"] = data.logprob if data is not None else None
            info["tokens"] = data.as_dict() if data is not None else None
        return step


@dataclass(slots=True)
class EpisodeSummary:
    index: int
    decisions: int = 0
    steps: int = 0  # primitive crafter steps
    episode_return: float = 0.0
    achievements: list[str] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "decisions": self.decisions,
            "steps": self.steps,
            "return": self.episode_return,
            "achievements": self.achievements,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }


@dataclass(slots=True)
class RolloutResult:
    plan: RolloutPlan
    started_at: datetime
    records: list[DecisionRecord] = field(default_factory=list)
    episodes: list[EpisodeSummary] = field(default_factory=list)
    ops_executed: int = 0
    decisions: int = 0
    unusable_answers: int = 0
    stop_reason: StopReason = StopReason.COMPLETED
    error: dict[str, Any] | None = None
    final_obs_text: str = ""
    finished_at: datetime | None = None
    stepwise_summary: dict[str, Any] | None = None
    decision_samples: list[dict[str, Any]] | None = None
    storage: dict[str, Any] | None = None
    rubric_scores: RolloutScores | None = None
    policy_versions: set[int] = field(default_factory=set)  # of the decisions played (policy/versions.py)
    end: RolloutEnd | None = None  # the last state, with `record.snapshot` (rollout/continuation.py)
    snapshot_id: str | None = None  # where the service stored `end`
    episode_sequences: list[dict[str, Any]] | None = None  # record.tokens "episode" (episode_sequences.py)

    @property
    def aborted(self) -> bool:
        return self.stop_reason.aborts

    @property
    def final_achievements(self) -> list[str]:
        return self.episodes[-1].achievements if self.episodes else []

    @property
    def env_id(self) -> str:
        return f"crafter:{self.plan.seed}:{self.plan.run_id}"

    @property
    def policy_id(self) -> str:
        return f"{self.plan.policy_name}:{self.plan.run_id}"

    def failure(self) -> dict[str, Any] | None:
        """`metrics.details.error` (rollout/failures.py) when the rollout did not complete normally."""
        plan, reason = self.plan, self.stop_reason
        if reason == StopReason.POLICY_ERROR and self.error:
            return policy_failure(self.error)
        if reason == StopReason.POLICY_UNUSABLE:
            message = (self.error or {}).get("message") or "the model's answers had no executable action"
            return failure(ErrorClass.MODEL_UNUSABLE, str(message), False)
        if reason == StopReason.DEADLINE:
            message = f"the rollout's deadline (safety.max_time_s = {plan.max_time_s:g} s) ran out"
            return failure(ErrorClass.DEADLINE, message, True)
        if reason == StopReason.ABORTED:
            return failure(ErrorClass.ABORTED, "the rollout was aborted (/run/abort, or the client went away)", False)
        if reason == StopReason.MAX_OPS:
            return failure(ErrorClass.ABORTED, f"safety.max_ops ({plan.max_ops}) was reached", False)
        if reason == StopReason.VERSION_LAG:
            message = (self.error or {}).get("message") or "the decisions spanned too many policy versions"
            return failure(ErrorClass.VERSION_LAG, str(message), True)
        if reason == StopReason.INTERNAL:
            message = (self.error or {}).get("message") or "internal error"
            return failure(ErrorClass.INTERNAL, str(message), True)
        return storage_failure(self.storage)

    def _episode_details(self) -> list[dict[str, Any]]:
        episodes = [episode.as_dict() for episode in self.episodes]
        for scored in self.rubric_scores.episodes if self.rubric_scores is not None else []:
            episodes[scored.index].update(
                ending=scored.ending, outcome_score=scored.outcome.score, events_score=scored.events.score
            )
        return episodes

    def metrics(self) -> dict[str, Any]:
        returns = [episode.episode_return for episode in self.episodes] or [0.0]
        achievements = self.final_achievements
        scores = self.rubric_scores
        details: dict[str, Any] = {
            "achievements": achievements,
            "achievement_count": len(achievements),
            "all_achievements": sorted({name for ep in self.episodes for name in ep.achievements}),
            "stop_reason": self.stop_reason.value,
            "seed": self.plan.seed,
            "decisions": self.decisions,
            "actions_executed": sum(len(record.outcome.results) for record in self.records),
            "rejected_actions": sum(len(record.plan.rejected) for record in self.records),
            "unusable_answers": self.unusable_answers,
            "policy_versions": sorted(self.policy_versions),
            "ops_dropped": self.plan.ops_dropped,
            "episodes": self._episode_details(),
            "duration_s": round(((self.finished_at or self.started_at) - self.started_at).total_seconds(), 4),
        }
        error = self.failure()
        if error is not None:
            details["error"] = error
        details["exclude"], details["failure_kind"] = exclusion(error)
        if scores is not None:
            details["rubrics"] = scores.details()
        if self.stepwise_summary is not None:
            details["stepwise"] = self.stepwise_summary
        if self.storage:
            details["storage"] = self.storage
        return {
            "episode_returns": returns,
            "mean_return": fmean(returns),
            "num_steps": len(self.records),
            "num_episodes": len(self.episodes),
            "outcome_score": scores.outcome.score if scores is not None else None,
            "events_score": scores.events.score if scores is not None else None,
            "details": details,
        }

    def _final(self) -> dict[str, Any]:
        final: dict[str, Any] = {"observation": {"text": self.final_obs_text}}
        if self.plan.record_snapshot:
            final["snapshot_id"] = self.snapshot_id
        return final

    def response(self, trace: dict[str, Any] | None = None) -> dict[str, Any]:
        """The RolloutResponse body."""
        plan = self.plan
        steps = []
        if plan.record_trajectories:
            steps = [record.step(plan.inference_url, tokens=plan.record_tokens) for record in self.records]
        trajectory = {
            "env_id": self.env_id,
            "policy_id": self.policy_id,
            "steps": steps,
            "final": self._final(),
            "length": len(self.records),
            # A string, as synth-ai's RolloutTrajectory requires; empty when the policy calls no model.
            "inference_url": plan.inference_url or "",
            "decision_samples": self.decision_samples,
        }
        if self.episode_sequences is not None:
            trajectory["episode_sequences"] = self.episode_sequences
        return {
            "run_id": plan.run_id,
            "trajectories": [trajectory],
            "branches": {},
            "metrics": self.metrics(),
            "aborted": self.aborted,
            "ops_executed": self.ops_executed,
            "trace_correlation_id": plan.trace_correlation_id,
            "trace": trace,
            "pipeline_metadata": {
                "trace_correlation_id": plan.trace_correlation_id,
                "inference_url": plan.inference_url,
                "alias_applied": plan.alias_applied,
                "policy_name": plan.policy_name,
                "seed": plan.seed,
            },
        }

    def response_bytes(self, trace: dict[str, Any] | None = None) -> bytes:
        """The RolloutResponse body as JSON."""
        return dumps_bytes(self.response(trace))
