"""Public liveness and readiness: `/`, `/health`, `/health/rollout` (never any part of a key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..deps import StateDep
from ..responses import JSONBytes
from ..state import AppState

router = APIRouter(tags=["health"])


def health_body(state: AppState) -> tuple[int, dict[str, Any]]:
    configured = bool(state.settings.api_keys)
    storage = state.recorder.health()
    body = {
        "healthy": configured,
        "service": state.settings.service_id,
        "auth": {"required": True, "configured": configured},
        "storage": storage,
        "rollouts": {"active": state.registry.active, "limit": state.registry.max_active},
        "world_cache": {"size": len(state.worlds), "hits": state.worlds.hits, "misses": state.worlds.misses},
    }
    if not configured:
        body["detail"] = "ENVIRONMENT_API_KEY is not configured"
    return (200 if configured else 503), body


# Two decorators, not `api_route(methods=[GET, HEAD])`: one route per method keeps the OpenAPI
# operation ids unique (FastAPI warns about, and under warnings-as-errors fails on, duplicates).
@router.get("/")
@router.head("/")
async def root(state: StateDep) -> JSONBytes:
    return JSONBytes({"status": "ok", "service": state.settings.service_id})


@router.get("/health")
async def health(state: StateDep) -> JSONBytes:
    status, body = health_body(state)
    return JSONBytes(body, status_code=status)


@router.get("/health/rollout")
async def health_rollout(state: StateDep) -> JSONBytes:
    status, body = health_body(state)
    return JSONBytes(body, status_code=status)
