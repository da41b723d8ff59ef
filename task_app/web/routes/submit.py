"""`POST /rollouts`: one rollout request, or a list of them (a group), accepted at once (202) and run in
the background; each run's status and result are then polled from any process (routes/runs.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ...core.contracts import AsyncRolloutRequest, SubmitResponse
from ..deps import AuthDep, StateDep
from ..openapi import BODY, PROTECTED, errors
from ..responses import JSONBytes
from ..strict_json import StrictJSONRoute
from .runs import links

router = APIRouter(tags=["runs"], dependencies=[AuthDep], route_class=StrictJSONRoute, responses=errors(*PROTECTED))
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {"model": SubmitResponse, "description": "accepted: each run with the URLs to poll"}
}


@router.post("/rollouts", status_code=202, responses={**ACCEPTED, **errors(*BODY, 429)})
async def submit_rollouts(body: AsyncRolloutRequest | list[AsyncRolloutRequest], state: StateDep) -> JSONBytes:
    requests = body if isinstance(body, list) else [body]
    accepted = await state.submissions.submit(requests)
    runs = [
        {
            "run_id": acceptance.view.run_id,
            "attempt": acceptance.view.attempt,
            "status": acceptance.view.status.value,
            "accepted": acceptance.accepted,
            **links(acceptance.view.run_id),
        }
        for acceptance in accepted
    ]
    return JSONBytes({"runs": runs}, status_code=202)
