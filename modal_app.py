"""The Crafter task app on Modal: `modal deploy modal_app.py` (docs/modal.md: calling, tuning).

    image   debian_slim(3.11) ─ uv pip install <pyproject dependencies> ─ numba cache warmed at build
            ─ env: the deploy knobs below + TASKAPP_MAX_TIME_S, TASKAPP_MAX_CONCURRENT_ROLLOUTS,
                   TASKAPP_INFERENCE_MAX_CONNECTIONS, TASKAPP_STATE_BACKEND
            ─ /root/task_app: the package with its data (rubrics, page templates), as a wheel carries it
            ─ /root/pyproject.toml (read again when Modal imports this module in the container)
    secrets <env secret> (ENVIRONMENT_API_KEY) + openai-api-key (OPENAI_API_KEY) + groq-api-key (GROQ_API_KEY)
    volume  /traces: one SQLite file per container, /traces/traces/<task id>.db
    dict    <state dict> (TASKAPP_STATE_BACKEND=modal-dict:<name>): env sessions, shared by every container
    class   CrafterTaskApp: @modal.concurrent; enter(snap=True) imports and JIT-compiles before the memory
            snapshot; the asgi_app factories run after restore, so the container's task id, secrets and
            settings are the live ones; `run_accepted`, a method started with `.spawn()` for each run
            POST /rollouts accepts, so Modal counts the run as an input of the app (see `spawner`).
    web     two endpoints of the one class, so one container serves both over one state: `fastapi_app`
            (https://<workspace>--<label>.modal.run, the app, MCP at /mcp included) and `ors_app`
            (https://<workspace>--<label>-ors.modal.run, the Open Reward Standard at the root of its own
            URL, as the openreward client needs; a view of the same app's state, key and caps).
    processes TASKAPP_MODAL_PROCESSES=N > 1 swaps the two asgi_app endpoints for two `@modal.web_server` ports
            of `task-app serve --processes N --ors-port` (`AppProcesses`): N processes on the container's cores,
            sharing the Dict and one trace database; no memory snapshot, no `run_accepted` (the trade-offs:
            docs/decisions/modal-processes.md).

Deploy-time knobs are environment variables of the deploying shell (TASKAPP_MODAL_*, see `DeployConfig`).
They are also written into the image environment, so this module evaluates to the same objects (the
same secrets, in the same order) when Modal imports it again inside the container.

Traces on a network volume: SQLite's WAL and locking are not safe on Modal Volumes (and Modal commits
volumes in the background at arbitrary moments), so the live database stays on the container's local
disk, where the app's single writer uses WAL. Every `commit_interval_s` (only when it changed) and at
shutdown, `TraceSync` copies a consistent snapshot with SQLite's online backup API into a local staging
file, copies that onto the volume under a temporary name, renames it into place (readers never see a
half-written file, and the file on the volume is a plain rollback-journal database with no -wal/-shm
companions) and commits the volume. A container killed hard loses at most one interval of traces; the
trainer has each rollout in its response anyway.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, closing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import modal

if TYPE_CHECKING:
    from fastapi import FastAPI

logger = logging.getLogger("modal_app")

ROOT = Path(__file__).resolve().parent
REMOTE_ROOT = "/root"  # on PYTHONPATH in Modal containers, and where this file is mounted
REMOTE_PACKAGE = f"{REMOTE_ROOT}/task_app"  # importable from /root, its package data read in place
TRACES_MOUNT = "/traces"
VOLUME_TRACES_DIR = Path(TRACES_MOUNT) / "traces"
LIVE_TRACES_DIR = Path("/tmp/task-app-traces")  # the container's local disk
# Local files that never go into the image (of the package's files, only those a wheel carries do).
IGNORE = [
    "**/__pycache__",
    "**/__pycache__/**",
    "**/*.pyc",
    "**/.env",
    "**/.env.*",
    "**/*.db",
    "**/*.db-*",
    "**/.venv",
    "**/.venv/**",
    "**/venv",
    "**/venv/**",
    "**/.*_cache",
    "**/.*_cache/**",
    "**/.git",
    "**/.git/**",
    "**/.DS_Store",
]
# Generating one small world at build time compiles opensimplex's numba kernels into numba's on-disk
# cache inside the image (a container on a different CPU model just recompiles once).
WARM_NUMBA_CACHE = "python -c 'import crafter; crafter.Env(area=(16, 16), length=10, seed=0).reset()'"
TIMEOUT_MARGIN_S = 300  # function timeout beyond the longest rollout: final inference call, trace write
MODAL_MAX_TIMEOUT_S = 86_400
MAX_PROCESSES = 16
# With several processes: the ports `task-app serve` listens on in the container, behind Modal's proxy,
# and how long Modal waits for them (each process imports the app and compiles its kernels anew).
APP_PORT, ORS_PORT = 8000, 8001
PROCESSES_STARTUP_S = 300
VENDOR_KEYS = {"openai": "OPENAI_API_KEY", "groq": "GROQ_API_KEY"}


# --- deploy-time configuration -------------------------------------------------------------------


@dataclass(frozen=True)
class DeployConfig:
    """Knobs read from the deploying shell; each field is `TASKAPP_MODAL_<FIELD>` (max_time_s: TASKAPP_MAX_TIME_S)."""

    app_name: str = "grpo-crafter-task-app"
    label: str = ""  # URL: https://<workspace>--<label>.modal.run; empty: the app name
    env_secret: str = "crafter-environment-api-key"  # holds ENVIRONMENT_API_KEY (+ optional TASKAPP_* settings)
    openai_secret: str = "openai-api-key"
    groq_secret: str = "groq-api-key"
    vendor_secrets: str = "openai,groq"  # which vendor secrets to attach; "none" for a deployment without proxies
    volume: str = "crafter-task-app-traces"
    state_dict: str = "crafter-task-app-state"  # the modal.Dict env sessions live in (TASKAPP_STATE_BACKEND)
    min_containers: int = 0
    max_containers: int = 10
    buffer_containers: int = 0
    scaledown_window_s: int = 300
    # Sized for models of 1-5 s a call (docs/modal.md; docs/performance.md has a fast model's profile, 64/96).
    max_inputs: int = 512  # concurrent requests (rollouts + health/info calls) per container
    target_inputs: int = 256  # what the autoscaler aims for; bursts go up to max_inputs
    cpu: float = 1.0  # physical cores (2 vCPUs): the event loop, and the worker thread beside it
    memory_mb: int = 2048
    max_time_s: int = 3600  # the app's TASKAPP_MAX_TIME_S, the longest rollout it accepts
    timeout_s: int = 0  # 0: max_time_s + TIMEOUT_MARGIN_S
    memory_snapshot: bool = True
    commit_interval_s: int = 60
    # App processes in the container (`task-app serve --processes N`); 1: the app in Modal's own process
    # (docs/decisions/modal-processes.md: why 1 is the default).
    processes: int = 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> DeployConfig:
        values: dict[str, Any] = {}
        for field in fields(cls):
            name = "TASKAPP_MAX_TIME_S" if field.name == "max_time_s" else f"TASKAPP_MODAL_{field.name.upper()}"
            raw = environ.get(name)
            if raw is None or raw.strip() == "":
                continue
            values[field.name] = _parse(name, raw.strip(), type(getattr(cls, field.name)))
        return cls(**values).validated()

    def validated(self) -> DeployConfig:
        timeout = self.timeout_s or self.max_time_s + TIMEOUT_MARGIN_S
        problems = [
            message
            for failed, message in (
                (self.max_time_s < 1, "TASKAPP_MAX_TIME_S must be at least 1"),
                (
                    not self.max_time_s < timeout <= MODAL_MAX_TIMEOUT_S,
                    f"TASKAPP_MODAL_TIMEOUT_S must exceed TASKAPP_MAX_TIME_S and be at most {MODAL_MAX_TIMEOUT_S}",
                ),
                (
                    not 0 <= self.min_containers <= self.max_containers,
                    "need 0 <= TASKAPP_MODAL_MIN_CONTAINERS <= TASKAPP_MODAL_MAX_CONTAINERS",
                ),
                (self.buffer_containers < 0, "TASKAPP_MODAL_BUFFER_CONTAINERS must be >= 0"),
                (not 2 <= self.scaledown_window_s <= 3600, "TASKAPP_MODAL_SCALEDOWN_WINDOW_S must be in [2, 3600]"),
                (
                    not 1 <= self.target_inputs <= self.max_inputs,
                    "need 1 <= TASKAPP_MODAL_TARGET_INPUTS <= TASKAPP_MODAL_MAX_INPUTS",
                ),
                (
                    self.cpu <= 0 or self.memory_mb < 512,
                    "need TASKAPP_MODAL_CPU > 0 and TASKAPP_MODAL_MEMORY_MB >= 512",
                ),
                (self.commit_interval_s < 5, "TASKAPP_MODAL_COMMIT_INTERVAL_S must be >= 5"),
                (not 1 <= self.processes <= MAX_PROCESSES, f"TASKAPP_MODAL_PROCESSES must be in [1, {MAX_PROCESSES}]"),
                (set(self.vendors) - set(VENDOR_KEYS), "TASKAPP_MODAL_VENDOR_SECRETS takes openai, groq or none"),
            )
            if failed
        ]
        if problems:
            raise ValueError("invalid deploy configuration: " + "; ".join(problems))
        return DeployConfig(**{**asdict(self), "timeout_s": timeout, "label": self.label or self.app_name})

    @property
    def vendors(self) -> tuple[str, ...]:
        names = [part.strip().lower() for part in self.vendor_secrets.split(",") if part.strip()]
        return () if names == ["none"] else tuple(dict.fromkeys(names))

    def image_env(self) -> dict[str, str]:
        """The knobs (so the container rebuilds the same objects) and the settings they imply for the app."""
        env = {
            f"TASKAPP_MODAL_{key.upper()}": _text(value) for key, value in asdict(self).items() if key != "max_time_s"
        }
        env.update(
            TASKAPP_MAX_TIME_S=str(self.max_time_s),
            # Modal never sends a container more than max_inputs requests, so the app's own cap never 429s below it,
            # and each of them may hold one connection to a model server or vendor.
            TASKAPP_MAX_CONCURRENT_ROLLOUTS=str(self.max_inputs),
            TASKAPP_INFERENCE_MAX_CONNECTIONS=str(self.max_inputs),
            # Consecutive requests for one env land on different containers: its record lives in the Dict.
            TASKAPP_STATE_BACKEND=f"modal-dict:{self.state_dict}",
        )
        return env


def _parse(name: str, raw: str, kind: type) -> Any:
    if kind is bool:
        if raw.lower() in ("1", "true", "yes", "on"):
            return True
        if raw.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")
    try:
        return kind(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be {kind.__name__}, got {raw!r}") from exc


def _text(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


# --- the image, secrets, volume ------------------------------------------------------------------


def _pyproject(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def python_dependencies(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's runtime requirements, exactly as pinned in pyproject.toml."""
    return list(_pyproject(pyproject)["project"]["dependencies"])


def package_ignore(pyproject: Path = ROOT / "pyproject.toml") -> Callable[[Path], bool]:
    """What of task_app/ stays out of the image: clutter, and every file a wheel would not carry either.

    A wheel carries the modules and the package data pyproject.toml declares (rubrics, page templates);
    the image carries the same selection, so it runs from the same files as a regular install.
    """
    package_data = _pyproject(pyproject)["tool"]["setuptools"]["package-data"]["task_app"]
    clutter, carried = modal.FilePatternMatcher(*IGNORE), modal.FilePatternMatcher("**/*.py", *package_data)
    return lambda path: clutter(path) or not carried(path)


def build_image(config: DeployConfig, root: Path = ROOT) -> modal.Image:
    return (
        modal.Image.debian_slim(python_version="3.11")
        .uv_pip_install(*python_dependencies(root / "pyproject.toml"))
        .run_commands(WARM_NUMBA_CACHE)
        .env(config.image_env())
        .add_local_dir(root / "task_app", REMOTE_PACKAGE, ignore=package_ignore(root / "pyproject.toml"))
        .add_local_file(root / "pyproject.toml", f"{REMOTE_ROOT}/pyproject.toml")
    )


def build_secrets(config: DeployConfig) -> list[modal.Secret]:
    secrets = [modal.Secret.from_name(config.env_secret, required_keys=["ENVIRONMENT_API_KEY"])]
    names = {"openai": config.openai_secret, "groq": config.groq_secret}
    for vendor in config.vendors:
        secrets.append(modal.Secret.from_name(names[vendor], required_keys=[VENDOR_KEYS[vendor]]))
    return secrets


def ors_label(config: DeployConfig) -> str:
    """The ORS endpoint's label: the app's, suffixed (its URL https://<workspace>--<label>-ors.modal.run)."""
    return f"{config.label}-ors"


CONFIG = DeployConfig.from_environ()
image = build_image(CONFIG)
traces_volume = modal.Volume.from_name(CONFIG.volume, create_if_missing=True)
app = modal.App(CONFIG.app_name)


# --- traces: live on local disk, consistent copies on the volume ----------------------------------

Commit = Callable[[], Awaitable[None]]


class TraceSync:
    """Copies the live trace database to the volume as one consistent file, then commits the volume."""

    def __init__(self, live: Path, target: Path, commit: Commit | None, interval_s: float) -> None:
        self.live, self.target, self.commit, self.interval_s = live, target, commit, interval_s
        self.copies = 0
        self._last: tuple[int, ...] | None = None

    def _signature(self) -> tuple[int, ...]:
        parts: list[int] = []
        for path in (self.live, self.live.with_name(self.live.name + "-wal")):
            stat = path.stat() if path.exists() else None
            parts += [stat.st_mtime_ns, stat.st_size] if stat else [0, 0]
        return tuple(parts)

    def copy(self) -> bool:
        """Blocking: snapshot the live database onto the volume if it changed since the last copy."""
        if not self.live.exists():
            return False
        signature = self._signature()
        if signature == self._last:
            return False
        staging = self.live.with_name(self.live.stem + ".snapshot")
        staging.unlink(missing_ok=True)
        with closing(sqlite3.connect(self.live)) as source, closing(sqlite3.connect(staging)) as copy:
            source.backup(copy)  # one step: a single read transaction, consistent even while the app writes
            copy.execute("PRAGMA journal_mode=DELETE")  # the copy is a self-contained file: no -wal/-shm for readers
        self.target.parent.mkdir(parents=True, exist_ok=True)
        partial = self.target.with_name(f".{self.target.name}.partial")
        shutil.copyfile(staging, partial)
        os.replace(partial, self.target)
        staging.unlink()
        self._last = signature
        self.copies += 1
        return True

    async def sync(self) -> None:
        if await anyio.to_thread.run_sync(self.copy) and self.commit is not None:
            await self.commit()

    async def sync_logged(self) -> None:
        try:
            await self.sync()
        except (OSError, sqlite3.Error, RuntimeError, modal.exception.Error) as exc:
            logger.warning("copying traces to the volume failed: %s", exc, exc_info=True)

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval_s)
            await self.sync_logged()


def attach_trace_sync(web_app: FastAPI, sync: TraceSync) -> None:
    """Run `sync` every interval while the app serves, and once more after its lifespan closed the store."""
    inner = web_app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        try:
            async with inner(application) as state, anyio.create_task_group() as tasks:
                tasks.start_soon(sync.run)
                yield state
                tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):  # the last copy happens even when shutdown is cancelled
                await sync.sync_logged()

    web_app.router.lifespan_context = lifespan


def container_name(environ: Mapping[str, str] = os.environ) -> str:
    """This container's id (MODAL_TASK_ID, set anew on every snapshot restore), safe as a file name."""
    raw = environ.get("MODAL_TASK_ID") or f"local-{socket.gethostname()}-{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", raw)[:120]


# --- several app processes in one container ------------------------------------------------------


def serve_command(
    config: DeployConfig, port: int = APP_PORT, ors_port: int = ORS_PORT, host: str = "0.0.0.0"
) -> list[str]:
    """What a container of `processes` > 1 runs: `task-app serve`, its processes sharing `port` (and the
    Open Reward Standard on `ors_port`), each building the app from the image's environment."""
    return [
        *(sys.executable, "-m", "task_app.cli.main", "serve", "--host", host, "--port", str(port)),
        *("--processes", str(config.processes), "--ors-port", str(ors_port)),
    ]


class AppProcesses:
    """The container's app processes (`serve_command`), and their one trace database copied by this one.

    The processes write the live database on local disk together (SQLite's WAL and its write lock work
    between processes of one machine; the trace writer takes the lock with BEGIN IMMEDIATE and waits
    `busy_timeout`); this process is the only one that copies it to the volume, as `TraceSync` does for
    the single-process app, every `interval_s` from a thread and once more after the processes stopped.
    """

    def __init__(self, command: list[str], sync: TraceSync | None) -> None:
        self.command, self.sync = command, sync
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._copier: threading.Thread | None = None

    def start(self) -> None:
        """Start the processes; a second call finds them started."""
        if self.process is not None:
            return
        env = dict(os.environ)
        if self.sync is not None:
            self.sync.live.parent.mkdir(parents=True, exist_ok=True)
            env["TASKAPP_TRACES_DB"] = str(self.sync.live)
            self._copier = threading.Thread(target=self._copy_every_interval, args=(self.sync,), daemon=True)
            self._copier.start()
        self.process = subprocess.Popen(self.command, env=env, stdin=subprocess.DEVNULL)

    def _copy_every_interval(self, sync: TraceSync) -> None:
        while not self._stopping.wait(sync.interval_s):
            anyio.run(sync.sync_logged)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (uvicorn's graceful shutdown of every process), then the last copy; the exit code."""
        self._stopping.set()
        if self._copier is not None:
            self._copier.join()
        code = None
        if self.process is not None:
            self.process.terminate()
            try:
                code = self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                code = self.process.wait()
        if self.sync is not None:
            anyio.run(self.sync.sync_logged)
        return code


def app_processes(config: DeployConfig, commit: Commit | None) -> AppProcesses:
    """This container's processes; their trace database is the container's, as `build_app`'s is."""
    from task_app.core.settings import Settings

    name = container_name()
    live = LIVE_TRACES_DIR / f"{name}.db"
    sync = TraceSync(live, VOLUME_TRACES_DIR / f"{name}.db", commit, config.commit_interval_s)
    return AppProcesses(serve_command(config), sync if Settings().tracing_enabled else None)


# --- the container -------------------------------------------------------------------------------


def warm_up() -> None:
    """The heavy imports, and numba's kernels compiled (or loaded from the image's cache) by one small world."""
    import task_app.web.server  # noqa: F401 - fastapi, pydantic models, crafter, numpy, numba, aiosqlite, aiohttp
    from task_app.game import WorldFactory
    from task_app.game import warm_up as warm_game

    warm_game(WorldFactory(cache_size=0))


Handover = Callable[[str, int], Awaitable[None]]


def spawner(method: Any) -> Handover:
    """Accepted runs as spawned calls of `method` (`CrafterTaskApp.run_accepted`, a `modal.Function`).

    A run started in the background of a web request is invisible to Modal: once the request is
    answered the container may count as idle and be scaled down under it. A spawned call is an input
    that Modal queues and counts while it runs (a container is idle only without inputs), and Modal
    starts containers for queued calls as it does for requests. Only `(run_id, attempt)` travels with
    the call; the request itself is in the state store.
    """

    async def handover(run_id: str, attempt: int) -> None:
        await method.spawn.aio(run_id, attempt)

    return handover


def build_app(commit: Commit | None = None, handover: Handover | None = None) -> FastAPI:
    """The task app of this container: settings from the environment, its own trace database."""
    from task_app.core.settings import Settings
    from task_app.web.server import create_app

    name = container_name()
    live = LIVE_TRACES_DIR / f"{name}.db"
    settings = Settings(traces_db=live)
    web_app = create_app(settings, handover)
    if settings.tracing_enabled:
        attach_trace_sync(web_app, TraceSync(live, VOLUME_TRACES_DIR / f"{name}.db", commit, CONFIG.commit_interval_s))
    return web_app


@app.cls(
    image=image,
    secrets=build_secrets(CONFIG),
    volumes={TRACES_MOUNT: traces_volume},
    timeout=CONFIG.timeout_s,
    cpu=CONFIG.cpu,
    memory=CONFIG.memory_mb,
    min_containers=CONFIG.min_containers,
    max_containers=CONFIG.max_containers,
    buffer_containers=CONFIG.buffer_containers,
    scaledown_window=CONFIG.scaledown_window_s,
    # A snapshot holds this process's memory only: with several processes the app lives in others.
    enable_memory_snapshot=CONFIG.memory_snapshot and CONFIG.processes == 1,
)
@modal.concurrent(max_inputs=CONFIG.max_inputs, target_inputs=CONFIG.target_inputs)
class CrafterTaskApp:
    if CONFIG.processes == 1:

        @modal.enter(snap=True)
        def warm(self) -> None:
            warm_up()

        def _web_app(self) -> FastAPI:
            """The container's one app, built by whichever endpoint's factory Modal calls first."""
            if getattr(self, "web_app", None) is None:
                # Outside a Modal container (`.local()`) there is no volume to commit and nothing to spawn on:
                # accepted runs then run in this process.
                if modal.is_local():
                    self.web_app = build_app()
                else:
                    self.web_app = build_app(traces_volume.commit.aio, spawner(self.run_accepted))
            return self.web_app

        @modal.asgi_app(label=CONFIG.label)
        def fastapi_app(self) -> FastAPI:
            return self._web_app()

        @modal.asgi_app(label=ors_label(CONFIG))
        def ors_app(self) -> FastAPI:
            """The Open Reward Standard on the app's state: no lifespan of its own (Modal starts the app's)."""
            from task_app.web.ors import create_ors_app

            return create_ors_app(self._web_app())

        @modal.method()
        async def run_accepted(self, run_id: str, attempt: int) -> None:
            """One run POST /rollouts accepted (on any container), run here to its end. Modal builds every
            method of the class at container start, the web app first, so `web_app` is there and serving."""
            await self.web_app.state.task_app.submissions.run_handed_over(run_id, attempt)

    else:

        @modal.enter()
        def start_processes(self) -> None:
            """The container's processes, started once before either endpoint is served."""
            self.processes = app_processes(CONFIG, traces_volume.commit.aio)
            self.processes.start()

        @modal.web_server(APP_PORT, startup_timeout=PROCESSES_STARTUP_S, label=CONFIG.label)
        def serve_app(self) -> None:
            """The app on APP_PORT (started in `start_processes`); Modal forwards the URL once it answers."""

        @modal.web_server(ORS_PORT, startup_timeout=PROCESSES_STARTUP_S, label=ors_label(CONFIG))
        def serve_ors(self) -> None:
            """The Open Reward Standard, served by the same processes on ORS_PORT."""

        @modal.exit()
        def stop_processes(self) -> None:
            self.processes.stop()
