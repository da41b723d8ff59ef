"""Serve the app under uvicorn: in a background thread on a loopback port (demo, tests), or as several
processes on one socket (`task-app serve --processes N`); with the Open Reward Standard on a second
port (`task-app serve --ors-port P`), which every process also serves (`ByLocalPort`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.supervisors import Multiprocess

from ..core.settings import Settings
from .http_protocol import AppHttpProtocol
from .ors import create_ors_app
from .server import create_app

# Requests are parsed by httptools, its unparsable ones answered with the app's error body (http_protocol.py).
# WebSocket messages go uncompressed (uvicorn's default negotiates permessage-deflate): compressing each
# reply costs the server, and inflating it the client, a zlib pass per message (docs/decisions/websocket.md).
# Every uvicorn the app starts takes these options.
UVICORN_OPTIONS: dict[str, Any] = {"http": AppHttpProtocol, "ws_per_message_deflate": False}


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        """Signal handlers belong to the main thread; this server runs in another."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound for uvicorn to listen on. IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only
    on connections accepted from a socket that names it (uvicorn's own `bind_socket` does not), and
    without it a response written in two parts waits for the client's delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def serve_processes(config: uvicorn.Config, socks: list[socket.socket]) -> None:
    """`config.workers` processes serving `config.app` (an import string: each process builds its own app)
    on `socks`, until SIGINT/SIGTERM. uvicorn's supervisor replaces a process that dies or hangs."""
    Multiprocess(config, sockets=socks).run()


class ByLocalPort:
    """One ASGI app over several listening sockets: a connection goes to the app of the port it arrived
    on (`scope["server"]`), the main app otherwise; lifespan events go to the main app only (the ORS
    app is a view of its state and has no lifespan of its own)."""

    def __init__(self, main: ASGIApp, apps: dict[int, ASGIApp]) -> None:
        self.main = main
        self.apps = apps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] != "lifespan" else None
        app = self.apps.get(server[1], self.main) if server else self.main
        await app(scope, receive, send)


def with_ors(main: FastAPI, ors_port: int) -> ByLocalPort:
    """`main`, and the Open Reward Standard on its state for connections to `ors_port`."""
    return ByLocalPort(main, {ors_port: create_ors_app(main)})


def doors_from_env() -> ASGIApp:
    """Factory for each process of `task-app serve --processes N --ors-port P`: the app from the
    environment, with ORS on TASKAPP_ORS_PORT (the port the parent bound)."""
    settings = Settings()
    main = create_app(settings)
    return main if settings.ors_port is None else with_ors(main, settings.ors_port)


DOORS_FROM_ENV = f"{__name__}:{doors_from_env.__name__}"


@contextmanager
def _serving(app: ASGIApp, socks: list[socket.socket], startup_timeout_s: float) -> Iterator[None]:
    config = uvicorn.Config(
        app,
        **UVICORN_OPTIONS,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": socks}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local server did not start")
            time.sleep(0.005)
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for sock in socks:
            sock.close()


@contextmanager
def serve_in_thread(app: ASGIApp, host: str = "127.0.0.1", startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Serve `app` on an OS-assigned port; yields the base URL and stops the server on exit."""
    sock = bind_socket(host, 0)
    with _serving(app, [sock], startup_timeout_s):
        yield f"http://{host}:{sock.getsockname()[1]}"


@contextmanager
def serve_with_ors_in_thread(
    app: FastAPI, host: str = "127.0.0.1", startup_timeout_s: float = 60.0
) -> Iterator[tuple[str, str]]:
    """Serve `app` and its Open Reward Standard door on two OS-assigned ports; yields both base URLs."""
    main, ors = bind_socket(host, 0), bind_socket(host, 0)
    ors_port = ors.getsockname()[1]
    with _serving(with_ors(app, ors_port), [main, ors], startup_timeout_s):
        yield f"http://{host}:{main.getsockname()[1]}", f"http://{host}:{ors_port}"
