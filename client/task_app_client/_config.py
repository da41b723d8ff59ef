"""The client's configuration: where the app is, its key, timeouts and the retry policy.

Small frozen values, checked when built. The URL and key fall back to the environment variables a
trainer node already has (`TASK_APP_URL`, `ENVIRONMENT_API_KEY`, the server's own name for its key).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

URL_VARIABLE = "TASK_APP_URL"
KEY_VARIABLE = "ENVIRONMENT_API_KEY"
KEY_HEADER = "X-API-Key"


@dataclass(frozen=True, kw_only=True)
class Timeout:
    """Seconds. `connect`: to open a connection; `total`: one call, its retries and their waits
    included; `rollout`: the total of the calls that wait for a rollout to end (`rollout()`, `result()`,
    `group()`), which the server bounds by the request's `safety.max_time_s` (3600 s by default)."""

    connect: float = 5.0
    total: float = 60.0
    rollout: float = 3630.0

    def __post_init__(self) -> None:
        for name in ("connect", "total", "rollout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Timeout.{name} must be positive, got {getattr(self, name)!r}")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When and how long to wait before sending a call again.

    A call is sent at most `attempts` times, never past its deadline. Before retry n (0 for the first),
    the client waits `max(Retry-After, min(max_backoff, backoff * 2**n))`, stretched by a random factor
    in [1, 1 + jitter) so that many clients refused at once do not come back at once.

    What is retried (docs/client.md, "Errors and retries"): 429 and 503 answers (an idempotent call
    unless the server says `retryable: false`; any other call only when it says `retryable: true`), and
    failures to connect (the request was never sent, so any call); an idempotent call also after the
    connection broke mid-request.
    """

    attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 8.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0 or self.jitter < 0:
            raise ValueError("RetryPolicy.backoff, max_backoff and jitter must not be negative")

    @classmethod
    def never(cls) -> RetryPolicy:
        """Send every call once."""
        return cls(attempts=1)

    def delay(self, retry: int, retry_after: float | None, random_fraction: float) -> float:
        """Seconds to wait before retry `retry` (0-based); `random_fraction` in [0, 1)."""
        base = max(retry_after or 0.0, min(self.max_backoff, self.backoff * 2.0**retry))
        return base * (1.0 + self.jitter * random_fraction)


@dataclass(frozen=True)
class Config:
    """What a client was built with, resolved (the URL without a trailing slash)."""

    base_url: str
    api_key: str = field(repr=False)
    timeout: Timeout
    retry: RetryPolicy

    @classmethod
    def resolve(
        cls, base_url: str | None, api_key: str | None, timeout: Timeout | float | None, retry: RetryPolicy | None
    ) -> Config:
        url = base_url or os.environ.get(URL_VARIABLE)
        if not url:
            raise ValueError(f"no base URL: pass base_url or set {URL_VARIABLE}")
        key = api_key or os.environ.get(KEY_VARIABLE)
        if not key:
            raise ValueError(f"no API key: pass api_key or set {KEY_VARIABLE}")
        if timeout is None:
            timeout = Timeout()
        elif not isinstance(timeout, Timeout):
            timeout = Timeout(total=float(timeout))
        return cls(url.rstrip("/"), key, timeout, retry or RetryPolicy())
