"""Serve an ASGI app from a benchmark child process on a loopback port the OS picks.

`benchmarks.app_server` and `benchmarks.fake_model` both bind 127.0.0.1:0 before uvicorn starts,
announce `{"port": N, ...}` as one JSON line on stdout (what `benchmarks.processes` waits for) and
serve until SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn

from task_app.web.local_server import UVICORN_OPTIONS, bind_socket, serve_processes, with_ors


def serve_on_loopback(app: Any, *, announce: dict[str, Any] | None = None, ors: bool = False, **options: Any) -> int:
    """Serve `app` under uvicorn (the app's httptools protocol, uncompressed WebSocket messages, no access
    log, 60 s keep-alive; `options` override) until interrupted. With `workers` > 1 in `options`, `app` is
    an import string and that many processes share the socket.
    With `ors`, the Open Reward Standard on `app`'s state on a second port (announced as `ors_port`)."""
    socks = [bind_socket("127.0.0.1", 0)]
    if ors:
        socks.append(bind_socket("127.0.0.1", 0))
        app = with_ors(app, socks[1].getsockname()[1])
    ports = {"port": socks[0].getsockname()[1], **({"ors_port": socks[1].getsockname()[1]} if ors else {})}
    print(json.dumps({**ports, **(announce or {})}), flush=True)
    defaults: dict[str, Any] = {
        **UVICORN_OPTIONS,
        "log_level": "warning",
        "access_log": False,
        "timeout_keep_alive": 60,
        "backlog": 4096,
    }
    config = uvicorn.Config(app, **{**defaults, **options})
    try:
        if config.workers > 1:
            serve_processes(config, socks)
        else:
            uvicorn.Server(config).run(sockets=socks)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it shut down on
        pass
    return 0
