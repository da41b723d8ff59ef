"""Error classes: every rollout that did not complete normally says why in `metrics.details.error = {class,
message, retryable}` (rollout/failures.py), one test per class against a real app and the loopback fake
model; the HTTP errors of `/rollout` carry the same `retryable` flag.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel, error, gated, hang, text, tool_call
from support.policies import ScriptedPolicy
from support.polling import wait_until
from support.rollouts import make_plan, request_body
from support.servers import AppServer, start_app_server

from task_app.game import WorldFactory
from task_app.rollout.engine import RolloutEngine
from task_app.rollout.failures import ERROR_CLASSES

pytestmark = pytest.mark.usefixtures("no_key_in_logs")

FAST: dict[str, Any] = {
    "inference_read_timeout_s": 0.3,
    "inference_max_attempts": 2,
    "inference_backoff_s": 0.01,
    "inference_backoff_max_s": 0.05,
    "warm_up": False,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    with ExitStack() as stack:
        yield start_app_server(stack, tmp_path_factory.mktemp("classes"), **FAST)


@pytest.fixture(scope="module")
def client(server: AppServer) -> httpx.Client:
    return server.client(timeout=30.0)


def react(url: str, decisions: int = 3, **overrides: Any) -> dict[str, Any]:
    body = request_body(
        run_id=f"class-{uuid.uuid4().hex[:10]}",
        ops=["agent", "env"] * decisions,
        policy={"policy_name": "crafter-react"},
    )
    body["policy"]["config"] = {"model": "fake-model", "inference_url": url, "max_llm_calls": decisions}
    body.update(overrides)
    return body


def error_of(response: httpx.Response, error_class: str, retryable: bool) -> dict[str, Any]:
    """The rollout answered 200, aborted, with this class of error (or, for storage, not aborted)."""
    assert response.status_code == 200, response.text
    body = response.json()
    failure: dict[str, Any] = body["metrics"]["details"]["error"]
    assert (failure["class"], failure["retryable"]) == (error_class, retryable), failure
    assert failure["class"] in ERROR_CLASSES and isinstance(failure["message"], str) and failure["message"]
    assert body["aborted"] is (error_class != "storage")
    return failure


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
def test_a_completed_rollout_has_no_error(client: httpx.Client, fake_model: FakeModel) -> None:
    response = client.post("/rollout", json=react(fake_model.url()))
    assert response.status_code == 200 and "error" not in response.json()["metrics"]["details"]


@pytest.mark.e2e
def test_model_unreachable_when_nothing_listens(client: httpx.Client) -> None:
    failure = error_of(
        client.post("/rollout", json=react(f"http://127.0.0.1:{closed_port()}/v1")), "model_unreachable", True
    )
    assert failure["code"] == "inference_unavailable" and failure["status"] is None


@pytest.mark.e2e
def test_model_unreachable_when_it_keeps_failing(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = error(503)
    failure = error_of(client.post("/rollout", json=react(fake_model.url())), "model_unreachable", True)
    assert failure["status"] == 503


@pytest.mark.e2e
def test_model_timeout(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = hang()
    failure = error_of(client.post("/rollout", json=react(fake_model.url())), "model_timeout", True)
    assert failure["code"] == "inference_timeout"


@pytest.mark.e2e
@pytest.mark.parametrize(("status", "retryable"), [(401, False), (404, False), (422, False), (429, True)])
def test_model_refused(client: httpx.Client, fake_model: FakeModel, status: int, retryable: bool) -> None:
    fake_model.default = error(status, retry_after=0)
    failure = error_of(client.post("/rollout", json=react(fake_model.url())), "model_refused", retryable)
    assert failure["status"] == status


@pytest.mark.e2e
def test_model_unusable(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.default = text("I would rather not say.")
    failure = error_of(client.post("/rollout", json=react(fake_model.url(), 5)), "model_unusable", False)
    assert failure["message"] == "3 unusable model answers in a row (the last: no_actions_in_text)"


@pytest.mark.e2e
def test_deadline(client: httpx.Client, fake_model: FakeModel) -> None:
    fake_model.script(tool_call("noop"))
    fake_model.default = hang()
    body = react(fake_model.url(), safety={"max_time_s": 0.2})
    failure = error_of(client.post("/rollout", json=body), "deadline", True)
    assert "safety.max_time_s = 0.2 s" in failure["message"]


@pytest.mark.e2e
def test_max_ops_is_an_abort(client: httpx.Client, fake_model: FakeModel) -> None:
    failure = error_of(client.post("/rollout", json=react(fake_model.url(), safety={"max_ops": 3})), "aborted", False)
    assert failure["message"] == "safety.max_ops (3) was reached"


@pytest.mark.e2e
def test_aborted(server: AppServer, client: httpx.Client, fake_model: FakeModel) -> None:
    gate = threading.Event()
    fake_model.default = gated(gate)
    body = react(fake_model.url())
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(client.post, "/rollout", json=body)
        wait_until(lambda: len(fake_model.requests) == 1)
        assert client.post("/run/abort", json={"run_id": body["run_id"]}).status_code == 200
        response = pending.result(timeout=10)
    gate.set()
    error_of(response, "aborted", False)


@pytest.mark.e2e
def test_storage(make_app_server: Callable[..., AppServer], tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the traces directory should be")
    server = make_app_server(traces_db=blocker / "traces.db", warm_up=False)
    response = server.client().post("/rollout", json=request_body(run_id="storage-class"))
    failure = error_of(response, "storage", False)
    assert failure["message"].startswith("not stored (trace: ")
    assert response.json()["metrics"]["details"]["stop_reason"] == "completed"


class BrokenWorlds(WorldFactory):
    """A world factory with a bug: the second episode's world cannot be built."""

    def __init__(self, worlds: WorldFactory) -> None:
        self.inner, self.calls = worlds, 0

    def world(self, seed: int, area: tuple[int, int] = (64, 64), length: int = 10000) -> Any:
        self.calls += 1
        if self.calls > 1:
            raise KeyError("a bug")
        return self.inner.world(seed, area, length)


def test_internal(worlds: WorldFactory) -> None:
    plan = make_plan(env={"config": {"length": 2}}, ops=["agent", "env"] * 4, on_done="reset")
    engine = RolloutEngine(plan, ScriptedPolicy([["noop"]]), BrokenWorlds(worlds))
    result = asyncio.run(engine.run())
    failure = result.metrics()["details"]["error"]
    assert result.stop_reason == "internal_error" and result.aborted and len(result.records) == 2
    assert (failure["class"], failure["retryable"]) == ("internal", True)
    assert failure["message"] == "internal error (KeyError) after 2 decision(s); the task app's log has the details"


# --- the HTTP errors of /rollout -------------------------------------------------------------------


def _retryable(response: httpx.Response, status: int) -> bool:
    assert response.status_code == status, response.text
    flag: bool = response.json()["error"]["retryable"]
    return flag


@pytest.mark.e2e
def test_http_errors_carry_the_retryable_flag(server: AppServer, client: httpx.Client, fake_model: FakeModel) -> None:
    assert _retryable(client.post("/rollout", json={"run_id": "x"}), 422) is False
    assert _retryable(client.post("/rollout", content=b"{", headers={"Content-Type": "application/json"}), 400) is False
    assert (
        _retryable(server.client(key="wrong-key", guard=False).post("/rollout", json=react("http://x")), 401) is False
    )
    vendor = react("http://127.0.0.1:9/v1")
    vendor["policy"]["config"] = {"model": "gpt-4o-mini", "provider": "openai"}
    assert _retryable(client.post("/rollout", json=vendor), 503) is False  # no vendor key configured here
    assert _retryable(client.get("/run/status/no-such-run"), 404) is False
    gate = threading.Event()
    fake_model.default = gated(gate)
    body = react(fake_model.url())
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(client.post, "/rollout", json=body)
        wait_until(lambda: len(fake_model.requests) == 1)
        assert _retryable(client.post("/rollout", json=body), 409) is True  # later, the same run_id replays
        gate.set()
        assert pending.result(timeout=10).status_code == 200


@pytest.mark.e2e
def test_capacity_is_retryable(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> None:
    server = make_app_server(max_concurrent_rollouts=1, warm_up=False)
    client = server.client()
    gate = threading.Event()
    fake_model.default = gated(gate)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(client.post, "/rollout", json=react(fake_model.url()))
        wait_until(lambda: len(fake_model.requests) == 1)
        refused = client.post("/rollout", json=react(fake_model.url()))
        assert _retryable(refused, 429) is True and refused.headers["Retry-After"]
        gate.set()
        assert pending.result(timeout=10).status_code == 200
