"""Serve an ASGI app from a benchmark child process on a loopback port the OS picks.

`benchmarks.app_server` and `benchmarks.fake_model` both bind 127.0.0.1:0 before uvicorn starts,
announce `{"port": N, ...}` as one JSON line on stdout (what `benchmarks.processes` waits for) and
serve until SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import uvicorn

from task_app.web.local_server import HTTP_PARSER


def serve_on_loopback(app: Any, *, announce: dict[str, Any] | None = None, **options: Any) -> int:
    """Serve `app` under uvicorn (h11, no access log, 60 s keep-alive; `options` override) until interrupted."""
    # With proto=IPPROTO_TCP asyncio turns TCP_NODELAY on for accepted connections (with proto=0 it does
    # not, and every response written in two parts then waits ~40 ms for a delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(json.dumps({"port": sock.getsockname()[1], **(announce or {})}), flush=True)
    defaults: dict[str, Any] = {
        "http": HTTP_PARSER,
        "log_level": "warning",
        "access_log": False,
        "timeout_keep_alive": 60,
        "backlog": 4096,
    }
    config = uvicorn.Config(app, **{**defaults, **options})
    try:
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it shut down on
        pass
    return 0
