"""FastAPI dependencies: shared objects the lifespan put on `app.state`, and the auth guard."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..core.settings import Settings
from ..service.rollouts import RolloutService
from .auth import check_api_key
from .state import AppState


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.task_app
    return state


def get_settings(request: Request) -> Settings:
    return get_state(request).settings


def get_service(request: Request) -> RolloutService:
    return get_state(request).service


def require_api_key(request: Request) -> None:
    check_api_key(request, get_state(request).settings)


StateDep = Annotated[AppState, Depends(get_state)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
ServiceDep = Annotated[RolloutService, Depends(get_service)]
AuthDep = Depends(require_api_key)
