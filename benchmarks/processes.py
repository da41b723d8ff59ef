"""The processes a benchmark runs: the app server and the fake model, each on its own loopback port.

    with fake_model(latency_s=0.2) as model, app_server(model, tracing=True) as app:
        app.cpu_s()      # the server process's own user+system CPU seconds (/proc/<pid>/stat)
        app.loop_cpu_s() # the same for its main thread only (the event loop)
        app.rss_bytes()  # its resident memory (/proc/<pid>/status VmRSS)

Both are started with this interpreter (`python -m benchmarks.fake_model | benchmarks.app_server`),
print their port on stdout, and are stopped with SIGINT (graceful: the app closes its trace store)
and, failing that, killed. Their stderr goes to benchmarks/results/logs/. With `--profile DIR`,
py-spy records a flame graph of every app server a benchmark starts.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

API_KEY = "bench-key"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_CPUCLOCK_SCHED = 2  # linux/posix-timers.h: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) = (~pid << 3) | 2
_ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(__file__).resolve().parent / "results" / "logs"


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid`, living or exited: the kernel's per-process CPU clock (ns
    resolution, `clock_gettime` on the clock id Linux derives from a pid), else /proc/<pid>/stat
    utime + stime (10 ms ticks)."""
    try:
        return time.clock_gettime((~pid << 3) | _CPUCLOCK_SCHED)
    except OSError:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """CPU time of one thread of `pid` (the main thread: tid = pid), from /proc in 10 ms ticks: Linux
    does not let another process read a thread's CPU clock."""
    return _stat_cpu_s(Path(f"/proc/{pid}/task/{tid}/stat"))


def _stat_cpu_s(stat: Path) -> float:
    text = stat.read_text()
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (fields 14, 15 of stat)


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now living (an app served by several processes is one tree)."""
    tree, index = [pid], 0
    while index < len(tree):
        for children in Path(f"/proc/{tree[index]}/task").glob("*/children"):
            try:
                tree += [int(child) for child in children.read_text().split()]
            except OSError:  # the thread or the process ended meanwhile
                continue
        index += 1
    return tree


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class _Profile:
    directory: Path | None = None
    format: str = "flamegraph"  # or "raw": collapsed stacks, for `benchmarks.stacks`
    count: int = 0


PROFILE = _Profile()  # set by `python -m benchmarks --profile DIR`


@dataclass
class Served:
    """A started server process and its base URL."""

    name: str
    process: subprocess.Popen[str]
    port: int
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        """CPU time of the process and its children (`--processes N`: the app's N processes)."""
        return sum(cpu_seconds(pid) for pid in process_tree(self.pid))

    def loop_cpu_s(self) -> float:
        """CPU time of the main threads: for the app server, uvicorn's event loop (one per process)."""
        return sum(thread_cpu_seconds(pid, pid) for pid in process_tree(self.pid))

    def rss_bytes(self) -> int:
        return sum(rss_bytes(pid) for pid in process_tree(self.pid))


def environment() -> dict[str, str]:
    """This environment without the app's own variables, with the repository on PYTHONPATH."""
    keep = {key: value for key, value in os.environ.items() if not key.startswith("TASKAPP_")}
    for key in ("ENVIRONMENT_API_KEY", "DEV_ENVIRONMENT_API_KEY", "ENVIRONMENT_API_KEY_ALIASES"):
        keep.pop(key, None)
    keep["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), keep.get("PYTHONPATH", "")]))
    return keep


def _start(name: str, module: str, args: list[str], python: str = sys.executable) -> Served:
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / f"{name}.log"
    log = log_path.open("a")
    process = subprocess.Popen(
        [python, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=_ROOT,
        env=environment(),
    )
    log.close()
    if process.stdout is None:  # pragma: no cover - stdout is a pipe
        raise RuntimeError("no stdout pipe")
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=STOP_TIMEOUT_S)
        raise RuntimeError(f"{name} exited before printing its port; see {log_path}")
    announced = json.loads(line)
    return Served(name, process, int(announced["port"]), log_path, extra=announced)


def _wait_ready(served: Served, path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            raise RuntimeError(f"{served.name} exited with {served.process.returncode}; see {served.log_path}")
        try:
            if httpx.get(served.url + path, timeout=2.0).status_code == httpx.codes.OK:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{served.name} did not become ready within {START_TIMEOUT_S:g} s")


def _stop(served: Served) -> None:
    if served.process.poll() is None:
        served.process.send_signal(signal.SIGINT)
        try:
            served.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            served.process.kill()
            served.process.wait(timeout=STOP_TIMEOUT_S)
    if served.process.stdout is not None:
        served.process.stdout.close()


@contextmanager
def fake_model(latency_s: float = 0.0, actions: int = 1) -> Iterator[Served]:
    served = _start("fake_model", "benchmarks.fake_model", ["--latency", str(latency_s), "--actions", str(actions)])
    try:
        _wait_ready(served, "/health")
        yield served
    finally:
        _stop(served)


@contextmanager
def app_server(
    *, traces_dir: Path | None = None, processes: int = 1, ors: bool = False, **overrides: Any
) -> Iterator[Served]:
    """The task app with `Settings(environment_api_key=API_KEY, traces_db=<temp dir>, **overrides)`; with
    `processes` > 1 served as `task-app serve --processes N` (their state store a sqlite file beside the traces);
    with `ors`, the Open Reward Standard on a second port (`extra["ors_port"]`)."""
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as temporary:
        directory = traces_dir or Path(temporary)
        settings = {"environment_api_key": API_KEY, "traces_db": str(directory / "traces.db"), **overrides}
        if processes > 1:
            settings.setdefault("state_backend", f"sqlite:{directory / 'state.db'}")
        arguments = ["--settings", json.dumps(settings), "--processes", str(processes), *(["--ors"] if ors else [])]
        served = _start("app_server", "benchmarks.app_server", arguments)
        served.extra["traces_db"] = directory / "traces.db"
        try:
            _wait_ready(served, "/health")
            if processes > 1:
                health_by_process(served.url, processes)  # every process up, not only the first
            with _profiled(served):
                yield served
        finally:
            _stop(served)


@contextmanager
def peer_server(python: str) -> Iterator[Served]:
    """Crafter served by OpenEnv's own server (`benchmarks.peer_openenv`), run by `python` (a virtualenv
    with openenv: it cannot live in the dev one)."""
    served = _start("peer_openenv", "benchmarks.peer_openenv", [], python=python)
    try:
        _wait_ready(served, "/health")
        with _profiled(served):
            yield served
    finally:
        _stop(served)


def health_by_process(url: str, processes: int) -> dict[int, dict[str, Any]]:
    """Each app process's /health body by pid: a new connection per read (it lands on any process)
    until all `processes` have answered."""
    deadline, found = time.monotonic() + START_TIMEOUT_S, {}
    while len(found) < processes:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(found)} of {processes} app processes answered within {START_TIMEOUT_S:g} s")
        health = httpx.get(url + "/health", timeout=5.0).json()
        found.setdefault(health["runtime"]["pid"], health)
    return found


@contextmanager
def _profiled(served: Served) -> Iterator[None]:
    """With `PROFILE.directory` set (`--profile DIR`), py-spy samples the app server while it serves
    (threads holding the GIL only, so idle waits do not count) into a flame graph SVG, or with
    `--profile-format raw` into collapsed stacks (`python -m benchmarks.stacks FILE` sums them)."""
    if PROFILE.directory is None:
        yield
        return
    PROFILE.directory.mkdir(parents=True, exist_ok=True)
    PROFILE.count += 1
    suffix = "txt" if PROFILE.format == "raw" else "svg"
    out = PROFILE.directory / f"app_server-{PROFILE.count:02d}.{suffix}"
    beside = Path(sys.executable).parent / "py-spy"  # the virtualenv's, when it is not activated
    executable = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if executable is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy (it is in the dev extra)")
    command = [executable, "record", "--pid", str(served.pid), "--output", str(out), "--gil", "--threads"]
    command += ["--subprocesses"]  # `--processes N`: the app's processes are the server's children
    command += ["--format", PROFILE.format]
    spy = subprocess.Popen([*command, "--rate", "250"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes the SVG when interrupted
        try:
            spy.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait(timeout=STOP_TIMEOUT_S)
