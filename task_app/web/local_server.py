"""Serve the app under uvicorn: in a background thread on a loopback port (demo, tests), or as several
processes on one socket (`task-app serve --processes N`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp
from uvicorn.supervisors import Multiprocess

# uvicorn's request parser, named because its "auto" picks httptools whenever it is installed, and it
# is (core.http1 parses answers with it); the app's limits and errors are those it shows under h11
# (a 64 KB request target is the app's 422 with h11, a bare 400 from uvicorn's httptools protocol).
HTTP_PARSER = "h11"


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


def serve_processes(config: uvicorn.Config, sock: socket.socket) -> None:
    """`config.workers` processes serving `config.app` (an import string: each process builds its own app)
    on `sock`, until SIGINT/SIGTERM. uvicorn's supervisor replaces a process that dies or hangs."""
    Multiprocess(config, sockets=[sock]).run()


@contextmanager
def serve_in_thread(app: ASGIApp, host: str = "127.0.0.1", startup_timeout_s: float = 60.0) -> Iterator[str]:
    """Serve `app` on an OS-assigned port; yields the base URL and stops the server on exit."""
    sock = bind_socket(host, 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, http=HTTP_PARSER, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local server did not start")
            time.sleep(0.005)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
