"""Runs, from any process of the fleet: `/run/status/{run_id}`, `/run/abort`, `GET /runs/{run_id}` and
`GET /runs/{run_id}/result` (200 the RolloutResponse, 202 while queued or running, 404 unknown, 409 lost
or failed, 410 once the response is no longer kept)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from ...core.contracts import (
    RUN_ID_MAX_LENGTH,
    RUN_ID_PATTERN,
    AbortRequest,
    AbortResponse,
    RolloutResponse,
    RunStatusResponse,
)
from ...rollout.fleet import RunView
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..strict_json import StrictJSONRoute

router = APIRouter(tags=["runs"], dependencies=[AuthDep], route_class=StrictJSONRoute, responses=errors(*PROTECTED))
RunId = Annotated[str, Path(min_length=1, max_length=RUN_ID_MAX_LENGTH, pattern=RUN_ID_PATTERN)]
STILL_RUNNING: dict[int | str, dict[str, Any]] = {
    202: {"model": RunStatusResponse, "description": "queued or running: poll again (Retry-After)"}
}


def links(run_id: str) -> dict[str, str]:
    """Where to poll a run (paths on this app's URL)."""
    return {"status_url": f"/runs/{run_id}", "result_url": f"/runs/{run_id}/result"}


def status_body(view: RunView) -> dict[str, Any]:
    return {**view.body(), **links(view.run_id)}


@router.get("/run/status/{run_id}", responses={**ok(RunStatusResponse), **errors(404, 422)})
async def run_status(run_id: RunId, state: StateDep) -> JSONBytes:
    return JSONBytes(status_body(await state.registry.status(run_id)))


@router.get("/runs/{run_id}", responses={**ok(RunStatusResponse), **errors(404, 422)})
async def run(run_id: RunId, state: StateDep) -> JSONBytes:
    return JSONBytes(status_body(await state.registry.status(run_id)))


@router.get("/runs/{run_id}/result", responses={**ok(RolloutResponse), **STILL_RUNNING, **errors(404, 409, 410, 422)})
async def run_result(run_id: RunId, state: StateDep) -> JSONBytes:
    view, response = await state.registry.result(run_id)
    if response is None:
        retry = max(1, round(state.settings.runs_heartbeat_s))
        return JSONBytes(status_body(view), status_code=202, headers={"Retry-After": str(retry)})
    return JSONBytes(response)


@router.post("/run/abort", responses={**ok(AbortResponse), **errors(*BODY, 404)})
async def run_abort(body: AbortRequest, state: StateDep) -> JSONBytes:
    view = await state.registry.abort(body.run_id)
    return JSONBytes({"ok": True, "run_id": view.run_id, "status": view.status.value})
