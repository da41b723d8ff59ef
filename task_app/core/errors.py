"""The exception hierarchy of the task app, free of HTTP machinery.

    TaskAppError                      status, code, message, details
    ├── BadRequest           400      a request this app does not serve (e.g. streaming)
    ├── InvalidRequest       422      a client mistake in the body or query
    │   └── UnknownName      422      env_name / policy_name we do not serve
    ├── Unauthorized         401
    ├── NotConfigured        503      a key the endpoint needs is not configured
    ├── NotFound             404
    ├── Conflict             409      run_id already running
    ├── Gone                 410      an env session that expired
    ├── RateLimited          429      a cap or a rate was reached (carries Retry-After)
    │   └── CapacityExceeded 429      too many rollouts in flight
    ├── UpstreamError        502      a model server / vendor answered badly
    ├── UpstreamTimeout      504
    └── StoreUnavailable     503      the state store (TASKAPP_STATE_BACKEND) failed

`web/handlers.py` maps every subclass to the one JSON error body `error_body` builds.
"""

from __future__ import annotations

from typing import Any


class TaskAppError(Exception):
    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details


class BadRequest(TaskAppError):
    status = 400
    code = "bad_request"


class InvalidRequest(TaskAppError):
    status = 422
    code = "invalid_request"


class UnknownName(InvalidRequest):
    code = "unknown_name"


class Unauthorized(TaskAppError):
    status = 401
    code = "unauthorized"


class NotConfigured(TaskAppError):
    status = 503
    code = "not_configured"


class NotFound(TaskAppError):
    status = 404
    code = "not_found"


class Conflict(TaskAppError):
    status = 409
    code = "conflict"


class Gone(TaskAppError):
    status = 410
    code = "gone"


class RateLimited(TaskAppError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1, code: str | None = None, **details: Any) -> None:
        super().__init__(message, code=code, **details)
        self.retry_after_s = max(1, retry_after_s)


class CapacityExceeded(RateLimited):
    code = "capacity_exceeded"

    def __init__(self, active: int, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"{active} rollouts are in flight, the limit is {limit}; retry later",
            retry_after_s=retry_after_s,
            active=active,
            limit=limit,
        )


class UpstreamError(TaskAppError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(TaskAppError):
    status = 504
    code = "upstream_timeout"


class StoreUnavailable(TaskAppError):
    status = 503
    code = "state_store_unavailable"


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The error shape of every answer (CONTRACT.md §1): `{"error": {code, message, ...}, "detail": message}`."""
    return {"error": {"code": code, "message": message, **details}, "detail": message}
