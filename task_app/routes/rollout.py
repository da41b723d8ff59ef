"""`POST /rollout` (and the seed system's `POST /done`)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request

from ..contracts import RolloutRequest
from ..deps import AuthDep, ServiceDep, SettingsDep
from ..responses import JSONBytes
from ..rollout.control import RunControl

router = APIRouter(tags=["rollout"], dependencies=[AuthDep])


async def _abort_on_disconnect(request: Request, control: RunControl) -> None:
    """A client that goes away cancels its rollout (the body is already read, so the next message is the end)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            control.abort()
            return


@router.post("/rollout")
async def rollout(body: RolloutRequest, request: Request, service: ServiceDep) -> JSONBytes:
    admission = service.admit(body)
    if admission.replay is not None:
        return JSONBytes(admission.replay)
    async with anyio.create_task_group() as group:
        group.start_soon(_abort_on_disconnect, request, admission.entry.control)
        payload = await service.execute(admission)
        group.cancel_scope.cancel()
    return JSONBytes(payload)


@router.post("/done")
async def done(settings: SettingsDep) -> JSONBytes:
    return JSONBytes({"ok": True, "service": settings.service_id})
