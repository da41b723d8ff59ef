"""The app's one error model: every exception becomes the JSON error body of docs/contract.md ("Errors").

TaskAppError             its status, code, retryable flag and headers (429 with Retry-After)
RequestValidationError   422 invalid_request (never echoing the input), or 400 invalid_json; not retryable
HTTPException            its status (404, 405 with every allowed method, 413, ...); retryable when 5xx
anything else            500 internal_error, logged with its traceback; retryable
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

from ..core.errors import TaskAppError, error_body
from .auth import check_api_key
from .openapi import allowed_methods
from .responses import JSONBytes

logger = logging.getLogger(__name__)

_SERVER_ERROR = 500  # from here on a failure is the server's and may pass
_STATUS_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_response(exc: TaskAppError) -> JSONBytes:
    body = error_body(exc.code, exc.message, retryable=exc.retryable, **exc.details)
    return JSONBytes(body, status_code=exc.status, headers=exc.headers or None)


async def _task_app_error(_: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, TaskAppError):  # pragma: no cover - registered for TaskAppError only
        raise exc
    return error_response(exc)


def _denied(request: Request) -> TaskAppError | None:
    """FastAPI parses a JSON body before the routes' auth dependency runs; a body error must not
    tell a caller without a valid key anything the 401/503 would not (every body route is protected)."""
    try:
        check_api_key(request, request.app.state.settings)
    except TaskAppError as exc:
        return exc
    return None


async def _validation_error(request: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, RequestValidationError):  # pragma: no cover
        raise exc
    # Never echo `input`: a rejected policy.config may carry an api_key.
    errors = [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type", "")}
        for error in exc.errors()
    ]
    if any(error["type"] == "json_invalid" for error in errors):
        if (denied := _denied(request)) is not None:
            return await _task_app_error(request, denied)
        return JSONBytes(error_body("invalid_json", "the request body is not valid JSON"), status_code=400)
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    location = ".".join(str(part) for part in first["loc"] if part != "body")
    message = f"{location}: {first['msg']}" if location else str(first["msg"])
    return JSONBytes(error_body("invalid_request", message, errors=errors), status_code=422)


async def _http_error(request: Request, exc: Exception) -> JSONBytes:
    if not isinstance(exc, StarletteHTTPException):  # pragma: no cover
        raise exc
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    retryable = exc.status_code >= _SERVER_ERROR
    if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. nesting too deep)
        if (denied := _denied(request)) is not None:
            return await _task_app_error(request, denied)
        code = "invalid_json"
    headers = exc.headers
    if exc.status_code == 405:  # list every method of the path, not just one route's
        headers = {**(headers or {}), "Allow": allowed_methods(request)}
    body = error_body(code, str(exc.detail), retryable=retryable)
    return JSONBytes(body, status_code=exc.status_code, headers=headers)


async def _unexpected_error(request: Request, exc: Exception) -> JSONBytes:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONBytes(error_body("internal_error", "internal server error", retryable=True), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(TaskAppError, _task_app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
