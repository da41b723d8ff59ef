"""Public liveness and readiness: `/`, `/health`, `/health/rollout` (never any part of a key)."""

from __future__ import annotations

import os
import threading
from typing import Any

from fastapi import APIRouter

from ...core.contracts import HealthResponse, RootResponse
from ..deps import StateDep
from ..openapi import ok
from ..responses import JSONBytes
from ..state import AppState

router = APIRouter(tags=["health"])
_NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {"model": HealthResponse, "description": "not ready: no API key is configured"}
}


def health_body(state: AppState) -> tuple[int, dict[str, Any]]:
    configured = bool(state.settings.api_keys)
    storage = state.recorder.health()
    body = {
        "healthy": configured,
        "service": state.settings.service_id,
        "auth": {"required": True, "configured": configured},
        "storage": storage,
        "rollouts": {
            "active": state.registry.active,
            "limit": state.registry.max_active,
            "queued": state.registry.queued,
            "paced": state.service.pacer.waiting,  # decisions waiting for a loop iteration (core.pacing)
        },
        "outbound": state.http.report(state.settings.max_concurrent_rollouts),  # the pool to model servers
        "world_cache": {"size": len(state.worlds), "hits": state.worlds.hits, "misses": state.worlds.misses},
        "sessions": {**state.sessions.envs.stats(), "websockets": state.sessions.websockets.active},
        # Counts only (no names, no stacks): what a soak test watches for leaks. The tasks include
        # this request's own and the server's (lifespan, trace writer, one per request in flight).
        # The pid says which of `task-app serve --processes N` answered (each has its own counters).
        "runtime": {"pid": os.getpid(), "tasks": state.tasks.live, "threads": threading.active_count()},
    }
    if state.loop_lag is not None:
        body["event_loop"] = state.loop_lag.snapshot()
    if not configured:
        body["detail"] = "ENVIRONMENT_API_KEY is not configured"
    return (200 if configured else 503), body


# Two decorators, not `api_route(methods=[GET, HEAD])`: one route per method keeps the OpenAPI
# operation ids unique (FastAPI warns about, and under warnings-as-errors fails on, duplicates).
@router.get("/", responses=ok(RootResponse))
@router.head("/", responses=ok(RootResponse))
async def root(state: StateDep) -> JSONBytes:
    return JSONBytes({"status": "ok", "service": state.settings.service_id})


@router.get("/health", responses={**ok(HealthResponse, "ready"), **_NOT_READY})
async def health(state: StateDep) -> JSONBytes:
    status, body = health_body(state)
    return JSONBytes(body, status_code=status)


@router.get("/health/rollout", responses={**ok(HealthResponse, "ready"), **_NOT_READY})
async def health_rollout(state: StateDep) -> JSONBytes:
    status, body = health_body(state)
    return JSONBytes(body, status_code=status)
