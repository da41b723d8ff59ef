"""The shared objects of one app instance, created and closed by the lifespan."""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

from .crafter import WorldFactory
from .loop_lag import LoopLagProbe
from .recording import TraceRecorder
from .rollout.engine import Offload
from .rollout.registry import RunRegistry
from .rubrics import Rubric
from .service import RolloutService
from .settings import Settings
from .taskset import Taskset, TraitsCache


@dataclass(slots=True)
class AppState:
    settings: Settings
    http: aiohttp.ClientSession  # outbound: model servers and vendors (task_app.outbound)
    worlds: WorldFactory
    traits: TraitsCache
    taskset: Taskset
    rubrics: dict[str, Rubric]
    registry: RunRegistry
    recorder: TraceRecorder
    service: RolloutService
    offload: Offload[object]
    loop_lag: LoopLagProbe | None = None  # set when TASKAPP_LOOP_LAG_PROBE_S > 0
