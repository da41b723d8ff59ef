"""`POST /rollout` (and the seed system's `POST /done`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from ...core.contracts import DoneResponse, RolloutRequest, RolloutResponse
from ...rollout.control import RunControl
from ..deps import AuthDep, ServiceDep, SettingsDep
from ..openapi import BODY, PROTECTED, errors, ok
from ..responses import JSONBytes
from ..strict_json import StrictJSONRoute

router = APIRouter(tags=["rollout"], dependencies=[AuthDep], route_class=StrictJSONRoute, responses=errors(*PROTECTED))


async def _abort_on_disconnect(request: Request, control: RunControl) -> None:
    """A client that goes away cancels its rollout (the body is already read, so the next message is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            control.abort()
            return


@router.post("/rollout", responses={**ok(RolloutResponse), **errors(*BODY, 409, 429)})
async def rollout(body: RolloutRequest, request: Request, service: ServiceDep) -> JSONBytes:
    admission = await service.admit(body)
    entry = admission.entry
    if entry is None:  # the run_id ended before (on any process): its response, as it was sent
        return JSONBytes(admission.replay or b"")
    # A plain task, cancelled at the end: an anyio task group's cancel formats the task's repr (its
    # coroutine chain) into a reason nobody reads, several times what this plain task costs.
    watcher = asyncio.create_task(_abort_on_disconnect(request, entry.control))
    try:
        payload = await service.execute(admission.plan, entry)
    finally:
        watcher.cancel()
    return JSONBytes(payload)


@router.post("/done", responses=ok(DoneResponse))
async def done(settings: SettingsDep) -> JSONBytes:
    return JSONBytes({"ok": True, "service": settings.service_id})
