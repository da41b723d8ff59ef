"""The `e2e` marker, enforced: a test that starts a server or a child process must carry it, so that
`pytest -m "not e2e"` runs only the fast part, and runs all of it.

conftest.py installs `E2E_GUARD` for the session and tells it which test runs and which fixture is
being set up. While a test without the marker is set up, run and torn down, a socket that starts
listening (uvicorn, the fake model, any server a test makes) or a child process started through
`subprocess` (asyncio's too) raises `NotMarkedE2E`, and the attempt is recorded, so the test fails
even where a server thread swallowed the exception.

A fixture may start its server for an earlier, marked test and hand it to a later one that is not:
such a test would start nothing itself and pass in the whole suite, then fail under `-m "not e2e"`.
So the guard remembers every fixture that listened or started a process while it was set up (and
knows `SERVER_FIXTURES` from the start), and a test without the marker that uses one of them,
directly or through another fixture, fails at setup. Whatever the order, the test fails.

Under `-m "not e2e"` a module marked e2e as a whole (`pytestmark`) is not even imported
(`skipped_whole`): none of its tests could run, and importing the client libraries some of them
test (openenv, openai, schemathesis) costs more than half of the fast run's collection.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

MARKER = "e2e"
SERVER_FIXTURES = frozenset({"app_server", "make_app_server", "fake_model_server", "chrome"})
"""The suite's shared server fixtures (conftest.py); module fixtures that start one are learnt."""


class NotMarkedE2E(RuntimeError):
    """A test without the e2e marker tried to start a server or a child process."""


class E2EGuard:
    def __init__(self) -> None:
        self.test: str | None = None  # the running test when it is not marked e2e
        self.violations: list[str] = []
        self.server_fixtures: set[tuple[str, str]] = set()  # (baseid, name) of fixtures that started one
        self._setting_up: list[tuple[str, str]] = []  # the fixtures being set up, innermost last
        self._lock = threading.Lock()
        self._listen = socket.socket.listen
        self._popen_init = subprocess.Popen.__init__

    def begin(self, item: pytest.Item) -> None:
        """Called before `item`'s setup: a test without the marker may not use a server fixture."""
        self.violations = []
        if item.get_closest_marker(MARKER) is not None:
            self.test = None
            return
        self.test = item.nodeid
        servers = sorted(
            name for name, key in _fixtures_of(item) if name in SERVER_FIXTURES or key in self.server_fixtures
        )
        if servers:
            pytest.fail(
                f"{item.nodeid} uses {', '.join(servers)} (a running server) but is not marked @pytest.mark.e2e",
                pytrace=False,
            )

    def end(self) -> None:
        self.test = None

    def enter_fixture(self, fixturedef: pytest.FixtureDef[Any]) -> None:
        self._setting_up.append((fixturedef.baseid, fixturedef.argname))

    def leave_fixture(self) -> None:
        self._setting_up.pop()

    def started(self, what: str) -> None:
        """A socket listens or a child process starts (in any thread)."""
        if self._setting_up:
            self.server_fixtures.add(self._setting_up[-1])
        test = self.test
        if test is None:
            return
        with self._lock:
            self.violations.append(what)
        raise NotMarkedE2E(f"{test} {what} but is not marked @pytest.mark.e2e")

    def install(self) -> None:
        guard, listen, popen_init = self, self._listen, self._popen_init

        def guarded_listen(sock: socket.socket, *args: Any) -> None:
            guard.started(f"listens on {sock.getsockname()!r}")
            listen(sock, *args)

        def guarded_popen_init(process: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
            guard.started(f"starts a child process {args!r}")
            popen_init(process, args, *rest, **options)

        socket.socket.listen = guarded_listen  # type: ignore[method-assign,assignment]
        subprocess.Popen.__init__ = guarded_popen_init  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        socket.socket.listen = self._listen  # type: ignore[method-assign]
        subprocess.Popen.__init__ = self._popen_init  # type: ignore[method-assign]


def _fixtures_of(item: pytest.Item) -> list[tuple[str, tuple[str, str]]]:
    """(name, (baseid, name)) of each fixture in the item's closure, as the item resolves it."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [(name, (defs[-1].baseid, name)) for name, defs in info.name2fixturedefs.items() if defs]


def skipped_whole(path: Path, markexpr: str) -> bool:
    """A test module `-m markexpr` leaves out whole: the expression is `not e2e` and the module's
    `pytestmark` (read from its source, not imported) carries the marker."""
    if " ".join(markexpr.split()) != f"not {MARKER}" or not (path.name.startswith("test_") and path.suffix == ".py"):
        return False
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "pytestmark" for target in node.targets):
            return any(ast.unparse(part) == f"pytest.mark.{MARKER}" for part in ast.walk(node.value))
    return False


E2E_GUARD = E2EGuard()
