"""`service.callbacks` against a real loopback receiver: what a delivery reports (the receiver's real
status, a large 2xx too), and its retries (the receiver's Retry-After honoured, a refusal not retried).
The whole path, a run's callback through the server, is in test_async_runs.py."""

from __future__ import annotations

import time

import pytest
from fake_model import FakeModel, error, raw

from task_app.core.outbound import open_session
from task_app.core.settings import Settings
from task_app.service.callbacks import ANSWER_BYTES, Callbacks

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

SETTINGS = Settings(callback_max_attempts=3, callback_backoff_s=0.01, callback_timeout_s=5.0)


async def deliver(fake_model: FakeModel, settings: Settings = SETTINGS) -> dict[str, object]:
    async with open_session(4) as http:
        return await Callbacks(http, settings).deliver(fake_model.url("/hooks/done"), "run-1", b'{"ok": true}')


@pytest.mark.parametrize("status", [200, 202])
async def test_a_2xx_longer_than_the_answer_limit_reports_its_real_status(fake_model: FakeModel, status: int) -> None:
    fake_model.script(raw(b"x" * (ANSWER_BYTES + 1), status=status))
    outcome = await deliver(fake_model)
    assert outcome == {"delivered": True, "attempts": 1, "status": status, "error": None}
    sent = fake_model.requests[0]
    assert sent.raw == b'{"ok": true}' and sent.headers["x-task-app-run-id"] == "run-1"


async def test_the_receivers_retry_after_is_honoured(fake_model: FakeModel) -> None:
    fake_model.script(error(503, retry_after="0.4"), raw(b"", status=204))
    started = time.monotonic()
    outcome = await deliver(fake_model)
    assert outcome == {"delivered": True, "attempts": 2, "status": 204, "error": None}
    assert time.monotonic() - started >= 0.4  # the backoff alone is at most 10 ms


async def test_a_receiver_that_keeps_failing_gets_every_attempt(fake_model: FakeModel) -> None:
    fake_model.default = error(500)
    outcome = await deliver(fake_model)
    assert outcome == {"delivered": False, "attempts": 3, "status": 500, "error": "HTTP 500"}
    assert len(fake_model.requests) == 3


async def test_a_refusal_is_not_retried(fake_model: FakeModel) -> None:
    fake_model.default = error(410)
    outcome = await deliver(fake_model)
    assert outcome == {"delivered": False, "attempts": 1, "status": 410, "error": "HTTP 410"}
