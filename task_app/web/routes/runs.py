"""Run status and abort: `/run/status/{run_id}`, `/run/abort`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from ...core.contracts import RUN_ID_MAX_LENGTH, RUN_ID_PATTERN, AbortRequest, AbortResponse, RunStatusResponse
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..strict_json import StrictJSONRoute

router = APIRouter(
    prefix="/run", tags=["runs"], dependencies=[AuthDep], route_class=StrictJSONRoute, responses=errors(*PROTECTED)
)
RunId = Annotated[str, Path(min_length=1, max_length=RUN_ID_MAX_LENGTH, pattern=RUN_ID_PATTERN)]


@router.get("/status/{run_id}", responses={**ok(RunStatusResponse), **errors(404, 422)})
async def run_status(run_id: RunId, state: StateDep) -> JSONBytes:
    return JSONBytes(state.registry.get(run_id).status_body())


@router.post("/abort", responses={**ok(AbortResponse), **errors(*BODY, 404)})
async def run_abort(body: AbortRequest, state: StateDep) -> JSONBytes:
    entry = state.registry.abort(body.run_id)
    return JSONBytes({"ok": True, "run_id": entry.run_id, "status": entry.status.value})
