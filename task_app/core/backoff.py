"""The waits between the attempts of a retried operation: capped exponential backoff with full jitter,
a bounded number of attempts, a total deadline, and a server's Retry-After honoured.

    retry = Backoff(base_s=0.5, cap_s=8.0, max_attempts=4).start(deadline)   # deadline on `clock`, or None
    while True:
        try:
            return await attempt()
        except Temporary as failure:
            wait = retry.next_wait(failure.retry_after_s)
            if wait is None:              # retry.stopped says why: ATTEMPTS or DEADLINE
                raise
            await anyio.sleep(wait)

Full jitter: the wait before attempt n + 1 is drawn uniformly from [0, min(cap_s, base_s * 2^(n-1))]
(AWS Architecture Blog, "Exponential Backoff And Jitter"). Callers that failed together (a model server's
hiccup fails the calls of every rollout at once) come back spread out instead of in waves. A Retry-After
up to `max_retry_after_s` is a lower bound on the wait; a longer one is ignored (the server asks for
more patience than the caller has), as the openai SDK does.
"""

from __future__ import annotations

import email.utils
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio

ATTEMPTS, DEADLINE = "attempts", "deadline"


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry policy. `max_attempts` counts the first attempt (1: never retry; None: only a deadline
    bounds the retries); `max_retry_after_s` defaults to `cap_s`."""

    base_s: float
    cap_s: float
    max_attempts: int | None = None
    max_retry_after_s: float | None = None
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)  # never the global one

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0 or (self.max_attempts is not None and self.max_attempts < 1):
            raise ValueError("base_s and cap_s must not be negative, max_attempts at least 1")

    def start(self, deadline: float | None = None, clock: Callable[[], float] = anyio.current_time) -> Retry:
        """The schedule of one operation, its first attempt about to start; `deadline` is absolute on
        `clock` (`time.monotonic` outside an event loop)."""
        return Retry(self, deadline, clock)

    def wait(self, failed: int, retry_after_s: float | None = None) -> float:
        """The wait after the `failed`-th attempt failed (1 for the first)."""
        wait = self.rng.uniform(0.0, min(self.cap_s, self.base_s * 2.0 ** (failed - 1)))
        longest = self.cap_s if self.max_retry_after_s is None else self.max_retry_after_s
        if retry_after_s is not None and retry_after_s <= longest:
            wait = max(wait, retry_after_s)
        return wait


@dataclass(slots=True)
class Retry:
    """One operation's attempts: `attempt` is the number of the current one (from 1)."""

    policy: Backoff
    deadline: float | None
    clock: Callable[[], float]
    attempt: int = 1
    stopped: str | None = None  # ATTEMPTS or DEADLINE once next_wait returned None

    def remaining(self) -> float | None:
        """Seconds to the deadline (negative once past it), or None without one."""
        return None if self.deadline is None else self.deadline - self.clock()

    def next_wait(self, retry_after_s: float | None = None) -> float | None:
        """The current attempt failed: the wait before the next, or None when there is no next (the
        attempts are used up, or the wait would not end before the deadline)."""
        if self.policy.max_attempts is not None and self.attempt >= self.policy.max_attempts:
            self.stopped = ATTEMPTS
            return None
        wait = self.policy.wait(self.attempt, retry_after_s)
        left = self.remaining()
        if left is not None and wait >= left:
            self.stopped = DEADLINE
            return None
        self.attempt += 1
        return wait


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())
