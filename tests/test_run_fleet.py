"""Runs across the fleet, with two real app processes sharing `TASKAPP_STATE_BACKEND=sqlite:PATH` (as
Modal's containers share a modal.Dict), each request addressed to one of them on purpose: status and
abort from the other process, fleet-wide idempotency, asynchronous submission and groups, a process
killed mid-rollout, and the trace commands over the folder of both processes' databases."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.errors import error_body
from support.fake_model import FakeModel, delay
from support.polling import wait_until
from support.processes import ServerProcess, server_process, server_processes
from support.rollouts import request_body
from support.traces import run_cli

from task_app.core.contracts import RolloutResponse

pytestmark = [pytest.mark.usefixtures("no_key_in_logs"), pytest.mark.e2e]

LOST_AFTER_S = 3.0
FLEET = {"runs_heartbeat_s": 0.25, "runs_lost_after_s": LOST_AFTER_S}
ABORT_BOUND_S = 1.0  # the bound on the sqlite backend, with the default TASKAPP_RUNS_ABORT_POLL_S
WAIT_S = 60.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    traces = tmp_path / "traces"
    traces.mkdir()
    settings = [{"state_backend": backend, "traces_db": traces / name, **FLEET} for name in ("a.db", "b.db")]
    with server_processes(tmp_path, *settings) as (first, second):
        yield first, second


@pytest.fixture
def clients(pair: tuple[ServerProcess, ServerProcess]) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    with pair[0].client() as a, pair[1].client() as b:
        yield a, b


def status(client: httpx.Client, run_id: str) -> dict[str, Any]:
    response = client.get(f"/runs/{run_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def decisions(client: httpx.Client, run_id: str) -> int:
    response = client.get(f"/run/status/{run_id}")
    return int(response.json()["progress"].get("decisions", 0)) if response.status_code == 200 else 0


def result(client: httpx.Client, run_id: str, timeout: float = WAIT_S) -> httpx.Response:
    """Poll `GET /runs/{run_id}/result` until it is not a 202."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/runs/{run_id}/result")
        if response.status_code != 202:
            return response
        assert response.json()["status"] in ("queued", "running") and int(response.headers["Retry-After"]) >= 1
        assert time.monotonic() < deadline, "no result in time"
        time.sleep(0.05)  # polling interval


def post_later(pool: ThreadPoolExecutor, client: httpx.Client, body: dict[str, Any]) -> tuple[Future[Any], list[float]]:
    """POST /rollout in the background; the list gets the moment the answer arrived."""
    answered: list[float] = []
    future = pool.submit(client.post, "/rollout", json=body)
    future.add_done_callback(lambda _: answered.append(time.monotonic()))
    return future, answered


def metric(client: httpx.Client, name: str, **labels: str) -> float:
    """A sample of /metrics, parsed by prometheus_client's own parser."""
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items()):
                return float(sample.value)
    return 0.0


def test_status_and_abort_from_the_other_process(
    clients: tuple[httpx.Client, httpx.Client], fake_model: FakeModel
) -> None:
    a, b = clients
    fake_model.default = delay(0.2)  # every decision waits 0.2 s for the model
    body = request_body(inference_url=fake_model.url(), decisions=200)
    run_id = body["run_id"]
    with ThreadPoolExecutor(1) as pool:
        running, answered = post_later(pool, a, body)
        wait_until(lambda: decisions(b, run_id) >= 2, timeout=WAIT_S)  # live progress, through a's heartbeat
        seen = status(b, run_id)
        assert (seen["status"], seen["attempt"], seen["finished_at"]) == ("running", 0, None)
        assert seen["result_url"] == f"/runs/{run_id}/result" and seen["status_url"] == f"/runs/{run_id}"
        asked = time.monotonic()
        aborted = b.post("/run/abort", json={"run_id": run_id})
        assert aborted.status_code == 200 and aborted.json() == {"ok": True, "run_id": run_id, "status": "running"}
        response = running.result(timeout=WAIT_S)
    assert answered[0] - asked < ABORT_BOUND_S, answered[0] - asked
    assert response.status_code == 200, response.text
    rolled = response.json()
    assert rolled["aborted"] is True and rolled["metrics"]["details"]["stop_reason"] == "aborted"
    assert 2 <= rolled["metrics"]["num_steps"] < 200
    final = status(b, run_id)
    assert final["status"] == "aborted" and final["progress"]["decisions"] == rolled["metrics"]["num_steps"]
    assert b.get(f"/runs/{run_id}/result").content == response.content


def test_the_same_run_id_on_the_other_process(
    clients: tuple[httpx.Client, httpx.Client], fake_model: FakeModel
) -> None:
    a, b = clients
    fake_model.default = delay(0.2)
    body = request_body(inference_url=fake_model.url(), decisions=6)
    with ThreadPoolExecutor(1) as pool:
        running, _ = post_later(pool, a, body)
        wait_until(lambda: decisions(b, body["run_id"]) >= 1, timeout=WAIT_S)
        error_body(b.post("/rollout", json=body), 409, "run_in_progress")
        first = running.result(timeout=WAIT_S)
    assert first.status_code == 200 and first.json()["metrics"]["num_steps"] == 6
    calls = len(fake_model.requests)
    for client in (b, a):
        again = client.post("/rollout", json=body)
        assert again.status_code == 200 and again.content == first.content  # byte for byte, from the store
    assert len(fake_model.requests) == calls  # and no second rollout
    assert metric(b, "taskapp_rollouts_started_total") == 0


def test_async_submission_on_one_process_and_the_result_from_the_other(
    clients: tuple[httpx.Client, httpx.Client], fake_model: FakeModel
) -> None:
    a, b = clients
    fake_model.default = delay(0.1)
    body = request_body(inference_url=fake_model.url(), decisions=5)
    accepted = a.post("/rollouts", json=body)
    assert accepted.status_code == 202, accepted.text
    (run,) = accepted.json()["runs"]
    assert (run["run_id"], run["attempt"], run["accepted"]) == (body["run_id"], 0, True)
    assert run["status"] in ("queued", "running") and run["result_url"] == f"/runs/{body['run_id']}/result"
    response = result(b, body["run_id"])
    assert response.status_code == 200, response.text
    rolled = RolloutResponse.model_validate(response.json())
    assert rolled.run_id == body["run_id"] and rolled.metrics.num_steps == 5 and rolled.aborted is False
    assert status(b, body["run_id"])["status"] == status(a, body["run_id"])["status"] == "completed"
    again = b.post("/rollouts", json=body)  # submitted again (say, after a network error): not run twice
    assert again.status_code == 202 and again.json()["runs"][0]["accepted"] is False
    assert again.json()["runs"][0]["status"] == "completed"
    assert b.post("/rollout", json=body).content == response.content
    error_body(b.get("/runs/never-submitted/result"), 404, "run_not_found")


def test_a_group_runs_every_rollout_and_generates_its_world_once(
    clients: tuple[httpx.Client, httpx.Client],
) -> None:
    a, b = clients
    group = [request_body(decisions=3, env={"seed": 9_876}) for _ in range(4)]  # a seed nobody generated yet
    misses = metric(a, "taskapp_world_cache_misses_total")
    accepted = a.post("/rollouts", json=group)
    assert accepted.status_code == 202, accepted.text
    assert [run["run_id"] for run in accepted.json()["runs"]] == [body["run_id"] for body in group]
    bodies = [result(b, body["run_id"]).json() for body in group]
    assert [body["metrics"]["num_steps"] for body in bodies] == [3, 3, 3, 3]
    assert len({json.dumps(body["trajectories"][0]["steps"][0]["obs"]) for body in bodies}) == 1  # one world
    assert metric(a, "taskapp_world_cache_misses_total") - misses == 1
    assert metric(a, "taskapp_world_cache_hits_total") >= 3
    error_body(a.post("/rollouts", json=[group[0], group[0]]), 422, "duplicate_run_id")
    error_body(a.post("/rollouts", json=[]), 422, "empty_batch")
    bad = [request_body(), request_body(env={"env_name": "pong"})]
    error_body(a.post("/rollouts", json=bad), 422, "unknown_env")  # nothing of a list is taken on a mistake
    error_body(b.get(f"/runs/{bad[0]['run_id']}"), 404, "run_not_found")


def test_a_killed_process_leaves_a_lost_run_that_runs_again(tmp_path: Path, fake_model: FakeModel) -> None:
    backend = f"sqlite:{tmp_path / 'state.db'}"
    fake_model.default = delay(0.2)
    body = request_body(inference_url=fake_model.url(), decisions=100)
    run_id = body["run_id"]
    with server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "b.db", **FLEET) as survivor:
        with survivor.client() as b:
            with server_process(tmp_path, state_backend=backend, traces_db=tmp_path / "a.db", **FLEET) as doomed:
                with doomed.client() as a:
                    assert a.post("/rollouts", json=body).status_code == 202
                    wait_until(lambda: decisions(b, run_id) >= 2, timeout=WAIT_S)
                doomed.kill()  # SIGKILL mid-rollout: no shutdown, no end record, no last heartbeat
                killed = time.monotonic()
            assert status(b, run_id)["status"] == "running"  # its last heartbeat is still fresh
            wait_until(lambda: status(b, run_id)["status"] == "lost", timeout=WAIT_S)
            declared = time.monotonic() - killed
            assert LOST_AFTER_S - 1.0 < declared < LOST_AFTER_S + 1.5, declared
            error_body(b.get(f"/runs/{run_id}/result"), 409, "run_lost")
            calls = len(fake_model.requests)
            fake_model.default = delay(0.0)
            again = b.post("/rollout", json=body)  # the lost run submitted again: it runs, as attempt 1
            assert again.status_code == 200, again.text
            assert again.json()["metrics"]["num_steps"] == 100 and again.json()["aborted"] is False
            assert len(fake_model.requests) - calls == 100
            final = status(b, run_id)
            assert (final["status"], final["attempt"]) == ("completed", 1)


def test_the_trace_commands_read_both_processes_databases_as_one(
    pair: tuple[ServerProcess, ServerProcess],
    clients: tuple[httpx.Client, httpx.Client],
    fake_model: FakeModel,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = clients
    on_a = request_body(inference_url=fake_model.url(), decisions=3)
    on_b = request_body(inference_url=fake_model.url(), decisions=2, env={"seed": 4})
    assert a.post("/rollout", json=on_a).status_code == 200
    assert b.post("/rollout", json=on_b).status_code == 200
    folder = tmp_path / "traces"
    assert sorted(path.name for path in folder.glob("*.db")) == ["a.db", "b.db"]

    def cli(*argv: str | Path) -> tuple[int, str]:
        code = run_cli(list(argv))
        return code, capsys.readouterr().out

    code, listed = cli("traces", "--db", folder, "list", "--json")
    assert code == 0
    assert {row["session_id"] for row in json.loads(listed)} == {on_a["run_id"], on_b["run_id"]}
    for body, steps in ((on_a, 3), (on_b, 2)):
        code, shown = cli("traces", "--db", folder, "show", body["run_id"], "--json")
        assert code == 0 and len(json.loads(shown)["decisions"]) == steps
        assert cli("replay", body["run_id"], "--db", folder)[0] == 0
    export = tmp_path / "sft.jsonl"
    assert cli("traces", "--db", folder, "export", "--format", "jsonl", "-o", export)[0] == 0
    records = [json.loads(line) for line in export.read_text().splitlines()]
    assert sorted(record["run_id"] for record in records) == sorted([on_a["run_id"]] * 3 + [on_b["run_id"]] * 2)
    page = tmp_path / "view.html"
    assert cli("view", on_b["run_id"], "--db", folder, "-o", page)[0] == 0 and page.stat().st_size > 0
    assert cli("traces", "--db", folder, "show", "no-such-run")[0] == 1
