"""The rollout service: plan → admission → engine → trace storage → response bytes → the fleet's record.

Owned by the app's lifespan; the HTTP routes (and `Submissions`, for runs in the background) only
translate requests into calls on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import anyio

from ..core.contracts import RolloutRequest
from ..core.errors import TaskAppError
from ..core.offload import Offload
from ..core.pacing import LoopPacer
from ..core.rubrics import Rubric
from ..core.settings import Settings
from ..game import WorldFactory
from ..policy.base import Policy
from ..rollout.continuation import RolloutStart, start_of
from ..rollout.control import RunStatus
from ..rollout.engine import SHORT_ROLLOUT, RolloutEngine
from ..rollout.plan import RolloutPlan, build_plan
from ..rollout.registry import RunEntry, RunRegistry
from ..rollout.result import DecisionRecord, RolloutResult, StopReason
from ..sessions.env_spec import EnvSpec
from ..sessions.manager import EnvSessions
from ..tracing.recording import RolloutRows, TraceRecorder
from ..tracing.trace import COMPACT
from .metrics import Metrics
from .run_log import log_rollout

logger = logging.getLogger(__name__)

# Loop time one iteration gives the rollouts' decisions when they come in a wave (core.pacing).
DECISIONS_BUDGET_S = 0.002

PolicyFactory = Callable[[RolloutPlan, float], Policy]


@dataclass(slots=True)
class Admission:
    """A rollout admitted to run here (`entry`), or the stored response of a run_id that already ended."""

    plan: RolloutPlan
    entry: RunEntry | None
    replay: bytes | None = None


class RolloutService:
    def __init__(
        self,
        settings: Settings,
        worlds: WorldFactory,
        registry: RunRegistry,
        policy_factory: PolicyFactory,
        recorder: TraceRecorder,
        offload: Offload,
        metrics: Metrics,
        rubrics: Mapping[str, Rubric] | None = None,
        envs: EnvSessions | None = None,
    ) -> None:
        self.settings = settings
        self.envs = envs  # env sessions and snapshots: where a rollout continues from, where it snapshots to
        self.rubrics = rubrics
        self.worlds = worlds
        self.registry = registry
        self.policy_factory = policy_factory
        self.recorder = recorder
        self.offload = offload
        self.pacer = LoopPacer(DECISIONS_BUDGET_S)
        self.metrics = metrics

    def plan(self, request: RolloutRequest) -> RolloutPlan:
        """Validate into a plan: every client mistake a 4xx, before anything is claimed or built."""
        return build_plan(request, self.settings)

    async def admit(self, request: RolloutRequest) -> Admission:
        """A plan and a slot (409 / 429), or the stored response of the run_id."""
        plan = self.plan(request)
        admitted = await self.registry.admit(plan.run_id)
        if isinstance(admitted, bytes):
            return Admission(plan, None, admitted)
        return Admission(plan, admitted)

    async def execute(self, plan: RolloutPlan, entry: RunEntry) -> bytes:
        """Run the rollout `entry` holds a slot for; its end goes into the fleet's record, whatever happens."""
        deadline = anyio.current_time() + plan.max_time_s
        status, body, policy, result = RunStatus.FAILED, None, None, None
        error: dict[str, Any] | None = None
        rows = self.recorder.rollout_rows(plan.run_id)
        self.metrics.started.inc()
        try:
            plan, start = await self._start(plan)
            policy = self.policy_factory(plan, deadline)
            engine = RolloutEngine(
                plan,
                policy,
                self.worlds,
                control=entry.control,
                offload=self.offload,
                pace=self.pacer.turn,
                history_length=self.settings.history_length,
                unusable_limit=self.settings.unusable_answers_limit,
                deadline=deadline,
                on_record=self._on_record(rows),
                rubrics=self.rubrics,
                start=start,
            )
            result = await engine.run()
            await self._snapshot(result)
            body = await self._finalise(result, rows)
            status = (
                RunStatus.FAILED
                if result.stop_reason == StopReason.INTERNAL
                else RunStatus.ABORTED
                if result.aborted
                else RunStatus.COMPLETED
            )
            return body
        except TaskAppError as exc:  # e.g. a provider whose key is not configured: the caller's error answer
            error = {"code": exc.code, "message": exc.message}
            raise
        finally:
            if body is None and rows is not None:
                rows.discard()
            with anyio.CancelScope(shield=True):
                await self.registry.finish(entry, status, body, error)
                if policy is not None:
                    await policy.aclose()
            self.metrics.rollout_finished(result, status)
            if self.settings.rollout_log and result is not None:
                log_rollout(result, status, entry.attempt, self.registry.fleet.instance)

    async def _start(self, plan: RolloutPlan) -> tuple[RolloutPlan, RolloutStart | None]:
        """The state `env.continue_from` names, and the plan on its world (seed, area, length)."""
        if plan.continue_from is None:
            return plan, None
        envs = self._envs()
        kind, name = plan.continue_from
        if kind == "env_id":
            spec, checkpoint = await envs.current(name)
            start = RolloutStart(checkpoint)
        else:
            spec, checkpoint, carried = await envs.read_snapshot(name)
            start = start_of(checkpoint, carried)
        return replace(plan, seed=spec.seed, area=spec.area, length=spec.length), start

    async def _snapshot(self, result: RolloutResult) -> None:
        """`record.snapshot`: the rollout's last state stored as a snapshot (`final.snapshot_id`)."""
        if result.end is None:
            return
        plan = result.plan
        spec = EnvSpec(plan.env_name, plan.seed, plan.area, plan.length, plan.image_size, plan.training_session_id)
        result.snapshot_id = await self._envs().save_snapshot(spec, result.end.checkpoint, result.end.carried)

    def _envs(self) -> EnvSessions:
        if self.envs is None:  # pragma: no cover - the app's lifespan always passes them
            raise RuntimeError("this rollout service has no env sessions")
        return self.envs

    def _on_record(self, rows: RolloutRows | None) -> Callable[[RolloutResult, DecisionRecord], None]:
        """Each decision as it is recorded: counted, its trace rows noted."""
        decision = self.metrics.decision

        def on_record(result: RolloutResult, record: DecisionRecord) -> None:
            decision(record)
            if rows is not None:
                rows.add(result, record)

        return on_record

    async def _finalise(self, result: RolloutResult, rows: RolloutRows | None) -> bytes:
        """Persist the trace (committed before we answer) and build the response bytes."""
        trace = await self.recorder.finalise(result, rows)
        if len(result.records) <= SHORT_ROLLOUT and (trace is None or result.plan.trace_format == COMPACT):
            return result.response_bytes(trace)
        return await self.offload(lambda: result.response_bytes(trace))
