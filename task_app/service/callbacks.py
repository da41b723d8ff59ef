"""A run's `callback_url` gets its RolloutResponse when the run ends: POSTed, retried with backoff.

    POST <callback_url>   body: the response bytes (what GET /runs/{run_id}/result answers)
                          headers: Content-Type: application/json, X-Task-App-Run-Id: <run_id>; never a key

The URL was checked when the run was submitted (`rollout.plan.check_outbound_url`: http(s), no
credentials, its host in TASKAPP_INFERENCE_ALLOWED_HOSTS when that is set). A 2xx answer delivers it
(its body is not read past `ANSWER_BYTES`; `status` is the receiver's all the same); a connection
failure, a timeout, 408, 429 and 5xx are tried again (`core.backoff`: up to `TASKAPP_CALLBACK_BACKOFF_S`
doubling per attempt, at most `MAX_BACKOFF_S`, with full jitter, the receiver's Retry-After honoured up
to `MAX_BACKOFF_S`), `TASKAPP_CALLBACK_MAX_ATTEMPTS` times in all; any other status is the receiver's
refusal and ends the delivery. The outcome goes into the run's record (`GET /runs/{run_id}`:
`callback`); the result stays available either way.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio

from ..core.backoff import Backoff, retry_after_seconds
from ..core.outbound import AnswerTooLarge, Outbound, SendFailure, post
from ..core.settings import Settings

logger = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
ANSWER_BYTES = 64 * 1024  # what a receiver's answer may hold; it is not read further
_AGAIN = frozenset({408, 429})
_SERVER_ERROR = 500


class Callbacks:
    def __init__(self, http: Outbound, settings: Settings) -> None:
        self.http = http
        self.backoff = Backoff(settings.callback_backoff_s, MAX_BACKOFF_S, max_attempts=settings.callback_max_attempts)
        self.connect_timeout_s = settings.inference_connect_timeout_s
        self.timeout_s = settings.callback_timeout_s

    async def deliver(self, url: str, run_id: str, body: bytes) -> dict[str, Any]:
        """`{"delivered", "attempts", "status", "error"}` (`status`: the receiver's last HTTP status)."""
        headers = {"Content-Type": "application/json", "X-Task-App-Run-Id": run_id}
        status: int | None = None
        error: str | None = None
        retry = self.backoff.start()
        while True:
            retry_after: str | None = None
            try:
                answer = await post(
                    self.http,
                    url.strip(),
                    body,
                    headers,
                    connect_timeout_s=self.connect_timeout_s,
                    read_timeout_s=self.timeout_s,
                    total_timeout_s=self.connect_timeout_s + self.timeout_s,
                    max_bytes=ANSWER_BYTES,
                )
            except AnswerTooLarge as exc:  # a 2xx with a long body: delivered all the same
                return {"delivered": True, "attempts": retry.attempt, "status": exc.status, "error": None}
            except SendFailure as exc:
                status, error = None, f"{exc.kind}: {exc}"
                if exc.kind == SendFailure.REQUEST:
                    break
            else:
                status, error, retry_after = (
                    answer.status,
                    None if answer.ok else f"HTTP {answer.status}",
                    answer.retry_after,
                )
                if answer.ok:
                    return {"delivered": True, "attempts": retry.attempt, "status": status, "error": None}
                if answer.status not in _AGAIN and answer.status < _SERVER_ERROR:
                    break
            wait = retry.next_wait(retry_after_seconds(retry_after))
            if wait is None:
                break
            await anyio.sleep(wait)
        logger.warning("callback for run %s not delivered after %d attempt(s): %s", run_id, retry.attempt, error)
        return {"delivered": False, "attempts": retry.attempt, "status": status, "error": error}
