"""The exception hierarchy of the task app, free of HTTP machinery.

    TaskAppError                      status, code, message, details      retryable
    ├── BadRequest           400      a request this app does not serve   no
    ├── InvalidRequest       422      a client mistake in the body/query  no
    │   └── UnknownName      422      env_name / policy_name we do not serve
    ├── Unauthorized         401                                          no
    ├── NotConfigured        503      a key the endpoint needs is missing no
    ├── NotFound             404                                          no
    ├── Conflict             409      run_id already running              yes (later: the cached response)
    ├── CapacityExceeded     429      too many rollouts (Retry-After)     yes
    ├── UpstreamError        502      a model server / vendor failed      yes
    └── UpstreamTimeout      504                                          yes

`retryable` tells a trainer whether sending the same request again can succeed; every error body
carries it (`error.retryable`). `web/handlers.py` maps every subclass to the one JSON error body
`error_body` builds.
"""

from __future__ import annotations

from typing import Any


class TaskAppError(Exception):
    status: int = 500
    code: str = "internal_error"
    retryable: bool = True  # an unexpected failure may not happen again

    def __init__(self, message: str, *, code: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details


class BadRequest(TaskAppError):
    status = 400
    code = "bad_request"
    retryable = False


class InvalidRequest(TaskAppError):
    status = 422
    code = "invalid_request"
    retryable = False


class UnknownName(InvalidRequest):
    code = "unknown_name"


class Unauthorized(TaskAppError):
    status = 401
    code = "unauthorized"
    retryable = False


class NotConfigured(TaskAppError):
    status = 503
    code = "not_configured"
    retryable = False


class NotFound(TaskAppError):
    status = 404
    code = "not_found"
    retryable = False


class Conflict(TaskAppError):
    status = 409
    code = "conflict"


class CapacityExceeded(TaskAppError):
    status = 429
    code = "capacity_exceeded"

    def __init__(self, active: int, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"{active} rollouts are in flight, the limit is {limit}; retry later",
            active=active,
            limit=limit,
        )
        self.retry_after_s = retry_after_s


class UpstreamError(TaskAppError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(TaskAppError):
    status = 504
    code = "upstream_timeout"


def error_body(code: str, message: str, *, retryable: bool = False, **details: Any) -> dict[str, Any]:
    """The error shape of every answer (CONTRACT.md §1): `{"error": {code, message, retryable, ...}, "detail"}`."""
    return {"error": {"code": code, "message": message, "retryable": retryable, **details}, "detail": message}
