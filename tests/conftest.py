"""Shared fixtures and checks: a clean environment for every test, one world factory per session, app
servers on loopback, the key guard, the one polling helper (`wait_until`) and a headless browser."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import browser
import httpx
import pytest
from fastapi import FastAPI
from helpers import FakeClock, FakeModalDict, first_line

from task_app.core.contracts import ErrorResponse
from task_app.core.settings import Settings
from task_app.game import WorldFactory, warm_up
from task_app.store import StateStore
from task_app.store.memory import MemoryStore
from task_app.store.modal_dict import ModalDictStore
from task_app.store.sqlite import SqliteStore
from task_app.web.local_server import serve_in_thread
from task_app.web.server import create_app
from task_app.web.state import AppState

if TYPE_CHECKING:  # imported by pytest as a plugin (below); importing it here would skip its assert rewriting
    from fake_model import FakeModel

_OWN_VARIABLES = (
    "ENVIRONMENT_API_KEY",
    "DEV_ENVIRONMENT_API_KEY",
    "ENVIRONMENT_API_KEY_ALIASES",
    "OPENAI_API_KEY",
    "GROQ_API_KEY",
)


LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class NonLoopbackConnection(RuntimeError):
    """A test tried to reach something beyond this machine's loopback."""


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every test: connections and name lookups beyond loopback raise, and are recorded in case one was
    swallowed (the suite's network traffic goes to 127.0.0.1 only)."""
    attempts: list[Any] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(address: Any) -> None:
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            attempts.append(address)
            raise NonLoopbackConnection(f"test tried to reach {address!r}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and str(host) not in LOOPBACK:
            check((str(host), 0))
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield attempts
    assert not attempts, f"non-loopback connections attempted: {attempts}"


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Tests never see the developer's keys or TASKAPP_* settings."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("TASKAPP_", "MODAL_")) or name in _OWN_VARIABLES:
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def worlds() -> WorldFactory:
    factory = WorldFactory(cache_size=64)
    warm_up(factory)
    return factory


@pytest.fixture(params=["memory", "sqlite", "modal-dict"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[StateStore, FakeClock]]:
    """Each state-store backend on a clock the test moves; modal-dict on `FakeModalDict` (1 ms calls)."""
    clock = FakeClock()
    store: StateStore
    if request.param == "memory":
        store = MemoryStore(clock)
    elif request.param == "sqlite":
        store = await SqliteStore(tmp_path / "state.db", clock).open()
    else:
        store = ModalDictStore(FakeModalDict(latency_s=0.001, clock=clock), clock=clock)
    try:
        yield store, clock
    finally:
        await store.close()


# --- HTTP end-to-end: the task app under a real uvicorn server ------------------------------------
#
# `app_server` (one per test module) and `make_app_server(**settings)` (per test, for special
# settings) run `create_app(Settings(...))` on 127.0.0.1 with an OS-assigned port. Clients made with
# `AppServer.client()` check every response (body and headers) for any 4-character piece of a key.


pytest_plugins = ("fake_model",)

# Mixed case and letters outside [0-9a-f]: no 4-character piece of these occurs in uuids, hex ids or prose.
TEST_KEY = "tk-Qz7WxJvKpLmYrNsT"
ALIAS_KEY = "ak-HgFzXqWvBnMjKyPu"
SECRETS = (TEST_KEY, ALIAS_KEY)
FRAGMENT = 4


def key_fragments(secret: str, size: int = FRAGMENT) -> set[str]:
    return {secret[index : index + size] for index in range(len(secret) - size + 1)}


def assert_no_key_material(text: str, secrets: tuple[str, ...] = SECRETS) -> None:
    """No substring of length >= 4 of any secret occurs in `text` (checking every 4-gram suffices)."""
    for secret in secrets:
        leaked = sorted(fragment for fragment in key_fragments(secret) if fragment in text)
        assert not leaked, f"text contains pieces of a key: {leaked}"


def assert_response_keeps_keys(response: httpx.Response, secrets: tuple[str, ...] = SECRETS) -> None:
    response.read()
    headers = "\n".join(f"{name}: {value}" for name, value in response.headers.multi_items())
    assert_no_key_material(response.content.decode("utf-8", "replace") + "\n" + headers, secrets)


def expect_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The contract's error body: `{"error": {"code", "message", ...}, "detail": message}`."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    parsed = ErrorResponse.model_validate(body)
    assert parsed.error.code == code, body
    assert parsed.detail == parsed.error.message
    assert parsed.error.message
    return body


def assert_not_a_server_error(response: httpx.Response) -> None:
    """A client mistake is never a 500 (docs/contract.md, "Errors"); nothing these tests send is a server fault."""
    assert response.status_code != 500, response.read()


@contextmanager
def _environ_without_own_variables() -> Iterator[None]:
    """Module-scoped servers are built before the function-scoped `clean_environ` runs."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("TASKAPP_", "MODAL_")) or name in _OWN_VARIABLES:
            del os.environ[name]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class AppServer:
    base_url: str
    app: FastAPI
    settings: Settings
    stack: ExitStack

    @property
    def state(self) -> AppState:
        """The app's shared objects (read-only use from tests: the event loop owns them)."""
        state: AppState = self.app.state.task_app
        return state

    def client(
        self,
        key: str | None = TEST_KEY,
        *,
        timeout: float = 15.0,
        guard: bool = True,
        headers: dict[str, str] | None = None,
    ) -> httpx.Client:
        """A client presenting `key` in X-API-Key (None: no key), closed when the server stops.

        Every response is checked: never a 500, and (with `guard`) no piece of a key in body or headers.
        """
        merged = {"X-API-Key": key} if key is not None else {}
        merged.update(headers or {})
        hooks: dict[str, list[Callable[..., Any]]] = {"response": [assert_not_a_server_error]}
        if guard:
            hooks["response"].append(assert_response_keeps_keys)
        client = httpx.Client(
            base_url=self.base_url, headers=merged, timeout=timeout, trust_env=False, event_hooks=hooks
        )
        return self.stack.enter_context(client)

    def health(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.base_url, trust_env=False, timeout=5.0) as client:
            response = client.get("/health")
            assert_response_keeps_keys(response)
            body: dict[str, Any] = response.json()
            return body


def start_app_server(stack: ExitStack, directory: Path, **overrides: Any) -> AppServer:
    values: dict[str, Any] = {
        "environment_api_key": TEST_KEY,
        "environment_api_key_aliases": [ALIAS_KEY],
        "traces_db": directory / "traces.db",
        "inference_connect_timeout_s": 2.0,
        "inference_read_timeout_s": 10.0,
        "inference_backoff_s": 0.01,
        "inference_backoff_max_s": 0.05,
    }
    values.update(overrides)
    with _environ_without_own_variables():
        settings = Settings(**values)
    app = create_app(settings)
    base_url = stack.enter_context(serve_in_thread(app))
    return AppServer(base_url=base_url, app=app, settings=settings, stack=stack)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.005) -> None:
    """The one polling helper: poll `predicate` every `interval` seconds until it holds; fail the test if
    it does not within `timeout`. (An async test calls it through `anyio.to_thread.run_sync`.)"""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"condition not reached in {timeout} s"
        time.sleep(interval)  # the polling interval, not a wait for something to happen


def open_rollout(base_url: str, body: dict[str, Any], *, timeout: float = 10.0) -> socket.socket:
    """Send POST /rollout (with the test key) on a bare socket and read nothing, so the test decides when
    the client goes away."""
    parts = urlsplit(base_url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /rollout HTTP/1.1\r\nHost: {parts.netloc}\r\nX-API-Key: {TEST_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    sock.sendall(head + payload)
    return sock


@pytest.fixture(scope="module")
def app_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """One task app per test module, default settings, the test key and an alias configured."""
    with ExitStack() as stack:
        yield start_app_server(stack, tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="module")
def client(app_server: AppServer) -> httpx.Client:
    """A client of the module's `app_server` with the test key (a module may define its own `client`)."""
    return app_server.client()


@pytest.fixture
def make_app_server(tmp_path: Path) -> Iterator[Callable[..., AppServer]]:
    """`make_app_server(**settings)`: a task app for this test only (stopped at teardown)."""
    counter = itertools.count()
    with ExitStack() as stack:

        def start(**overrides: Any) -> AppServer:
            directory = tmp_path / f"app{next(counter)}"
            directory.mkdir()
            return start_app_server(stack, directory, **overrides)

        yield start


# --- the vendor proxies: a task app whose OpenAI and Groq base URLs point at the fake model ----------

OPENAI_KEY = "sk-proj-Vw9QeRtYuPzXcMnB"
GROQ_KEY = "gsk_Lk8JhGfDsAzXwQeRt"


@pytest.fixture
def vendor_app(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> AppServer:
    """A task app whose OpenAI and Groq base URLs point at the fake vendor, both keys configured."""
    return make_app_server(
        openai_base_url=fake_model.url("/v1"),
        groq_base_url=fake_model.url("/openai/v1"),
        openai_api_key=OPENAI_KEY,
        groq_api_key=GROQ_KEY,
    )


# --- a task app in its own process ----------------------------------------------------------------
#
# `server_process(log_dir, **settings)` runs `python -m benchmarks.app_server` (builds
# `create_app(Settings(...))`, serves it with uvicorn on a pre-bound 127.0.0.1 socket and prints the
# port): for tests that kill a server, or that need several app processes at once. Its log is checked
# for key material when it stops.

ROOT = Path(__file__).resolve().parent.parent
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


def _child_environment() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("TASKAPP_", "MODAL_"))}
    for name in _OWN_VARIABLES:
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


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
            env=_child_environment(),
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
    """One `server_process` per settings dict, started at once (their ~2.5 s start-ups overlap), all
    ready when this yields; each is stopped and its log checked on exit."""
    with ExitStack() as stack:
        with ThreadPoolExecutor(len(settings)) as pool:
            starting = [pool.submit(stack.enter_context, server_process(log_dir, **each)) for each in settings]
        yield [future.result() for future in starting]


# --- the whole suite's logs ------------------------------------------------------------------------
#
# Every log record of the session, from any logger and any thread (uvicorn's non-propagating loggers
# included), passes through `KEY_GUARD` on its way to the handlers, with `task_app` at DEBUG; the
# session fails at the end if any record (message, exception, `extra` fields) held a 4-character piece
# of a configured key. Servers run as child processes have their logs checked when they stop.
# `tests/test_security.py` checks that the guard is installed and catches a leak.

_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class KeyGuard:
    def __init__(self, secrets: tuple[str, ...] = SECRETS) -> None:
        self.secrets = secrets
        self.checked = 0
        self.leaks: list[str] = []
        self._lock = threading.Lock()

    @staticmethod
    def text_of(record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed %-format still has its parts checked
            message = f"{record.msg!r} {record.args!r}"
        parts = [message, record.exc_text or "", record.stack_info or ""]
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(logging.Formatter().formatException(record.exc_info))
        parts.extend(f"{name}={value!r}" for name, value in record.__dict__.items() if name not in _RECORD_ATTRIBUTES)
        return "\n".join(parts)

    def leaked(self, text: str) -> list[str]:
        return sorted({piece for secret in self.secrets for piece in key_fragments(secret) if piece in text})

    def check(self, record: logging.LogRecord) -> None:
        text = self.text_of(record)
        found = self.leaked(text)
        with self._lock:
            self.checked += 1
            if found:
                self.leaks.append(f"{record.name} {record.levelname}: {found} in {text[:300]!r}")


KEY_GUARD = KeyGuard()
_unguarded_handle = logging.Logger.handle


def _guarded_handle(self: logging.Logger, record: logging.LogRecord) -> None:
    KEY_GUARD.check(record)
    _unguarded_handle(self, record)


def pytest_configure(config: pytest.Config) -> None:
    logging.Logger.handle = _guarded_handle  # type: ignore[method-assign]
    logging.getLogger("task_app").setLevel(logging.DEBUG)  # every line the app can write is checked


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.Logger.handle = _unguarded_handle  # type: ignore[method-assign]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if KEY_GUARD.leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if KEY_GUARD.leaks:
        terminalreporter.section("key material in log records", red=True)
        for leak in KEY_GUARD.leaks:
            terminalreporter.line(leak)
    leaks = len(KEY_GUARD.leaks)
    terminalreporter.line(f"key guard: {KEY_GUARD.checked} log records checked, {leaks} with key material")


@pytest.fixture
def no_key_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No log record of the test (any thread, task_app at DEBUG) contains a piece of a key."""
    caplog.set_level(logging.DEBUG, logger="task_app")
    yield
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        assert_no_key_material(text)


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """Headless Chromium for the page tests (tests/browser.py), one per test module."""
    with browser.chromium() as driver:
        yield driver


@pytest.fixture
def anyio_backend() -> str:
    """The app runs on asyncio under uvicorn; async tests run there too (trio may be installed by tools)."""
    return "asyncio"
