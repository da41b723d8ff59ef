"""The commands users run first, as they run them: the installed `task-app` script in a child process.

`demo` end to end in an empty directory; `eval` (and `eval --async`) against a real app server and the
loopback fake model;
`serve` answering `/health` on a free port until it is stopped.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.fake_model import FakeModel, gated
from support.keys import SECRETS, TEST_KEY, assert_no_key_material
from support.polling import wait_until
from support.rollouts import request_body
from support.servers import AppServer

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process

TASK_APP = str(Path(sys.executable).with_name("task-app"))  # the console script `pip install` made
RUN_TIMEOUT_S = 120.0
_ROW = re.compile(r"^│(.*)│$", re.M)


def _environment(**extra: str) -> dict[str, str]:
    """This test's environment (already without TASKAPP_* and keys) plus a wide terminal for rich's tables."""
    return {**os.environ, "COLUMNS": "200", **extra}


def _task_app(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TASK_APP, *args],
        cwd=cwd,
        env=_environment(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def _rows(output: str) -> dict[int, tuple[int, int, str]]:
    """The per-seed table (seed, ach, return, outcome, events, steps, time, stop): seed → (ach, steps, stop)."""
    rows = {}
    for line in _ROW.findall(output):
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) == 8 and cells[0].isdigit():
            rows[int(cells[0])] = (int(cells[1]), int(cells[5]), cells[7])
    return rows


def test_demo_plays_two_seeds_and_leaves_traces_and_a_report(tmp_path: Path) -> None:
    run = _task_app("demo", "--seeds", "0-1", "--decisions", "20", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = _rows(run.stdout)
    assert set(rows) == {0, 1}, run.stdout
    assert all(steps == 20 and stop == "completed" and count > 0 for count, steps, stop in rows.values()), rows
    assert "Mean achievements per episode:" in run.stdout and "Crafter score:" in run.stdout
    db = tmp_path / "traces" / "task_app.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0] == 2
    assert (tmp_path / "traces" / "report.html").stat().st_size > 0
    assert len(list((tmp_path / "traces" / "episodes").glob("demo-*.html"))) == 2


def test_eval_drives_a_served_app_against_the_fake_model(
    app_server: AppServer, fake_model: FakeModel, tmp_path: Path
) -> None:
    run = _task_app(
        "eval",
        *("--base-url", app_server.base_url, "--api-key", TEST_KEY),
        *("--inference-url", fake_model.url(), "--model", "fake-model"),
        *("--seeds", "3,5", "--decisions", "3", "--concurrency", "2"),
        *("--report", str(tmp_path / "out" / "report.html")),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert {seed: (steps, stop) for seed, (_, steps, stop) in _rows(run.stdout).items()} == {
        3: (3, "completed"),
        5: (3, "completed"),
    }
    assert len(fake_model.requests) == 6  # three decisions per seed, each one model call
    assert (tmp_path / "out" / "report.html").exists()
    assert len(list((tmp_path / "out" / "episodes").glob("eval-*.html"))) == 2
    assert_no_key_material(run.stdout + run.stderr, SECRETS)


def test_eval_async_submits_every_rollout_at_once_and_polls_the_results(
    app_server: AppServer, fake_model: FakeModel, tmp_path: Path
) -> None:
    """Four rollouts with `--concurrency 1`: submitted together (all four run while the model holds its
    answers, which one POST /rollout at a time could not do), each result polled."""
    gate = threading.Event()
    fake_model.default = gated(gate)
    args = (
        "eval",
        *("--base-url", app_server.base_url, "--api-key", TEST_KEY),
        *("--inference-url", fake_model.url(), "--model", "fake-model"),
        *("--seeds", "3,5", "--repeats", "2", "--decisions", "2", "--concurrency", "1", "--async"),
    )
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_task_app, *args, cwd=tmp_path)
        try:
            wait_until(lambda: app_server.health()["rollouts"]["active"] == 4, timeout=RUN_TIMEOUT_S)
        finally:
            gate.set()
        run = running.result(timeout=RUN_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    assert {seed: (steps, stop) for seed, (_, steps, stop) in _rows(run.stdout).items()} == {
        3: (2, "completed"),
        5: (2, "completed"),
    }
    assert "Over 2 seed(s), 2 rollout(s) each" in run.stdout
    assert len(fake_model.requests) == 8
    assert_no_key_material(run.stdout + run.stderr, SECRETS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_serve_answers_health_and_stops_cleanly(tmp_path: Path) -> None:
    port = _free_port()
    environment = _environment(
        ENVIRONMENT_API_KEY=TEST_KEY, TASKAPP_TRACES_DB=str(tmp_path / "t.db"), TASKAPP_WARM_UP="false"
    )
    with subprocess.Popen(
        [TASK_APP, "serve", "--port", str(port)],
        cwd=tmp_path,  # no .env here
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as server:
        try:

            def answers() -> bool:
                assert server.poll() is None, "task-app serve exited"
                try:
                    response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0, trust_env=False)
                except httpx.TransportError:
                    return False
                assert response.status_code == 200, response.text
                assert response.json()["healthy"] is True
                return True

            wait_until(answers, timeout=60.0, interval=0.05)
        finally:
            server.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
            output, _ = server.communicate(timeout=30)
    assert server.returncode == 0, output
    assert "Application shutdown complete" in output
    assert_no_key_material(output, SECRETS)


def _pids_answering(base_url: str, processes: int) -> set[int]:
    """The pids /health reports, each read on a new connection (it lands on any process), until
    `processes` distinct ones answered."""
    seen: set[int] = set()

    def all_answered() -> bool:
        try:
            health = httpx.get(base_url + "/health", timeout=2.0, trust_env=False).json()
        except httpx.TransportError:
            return False
        seen.add(health["runtime"]["pid"])
        return len(seen) >= processes

    wait_until(all_answered, timeout=90.0, interval=0.02)
    return seen


def test_serve_processes_share_the_port_env_sessions_and_runs(fake_model: FakeModel, tmp_path: Path) -> None:
    """`--processes 2` on a sqlite state store: both processes answer on the one port; an env and a
    run are found from every new connection (12 each, landing on either process: all on one has a
    chance of 1 in 2,048), a process that dies is replaced, and SIGINT stops them all."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    environment = _environment(
        ENVIRONMENT_API_KEY=TEST_KEY,
        TASKAPP_TRACES_DB=str(tmp_path / "t.db"),
        TASKAPP_STATE_BACKEND=f"sqlite:{tmp_path / 'state.db'}",
        TASKAPP_WARM_UP="false",
    )
    command = [TASK_APP, "serve", "--port", str(port), "--processes", "2"]
    with subprocess.Popen(
        command, cwd=tmp_path, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    ) as server:  # fmt: skip
        try:
            first = _pids_answering(base_url, 2)
            assert server.pid not in first and len(first) == 2

            def fresh(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
                headers = {"X-API-Key": TEST_KEY, "Connection": "close"}  # the next request: a new connection
                return httpx.request(method, base_url + path, json=body, headers=headers, timeout=30.0, trust_env=False)

            created = fresh("POST", "/env/create", {"env_name": "crafter", "seed": 3}).json()
            for index in range(1, 13):
                stepped = fresh("POST", "/env/step", {"env_id": created["env_id"], "action": {"actions": ["noop"]}})
                assert stepped.status_code == 200, stepped.text
                assert stepped.json()["step_idx"] == index  # one env, whichever process took the step

            body = request_body(decisions=2, inference_url=fake_model.url())
            answered = fresh("POST", "/rollout", body)
            assert answered.status_code == 200, answered.text
            for _ in range(12):  # the run's status from whichever process each connection reaches
                status = fresh("GET", f"/runs/{body['run_id']}")
                assert (status.status_code, status.json()["status"]) == (200, "completed"), status.text

            killed = min(first)
            os.kill(killed, signal.SIGKILL)
            after = _pids_answering(base_url, 2)  # only pids that answered after the kill
            assert killed not in after and len(after - first) == 1, (first, after)
        finally:
            server.send_signal(signal.SIGINT)
            output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output
    assert output.count("Application shutdown complete") >= 2, output  # each process's lifespan ended
    assert_no_key_material(output, SECRETS)


def test_serve_refuses_several_processes_on_the_memory_state_store(tmp_path: Path) -> None:
    run = subprocess.run(
        [TASK_APP, "serve", "--port", str(_free_port()), "--processes", "2"],
        cwd=tmp_path, env=_environment(ENVIRONMENT_API_KEY=TEST_KEY), stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert "TASKAPP_STATE_BACKEND" in run.stderr and "Traceback" not in run.stderr
