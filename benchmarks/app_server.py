"""Run the task app in this process for a benchmark, on a loopback port the OS picks.

    python -m benchmarks.app_server --settings '{"environment_api_key": "k", "traces_db": "/tmp/t.db"}'

Builds `Settings(**settings)` (environment variables still apply underneath, as in production; the
benchmark driver clears `TASKAPP_*` first), binds 127.0.0.1:0 before uvicorn starts, prints
`{"port": N, "pid": P}` on stdout, and serves until SIGINT/SIGTERM (uvicorn's graceful shutdown, so
the lifespan closes the trace store). The driver waits for `/health` before it measures anything,
and reads this process's CPU and memory counters from /proc, so they hold the app's work only.

The uvicorn options are the ones the Modal deployment effectively has: no access log, asyncio loop,
httptools (`task_app.web.http_protocol`; no uvloop). `--processes N` serves N app processes on the
port as `task-app serve --processes N` does (the settings travel to them as environment variables; the
announced pid is their parent's, and `benchmarks.processes` counts the whole process tree).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from task_app.core.settings import Settings
from task_app.web.server import APP_FROM_ENV, create_app

from .loopback import serve_on_loopback


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="serve the task app for a benchmark")
    parser.add_argument("--settings", default="{}", help="Settings fields as a JSON object")
    parser.add_argument("--uvicorn", default="{}", help="uvicorn options on top, as a JSON object (e.g. access_log)")
    parser.add_argument("--processes", type=int, default=1, help="app processes on the port (task-app serve's)")
    parser.add_argument("--ors", action="store_true", help="the Open Reward Standard on a second port (one process)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fields = json.loads(args.settings)
    settings = Settings(**fields, processes=args.processes)  # refuses a memory state store for several
    options = {"lifespan": "on", "loop": "asyncio", "timeout_graceful_shutdown": 10, **json.loads(args.uvicorn)}
    if args.processes == 1:
        return serve_on_loopback(create_app(settings), announce={"pid": os.getpid()}, ors=args.ors, **options)
    for name, value in fields.items():  # each process builds its app from the environment
        os.environ[_variable(name)] = value if isinstance(value, str) else json.dumps(value)
    return serve_on_loopback(
        APP_FROM_ENV, announce={"pid": os.getpid()}, factory=True, workers=args.processes, **options
    )


def _variable(field: str) -> str:
    """The environment variable `Settings` reads `field` from (the API key keeps the seed system's name)."""
    return "ENVIRONMENT_API_KEY" if field == "environment_api_key" else f"TASKAPP_{field.upper()}"


if __name__ == "__main__":
    sys.exit(main())
