"""A load generator in a process of its own: the benchmark starts it, it says `ready` on stdout once set up,
starts on a line from stdin, and prints its outcome as one JSON line.

    with driver("benchmarks.rollout_driver", [url, ...]) as load:   # started and ready, outside the clock
        load.go()
        outcome = load.result()   # blocking: the JSON the driver printed

Drivers live beside this module (`rollout_driver`: aiohttp, as a trainer's script would post rollouts;
`session_driver`: env sessions through the client library). Each reports its own wall time (from the
go to its last answer) and CPU, so neither the benchmark process nor the start-up is counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .processes import STOP_TIMEOUT_S, environment

CLIENT_SOURCES = Path(__file__).resolve().parent.parent / "client"  # task_app_client, not installed in .venv


class Driver:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def go(self) -> None:
        if self.process.stdin is None:  # pragma: no cover - stdin is a pipe
            raise RuntimeError("no stdin pipe")
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def result(self) -> dict[str, Any]:
        if self.process.stdout is None:  # pragma: no cover - stdout is a pipe
            raise RuntimeError("no stdout pipe")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the driver exited with {self.process.wait(timeout=STOP_TIMEOUT_S)} and no result")
        outcome: dict[str, Any] = json.loads(line)
        return outcome


@contextmanager
def driver(module: str, args: list[str]) -> Iterator[Driver]:
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join([str(CLIENT_SOURCES), env["PYTHONPATH"]])
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        if process.stdout is None or process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{module} did not start")
        yield Driver(process)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def wait_for_go() -> None:
    """In a driver: announce readiness, then block until the benchmark says go."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the benchmark")
