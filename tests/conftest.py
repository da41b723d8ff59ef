"""Fixtures and hooks only; the shared test code lives in tests/support/ (its package docstring lists it).

Every test: a clean environment (none of the developer's keys or TASKAPP_* settings), traffic to
loopback only, the key guard on every log record, and the `e2e` marker enforced (support/e2e.py).
"""

from __future__ import annotations

import itertools
import logging
import socket
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.register_assert_rewrite("support")

from support import browser  # noqa: E402 - after the assert rewriting is registered
from support.e2e import E2E_GUARD, skipped_whole  # noqa: E402
from support.fake_model import FakeModel  # noqa: E402
from support.fakes import FakeClock, FakeModalDict  # noqa: E402
from support.keys import (  # noqa: E402
    GROQ_KEY,
    KEY_GUARD,
    OPENAI_KEY,
    assert_no_key_material,
    install_key_guard,
    uninstall_key_guard,
    without_own_variables,
)
from support.servers import LOOPBACK, AppServer, NonLoopbackConnection, start_app_server  # noqa: E402

from task_app.game import WorldFactory, warm_up  # noqa: E402
from task_app.store import StateStore  # noqa: E402
from task_app.store.memory import MemoryStore  # noqa: E402
from task_app.store.modal_dict import ModalDictStore  # noqa: E402
from task_app.store.sqlite import SqliteStore  # noqa: E402

# --- hooks: the key guard and the e2e marker, for the whole session ---------------------------------


def pytest_configure(config: pytest.Config) -> None:
    install_key_guard()
    E2E_GUARD.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    E2E_GUARD.uninstall()
    uninstall_key_guard()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return True if skipped_whole(collection_path, config.option.markexpr) else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    E2E_GUARD.begin(item)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    E2E_GUARD.enter_fixture(fixturedef)
    try:
        return (yield)
    finally:
        E2E_GUARD.leave_fixture()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    E2E_GUARD.end()


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


# --- every test -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def e2e_marked() -> Iterator[None]:
    """A test not marked e2e started no server and no child process (an attempt raised; this catches
    the ones a server thread swallowed)."""
    yield
    assert E2E_GUARD.violations == [], "not marked @pytest.mark.e2e"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Connections and name lookups beyond loopback raise, and are recorded in case one was swallowed
    (the suite's network traffic goes to 127.0.0.1 only)."""
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
    with without_own_variables():
        yield


@pytest.fixture
def anyio_backend() -> str:
    """The app runs on asyncio under uvicorn; async tests run there too (trio may be installed by tools)."""
    return "asyncio"


@pytest.fixture
def no_key_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No log record of the test (any thread, task_app at DEBUG) contains a piece of a key."""
    caplog.set_level(logging.DEBUG, logger="task_app")
    yield
    for record in caplog.records:
        assert_no_key_material(record.getMessage() + (record.exc_text or ""))


# --- worlds and state stores ----------------------------------------------------------------------


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


# --- servers (tests using these are marked e2e) ----------------------------------------------------


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


@pytest.fixture
def vendor_app(make_app_server: Callable[..., AppServer], fake_model: FakeModel) -> AppServer:
    """A task app whose OpenAI and Groq base URLs point at the fake vendor, both keys configured."""
    return make_app_server(
        openai_base_url=fake_model.url("/v1"),
        groq_base_url=fake_model.url("/openai/v1"),
        openai_api_key=OPENAI_KEY,
        groq_api_key=GROQ_KEY,
    )


@pytest.fixture(scope="session")
def fake_model_server() -> Iterator[FakeModel]:
    """One fake model server (support/fake_model.py) for the whole session."""
    with FakeModel() as server:
        yield server


@pytest.fixture
def fake_model(fake_model_server: FakeModel) -> Iterator[FakeModel]:
    """The session's fake model server with an empty script and no recorded requests."""
    fake_model_server.reset()
    yield fake_model_server
    fake_model_server.reset()


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """Headless Chromium for the page tests (support/browser.py), one per test module."""
    with browser.chromium() as driver:
        yield driver
