"""The shared objects of one app instance, created and closed by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.offload import Offload
from ..core.outbound import Outbound
from ..core.rubrics import Rubric
from ..core.settings import Settings
from ..game import WorldFactory
from ..rollout.registry import RunRegistry
from ..service.metrics import Metrics
from ..service.rollouts import RolloutService
from ..service.submissions import Submissions
from ..service.taskset import Taskset, TraitsCache
from ..sessions.runtime import SessionServices
from ..tracing.recording import TraceRecorder
from .loop_lag import LoopLagProbe
from .task_count import TaskCount


@dataclass(slots=True)
class AppState:
    settings: Settings
    http: Outbound  # outbound: model servers and vendors (task_app.core.outbound)
    worlds: WorldFactory
    traits: TraitsCache
    taskset: Taskset
    rubrics: dict[str, Rubric]
    registry: RunRegistry
    recorder: TraceRecorder
    service: RolloutService
    submissions: Submissions  # POST /rollouts: runs accepted now, run in the background
    metrics: Metrics
    offload: Offload
    sessions: SessionServices  # env sessions, their state store, OpenEnv tokens and WebSocket cap
    tasks: TaskCount  # the loop's live asyncio tasks (/health)
    loop_lag: LoopLagProbe | None = None  # set when TASKAPP_LOOP_LAG_PROBE_S > 0
