"""The task app in its own process: for tests that kill a server, or that need several app processes.

`server_process(log_dir, **settings)` runs `python -m benchmarks.app_server` (builds
`create_app(Settings(...))`, serves it with uvicorn on a pre-bound 127.0.0.1 socket and prints the
port). Its log is checked for key material when it stops.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .keys import SECRETS, TEST_KEY, assert_no_key_material, is_own_variable

ROOT = Path(__file__).resolve().parent.parent.parent
PROCESS_START_TIMEOUT_S = 60.0
PROCESS_WAIT_S = 20.0


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    base_url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self, key: str | None = TEST_KEY, timeout: float = 30.0) -> httpx.Client:
        headers = {"X-API-Key": key} if key is not None else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, trust_env=False)

    def health(self) -> dict[str, Any]:
        with self.client(key=None, timeout=5.0) as client:
            body: dict[str, Any] = client.get("/health").json()
        return body

    def kill(self) -> None:
        """SIGKILL: no shutdown, no lifespan exit, no checkpoint."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.wait(timeout=PROCESS_WAIT_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown closes the trace store
            try:
                self.process.wait(timeout=PROCESS_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=PROCESS_WAIT_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


def child_environment() -> dict[str, str]:
    """This environment without the app's own variables, with the repository on PYTHONPATH."""
    env = {name: value for name, value in os.environ.items() if not is_own_variable(name)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def first_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line on stdout, or "" as soon as it exits without one or `timeout` passes: a
    child that fails before printing fails the test at once (the caller shows its stderr), not at the
    suite's 300 s timeout."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if selector.select(min(left, 0.1)):
                return process.stdout.readline()  # "" at end of file: the child closed stdout or exited
            if process.poll() is not None:
                return ""
    return ""


@contextmanager
def server_process(
    log_dir: Path, *, prefix: Sequence[str] = (), uvicorn: dict[str, Any] | None = None, **settings: Any
) -> Iterator[ServerProcess]:
    """The task app with `Settings(environment_api_key=TEST_KEY, warm_up=False, **settings)` in a child
    process (optionally started through `prefix`, e.g. `unshare -m ...`; `uvicorn`: server options such
    as `{"access_log": True, "log_level": "info"}`), ready when this yields."""
    values = {"environment_api_key": TEST_KEY, "warm_up": False, **settings}
    command = [*prefix, sys.executable, "-m", "benchmarks.app_server", "--settings", json.dumps(values, default=str)]
    if uvicorn:
        command += ["--uvicorn", json.dumps(uvicorn)]
    log_path = log_dir / f"server-{uuid.uuid4().hex[:8]}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    assert process.stdout is not None
    served = ServerProcess(process, "", log_path)
    try:
        line = first_line(process, PROCESS_START_TIMEOUT_S)
        assert line, f"the server printed no port (exited or hung): {log_path.read_text()[-2000:]}"
        served.base_url = f"http://127.0.0.1:{json.loads(line)['port']}"
        deadline = time.monotonic() + PROCESS_START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"the server exited: {log_path.read_text()[-2000:]}"
            with suppress(httpx.TransportError):
                if httpx.get(served.base_url + "/health", timeout=2.0, trust_env=False).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.02)  # polling interval
        yield served
    finally:
        served.stop()
        assert_no_key_material(log_path.read_text(errors="replace"), SECRETS)


@contextmanager
def server_processes(log_dir: Path, *settings: dict[str, Any]) -> Iterator[list[ServerProcess]]:
    """One `server_process` per settings dict, started at once (their start-ups overlap), all ready when
    this yields; each is stopped and its log checked on exit."""
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(settings)) as pool:
            starting = [pool.submit(stack.enter_context, server_process(log_dir, **each)) for each in settings]
        yield [future.result() for future in starting]
