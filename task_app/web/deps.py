"""FastAPI dependencies: shared objects the lifespan put on `app.state`, and the auth guard.

They are `async def` although they never await: FastAPI runs a plain `def` dependency in its thread
pool, a thread handoff per dependency per request: a measurable share of an env session's `/step`
(docs/performance.md).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..core.settings import Settings
from ..service.rollouts import RolloutService
from .auth import check_api_key
from .state import AppState


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.task_app
    return state


async def get_state(request: Request) -> AppState:
    return _state(request)


async def get_settings(request: Request) -> Settings:
    return _state(request).settings


async def get_service(request: Request) -> RolloutService:
    return _state(request).service


async def require_api_key(request: Request) -> None:
    check_api_key(request, _state(request).settings)


StateDep = Annotated[AppState, Depends(get_state)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[RolloutService, Depends(get_service)]
AuthDep = Depends(require_api_key)
