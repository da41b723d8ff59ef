"""Every exception the client raises, in one hierarchy.

    TaskAppClientError                 base: catch this for "the call failed"
    ├── APIConnectionError             no answer: refused, reset, dropped mid-response
    │   └── APITimeoutError            no answer within the call's deadline (also a builtin TimeoutError)
    │       └── RunNotFinished         result() waited its deadline and the run goes on (`.run`)
    ├── APIStatusError                 the app answered an error: status, code, message, retryable, details
    │   ├── BadRequestError            400, 413, 422  a mistake in the request
    │   ├── AuthenticationError        401, 403       a missing or wrong API key
    │   ├── NotFoundError              404            env_not_found, run_not_found, snapshot_not_found, ...
    │   ├── ConflictError              409            run_in_progress, run_id_used, run_lost, env_busy, ...
    │   ├── GoneError                  410            env_expired, result_expired
    │   ├── RateLimitError             429            too_many_live_envs, capacity_exceeded, ... (Retry-After)
    │   └── InternalServerError        5xx
    │       └── ServiceUnavailableError 503           state_store_unavailable, not_configured, a proxy's 503
    └── APIResponseValidationError     a success answer the client cannot read

`APIStatusError.retryable` is the server's own verdict (`error.retryable` of its error body: can the
same request succeed later?), None when the answer did not come from the app (a proxy's error page).
`error_from_response` is the one place a response becomes an exception.
"""

from __future__ import annotations

import email.utils
import json
import time
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from ._results import RunStatus

MESSAGE_CHARS = 300  # of a body that is not the app's error shape, quoted in the message


class TaskAppClientError(Exception):
    """Base class of every error this client raises."""


class APIConnectionError(TaskAppClientError):
    """The request got no answer (connection refused or reset, the server went away mid-response)."""


class APITimeoutError(APIConnectionError, TimeoutError):
    """No answer within the call's deadline (or, after retries, no connection within the connect timeout)."""


class RunNotFinished(APITimeoutError):
    """`result()` waited as long as it was allowed to; the run goes on (`run`: its last status)."""

    def __init__(self, message: str, run: RunStatus) -> None:
        super().__init__(message)
        self.run = run


class APIResponseValidationError(TaskAppClientError):
    """A success answer that is not what the route documents (not JSON, or not its shape)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class APIStatusError(TaskAppClientError):
    """The app answered with an error status.

    `code` and `message` are the server's (`error.code`, `error.message`); `retryable` its verdict, or
    None when the body was not the app's error shape; `details` the error's other fields (`env_id`,
    `run_id`, `limit`, `errors`, ...); `retry_after` the `Retry-After` header in seconds, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str,
        retryable: bool | None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = retryable
        self.details = dict(details or {})
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}"


class BadRequestError(APIStatusError):
    """400, 413 or 422: the request is wrong (`details["errors"]` lists a validation error's fields)."""


class AuthenticationError(APIStatusError):
    """401 or 403: the API key is missing or wrong."""


class NotFoundError(APIStatusError):
    """404: no such env, snapshot or run (or route)."""


class ConflictError(APIStatusError):
    """409: e.g. the run_id is still running (`run_in_progress`) or was used (`run_id_used`)."""


class GoneError(APIStatusError):
    """410: the env expired after being idle, or the run's response is no longer kept."""


class RateLimitError(APIStatusError):
    """429: a cap or a rate was reached; `retry_after` says when to come back."""


class InternalServerError(APIStatusError):
    """5xx: the server failed (or a model server behind it did: `upstream_*` codes)."""


class ServiceUnavailableError(InternalServerError):
    """503: the state store is unavailable, the app is not configured, or a proxy has no backend."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}
_SERVER_ERROR = 500


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """`Retry-After` in seconds: delay-seconds or an HTTP date (RFC 9110 §10.2.3); None when absent or bad."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _error_object(response: httpx.Response) -> dict[str, Any] | None:
    """The app's `{"error": {"code", "message", ...}}`, or None for any other body."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and isinstance(error.get("message"), str):
        return error
    return None


def error_from_response(response: httpx.Response) -> APIStatusError:
    """The exception for an error answer: the class by status, the fields from the app's error body."""
    status = response.status_code
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= _SERVER_ERROR else APIStatusError)
    retry_after = retry_after_s(response.headers.get("retry-after"))
    error = _error_object(response)
    if error is None:
        text = response.text.strip()[:MESSAGE_CHARS] or response.reason_phrase or "no body"
        return cls(
            f"HTTP {status}: {text}", status=status, code=f"http_{status}", retryable=None, retry_after=retry_after
        )
    details = {key: value for key, value in error.items() if key not in ("code", "message", "retryable")}
    retryable = error.get("retryable")
    return cls(
        error["message"],
        status=status,
        code=error["code"],
        retryable=retryable if isinstance(retryable, bool) else None,
        details=details,
        retry_after=retry_after,
    )
