"""Model servers that misbehave, end to end: a real task app, the loopback fake model, one fault each.

Every rollout answers 200 within its deadline with a precise `metrics.details.stop_reason` (and, for
a policy error, `metrics.details.error.code`); retries never outlast the deadline; the server is idle
afterwards. Faults: 5xx, 429 with Retry-After (short, and longer than the time left), a hang, a slow
drip, connection refused, invalid JSON, a 50 MB answer (an unusable answer for its decision), no tool
call, invalid actions, a wrong tool.

Timings use small limits (read timeout 0.5 s, rollout deadlines of 1-1.5 s), never long sleeps, and are
the server's own (`metrics.details.duration_s`), so a loaded test process cannot stretch them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import anyio
import httpx
import pytest
from support.fake_model import Behaviour, Exchange, FakeModel, error, hang, huge, raw, text, tool_call
from support.polling import wait_until
from support.rollouts import request_body
from support.servers import AppServer, start_app_server

from task_app.core.contracts import RolloutResponse

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

ATTEMPTS = 3
READ_TIMEOUT_S = 0.5
MARGIN_S = 0.5  # what a rollout may take beyond its deadline by the server's clock (cancelling, a crafter step)
EARLY_S = 0.05  # the deadline starts before that clock does (the policy is built first)
FAULT_SETTINGS: dict[str, Any] = {
    "inference_connect_timeout_s": 0.5,
    "inference_read_timeout_s": READ_TIMEOUT_S,
    "inference_max_attempts": ATTEMPTS,
    "inference_backoff_s": 0.05,
    "inference_backoff_max_s": 0.3,
    "warm_up": False,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    with ExitStack() as stack:
        yield start_app_server(stack, tmp_path_factory.mktemp("faults"), **FAULT_SETTINGS)


@pytest.fixture(scope="module")
def client(server: AppServer) -> httpx.Client:
    return server.client(timeout=30.0)


@pytest.fixture(autouse=True)
def idle_afterwards(server: AppServer) -> Iterator[None]:
    yield
    assert server.health()["rollouts"]["active"] == 0


def rollout(
    client: httpx.Client, url: str, decisions: int = 3, max_time_s: float = 5.0
) -> tuple[dict[str, Any], float]:
    """POST a crafter-react rollout against `url`: the validated response, and how long the rollout took
    by the server's own clock (`duration_s`, the engine's: no HTTP and no test thread in it)."""
    body = request_body(inference_url=url, decisions=decisions, safety={"max_time_s": max_time_s})
    response = client.post("/rollout", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    RolloutResponse.model_validate(result)
    return result, result["metrics"]["details"]["duration_s"]


def stopped(result: dict[str, Any], reason: str, code: str | None = None) -> dict[str, Any]:
    details: dict[str, Any] = result["metrics"]["details"]
    assert details["stop_reason"] == reason, details
    assert result["aborted"] is (reason not in ("completed", "episode_done"))
    if code is not None:
        assert details["error"]["code"] == code, details["error"]
    return details


def stamped(behaviour: Behaviour, arrivals: list[float]) -> Behaviour:
    """`behaviour`, noting when each request arrived."""

    async def respond(ex: Exchange) -> None:
        arrivals.append(time.monotonic())
        await behaviour(ex)

    return respond


def drip(every_s: float, piece: bytes = b" ") -> Behaviour:
    """A 200 whose body never ends: one `piece` every `every_s` (each well inside the read timeout)."""

    async def respond(ex: Exchange) -> None:
        gone = anyio.Event()

        async def watch() -> None:
            while (await ex.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        sent = 0
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch)
            await ex.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await ex.send({"type": "http.response.body", "body": b'{"choices": [', "more_body": True})
            with anyio.move_on_after(30):
                while not gone.is_set() and not ex.stopping.is_set():
                    await anyio.sleep(every_s)
                    await ex.send({"type": "http.response.body", "body": piece, "more_body": True})
                    sent += 1
            ex.stats["drip_pieces"] = sent
            ex.stats["drip_client_left"] = int(gone.is_set())
            tasks.cancel_scope.cancel()

    return respond


def dead_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- server errors and rate limits ----------------------------------------------------------------


def test_server_errors_exhaust_the_attempts_within_the_deadline(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = error(500)
    result, elapsed = rollout(client, fake_model.url())
    details = stopped(result, "policy_error", "inference_unavailable")
    assert details["error"]["status"] == 500
    assert len(fake_model.requests) == ATTEMPTS  # one decision, three attempts, then the rollout stops
    assert elapsed < 2.0  # three quick attempts and two short backoffs, nowhere near the 5 s deadline
    assert result["metrics"]["num_steps"] == 0


def test_transient_server_errors_are_retried(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(error(500), error(503), tool_call("move_left"))
    fake_model.default = tool_call("noop")
    result, _ = rollout(client, fake_model.url(), decisions=2)
    stopped(result, "completed")
    assert len(fake_model.requests) == 4
    assert result["metrics"]["num_steps"] == 2
    assert result["trajectories"][0]["steps"][0]["info"]["meta"]["actions"] == ["move_left"]


def test_429_retry_after_is_honoured(client: httpx.Client, fake_model: FakeModel) -> None:
    arrivals: list[float] = []
    fake_model.script(stamped(error(429, retry_after="0.25"), arrivals))
    fake_model.default = stamped(tool_call("noop"), arrivals)
    result, _ = rollout(client, fake_model.url(), decisions=1)
    stopped(result, "completed")
    assert len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.25  # waited as told, not the 0.05 s backoff


def test_429_to_the_end_is_a_precise_error(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = error(429, retry_after="0")
    result, elapsed = rollout(client, fake_model.url())
    details = stopped(result, "policy_error", "inference_rate_limited")
    assert details["error"]["status"] == 429
    assert len(fake_model.requests) == ATTEMPTS and elapsed < 2.0


def test_a_retry_after_past_the_deadline_is_not_waited_for(
    make_app_server: Callable[..., AppServer], fake_model: FakeModel
) -> None:
    """Retry-After is honoured up to 30 s here, the rollout has 1.5 s: it stops at once, not at 30 s."""
    server = make_app_server(**{**FAULT_SETTINGS, "inference_backoff_max_s": 30.0})
    fake_model.default = error(429, retry_after="20")
    result, elapsed = rollout(server.client(), fake_model.url(), max_time_s=1.5)
    details = stopped(result, "policy_error", "inference_rate_limited")
    assert "no time left" in details["error"]["message"]
    assert len(fake_model.requests) == 1 and elapsed < 1.0


# --- answers that never come ----------------------------------------------------------------------


def test_a_hanging_model_ends_at_the_deadline(client: httpx.Client, fake_model: FakeModel) -> None:
    """The read timeout (0.5 s) cuts each attempt; the third attempt is cut by the 1 s deadline."""
    fake_model.script(tool_call("noop"))
    fake_model.default = hang()
    result, elapsed = rollout(client, fake_model.url(), max_time_s=1.0)
    stopped(result, "deadline")
    assert result["metrics"]["num_steps"] == 1  # what ran before the hang is returned
    assert 1.0 - EARLY_S <= elapsed < 1.0 + MARGIN_S
    assert len(fake_model.requests) <= 1 + ATTEMPTS


def test_a_slow_drip_ends_at_the_deadline(client: httpx.Client, fake_model: FakeModel) -> None:
    """A byte every 0.1 s never trips the 0.5 s read timeout; the attempt budget (connect + read = 1 s)
    cuts the first attempt, the rollout deadline the second."""
    fake_model.default = drip(every_s=0.1)
    result, elapsed = rollout(client, fake_model.url(), max_time_s=1.5)
    stopped(result, "deadline")
    assert 1.5 - EARLY_S <= elapsed < 1.5 + MARGIN_S
    wait_until(lambda: fake_model.stats.get("drip_client_left") == 1, timeout=5.0)  # the app hung up on the drip
    assert fake_model.stats["drip_pieces"] < 25


def test_a_slow_drip_is_cut_per_attempt_and_retried(client: httpx.Client, fake_model: FakeModel) -> None:
    """A drip counts against the attempt's total budget and is retried, as a hang is."""
    fake_model.default = drip(every_s=0.1)
    rollout(client, fake_model.url(), max_time_s=2.0)
    assert len(fake_model.requests) >= 2  # each attempt cut after connect + read = 1 s, then retried


def test_connection_refused_is_retried_then_a_precise_error(client: httpx.Client) -> None:
    result, elapsed = rollout(client, f"http://127.0.0.1:{dead_port()}/v1")
    details = stopped(result, "policy_error", "inference_unavailable")
    assert f"after {ATTEMPTS} attempt(s)" in details["error"]["message"]
    assert elapsed < 2.0


# --- answers that are not usable ------------------------------------------------------------------


def test_invalid_json_answers_stop_the_rollout_as_unusable(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = raw(b'{"choices": [{"message": ')
    result, _ = rollout(client, fake_model.url(), decisions=5)
    stopped(result, "policy_unusable")
    assert len(fake_model.requests) == 3  # not retried: three unusable answers in a row, then stop
    steps = result["trajectories"][0]["steps"]
    assert len(steps) == 2  # the third unusable answer stops before its env op
    for step in steps:
        meta = step["info"]["meta"]
        assert meta["unusable_reason"] == "invalid_json" and meta["fallback_noop"] is True
        assert meta["actions"] == ["noop"]


def too_large(result: dict[str, Any]) -> None:
    """The first decision's answer was refused as too large: a noop for that decision, then the rollout went on."""
    stopped(result, "completed")
    first, second = result["trajectories"][0]["steps"][:2]
    assert first["info"]["meta"]["unusable_reason"] == "response_too_large"
    assert "8388608 bytes" in first["info"]["meta"]["unusable_detail"]
    assert first["info"]["meta"]["actions"] == ["noop"] and second["info"]["meta"]["actions"] == ["noop"]


def test_a_50_mb_answer_is_cut_off_at_the_cap(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(huge(50 * 1024 * 1024))
    result, elapsed = rollout(client, fake_model.url())
    too_large(result)
    wait_until(lambda: "huge_bytes_sent" in fake_model.stats, timeout=5.0)
    assert fake_model.stats["huge_bytes_sent"] < 20 * 1024 * 1024  # the app stopped reading near 8 MB
    assert len(fake_model.requests) == 3 and elapsed < 5.0  # not retried: one request per decision


def test_a_declared_50_mb_answer_is_refused_unread(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(huge(50 * 1024 * 1024, declare_length=True))
    result, _ = rollout(client, fake_model.url())
    too_large(result)
    wait_until(lambda: "huge_bytes_sent" in fake_model.stats, timeout=5.0)
    assert fake_model.stats["huge_bytes_sent"] < 20 * 1024 * 1024


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (text("Let me think about the best move here."), "no_actions_in_text"),
        (text(""), "empty_answer"),
        (tool_call("fly", "teleport"), "invalid_tool_calls"),
        (tool_call("move_left", name="launch_missiles"), "invalid_tool_calls"),
        (tool_call(arguments="{not json"), "invalid_tool_calls"),
        (tool_call(arguments={"actions": 42}, as_string=False), "invalid_tool_calls"),
    ],
    ids=["prose-without-actions", "empty", "invalid-actions", "wrong-tool-name", "broken-arguments", "actions-int"],
)
def test_unusable_answers_stop_after_three_in_a_row(
    client: httpx.Client, fake_model: FakeModel, answer: Behaviour, reason: str
) -> None:
    fake_model.default = answer
    result, _ = rollout(client, fake_model.url(), decisions=5)
    stopped(result, "policy_unusable")
    assert len(fake_model.requests) == 3
    for step in result["trajectories"][0]["steps"]:
        assert step["info"]["meta"]["unusable_reason"] == reason
        assert step["info"]["meta"]["actions"] == ["noop"]


def test_partly_invalid_actions_run_the_valid_ones_and_report_the_rest(
    client: httpx.Client, fake_model: FakeModel
) -> None:
    fake_model.default = tool_call("fly", "move_left", 99, "do")
    result, _ = rollout(client, fake_model.url(), decisions=2)
    stopped(result, "completed")
    for step in result["trajectories"][0]["steps"]:
        meta = step["info"]["meta"]
        assert meta["actions"] == ["move_left", "do"]
        assert {item["item"] for item in meta["rejected"]} >= {"fly", "99"}


def test_a_tool_named_after_an_action_is_accepted(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = tool_call(arguments={}, name="move_left")
    result, _ = rollout(client, fake_model.url(), decisions=2)
    stopped(result, "completed")
    assert all(step["info"]["meta"]["actions"] == ["move_left"] for step in result["trajectories"][0]["steps"])
