"""The ops loop: `agent` asks the policy for a decision, `env` applies it to the game.

    plan ──► world (cache or fresh, worker thread) ──► for op in ops:
                 agent: policy.decide(obs, history)          (awaited under deadline + abort)
                 env:   game.step(actions) (on the loop, in turn; a worker thread to render a frame)
                        → rewards → record → on_record (trace rows)
                 episode over? on_done: reset (lazily, at the next op) | terminate
             ──► RolloutResult (partial when a limit stopped it)

Nothing here knows about HTTP. A decision's step without a frame (the text observation only) runs
on the event loop: it is Python that holds the GIL wherever it runs, and handing it to a worker
thread and back costs more CPU than the step (two thread wake-ups, the GIL passed back and forth;
docs/performance.md has the figures). A wave of decisions takes turns (`pace`, core.pacing), so that
one loop iteration does not run them all. What can take milliseconds goes through `offload`:
building or generating the world (the compiled generator releases the GIL), a step that renders a
frame for a vision policy, and the rubric scores and response encoding of a long rollout
(SHORT_ROLLOUT).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from time import perf_counter
from typing import Any

import anyio

from ..core.offload import Offload, run_in_thread
from ..core.rubrics import Rubric
from ..game import Game, Observation, WorldFactory, normalise_tool_calls
from ..game.actions import NOOP, plan_from_names
from ..game.checkpoint import dump_game, load_game
from ..game.compact_text import observation_text
from ..policy.base import HistoryEntry, Policy, PolicyDecision, PolicyError
from .continuation import RolloutEnd, RolloutStart, carried
from .control import RunControl
from .episode_sequences import rollout_sequences
from .plan import AGENT, RolloutPlan
from .result import DecisionRecord, EpisodeSummary, RolloutResult, StopReason
from .rubric_scores import decision_event_scores, score_rollout
from .scores import EVENTS
from .step_rewards import StepRewardShaper

logger = logging.getLogger(__name__)

# A rollout of at most this many decisions ends on the event loop: its rubric scores here and its
# response's encoding in the service take microseconds a decision. Handed to a worker thread, each
# cost a round trip through the loop too, and at a thousand rollouts in flight the ends queued behind
# one another for the two threads (docs/performance.md).
SHORT_ROLLOUT = 100


class _Stop(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


class RolloutEngine:
    """Runs one rollout. Instances are single-use; nothing is shared with other rollouts."""

    def __init__(
        self,
        plan: RolloutPlan,
        policy: Policy,
        worlds: WorldFactory,
        *,
        control: RunControl | None = None,
        offload: Offload = run_in_thread,
        pace: Callable[[], Awaitable[None]] | None = None,
        history_length: int = 5,
        unusable_limit: int = 3,
        deadline: float | None = None,
        on_record: Callable[[RolloutResult, DecisionRecord], None] | None = None,
        rubrics: Mapping[str, Rubric] | None = None,
        start: RolloutStart | None = None,
    ) -> None:
        self.plan = plan
        self.rubrics = rubrics  # the shipped rubrics: metrics.outcome_score / events_score
        self.on_record = on_record  # called with each decision as it is recorded (trace rows)
        self.policy = policy
        self.worlds = worlds
        self.control = control or RunControl()
        self.offload = offload
        self.pace = pace  # awaited before each decision's step: a wave's decisions spread over loop iterations
        self.history: deque[HistoryEntry] = deque(start.history if start else (), maxlen=history_length)
        self._start = start  # the state the first episode continues from (None: the seed's new world)
        self._offset = start.decisions if start else 0  # decisions played before it: history numbers go on
        self.unusable_limit = unusable_limit
        self.shaper = StepRewardShaper(plan.step_rewards) if plan.step_rewards.active else None
        self.result = RolloutResult(plan=plan, started_at=datetime.now(UTC))
        self._deadline = deadline
        self._game: Game | None = None
        self._obs_text = ""
        self._observation: Any = None
        self._pending: PolicyDecision | None = None
        self._unusable_streak = 0
        self._needs_reset = False

    async def run(self) -> RolloutResult:
        if self._deadline is None:
            self._deadline = anyio.current_time() + self.plan.max_time_s
        if self.shaper is not None or self.plan.record_tokens:
            self.result.decision_samples = []
        try:
            # One cancel scope for the whole loop (not one per op): the deadline and an abort cancel
            # whichever op is in progress, and ops_executed counts only ops that completed.
            with anyio.CancelScope(deadline=self._deadline) as scope:
                self.control.bind(scope)
                await self._new_episode()
                for op in self.plan.ops:
                    self._check_limits()
                    await (self._agent() if op == AGENT else self._env())
                    self.result.ops_executed += 1
                    self._publish_progress()
            if scope.cancelled_caught:
                raise _Stop(StopReason.ABORTED if self.control.aborted else StopReason.DEADLINE)
        except _Stop as stop:
            self.result.stop_reason = stop.reason
        except Exception as exc:  # a bug ends this rollout with what ran, never the process's others
            logger.error("rollout failed", exc_info=True, extra={"run_id": self.plan.run_id})
            self.result.stop_reason = StopReason.INTERNAL
            self.result.error = {
                "code": StopReason.INTERNAL,
                "message": f"internal error ({type(exc).__name__}) after {len(self.result.records)} decision(s); "
                "the task app's log has the details",
            }
        finally:
            self.control.bind(None)
            game, self._game = self._game, None
            if game is not None and not self.plan.record_snapshot:
                game.close()
        await self._conclude(game)
        return self._finish()

    async def _conclude(self, game: Game | None) -> None:
        """What is computed from a finished loop: the last state, the rubric scores, the sequences."""
        if game is not None and self.plan.record_snapshot:  # the last state, written off the loop
            try:
                self.result.end = await self.offload(lambda: self._end(game))
            finally:
                game.close()
        if self.rubrics is not None:  # a long rollout's scores off the loop, a short one's on it
            rubrics = self.rubrics
            if len(self.result.records) <= SHORT_ROLLOUT:
                self.result.rubric_scores = score_rollout(self.result, rubrics)
            else:
                self.result.rubric_scores = await self.offload(lambda: score_rollout(self.result, rubrics))
        if self.plan.record_episodes:  # the same rule: a long rollout's sequences are built off the loop
            if len(self.result.records) <= SHORT_ROLLOUT:
                self.result.episode_sequences = rollout_sequences(self.result)
            else:
                self.result.episode_sequences = await self.offload(lambda: rollout_sequences(self.result))

    # --- guards ---------------------------------------------------------------------------------

    def _check_limits(self) -> None:
        if self.control.aborted:
            raise _Stop(StopReason.ABORTED)
        if self._game is not None and self._game.done and self.plan.on_done == "terminate":
            raise _Stop(StopReason.EPISODE_DONE)
        if self.result.ops_executed >= self.plan.max_ops:
            raise _Stop(StopReason.MAX_OPS)
        if self._deadline is not None and anyio.current_time() >= self._deadline:
            raise _Stop(StopReason.DEADLINE)

    # --- ops ------------------------------------------------------------------------------------

    def _start_game(self, start: RolloutStart | None) -> tuple[Game, Observation]:
        """The world (cached or generated, or the state `start` continues from) and its first observation:
        one worker-thread job."""
        plan = self.plan
        if start is not None:
            game, _ = load_game(start.checkpoint, self.worlds, plan.image_size)
            game.decision_limit = plan.max_steps_per_episode
        else:
            env = self.worlds.world(plan.seed, plan.area, plan.length)
            game = Game(env, image_size=plan.image_size, decision_limit=plan.max_steps_per_episode)
        return game, game.observe()

    def _end(self, game: Game) -> RolloutEnd:
        """The last state and what a continuation needs besides it (`record.snapshot`)."""
        decisions = self._offset + len(self.result.records)
        return RolloutEnd(dump_game(game), carried(decisions, tuple(self.history)))

    async def _new_episode(self) -> None:
        start, self._start = self._start, None  # only the first episode continues; a reset plays the seed
        game, observation = await self.offload(lambda: self._start_game(start))
        if self._game is not None:
            self._game.close()
        text = observation_text(observation, self.plan.text_format)
        self._game, self._observation, self._obs_text = game, observation, text
        self._pending = None
        self._needs_reset = False
        self.result.episodes.append(EpisodeSummary(index=len(self.result.episodes)))
        self.result.final_obs_text = text
        if self.shaper is not None:
            self.shaper.reset_episode()
        self._needs_reset = game.done and self.plan.on_done == "reset"  # a continued state may have ended

    async def _agent(self) -> None:
        if self._needs_reset:
            await self._new_episode()
        try:
            decision = await self.policy.decide(self._observation, tuple(self.history))
        except PolicyError as exc:
            self.result.error = {"code": exc.code, "message": str(exc), "status": exc.status}
            raise _Stop(StopReason.POLICY_ERROR) from exc
        self._check_version(decision)
        self.result.decisions += 1
        if decision.usable:
            self._unusable_streak = 0
        else:
            self.result.unusable_answers += 1
            self._unusable_streak += 1
            if self._unusable_streak >= self.unusable_limit:
                reason = decision.meta.get("unusable_reason") or "no executable action"
                self.result.error = {
                    "code": StopReason.POLICY_UNUSABLE,
                    "message": f"{self._unusable_streak} unusable model answers in a row (the last: {reason})",
                }
                raise _Stop(StopReason.POLICY_UNUSABLE)
        self._pending = decision

    def _check_version(self, decision: PolicyDecision) -> None:
        """Note the decision's policy version; stop, without playing it, when it would make the rollout's
        decisions span more versions than `policy.config.max_version_lag`."""
        if decision.version is None:
            return
        seen, version, lag = self.result.policy_versions, decision.version.version, self.plan.policy.max_version_lag
        if lag is not None and seen and max(*seen, version) - min(*seen, version) > lag:
            self.result.error = {
                "code": StopReason.VERSION_LAG,
                "message": f"decision {self.result.decisions} came from policy version {version}, more than "
                f"max_version_lag ({lag}) from the versions {sorted(seen)} of the decisions before it",
            }
            raise _Stop(StopReason.VERSION_LAG)
        seen.add(version)

    async def _env(self) -> None:
        if self._needs_reset:
            await self._new_episode()
        if self.pace is not None:
            await self.pace()
        game, decision = self._game, self._pending
        if game is None:  # pragma: no cover - _new_episode always ran first
            raise RuntimeError("env op before the world exists")
        if decision is None:
            plan = plan_from_names([NOOP], self.plan.max_actions)
        elif decision.plan is not None and len(decision.plan.actions) <= self.plan.max_actions:
            plan = decision.plan  # the policy normalised its calls already
        else:
            plan = normalise_tool_calls(decision.tool_calls, self.plan.max_actions)
        started_at, start = datetime.now(UTC), perf_counter()
        if game.image_size:  # a frame to render and encode as PNG: milliseconds, off the loop
            outcome, observation = await self.offload(lambda: game.step(plan))
        else:
            outcome, observation = game.step(plan)
        env_ms = (perf_counter() - start) * 1000
        obs_after_text = observation_text(observation, self.plan.text_format)
        episode = self.result.episodes[-1]
        episode.decisions += 1
        episode.steps += len(outcome.results)
        episode.episode_return += outcome.reward
        record = DecisionRecord(
            index=len(self.result.records),
            episode=episode.index,
            obs_text=self._obs_text,
            decision=decision,
            plan=plan,
            outcome=outcome,
            obs_after_text=obs_after_text,
            done=game.done,
            truncated=game.truncated,
            started_at=started_at,
            finished_at=datetime.now(UTC),
            env_ms=env_ms,
        )
        if self.shaper is not None:
            record.stepwise = self.shaper.score(record.index, outcome, outcome.actions)
        if self.rubrics is not None:
            record.event_scores = decision_event_scores(record, self.rubrics[EVENTS])
        self._sample(record)
        self.result.records.append(record)
        if self.on_record is not None:
            self.on_record(self.result, record)
        self.history.append(
            HistoryEntry(
                self._offset + record.index,
                tuple(outcome.actions),
                outcome.unlocked,
                outcome.reward,
                len(plan.rejected),
            )
        )
        self._observation, self._obs_text, self._pending = observation, obs_after_text, None
        self.result.final_obs_text = obs_after_text
        episode.achievements = game.achievements()
        if game.done:
            episode.terminated, episode.truncated = game.terminated, game.truncated
            self._needs_reset = self.plan.on_done == "reset"

    # --- bookkeeping ----------------------------------------------------------------------------

    def _sample(self, record: DecisionRecord) -> None:
        """`trajectory.decision_samples`: one per decision when step rewards or exact tokens are on."""
        samples = self.result.decision_samples
        if samples is None:
            return
        sample: dict[str, Any] = (
            dict(record.stepwise.sample) if record.stepwise is not None else {"decision_index": record.index}
        )
        if self.plan.record_tokens:
            tokens = record.tokens
            sample["tokens"] = tokens.as_dict() if tokens is not None else None
        samples.append(sample)

    def _publish_progress(self) -> None:
        progress = self.control.progress
        progress["ops_executed"] = self.result.ops_executed
        progress["decisions"] = len(self.result.records)
        progress["episodes"] = len(self.result.episodes)
        progress["achievements"] = self.result.final_achievements

    def _finish(self) -> RolloutResult:
        result = self.result
        result.finished_at = datetime.now(UTC)
        if self.shaper is not None:
            result.stepwise_summary = self.shaper.summary(result.final_achievements)
        self._publish_progress()
        logger.info(
            "rollout finished: %d decisions, %d achievements, stop_reason=%s",
            len(result.records),
            len(result.final_achievements),
            result.stop_reason,
            extra={"run_id": self.plan.run_id, "seed": self.plan.seed, "policy": self.plan.policy_name},
        )
        return result
