"""Asynchronous runs on one real server: callbacks (delivered, a receiver that keeps failing, one that
refuses, a host that is not allowed), `/metrics` read with prometheus_client's own parser as rollouts
run, and the one JSON line per finished rollout (`TASKAPP_ROLLOUT_LOG`). Across processes:
tests/test_run_fleet.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.errors import error_body
from support.fake_model import FakeModel, Recorded, delay, error, json_body
from support.keys import SECRETS, assert_no_key_material
from support.polling import wait_until
from support.processes import server_process
from support.rollouts import request_body
from support.servers import AppServer

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

WAIT_S = 30.0


@pytest.fixture
def server(make_app_server: Callable[..., AppServer]) -> AppServer:
    return make_app_server(
        inference_allowed_hosts=["127.0.0.1"], callback_backoff_s=0.02, callback_max_attempts=3, runs_heartbeat_s=0.2
    )


def finished(client: httpx.Client, run_id: str, key: str = "status") -> dict[str, Any]:
    """The run's status once it has ended (and, with key="callback", once its callback was settled)."""
    seen: dict[str, Any] = {}

    def done() -> bool:
        seen.update(client.get(f"/runs/{run_id}").json())
        return seen["status"] in ("completed", "aborted", "failed") and key in seen

    wait_until(done, timeout=WAIT_S)
    return seen


def hooks(model: FakeModel) -> list[Recorded]:
    return [record for record in model.requests if record.path == "/hooks/done"]


def test_a_callback_gets_the_response_and_no_key(server: AppServer, fake_model: FakeModel) -> None:
    client = server.client()
    body = request_body(decisions=4, callback_url=fake_model.url("/hooks/done"))
    accepted = client.post("/rollouts", json=body)
    assert accepted.status_code == 202, accepted.text
    seen = finished(client, body["run_id"], "callback")
    assert seen["callback"] == {"delivered": True, "attempts": 1, "status": 200, "error": None}
    (hook,) = hooks(fake_model)
    stored = client.get(f"/runs/{body['run_id']}/result")
    assert stored.status_code == 200 and hook.raw == stored.content  # the response, byte for byte
    assert hook.method == "POST" and hook.headers["content-type"] == "application/json"
    assert hook.headers["x-task-app-run-id"] == body["run_id"]
    assert not {"authorization", "x-api-key", "x-api-keys"} & set(hook.headers)
    assert_no_key_material(json.dumps(hook.headers) + hook.raw.decode(), SECRETS)


def test_a_failing_receiver_is_retried_then_given_up(server: AppServer, fake_model: FakeModel) -> None:
    client = server.client()
    fake_model.script(error(500), error(503), error(502))
    body = request_body(decisions=2, callback_url=fake_model.url("/hooks/done"))
    assert client.post("/rollouts", json=body).status_code == 202
    seen = finished(client, body["run_id"], "callback")
    assert seen["callback"] == {"delivered": False, "attempts": 3, "status": 502, "error": "HTTP 502"}
    assert len(hooks(fake_model)) == 3
    assert client.get(f"/runs/{body['run_id']}/result").status_code == 200  # the result stays available
    retried = request_body(decisions=2, callback_url=fake_model.url("/hooks/done"))
    fake_model.script(error(429), json_body({"ok": True}))
    assert client.post("/rollouts", json=retried).status_code == 202
    assert finished(client, retried["run_id"], "callback")["callback"]["attempts"] == 2


def test_a_refusing_receiver_is_not_asked_again(server: AppServer, fake_model: FakeModel) -> None:
    client = server.client()
    fake_model.script(error(404))
    body = request_body(decisions=1, callback_url=fake_model.url("/hooks/done"))
    assert client.post("/rollouts", json=body).status_code == 202
    assert finished(client, body["run_id"], "callback")["callback"]["attempts"] == 1


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://192.0.2.7/hooks", "callback_host_not_allowed"),
        ("http://user:secret@127.0.0.1/hooks", "invalid_callback_url"),
        ("ftp://127.0.0.1/hooks", "invalid_callback_url"),
    ],
)
def test_a_callback_url_outside_the_allow_list_is_refused_before_anything_runs(
    server: AppServer, url: str, code: str
) -> None:
    client = server.client()
    bodies = [request_body(decisions=1), request_body(decisions=1, callback_url=url)]
    error_body(client.post("/rollouts", json=bodies), 422, code)
    for body in bodies:
        error_body(client.get(f"/runs/{body['run_id']}"), 404, "run_not_found")


def samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_metrics_move_as_rollouts_run(server: AppServer, fake_model: FakeModel) -> None:
    client = server.client()
    before = samples(client)
    assert before[("taskapp_rollouts_in_flight", ())] == 0
    ((_, labels),) = [key for key in before if key[0] == "taskapp_process_info"]
    assert dict(labels)["instance"]
    fake_model.default = delay(0.3)
    body = request_body(inference_url=fake_model.url(), decisions=3)
    assert client.post("/rollouts", json=body).status_code == 202
    wait_until(lambda: samples(client)[("taskapp_rollouts_in_flight", ())] == 1, timeout=WAIT_S)
    finished(client, body["run_id"])
    assert client.post("/rollout", json=request_body(decisions=2)).status_code == 200  # scripted, no model call
    after = samples(client)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("taskapp_rollouts_started_total") == 2
    assert moved("taskapp_rollouts_finished_total", status="completed", stop_reason="completed") == 2
    assert moved("taskapp_decisions_total") == 5
    assert moved("taskapp_model_call_seconds_count") == 3
    assert moved("taskapp_model_call_seconds_sum") >= 0.9
    assert moved("taskapp_model_call_seconds_bucket", le="0.25") == 0  # each call took 0.3 s
    assert moved("taskapp_trace_writes_total") == 2
    assert moved("taskapp_rollout_seconds_count") == 2
    assert after[("taskapp_rollouts_in_flight", ())] == 0
    fake_model.default = error(401)
    failing = request_body(inference_url=fake_model.url(), decisions=2)
    assert client.post("/rollout", json=failing).json()["metrics"]["details"]["error"]["class"] == "model_refused"
    assert samples(client)[("taskapp_rollout_errors_total", (("class", "model_refused"),))] == 1
    error_body(server.client(key=None).get("/metrics"), 401, "unauthorized")


def test_one_json_line_per_finished_rollout(tmp_path: Path) -> None:
    body = request_body(decisions=3, env={"seed": 5})
    with server_process(tmp_path, rollout_log=True, traces_db=tmp_path / "t.db") as process:
        with process.client() as client:
            assert client.post("/rollout", json=body).status_code == 200
            assert client.post("/rollout", json=body).status_code == 200  # a replay is not a rollout

        def lines() -> list[dict[str, Any]]:
            text = process.log_path.read_text()
            return [json.loads(line) for line in text.splitlines() if line.startswith('{"event":"rollout_finished"')]

        wait_until(lambda: len(lines()) >= 1, timeout=WAIT_S)
    (line,) = lines()  # the replay wrote none
    assert line["run_id"] == body["run_id"] and line["trace_correlation_id"] == f"trace_{body['run_id']}"
    assert (line["seed"], line["policy"], line["model"], line["decisions"]) == (5, "crafter-scripted", None, 3)
    assert (line["status"], line["stop_reason"], line["error_class"], line["attempt"]) == (
        "completed",
        "completed",
        None,
        0,
    )
    assert line["achievement_count"] == len(line["achievements"]) and line["duration_s"] > 0
    assert line["stored"] is True and line["instance"]
