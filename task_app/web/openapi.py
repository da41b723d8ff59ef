"""What the OpenAPI schema says the routes answer, error statuses included.

Handlers return ready `JSONBytes` responses (often pre-encoded bytes), so FastAPI cannot infer what
they answer: each route declares its 200 body with `ok(Model)` (models in `contracts.py`) and, with
`errors(...)`, the statuses it can fail with, all of them in the one error body of docs/contract.md ("Errors"),
`{"error": {"code", "message", ...}, "detail"}`. The fuzz test (`tests/test_fuzz.py`) holds every
response of every route to these declarations. `allowed_methods` makes a 405's `Allow` header true.
"""

from __future__ import annotations

from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.requests import Request
from starlette.routing import Match

from ..core.contracts import ErrorResponse

__all__ = ["BODY", "PROTECTED", "allowed_methods", "errors", "ok"]

_WHY = {
    400: "the body is not valid JSON (`invalid_json`: syntax, encoding, NaN, nesting over 1024), or (proxies) "
    "the vendor refused the request: its status and sanitised error",
    401: "API key missing or invalid (`unauthorized`)",
    404: "no such run, env or snapshot (`run_not_found`, `env_not_found`, `snapshot_not_found`, `not_found`), or "
    "(proxies) the vendor's 404, e.g. an unknown model",
    409: "the run is still running (`run_in_progress`), already ran and its response is no longer kept "
    "(`run_id_used`), was lost with its process (`run_lost`), failed without a response (`run_failed`) or "
    "cannot be replayed (`not_replayable`); the env is being stepped elsewhere (`env_busy`) or took its "
    "last step (`env_step_limit`)",
    410: "the env expired after being idle (`env_expired`); the run's response is no longer kept (`result_expired`)",
    413: "the request body is larger than TASKAPP_MAX_BODY_BYTES (`payload_too_large`)",
    422: "a client mistake in the body, query or path (`invalid_request` or a more precise code; proxies: also "
    "the vendor's 422)",
    429: "a cap or rate was reached (`capacity_exceeded`, `queue_full`, `too_many_envs`, `too_many_live_envs`, "
    "`too_many_snapshots`, `env_rate_limited`), or (proxies) the vendor's rate limit; retry after "
    "`Retry-After` seconds",
    502: "the vendor answered badly, refused this app's key or could not be reached (`<vendor>_error`, "
    "`<vendor>_key_refused`, `<vendor>_unreachable`, ...); `x-should-retry: false` when a retry cannot help",
    503: "a key this endpoint needs is not configured (`missing_environment_api_key`, "
    "`missing_<vendor>_api_key`) or the trace store is unavailable",
    504: "the vendor did not answer in time (`<vendor>_timeout`)",
}
_HEADERS: dict[int, dict[str, Any]] = {
    429: {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}},
}

PROTECTED = (401, 503)  # every route behind the API key (503 when the server has no key configured)
BODY = (400, 413, 422)  # every route that reads a JSON body


_ERROR_SCHEMA = {"$ref": "#/components/schemas/ErrorResponse"}


def errors(*statuses: int, non_json: bool = False) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these statuses, each with the contract's error body.

    FastAPI files a `model` under the route's own media type; the errors of a route that answers HTML
    or text are JSON all the same, so for those the JSON content is spelled out (the JSON routes
    register `ErrorResponse`).
    """
    declared: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        entry: dict[str, Any] = {"description": _WHY[status]}
        if non_json:
            entry["content"] = {"application/json": {"schema": _ERROR_SCHEMA}}
        else:
            entry["model"] = ErrorResponse
        if status in _HEADERS:
            entry["headers"] = _HEADERS[status]
        declared[status] = entry
    return declared


def ok(model: Any, description: str = "success") -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry for a 200 answer whose JSON body is `model` (a pydantic model or type)."""
    return {200: {"model": model, "description": description}}


def allowed_methods(request: Request) -> str:
    """The `Allow` header of a 405: every method the request's path serves.

    Starlette lists only the methods of the first route matching the path, and `GET /` and `HEAD /`
    are separate routes here (one operation id each), so a 405 on `/` would say `Allow: HEAD`.
    """
    methods: set[str] = set()
    for context in iter_route_contexts(request.app.routes):
        route = context.route
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))
