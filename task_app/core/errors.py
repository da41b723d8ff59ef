"""The exception hierarchy of the task app, free of HTTP machinery.

    TaskAppError                      status, code, message, details, headers   retryable
    ├── BadRequest           400      a body that is not JSON (OpenEnv routes)  no
    ├── InvalidRequest       422      a client mistake in the body or query     no
    │   └── UnknownName      422      env_name / policy_name we do not serve
    ├── Unauthorized         401                                                no
    ├── NotConfigured        503      a key the endpoint needs is not configured no
    ├── NotFound             404                                                no
    ├── Conflict             409      run_id already running                    yes (later: the cached response)
    ├── Gone                 410      an env session that expired               no
    ├── RateLimited          429      a cap or a rate was reached (Retry-After) yes
    │   └── CapacityExceeded 429      too many rollouts in flight
    ├── UpstreamRefused      4xx      a vendor refused the caller's request     no
    ├── UpstreamRateLimited  429      a vendor's rate limit (Retry-After)       yes
    ├── UpstreamError        502      a model server / vendor answered badly    yes, unless x-should-retry: false
    ├── UpstreamTimeout      504                                                yes
    └── StoreUnavailable     503      the state store (TASKAPP_STATE_BACKEND)   yes

`retryable` tells a trainer whether sending the same request again can succeed; every error body
carries it (`error.retryable`), and it agrees with an `x-should-retry: false` header the error sends.
`web/handlers.py` maps every subclass to the one JSON error body `error_body` builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class TaskAppError(Exception):
    status: int = 500
    code: str = "internal_error"
    retryable: bool = True  # an unexpected failure may not happen again

    def __init__(
        self, message: str, *, code: str | None = None, headers: Mapping[str, str] | None = None, **details: Any
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})  # sent with the error (Retry-After, x-should-retry)
        self.details = details
        self.retryable = type(self).retryable and self.headers.get("x-should-retry") != "false"


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


class Gone(TaskAppError):
    status = 410
    code = "gone"
    retryable = False


class RateLimited(TaskAppError):
    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1, code: str | None = None, **details: Any) -> None:
        self.retry_after_s = max(1, retry_after_s)
        super().__init__(message, code=code, headers={"Retry-After": str(self.retry_after_s)}, **details)


class CapacityExceeded(RateLimited):
    code = "capacity_exceeded"

    def __init__(self, active: int, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"{active} rollouts are in flight, the limit is {limit}; retry later",
            retry_after_s=retry_after_s,
            active=active,
            limit=limit,
        )


class UpstreamRefused(TaskAppError):
    """The vendor refused the request as the caller sent it: answered with the vendor's own status,
    which the error body also carries (`status`)."""

    code = "upstream_refused"
    retryable = False

    def __init__(self, message: str, *, status: int, **kwargs: Any) -> None:
        super().__init__(message, status=status, **kwargs)
        self.status = status


class UpstreamRateLimited(TaskAppError):
    status = 429
    code = "upstream_rate_limited"


class UpstreamError(TaskAppError):
    status = 502
    code = "upstream_error"


class UpstreamTimeout(TaskAppError):
    status = 504
    code = "upstream_timeout"


class StoreUnavailable(TaskAppError):
    status = 503
    code = "state_store_unavailable"


# --- client values inside messages: bounded, and in JSON's words (a message never says "None") ------

QUOTED_CHARS = 60
_JSON_KINDS = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def quoted(text: str) -> str:
    """A client's string quoted for a message, cut to `QUOTED_CHARS` characters."""
    return repr(text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "...")


def json_kind(value: Any) -> str:
    """What a parsed JSON value is: "null", "a number", "an array", ..."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return _JSON_KINDS.get(type(value), type(value).__name__)


def error_body(code: str, message: str, *, retryable: bool = False, **details: Any) -> dict[str, Any]:
    """The error shape of every answer (docs/contract.md, "Errors"):
    `{"error": {code, message, retryable, ...}, "detail"}`."""
    return {"error": {"code": code, "message": message, "retryable": retryable, **details}, "detail": message}
