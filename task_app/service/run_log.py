"""One structured JSON line per finished rollout (`TASKAPP_ROLLOUT_LOG=true`), on stderr.

    {"event": "rollout_finished", "run_id", "attempt", "trace_correlation_id", "seed", "policy", "model",
     "mode", "status", "stop_reason", "error_class", "decisions", "episodes", "achievements",
     "achievement_count", "duration_s", "model_s", "env_s", "stored", "instance"}

Written by the `task_app.rollouts` logger through its own handler (the line alone, no prefix), so it
reaches stderr (Modal's logs) whatever logging the host configured. No URL, key or prompt is in it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..core.json_codec import dumps
from ..rollout.control import RunStatus
from ..rollout.result import RolloutResult

ROLLOUT_LOGGER = "task_app.rollouts"
logger = logging.getLogger(ROLLOUT_LOGGER)


def rollout_record(result: RolloutResult, status: RunStatus, attempt: int, instance: str) -> dict[str, Any]:
    plan = result.plan
    calls = [record.decision.lm_call for record in result.records if record.decision is not None]
    failure = result.failure()
    finished = result.finished_at or result.started_at
    return {
        "event": "rollout_finished",
        "run_id": plan.run_id,
        "attempt": attempt,
        "trace_correlation_id": plan.trace_correlation_id,
        "seed": plan.seed,
        "policy": plan.policy_name,
        "model": plan.policy.model,
        "mode": plan.mode,
        "status": status.value,
        "stop_reason": result.stop_reason.value,
        "error_class": failure["class"] if failure is not None else None,
        "decisions": len(result.records),
        "episodes": len(result.episodes),
        "achievements": result.final_achievements,
        "achievement_count": len(result.final_achievements),
        "duration_s": round((finished - result.started_at).total_seconds(), 4),
        "model_s": round(sum(call.latency_ms for call in calls if call is not None) / 1000, 4),
        "env_s": round(sum(record.env_ms for record in result.records) / 1000, 4),
        "stored": bool((result.storage or {}).get("trace", {}).get("stored")),
        "instance": instance,
    }


def log_rollout(result: RolloutResult, status: RunStatus, attempt: int, instance: str) -> None:
    """Called only with the setting on (the line goes to the handler `rollout_lines` installed)."""
    logger.info(dumps(rollout_record(result, status, attempt, instance)))


@contextmanager
def rollout_lines(enabled: bool) -> Iterator[None]:
    """While the app serves: the logger at INFO with a handler of its own on stderr (when `enabled`)."""
    if not enabled:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
