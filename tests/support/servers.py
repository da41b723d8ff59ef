"""The task app under a real uvicorn server on loopback, in this process.

`start_app_server(stack, directory, **settings)` runs `create_app(Settings(...))` on 127.0.0.1 with an
OS-assigned port (conftest.py's `app_server`, one per test module, and `make_app_server(**settings)`,
per test, use it). Clients made with `AppServer.client()` check every response: never a 500, and no
4-character piece of a key in body or headers.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI

from task_app.core.json_codec import dumps_bytes
from task_app.core.settings import Settings
from task_app.web.local_server import serve_in_thread
from task_app.web.server import create_app
from task_app.web.state import AppState

from .errors import assert_not_a_server_error
from .keys import ALIAS_KEY, TEST_KEY, assert_response_keeps_keys, without_own_variables

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class NonLoopbackConnection(RuntimeError):
    """A test tried to reach something beyond this machine's loopback."""


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
    with without_own_variables():  # module-scoped servers are built before `clean_environ` runs
        settings = Settings(**values)
    app = create_app(settings)
    base_url = stack.enter_context(serve_in_thread(app))
    return AppServer(base_url=base_url, app=app, settings=settings, stack=stack)


def open_rollout(base_url: str, body: dict[str, Any], *, timeout: float = 10.0) -> socket.socket:
    """Send POST /rollout (with the test key) on a bare socket and read nothing, so the test decides when
    the client goes away."""
    parts = urlsplit(base_url)
    payload = dumps_bytes(body)
    head = (
        f"POST /rollout HTTP/1.1\r\nHost: {parts.netloc}\r\nX-API-Key: {TEST_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout)
    sock.sendall(head + payload)
    return sock
