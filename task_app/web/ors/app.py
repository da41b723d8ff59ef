"""The Open Reward Standard as a second ASGI app, served at the root of its own URL.

The `openreward` client joins absolute paths (`/create_session`, `/create`, `/{env}/call`, ...) onto
the host of its base URL, dropping any path prefix, and ORS's `/create` would collide with the env
sessions' `/create` of the main app: so ORS cannot live under a prefix of the main app's URL. It is
its own app, on its own port (`task-app serve --ors-port`) or its own Modal web endpoint, and a view of
the main app: it has no lifespan of its own and answers from the main app's shared objects (state
store, env sessions, settings and key, caps, metrics), so both doors see one process.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import HTTPConnection

from ...core.errors import StoreUnavailable
from ..handlers import install_error_handlers
from ..limits import BodySizeLimit
from ..responses import JSONBytes
from ..state import AppState
from .routes import router


def main_state(connection: HTTPConnection) -> AppState:
    """The main app's shared objects; 503 while its lifespan has not made them yet."""
    state: AppState | None = getattr(connection.app.state.main.state, "task_app", None)
    if state is None:
        raise StoreUnavailable("the task app is starting; retry in a moment", code="starting")
    return state


def create_ors_app(main: FastAPI) -> FastAPI:
    """The ORS server over `main`'s state (`main` is a `create_app` app; its lifespan runs elsewhere)."""
    settings = main.state.settings
    app = FastAPI(
        title="Crafter (Open Reward Standard)",
        version="1.0.0",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        default_response_class=JSONBytes,
    )
    app.state.settings = settings  # the error handlers' key check reads it
    app.state.main = main
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
