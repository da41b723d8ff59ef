"""`GET /metrics`: this process's metrics in the Prometheus text format (service/metrics.py), behind the key."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..deps import AuthDep, StateDep

router = APIRouter(tags=["metrics"], dependencies=[AuthDep])
TEXT: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format"}
}


@router.get("/metrics", response_class=Response, responses=TEXT)
async def metrics(state: StateDep) -> Response:
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
