"""The env-session step answered without FastAPI's per-request machinery, when nothing about it is unusual.

A `POST /step` (or `/env/step`) with a JSON content type, a declared length, the key, and a body that
parses and validates as `EnvStepRequest` is answered here: the same validation, the same `EnvSessions.step`
and the same answer as the route (`routes/envs.py` `answer_step`), without routing, dependency solving
and FastAPI's request and exception layers. Every other request goes to the app untouched, and so does
any step this path cannot answer as the route would (another content type, a chunked body, a bad key,
a body that does not parse or validate): its body is replayed to the app, so its answer, error or not,
is the route's own. Errors of the step itself (unknown env, 409, 429, ...) are rendered by the app's
error handler. It sits inside the body-size limit and the compression middleware, which apply as to
any request. Why and its figure: docs/decisions/step-path.md ("A step path beside FastAPI").
"""

from __future__ import annotations

from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.env_contracts import EnvStepRequest
from ..core.errors import TaskAppError
from ..core.json_codec import JSONDecodeError, loads
from .auth import check_api_key
from .handlers import error_response
from .request_body import read_body
from .routes.envs import answer_step
from .state import AppState

STEP_PATHS = frozenset({"/step", "/env/step"})


def _plain_json(scope: Scope) -> bool:
    """A JSON content type (`application/json` or `application/*+json`) and a declared length, not chunked."""
    media, length = b"", False
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = bytes(value).split(b";", 1)[0].strip().lower()
        elif name == b"content-length":
            length = True
        elif name == b"transfer-encoding":
            return False
    json_type = media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return json_type and length


class StepFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: AppState | None = getattr(scope["app"].state, "task_app", None) if scope["type"] == "http" else None
        if (
            state is None
            or scope["method"] != "POST"
            or scope["path"] not in STEP_PATHS
            or scope.get("root_path")
            or not _plain_json(scope)
        ):
            await self.app(scope, receive, send)
            return
        body, receive = await read_body(receive)
        request = _parsed(body, state, scope) if body is not None else None
        if request is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await answer_step(state, request)
        except TaskAppError as exc:
            response = error_response(exc)
        await response(scope, receive, send)


def _parsed(body: bytes, state: AppState, scope: Scope) -> EnvStepRequest | None:
    """The request when the route would accept it; None when the route must answer (whatever it answers)."""
    try:
        check_api_key(HTTPConnection(scope), state.settings)
        data = loads(body, strict=True)
        return EnvStepRequest.model_validate(data) if isinstance(data, dict) else None
    except (TaskAppError, JSONDecodeError, ValidationError):
        return None
