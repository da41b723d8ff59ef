"""Run status and abort: `/run/status/{run_id}`, `/run/abort`."""

from __future__ import annotations

from fastapi import APIRouter

from ..contracts import AbortRequest
from ..deps import AuthDep, StateDep
from ..responses import JSONBytes

router = APIRouter(prefix="/run", tags=["runs"], dependencies=[AuthDep])


@router.get("/status/{run_id}")
async def run_status(run_id: str, state: StateDep) -> JSONBytes:
    return JSONBytes(state.registry.get(run_id).status_body())


@router.post("/abort")
async def run_abort(body: AbortRequest, state: StateDep) -> JSONBytes:
    entry = state.registry.abort(body.run_id)
    return JSONBytes({"ok": True, "run_id": entry.run_id, "status": entry.status.value})
