"""The rollout service: plan → admission → engine → trace storage → response bytes.

Owned by the app's lifespan; the HTTP routes only translate requests into calls on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from ..core.contracts import RolloutRequest
from ..core.offload import Offload
from ..core.rubrics import Rubric
from ..core.settings import Settings
from ..game import WorldFactory
from ..policy.base import Policy
from ..rollout.control import RunStatus
from ..rollout.engine import RolloutEngine
from ..rollout.plan import RolloutPlan, build_plan
from ..rollout.registry import RunEntry, RunRegistry
from ..rollout.result import RolloutResult, StopReason
from ..tracing.recording import RolloutRows, TraceRecorder

logger = logging.getLogger(__name__)

PolicyFactory = Callable[[RolloutPlan, float], Policy]


@dataclass(slots=True)
class Admission:
    """A rollout admitted to run, or the cached response of a run_id that already completed."""

    plan: RolloutPlan
    entry: RunEntry
    replay: bytes | None = None


def encode(body: Any) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


class RolloutService:
    def __init__(
        self,
        settings: Settings,
        worlds: WorldFactory,
        registry: RunRegistry,
        policy_factory: PolicyFactory,
        recorder: TraceRecorder,
        offload: Offload,
        rubrics: Mapping[str, Rubric] | None = None,
    ) -> None:
        self.settings = settings
        self.rubrics = rubrics
        self.worlds = worlds
        self.registry = registry
        self.policy_factory = policy_factory
        self.recorder = recorder
        self.offload = offload

    def admit(self, request: RolloutRequest) -> Admission:
        """Validate into a plan (4xx on mistakes) and take a slot (409 / 429), or find the replay."""
        plan = build_plan(request, self.settings)
        entry = self.registry.admit(plan.run_id)
        replay = entry.response if entry.status is not RunStatus.RUNNING else None
        return Admission(plan, entry, replay)

    async def execute(self, admission: Admission) -> bytes:
        plan, entry = admission.plan, admission.entry
        deadline = anyio.current_time() + plan.max_time_s
        status, body, policy = RunStatus.FAILED, None, None
        rows = self.recorder.rollout_rows(plan.run_id)
        try:
            policy = self.policy_factory(plan, deadline)
            engine = RolloutEngine(
                plan,
                policy,
                self.worlds,
                control=entry.control,
                offload=self.offload,
                history_length=self.settings.history_length,
                unusable_limit=self.settings.unusable_answers_limit,
                deadline=deadline,
                on_record=rows.add if rows is not None else None,
                rubrics=self.rubrics,
            )
            result = await engine.run()
            body = await self._finalise(result, rows)
            status = (
                RunStatus.FAILED
                if result.stop_reason == StopReason.INTERNAL
                else RunStatus.ABORTED
                if result.aborted
                else RunStatus.COMPLETED
            )
            return body
        finally:
            self.registry.finish(entry, status, body)
            if policy is not None:
                await policy.aclose()

    async def _finalise(self, result: RolloutResult, rows: RolloutRows | None) -> bytes:
        """Persist the trace (committed before we answer) and build the response bytes."""
        trace = await self.recorder.finalise(result, rows)
        return await self.offload(lambda: encode(result.response(trace)))
