"""A scripted HTTP server on loopback for the client's retry and timeout tests (standard library only).

    with StubServer() as stub:                        # 127.0.0.1, an OS-assigned port, its own thread
        stub.script(Reply(429, ERROR, {"Retry-After": "1"}), Reply(200, {...}))
        ... Client(stub.base_url, KEY).info() ...
        stub.arrivals                                  # [(monotonic time, method, path), ...]
        stub.connections                               # opened so far; stub.peak_connections: most open at once

Each request takes the next scripted reply (then `default`). A reply may `stall` (answer nothing
until the server stops), `drop` the connection without answering, or answer after `delay_s`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

STALL_LIMIT_S = 60.0  # a stalled request gives up by itself eventually


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)
    stall: bool = False
    drop: bool = False
    delay_s: float = 0.0


def app_error(code: str, retryable: bool | None = None) -> dict[str, Any]:
    """The app's error body (`{"error": {code, message, retryable}, "detail"}`)."""
    error: dict[str, Any] = {"code": code, "message": f"stub says {code}"}
    if retryable is not None:
        error["retryable"] = retryable
    return {"error": error, "detail": error["message"]}


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # the listen backlog: many clients connect at once


class StubServer:
    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply(200, {})
        self.arrivals: list[tuple[float, str, str]] = []
        self.connections = self.peak_connections = 0
        self._open = 0
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stub-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, *replies: Reply) -> StubServer:
        with self._lock:
            self._script.extend(replies)
        return self

    def gaps(self) -> list[float]:
        """Seconds between consecutive requests."""
        times = [arrival[0] for arrival in self.arrivals]
        return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]

    def _next(self, method: str, path: str) -> Reply:
        with self._lock:
            self.arrivals.append((time.monotonic(), method, path))
            return self._script.popleft() if self._script else self.default

    def _opened(self, change: int) -> None:
        with self._lock:
            self._open += change
            self.connections += max(change, 0)
            self.peak_connections = max(self.peak_connections, self._open)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the app's uvicorn

            def setup(self) -> None:
                stub._opened(1)
                super().setup()

            def finish(self) -> None:
                super().finish()
                stub._opened(-1)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                reply = stub._next(self.command, self.path)
                if reply.stall:
                    stub._released.wait(STALL_LIMIT_S)
                time.sleep(reply.delay_s)
                if reply.stall or reply.drop:
                    self.close_connection = True
                    return
                payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler

    def __enter__(self) -> StubServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
