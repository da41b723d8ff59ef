"""The episode viewer of a stored run: `GET /runs/{run_id}/view` (an HTML page, behind the API key).

    trace store ──get_session──► RecordedRun ──replay + render (worker thread, via state.offload)──► HTML

404 `not_found` when tracing is disabled or the store has no such run; 503 `not_configured` when the
store is broken; 409 `not_replayable` for a trace without a seed. The page itself reports a replay that
diverged from the trace (frames stop at the first difference).
"""

from __future__ import annotations

import sqlite3

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ...core.errors import NotConfigured, NotFound, TaskAppError
from ...inspection.replay import ReplayError, run_from_trace
from ...inspection.viewer import build_episode_page
from ..deps import AuthDep, StateDep

router = APIRouter(prefix="/runs", tags=["view"], dependencies=[AuthDep])


class NotReplayable(TaskAppError):
    status = 409
    code = "not_replayable"


@router.get("/{run_id}/view", response_class=HTMLResponse)
async def view_run(run_id: str, state: StateDep) -> HTMLResponse:
    store = state.recorder.store
    if store is None:
        raise NotFound("tracing is disabled on this server, so no run can be viewed", run_id=run_id)
    if not store.running:
        reason = store.health()["last_error"] or "it is not running"
        raise NotConfigured(f"the trace store is unavailable: {reason}", run_id=run_id)
    try:
        trace = await store.get_session(run_id)
    except sqlite3.Error as exc:
        raise NotConfigured(f"the trace store could not be read: {exc}", run_id=run_id) from exc
    if trace is None:
        raise NotFound(f"no stored trace for run {run_id!r}", run_id=run_id)
    try:
        run = run_from_trace(trace)
    except ReplayError as exc:
        raise NotReplayable(f"run {run_id!r} cannot be replayed: {exc}", run_id=run_id) from exc
    page = await state.offload(lambda: build_episode_page(run, state.worlds))
    return HTMLResponse(page.html)
