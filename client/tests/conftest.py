"""Fixtures: a live task app (`task-app serve` from the server's virtualenv, a child process on a free
loopback port), the suite's loopback fake model in a child process, and clients on them.

The client's tests run where only the client is installed (.ci/client: a fresh virtualenv with the
wheel and pytest); the app runs from the server's virtualenv, found in `TASK_APP_SERVER_VENV`, or
the running interpreter's own when the server is installed there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from task_app_client import Client, RetryPolicy, Timeout

KEY = "client-test-key-4f1e2d"
SERVER_VENV_VARIABLE = "TASK_APP_SERVER_VENV"
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0  # a cold start under load on the shared 2-core machines
STOP_TIMEOUT_S = 20.0
FAKE_MODEL_LAUNCHER = Path(__file__).with_name("fake_model_process.py")
# Where the server's suite keeps fake_model.py (branch `structure` moves shared test code to tests/support/).
SUITE_SUPPORT = next(
    (folder for folder in (REPO / "tests" / "support", REPO / "tests") if (folder / "fake_model.py").exists()),
    REPO / "tests",
)


def server_venv() -> Path:
    named = os.environ.get(SERVER_VENV_VARIABLE)
    venv = Path(named) if named else Path(sys.prefix)
    if not (venv / "bin" / "task-app").exists():
        pytest.fail(
            f"no task app to test against: {venv}/bin/task-app does not exist; set {SERVER_VENV_VARIABLE} "
            "to the server's virtualenv (.ci/client does)"
        )
    return venv


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def child_environment(**variables: str) -> dict[str, str]:
    """This process's environment without the app's and the client's settings, plus `variables`."""
    keep = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TASKAPP_") and name not in ("ENVIRONMENT_API_KEY", "TASK_APP_URL", "PYTHONPATH")
    }
    return {**keep, **variables}


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class App:
    base_url: str
    log: Path

    def client(self, **options: object) -> Client:
        return Client(self.base_url, KEY, **options)  # type: ignore[arg-type]


@contextmanager
def serve_app(workdir: Path, **settings: str) -> Iterator[App]:
    """`task-app serve` on a free loopback port with the test key and `TASKAPP_*` `settings`, ready
    (GET /health 200) when this yields; stopped (SIGINT, uvicorn's graceful shutdown) after."""
    venv = server_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    variables = {
        "ENVIRONMENT_API_KEY": KEY,
        "TASKAPP_WARM_UP": "false",
        "TASKAPP_TRACES_DB": str(workdir / "traces.db"),
        **{f"TASKAPP_{name.upper()}": value for name, value in settings.items()},
    }
    for attempt in range(3):  # the free port may be taken between the probe and the bind
        port = free_port()
        log = workdir / f"server-{port}.log"
        with log.open("w") as sink:
            process = subprocess.Popen(
                [str(venv / "bin" / "task-app"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                cwd=workdir,
                env=child_environment(**variables),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
            )
        base_url = f"http://127.0.0.1:{port}"
        try:
            if _ready(process, base_url):
                yield App(base_url, log)
                return
        finally:
            stop(process)
        if attempt == 2 or "address already in use" not in log.read_text().lower():
            pytest.fail(f"the task app did not start: {log.read_text()[-3000:]}")


def _ready(process: subprocess.Popen[str], base_url: str) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            if httpx.get(base_url + "/health", timeout=2.0, trust_env=False).status_code == httpx.codes.OK:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.1)  # polling interval
    pytest.fail(f"the task app at {base_url} was not ready within {START_TIMEOUT_S:g} s")


@dataclass
class FakeModelProcess:
    base_url: str

    def url(self, path: str = "/v1/chat/completions") -> str:
        return self.base_url + path


@pytest.fixture(scope="session")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    with serve_app(tmp_path_factory.mktemp("app")) as served:
        yield served


@pytest.fixture(scope="session")
def fake_model() -> Iterator[FakeModelProcess]:
    """The server suite's loopback fake model (tests/fake_model.py; it answers `move_left, do`), run by
    the server's interpreter, which has its dependencies (uvicorn, starlette)."""
    process = subprocess.Popen(
        [str(server_venv() / "bin" / "python"), str(FAKE_MODEL_LAUNCHER)],
        env=child_environment(PYTHONPATH=str(SUITE_SUPPORT)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        line = process.stdout.readline()
        assert line, "the fake model printed no port"
        yield FakeModelProcess(f"http://127.0.0.1:{json.loads(line)['port']}")
    finally:
        process.stdin.close()  # the launcher serves until its stdin closes
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()


@pytest.fixture
def client(app: App) -> Iterator[Client]:
    with app.client() as made:
        yield made


@pytest.fixture(autouse=True)
def _no_client_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests say where the app is; the machine's TASK_APP_URL / ENVIRONMENT_API_KEY never leak in."""
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)


FAST_RETRY = RetryPolicy(attempts=4, backoff=0.05, max_backoff=0.2, jitter=0.25)
SHORT = Timeout(connect=2.0, total=10.0, rollout=60.0)
