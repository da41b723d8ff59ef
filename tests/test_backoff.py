"""`task_app.core.backoff`: full jitter within a capped exponential bound, attempts and a deadline that end
the retries, Retry-After honoured up to a bound, and the Retry-After header read."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from task_app.core.backoff import ATTEMPTS, DEADLINE, Backoff, retry_after_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_waits_are_full_jitter_under_a_doubling_cap() -> None:
    backoff = Backoff(base_s=0.5, cap_s=4.0, rng=random.Random(1))
    for failed, bound in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (9, 4.0)]:
        waits = [backoff.wait(failed) for _ in range(2000)]
        assert 0.0 <= min(waits) < 0.05 * bound and 0.95 * bound < max(waits) <= bound
        assert abs(sum(waits) / len(waits) - bound / 2) < 0.05 * bound  # uniform over [0, bound]


def test_callers_that_failed_together_come_back_spread_out() -> None:
    """Two hundred rollouts whose model call failed at once do not retry at one instant."""
    backoff = Backoff(base_s=1.0, cap_s=8.0)
    waits = sorted(backoff.start().next_wait() or 0.0 for _ in range(200))
    assert len({round(wait, 3) for wait in waits}) > 150 and waits[-1] - waits[0] > 0.8


def test_attempts_end_the_retries() -> None:
    retry = Backoff(base_s=0.01, cap_s=0.01, max_attempts=3).start(None, Clock())
    assert retry.attempt == 1 and retry.remaining() is None
    assert retry.next_wait() is not None and retry.attempt == 2
    assert retry.next_wait() is not None and retry.attempt == 3
    assert retry.next_wait() is None and retry.stopped == ATTEMPTS and retry.attempt == 3


def test_a_wait_that_would_end_past_the_deadline_is_not_started() -> None:
    clock = Clock()
    retry = Backoff(base_s=1.0, cap_s=1.0, max_retry_after_s=60.0).start(clock.now + 10.0, clock)
    assert retry.next_wait(retry_after_s=9.0) == 9.0
    clock.now += 9.0
    assert retry.remaining() == pytest.approx(1.0)
    assert retry.next_wait(retry_after_s=1.0) is None and retry.stopped == DEADLINE


@pytest.mark.parametrize(
    ("retry_after_s", "longest", "expected"),
    [(3.0, None, 3.0), (8.0, None, 8.0), (20.0, 30.0, 20.0), (9.0, None, None), (31.0, 30.0, None)],
    ids=["within-cap", "at-cap", "within-longest", "beyond-cap", "beyond-longest"],
)
def test_retry_after_is_a_lower_bound_up_to_the_longest_honoured(
    retry_after_s: float, longest: float | None, expected: float | None
) -> None:
    backoff = Backoff(base_s=0.001, cap_s=8.0, max_retry_after_s=longest)
    wait = backoff.wait(1, retry_after_s)
    if expected is None:  # asks for more patience than the caller has: its own backoff instead
        assert wait <= 0.001
    else:
        assert wait == expected


def test_a_policy_must_be_possible() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        Backoff(base_s=1.0, cap_s=1.0, max_attempts=0)


def test_retry_after_header_forms() -> None:
    assert retry_after_seconds("2.5") == 2.5
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds(None) is None and retry_after_seconds("") is None
    assert retry_after_seconds("soon") is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < (retry_after_seconds(later) or 0) <= 30
    assert retry_after_seconds(format_datetime(datetime.now(UTC) - timedelta(hours=1), usegmt=True)) == 0.0
