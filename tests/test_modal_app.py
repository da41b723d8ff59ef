"""`modal_app.py`, inspected and run offline: no Modal account, no credentials, no traffic beyond loopback.

How the configuration is read without a server:
- `CrafterTaskApp().fastapi_app.info()` (public; answered locally for a function that is defined, not
  deployed): cpu, memory, timeout, concurrency, volumes, secrets, web endpoint.
- The exact `FunctionCreate` request `modal deploy` would send (autoscaler, memory snapshot, label, ...):
  the class's service function is loaded against a recording stub instead of Modal's API.
- The image: its layers' Dockerfile commands and the files each local-files layer would upload.
- `fastapi_app.local()` builds the app in this process; it serves a rollout over real HTTP.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, closing, contextmanager
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import modal
import pytest
from modal._image import _Image
from modal._load_context import LoadContext
from modal._utils.async_utils import synchronizer
from modal.mount import _Mount
from modal_proto import api_pb2
from support.fake_model import FakeModel, tool_call
from support.fakes import FakeModalDict
from support.keys import TEST_KEY, assert_no_key_material
from support.polling import wait_until
from support.servers import NonLoopbackConnection

from task_app.core.rubrics import RUBRIC_FILES
from task_app.store.modal_dict import ModalDictStore
from task_app.web.local_server import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent


def _import_modal_app(name: str = "modal_app") -> Any:
    """modal_app.py lives at the repository root, which is not on sys.path under pytest: load it by path."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "modal_app.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


modal_app = _import_modal_app()
DEPLOY_PAGE = ROOT / "docs" / "modal.md"
# What a wheel of the package carries (CI installs one and runs the demo): its modules and its package data.
PACKAGE_DATA_DIRS = ("task_app/data/rubrics", "task_app/inspection/templates")
PACKAGE_FILES = sorted(
    str(path.relative_to(ROOT))
    for path in [
        *(ROOT / "task_app").rglob("*.py"),
        *(path for folder in PACKAGE_DATA_DIRS for path in (ROOT / folder).iterdir()),
    ]
)


def deploy_section() -> str:
    """The docs' deploy page: what a user with a Modal account reads."""
    return DEPLOY_PAGE.read_text()


OPENAI_KEY = "sk-proj-Zx8CvBnMqWeRtYuI"
DEPRECATED = (
    "keep_warm",
    "concurrency_limit",
    "allow_concurrent_inputs",
    "container_idle_timeout",
    "modal.Mount",
    "copy_local_dir",
    "web_endpoint",
    "modal.Stub",
)


# --- offline guards --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, loopback_only: list[Any]) -> list[Any]:
    """No Modal credentials; the suite-wide guard (conftest) refuses traffic beyond loopback."""
    for name in list(os.environ):
        if name.startswith("MODAL_"):
            monkeypatch.delenv(name)
    assert modal.config.config.get("token_id") is None
    assert modal.config.config.get("token_secret") is None
    return loopback_only


def test_the_guard_refuses_the_internet(offline: list[Any]) -> None:
    with pytest.raises(NonLoopbackConnection):
        socket.create_connection(("192.0.2.1", 443), timeout=1)
    with pytest.raises(NonLoopbackConnection):
        socket.getaddrinfo("api.modal.com", 443)
    offline.clear()


# --- inspection helpers ----------------------------------------------------------------------------


class _Captured(Exception):
    pass


class _RecordingStub:
    def __init__(self) -> None:
        self.requests: list[Any] = []

    async def FunctionCreate(self, request: Any, **_: Any) -> Any:  # Modal's RPC name
        self.requests.append(request)
        raise _Captured


class _RecordingClient:
    def __init__(self) -> None:
        self._stub = _RecordingStub()


@contextmanager
def fresh_modal_app() -> Iterator[Any]:
    """A separate copy of the module, for tests that hydrate its objects with fake ids."""
    try:
        yield _import_modal_app("modal_app_disposable")
    finally:
        sys.modules.pop("modal_app_disposable", None)


def function_create_request(module: Any) -> tuple[Any, dict[str, Any]]:
    """The `FunctionCreate` request deploying `module.CrafterTaskApp` would send, and fake object id → dependency."""
    service = synchronizer._translate_in(module.CrafterTaskApp)._get_class_service_function()
    client = _RecordingClient()
    by_id: dict[str, Any] = {}
    for index, dependency in enumerate(service._deps()):
        object_id = f"{dependency._type_prefixes[0]}-offline{index}"
        metadata = api_pb2.MountHandleMetadata() if isinstance(dependency, _Mount) else None
        dependency._hydrate(object_id, client, metadata)
        by_id[object_id] = dependency
    context = LoadContext(client=client, app_id="ap-offline", environment_name="main")  # type: ignore[arg-type]
    with pytest.raises(_Captured):
        asyncio.run(service._load(service, None, context, None))
    (request,) = client._stub.requests
    return request.function, by_id


def image_layers(image: modal.Image) -> list[dict[str, Any]]:
    """The image's layers, base first: Dockerfile commands or (local file, remote path) uploads."""
    layers: list[dict[str, Any]] = []
    node: Any = synchronizer._translate_in(image)
    builder = modal.config.config.get("image_builder_version") or "2025.06"
    while node is not None:
        closure = inspect.getclosurevars(node._load).nonlocals
        dependencies = node._deps()
        if closure.get("dockerfile_function") is not None:
            layers.append({"commands": closure["dockerfile_function"](builder).commands})
        for mount in (dependency for dependency in dependencies if isinstance(dependency, _Mount)):
            files = [
                (Path(local), str(remote)) for entry in mount.entries for local, remote in entry.get_files_to_upload()
            ]
            layers.append({"files": sorted(files, key=lambda pair: pair[1])})
        bases = [dependency for dependency in dependencies if isinstance(dependency, _Image)]
        node = bases[0] if bases else None
    return layers[::-1]


def image_env(layers: list[dict[str, Any]]) -> dict[str, str]:
    commands = [command for layer in layers for command in layer.get("commands", ())]
    return dict(command[4:].split("=", 1) for command in commands if command.startswith("ENV "))


def uploads(layers: list[dict[str, Any]]) -> dict[str, Path]:
    return {remote: local for layer in layers for local, remote in layer.get("files", ())}


def documented_defaults() -> dict[str, str]:
    rows = re.findall(r"^\| `(TASKAPP_[A-Z_]+)` \| `([^`]*)` \|", deploy_section(), flags=re.MULTILINE)
    return dict(rows)


def _config_variable(field: str) -> str:
    return "TASKAPP_MAX_TIME_S" if field == "max_time_s" else f"TASKAPP_MODAL_{field.upper()}"


# --- the module ------------------------------------------------------------------------------------


def test_module_imports_offline_without_deprecated_apis() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            module = _import_modal_app("modal_app_fresh_import")
        finally:
            sys.modules.pop("modal_app_fresh_import", None)
    assert isinstance(module.app, modal.App)
    assert isinstance(module.CrafterTaskApp, modal.Cls)
    source = (ROOT / "modal_app.py").read_text()
    for name in DEPRECATED:
        assert name not in source, name
    assert "os.environ" not in (ROOT / "task_app" / "web" / "server.py").read_text()


def test_function_info_shows_resources_secrets_volume_and_concurrency() -> None:
    config = modal_app.CONFIG
    info = modal_app.CrafterTaskApp().fastapi_app.info()
    assert (info.cpu, info.memory_mib) == (1.0, 2048)
    assert info.timeout == config.timeout_s == 3900 > config.max_time_s == 3600
    assert info.concurrency_info is not None
    assert (info.concurrency_info.max_inputs, info.concurrency_info.target_inputs) == (512, 256)
    assert {path: mount.name for path, mount in info.volumes.items()} == {"/traces": "crafter-task-app-traces"}
    assert info.secrets == [
        "modal.Secret.from_name('crafter-environment-api-key')",
        "modal.Secret.from_name('openai-api-key')",
        "modal.Secret.from_name('groq-api-key')",
    ]
    assert info.method_names == ["fastapi_app", "ors_app", "run_accepted"]


def test_deploy_request_carries_autoscaling_snapshot_and_label() -> None:
    config = modal_app.CONFIG
    with fresh_modal_app() as module:
        function, by_id = function_create_request(module)
    scaling = function.autoscaler_settings
    assert (scaling.min_containers, scaling.max_containers, scaling.buffer_containers, scaling.scaledown_window) == (
        config.min_containers,
        config.max_containers,
        config.buffer_containers,
        config.scaledown_window_s,
    )
    assert (config.min_containers, config.max_containers, config.buffer_containers) == (0, 10, 0)
    assert function.timeout_secs == config.timeout_s
    assert (function.max_concurrent_inputs, function.target_concurrent_inputs) == (512, 256)
    assert function.checkpointing_enabled is True  # enable_memory_snapshot
    assert (function.resources.milli_cpu, function.resources.memory_mb) == (1000, 2048)
    webhook = function.method_definitions["fastapi_app"].webhook_config
    assert webhook.type == api_pb2.WEBHOOK_TYPE_ASGI_APP
    assert webhook.requested_suffix == config.label == "grpo-crafter-task-app"
    ors = function.method_definitions["ors_app"].webhook_config  # the second endpoint: its own URL
    assert ors.type == api_pb2.WEBHOOK_TYPE_ASGI_APP
    assert ors.requested_suffix == modal_app.ors_label(config) == "grpo-crafter-task-app-ors"
    assert [(mount.mount_path, mount.allow_background_commits) for mount in function.volume_mounts] == [
        ("/traces", True)
    ]
    assert isinstance(by_id[function.volume_mounts[0].volume_id], modal._object._Object)
    secrets = [repr(synchronizer._translate_out(by_id[secret_id])) for secret_id in function.secret_ids]
    assert [re.sub(r".*'(.*)'.*", r"\1", text) for text in secrets] == [
        "crafter-environment-api-key",
        "openai-api-key",
        "groq-api-key",
    ]


def test_documented_defaults_are_the_deployed_ones() -> None:
    documented = documented_defaults()
    defaults = modal_app.DeployConfig.from_environ({})
    assert defaults == modal_app.CONFIG
    expected = {_config_variable(field): modal_app._text(value) for field, value in asdict(defaults).items()}
    assert documented == expected
    text = deploy_section()
    for needle in (
        "/root/task_app",
        "task_app/data/rubrics",
        "/traces",
        "follow_redirects",
        "X-API-Key",
        "303",
        "modal serve modal_app.py",
        "modal deploy modal_app.py",
        "https://<workspace>--<label>.modal.run",
        "modal secret create crafter-environment-api-key",
        "modal secret create openai-api-key",
        "modal secret create groq-api-key",
    ):
        assert needle in text, needle


# --- deploy-time knobs -----------------------------------------------------------------------------


def test_knobs_from_the_environment() -> None:
    config = modal_app.DeployConfig.from_environ(
        {
            "TASKAPP_MODAL_APP_NAME": "crafter-staging",
            "TASKAPP_MODAL_VENDOR_SECRETS": "groq",
            "TASKAPP_MODAL_GROQ_SECRET": "groq-staging",
            "TASKAPP_MODAL_MAX_CONTAINERS": "3",
            "TASKAPP_MODAL_MEMORY_SNAPSHOT": "false",
            "TASKAPP_MAX_TIME_S": "600",
            "TASKAPP_MODAL_CPU": " ",
        }
    )
    assert (config.label, config.max_containers, config.memory_snapshot) == ("crafter-staging", 3, False)
    assert (config.timeout_s, config.cpu) == (900, 1.0)
    secrets = [repr(secret) for secret in modal_app.build_secrets(config)]
    assert secrets == [
        "modal.Secret.from_name('crafter-environment-api-key')",
        "modal.Secret.from_name('groq-staging')",
    ]
    without = modal_app.DeployConfig.from_environ({"TASKAPP_MODAL_VENDOR_SECRETS": "none"})
    assert [repr(secret) for secret in modal_app.build_secrets(without)] == [
        "modal.Secret.from_name('crafter-environment-api-key')"
    ]


@pytest.mark.parametrize(
    "environ",
    [
        {"TASKAPP_MODAL_MAX_CONTAINERS": "many"},
        {"TASKAPP_MODAL_MEMORY_SNAPSHOT": "maybe"},
        {"TASKAPP_MODAL_MIN_CONTAINERS": "5", "TASKAPP_MODAL_MAX_CONTAINERS": "2"},
        {"TASKAPP_MODAL_TARGET_INPUTS": "1000"},
        {"TASKAPP_MODAL_TIMEOUT_S": "3600"},
        {"TASKAPP_MAX_TIME_S": "90000"},
        {"TASKAPP_MODAL_SCALEDOWN_WINDOW_S": "1"},
        {"TASKAPP_MODAL_VENDOR_SECRETS": "openai,anthropic"},
    ],
)
def test_bad_knobs_fail_the_deploy(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="TASKAPP_"):
        modal_app.DeployConfig.from_environ(environ)


def test_the_image_environment_reproduces_the_config_in_the_container() -> None:
    """Modal imports modal_app again in the container; with the image's env it must build the same objects."""
    for environ in (
        {},
        {"TASKAPP_MODAL_VENDOR_SECRETS": "none", "TASKAPP_MAX_TIME_S": "1200", "TASKAPP_MODAL_LABEL": "x"},
    ):
        config = modal_app.DeployConfig.from_environ(environ)
        assert modal_app.DeployConfig.from_environ(config.image_env()) == config
    env = modal_app.CONFIG.image_env()
    assert "TASKAPP_RUBRICS_DIR" not in env  # the app reads the rubrics its package carries
    assert env["TASKAPP_MAX_TIME_S"] == "3600"
    assert env["TASKAPP_MAX_CONCURRENT_ROLLOUTS"] == env["TASKAPP_INFERENCE_MAX_CONNECTIONS"] == "512"
    assert env["TASKAPP_STATE_BACKEND"] == "modal-dict:crafter-task-app-state"  # env sessions span containers


# --- the image -------------------------------------------------------------------------------------


def test_image_build_steps_and_added_folders() -> None:
    layers = image_layers(modal_app.image)
    commands = [layer["commands"] for layer in layers if "commands" in layer]
    assert re.fullmatch(r"FROM python:3\.11\.\d+-slim-\w+", commands[0][0])
    install = next(command for layer in commands for command in layer if "uv pip install" in command)
    dependencies = modal_app.python_dependencies()
    assert dependencies and any(item.startswith("crafter") for item in dependencies)
    tokens = shlex.split(install)
    options = [index for index, token in enumerate(tokens) if token.startswith("--")]
    assert tokens[options[-1] + 1 :] == sorted(dependencies)  # quoted or not (opensimplex==0.4.5.1 is not)
    assert any(modal_app.WARM_NUMBA_CACHE in command for layer in commands for command in layer)
    assert image_env(layers) == modal_app.CONFIG.image_env()
    files = uploads(layers)
    assert sorted(files) == sorted(["/root/pyproject.toml", *(f"/root/{name}" for name in PACKAGE_FILES)])
    assert all(files[remote] == ROOT / PurePosixPath(remote).relative_to("/root") for remote in files)
    # The local files are the last layers (build steps after them would rebuild on every code change).
    assert all("files" in layer for layer in layers[-2:]) and all("files" not in layer for layer in layers[:-2])


def test_image_leaves_out_local_clutter(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["crafter"]\n\n[tool.setuptools.package-data]\ntask_app = ["data/*.json"]\n'
    )
    keep = ["task_app/__init__.py", "task_app/sub/module.py", "task_app/data/a.json"]
    clutter = [
        "task_app/notes.md",  # not package data: a wheel would not carry it either
        "task_app/data/b.txt",
        "task_app/data/deeper/c.json",
        "rubrics/a.json",
        "task_app/.env",
        "task_app/.env.local",
        "task_app/__pycache__/x.cpython-311.pyc",
        "task_app/sub/y.pyc",
        "task_app/traces.db",
        "task_app/traces.db-wal",
        "task_app/.venv/lib/z.py",
        "task_app/venv/z.py",
        "task_app/.mypy_cache/m.json",
        "task_app/.pytest_cache/v",
        "task_app/.git/HEAD",
        "task_app/data/.env",
        "task_app/data/old.db",
    ]
    for name in keep + clutter:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    files = uploads(image_layers(modal_app.build_image(modal_app.CONFIG, root=tmp_path)))
    assert sorted(files) == sorted(["/root/pyproject.toml", *(f"/root/{name}" for name in keep)])


def _materialise(layers: list[dict[str, Any]], root: Path) -> Path:
    """Copy every file the image would receive to `root` + its remote path; return root + /root."""
    for remote, local in uploads(layers).items():
        target = root / PurePosixPath(remote).relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local, target)
    shutil.copy(ROOT / "modal_app.py", root / "root" / "modal_app.py")  # Modal mounts the entrypoint file at /root
    return root / "root"


PROBE = """
import asyncio, json, sys
from dataclasses import asdict
from pathlib import Path
import httpx
import modal_app
from task_app.core import rubrics
from task_app.core.settings import Settings
from task_app.inspection.viewer import read_template

async def served_info(app):
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return (await client.get("/info", headers={"X-API-Key": sys.argv[2]})).json()

modal_app.LIVE_TRACES_DIR = Path(sys.argv[1]) / "local-disk"
modal_app.VOLUME_TRACES_DIR = Path(sys.argv[1]) / "volume"
settings = Settings()
print(json.dumps({
    "package": rubrics.__file__,
    "rubrics_dir": None if settings.rubrics_dir is None else str(settings.rubrics_dir),
    "packaged_rubrics": str(rubrics.packaged_rubrics()),
    "served_rubrics": asyncio.run(served_info(modal_app.build_app()))["rubrics"],
    "templates": {name: read_template(name) for name in json.loads(sys.argv[3])},
    "config": asdict(modal_app.CONFIG),
    "secrets": [repr(secret) for secret in modal_app.build_secrets(modal_app.CONFIG)],
    "max_time_s": settings.max_time_s,
}))
"""


@pytest.mark.e2e
def test_the_container_layout_starts_the_app_on_its_package_data(tmp_path: Path) -> None:
    """Import modal_app and task_app from the image's files alone, with the image's environment, and start the app."""
    image_root = _materialise(image_layers(modal_app.image), tmp_path / "image")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TASKAPP_", "MODAL_"))}
    env.update(modal_app.CONFIG.image_env(), PYTHONPATH=str(image_root), ENVIRONMENT_API_KEY=TEST_KEY)
    env["TASKAPP_WARM_UP"] = "false"  # the container warms up in @modal.enter; not needed to read the data
    templates = sorted(path.name for path in (ROOT / "task_app" / "inspection" / "templates").iterdir())
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", PROBE, str(tmp_path), TEST_KEY, json.dumps(templates)],
        cwd=image_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["package"] == str(image_root / "task_app" / "core" / "rubrics.py")  # not the checkout's
    assert probe["rubrics_dir"] is None
    assert probe["packaged_rubrics"] == str(image_root / "task_app" / "data" / "rubrics")
    assert probe["served_rubrics"] == {
        kind: json.loads((ROOT / "task_app" / "data" / "rubrics" / name).read_text())
        for kind, name in RUBRIC_FILES.items()
    }
    assert templates and probe["templates"] == {
        name: (ROOT / "task_app" / "inspection" / "templates" / name).read_text() for name in templates
    }
    assert probe["config"] == asdict(modal_app.CONFIG)
    assert probe["secrets"] == [repr(secret) for secret in modal_app.build_secrets(modal_app.CONFIG)]
    assert probe["max_time_s"] == modal_app.CONFIG.max_time_s


# --- the app the factory builds --------------------------------------------------------------------


@pytest.mark.e2e
def test_factory_app_serves_a_rollout_with_image_rubrics_and_synced_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_model: FakeModel
) -> None:
    image_root = _materialise(image_layers(modal_app.image), tmp_path / "image")
    volume = tmp_path / "volume" / "traces"
    monkeypatch.setattr(modal_app, "LIVE_TRACES_DIR", tmp_path / "local-disk")
    monkeypatch.setattr(modal_app, "VOLUME_TRACES_DIR", volume)
    for key, value in modal_app.CONFIG.image_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TASKAPP_RUBRICS_DIR", raising=False)  # as in the image: the packaged rubrics
    # The secrets, as Modal would inject them, and a fake OpenAI.
    monkeypatch.setenv("ENVIRONMENT_API_KEY", TEST_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("TASKAPP_OPENAI_BASE_URL", fake_model.url("/v1"))
    monkeypatch.setenv("MODAL_TASK_ID", "ta-01OFFLINE/test")
    fake_model.default = tool_call("move_left", "do")
    shared = FakeModalDict()  # the Dict the image names (the run registry and env sessions), as documented
    monkeypatch.setattr(ModalDictStore, "from_name", classmethod(lambda cls, name: cls(shared)))

    with pytest.warns(UserWarning, match="will not have access to the mounted Volume"):
        web_app = modal_app.CrafterTaskApp().fastapi_app.local()
    request = {
        "run_id": "modal-local-1",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 11, "config": {}},
        "policy": {"policy_name": "crafter-react", "config": {"provider": "openai", "model": "gpt-4o-mini"}},
        "ops": ["agent", "env"] * 4,
    }
    with (
        serve_in_thread(web_app) as base_url,
        httpx.Client(base_url=base_url, headers={"X-API-Key": TEST_KEY}, timeout=60.0, trust_env=False) as client,
    ):
        assert client.get("/health").json()["healthy"] is True
        info = client.get("/info").json()
        for kind, name in RUBRIC_FILES.items():  # the files the image carries in its package
            assert info["rubrics"][kind] == json.loads(
                (image_root / "task_app" / "data" / "rubrics" / name).read_text()
            )
        response = client.post("/rollout", json=request)
        assert response.status_code == 200, response.text
        assert_no_key_material(response.text, (TEST_KEY, OPENAI_KEY))
        assert response.json()["trajectories"][0]["length"] == 4
        assert client.post("/rollout", json={**request, "run_id": "modal-local-2"}).status_code == 200
        settings = web_app.state.task_app.settings
        assert settings.traces_db == tmp_path / "local-disk" / "ta-01OFFLINE_test.db"
        assert settings.max_concurrent_rollouts == modal_app.CONFIG.max_inputs
        assert web_app.state.task_app.sessions.store.name == "modal-dict"  # env sessions in the shared Dict
        assert client.get("/runs/modal-local-1").json()["status"] == "completed"  # and the run registry
    assert [record.headers["authorization"] for record in fake_model.requests] == [f"Bearer {OPENAI_KEY}"] * 8

    copied = volume / "ta-01OFFLINE_test.db"  # written by the final sync at shutdown
    assert sorted(path.name for path in volume.iterdir()) == [copied.name]  # no -wal, -shm or partial file
    with closing(sqlite3.connect(copied)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        rows = db.execute("SELECT session_id, metadata FROM session_traces").fetchall()
    assert len(rows) == 2
    assert all(run_id in json.dumps(rows) for run_id in ("modal-local-1", "modal-local-2"))


def _write_session(db: sqlite3.Connection, name: str) -> None:
    db.execute("INSERT INTO runs(name) VALUES (?)", (name,))
    db.commit()


def test_trace_sync_copies_consistent_snapshots_and_commits_only_changes(tmp_path: Path) -> None:
    live = tmp_path / "local" / "task.db"
    live.parent.mkdir()
    target = tmp_path / "volume" / "traces" / "task.db"
    commits: list[int] = []

    async def commit() -> None:
        commits.append(1)

    sync = modal_app.TraceSync(live, target, commit, interval_s=0.05)
    anyio.run(sync.sync)
    assert (commits, target.exists()) == ([], False)  # nothing to copy yet

    with closing(sqlite3.connect(live, isolation_level=None)) as writer:  # the app's writer stays open (WAL)
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("CREATE TABLE runs(name TEXT)")
        _write_session(writer, "first")
        anyio.run(sync.sync)
        anyio.run(sync.sync)  # unchanged: neither copied nor committed again
        assert (sync.copies, len(commits)) == (1, 1)
        _write_session(writer, "second")

        async def periodic() -> None:
            with anyio.move_on_after(1.0):
                await sync.run()

        anyio.run(periodic)
        assert sync.copies == 2
        assert len(commits) == 2
        with closing(sqlite3.connect(target)) as copy:
            assert [row[0] for row in copy.execute("SELECT name FROM runs")] == ["first", "second"]
            assert copy.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert sorted(path.name for path in target.parent.iterdir()) == ["task.db"]


def test_trace_sync_failures_are_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "task.db"
    live.write_bytes(b"this is not a database")
    sync = modal_app.TraceSync(live, tmp_path / "volume" / "task.db", None, interval_s=60)
    anyio.run(sync.sync_logged)
    assert "copying traces to the volume failed" in caplog.text


def test_container_names_are_file_safe() -> None:
    assert modal_app.container_name({"MODAL_TASK_ID": "ta-01ABC"}) == "ta-01ABC"
    assert modal_app.container_name({"MODAL_TASK_ID": "../../etc/passwd"}) == ".._.._etc_passwd"
    assert re.fullmatch(r"local-[A-Za-z0-9._-]+-\d+", modal_app.container_name({}))


# --- accepted runs: spawned calls of CrafterTaskApp.run_accepted -----------------------------------
#
# `.spawn()` needs a Modal account. What runs offline: the class declares the method (not a web
# endpoint, async, no retries), the handover calls `.spawn.aio(run_id, attempt)` on it, and the body of
# the method runs a handed-over run on another "container": two apps built by `build_app`, their
# lifespans in one event loop, sharing one `FakeModalDict` as the containers share the Dict.


class SpawnedCalls:
    """`modal.Function` as the handover uses it (`.spawn.aio(*args)`): each call queued for the test to
    deliver, as Modal queues them for its containers."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail
        self.spawn = self

    async def aio(self, *args: Any) -> object:
        if self.fail:
            raise modal.exception.Error("spawn refused")
        self.calls.append(args)
        return object()


def run_accepted_body() -> Any:
    """The function `CrafterTaskApp.run_accepted` wraps, as a container calls it on its instance."""
    user_cls = synchronizer._translate_in(modal_app.CrafterTaskApp)._user_cls
    return synchronizer._translate_in(user_cls.__dict__["run_accepted"]).raw_f


def test_run_accepted_is_a_plain_async_method_of_the_class() -> None:
    info = modal_app.CrafterTaskApp().run_accepted.info()
    assert info.web_info is None and info.max_retries is None  # an input; a failure is not re-run by Modal
    assert set(info.method_details) == {"fastapi_app", "ors_app"}  # the web endpoints
    assert inspect.iscoroutinefunction(run_accepted_body())
    with fresh_modal_app() as module:
        function, _ = function_create_request(module)
    method = function.method_definitions["run_accepted"]
    assert method.webhook_config.type == api_pb2.WEBHOOK_TYPE_UNSPECIFIED


def test_the_handover_spawns_the_method_with_the_run_id_and_attempt() -> None:
    calls = SpawnedCalls()
    anyio.run(modal_app.spawner(calls), "run-1", 2)
    assert calls.calls == [("run-1", 2)]


@pytest.fixture
def containers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`containers(handover)`: the app of one more container (its own task id and trace file)."""
    monkeypatch.setattr(modal_app, "LIVE_TRACES_DIR", tmp_path / "local-disk")
    monkeypatch.setattr(modal_app, "VOLUME_TRACES_DIR", tmp_path / "volume")
    for key, value in modal_app.CONFIG.image_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", TEST_KEY)
    monkeypatch.setenv("TASKAPP_WARM_UP", "false")
    shared = FakeModalDict()
    monkeypatch.setattr(ModalDictStore, "from_name", classmethod(lambda cls, name: cls(shared)))
    built = iter(range(100))

    def build(handover: Any = None) -> Any:
        monkeypatch.setenv("MODAL_TASK_ID", f"ta-OFFLINE{next(built)}")
        return modal_app.build_app(handover=handover)

    return build


@asynccontextmanager
async def serving(*apps: Any) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with AsyncExitStack() as stack:
        clients = []
        for web_app in apps:
            await stack.enter_async_context(web_app.router.lifespan_context(web_app))
            transport = httpx.ASGITransport(app=web_app)
            client = httpx.AsyncClient(
                transport=transport, base_url="http://container", headers={"X-API-Key": TEST_KEY}
            )
            clients.append(await stack.enter_async_context(client))
        yield clients


def scripted(decisions: int) -> dict[str, Any]:
    return {
        "run_id": f"spawned-{os.urandom(4).hex()}",
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": 3},
        "policy": {"policy_name": "crafter-scripted", "config": {"max_llm_calls": decisions}},
        "ops": ["agent", "env"] * decisions,
    }


@pytest.mark.anyio
async def test_a_spawned_call_runs_the_accepted_run_on_another_container(containers: Any) -> None:
    calls = SpawnedCalls()
    accepting, running = containers(modal_app.spawner(calls)), containers()
    method = run_accepted_body()
    async with serving(accepting, running) as (a, b):
        body = scripted(3)
        accepted = await a.post("/rollouts", json=body)
        assert accepted.status_code == 202 and accepted.json()["runs"][0]["status"] == "queued"
        assert calls.calls == [(body["run_id"], 0)]  # only the run_id and attempt travel with the call
        assert (await b.get(f"/runs/{body['run_id']}")).json()["status"] == "queued"  # Modal holds the input
        await method(SimpleNamespace(web_app=running), *calls.calls[0])  # the input, on another container
        result = await a.get(f"/runs/{body['run_id']}/result")
        assert result.status_code == 200 and result.json()["metrics"]["num_steps"] == 3
        await method(SimpleNamespace(web_app=accepting), *calls.calls[0])  # delivered twice: not run again
        metrics = [web_app.state.task_app.metrics.registry for web_app in (accepting, running)]
        assert [each.get_sample_value("taskapp_rollouts_started_total") for each in metrics] == [0, 1]

        aborted = scripted(50)
        assert (await a.post("/rollouts", json=aborted)).status_code == 202
        stopped = await b.post("/run/abort", json={"run_id": aborted["run_id"]})  # before any container took it
        assert stopped.json()["status"] == "queued"
        await method(SimpleNamespace(web_app=running), *calls.calls[1])
        late = (await b.get(f"/runs/{aborted['run_id']}/result")).json()
        assert late["aborted"] is True and late["metrics"]["num_steps"] == 0


@pytest.mark.anyio
async def test_the_ors_endpoint_serves_the_same_container_state(containers: Any) -> None:
    """Both endpoints' factories, as a container calls them: one app built, ORS a view of its state."""
    containers()  # the image's environment, a fake Dict
    user_cls = synchronizer._translate_in(modal_app.CrafterTaskApp)._user_cls
    instance = user_cls()
    factories = {name: synchronizer._translate_in(user_cls.__dict__[name]).raw_f for name in ("ors_app", "fastapi_app")}
    ors_app = factories["ors_app"](instance)  # Modal may call either factory first
    web_app = factories["fastapi_app"](instance)
    assert ors_app.state.main is web_app is instance.web_app
    async with serving(web_app) as (main,):
        ors = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=ors_app), base_url="http://ors", headers={"X-API-Key": TEST_KEY}
        )
        async with ors:
            created = await ors.post("/create_session")
            sid = created.text.split("event: task_id\ndata: ")[1].split("\n")[0]
            answer = await ors.post("/create", json={"split": "train", "index": 4}, headers={"X-Session-ID": sid})
            assert answer.json() == {"sid": sid}
            assert (await main.get("/health")).json()["sessions"]["created"] == 1  # on the app's env sessions
            assert (await ors.get("/tools", headers={"X-API-Key": "wrong"})).status_code == 401


@pytest.mark.anyio
async def test_a_refused_spawn_ends_the_run_failed_and_free_to_submit_again(containers: Any) -> None:
    async with serving(containers(modal_app.spawner(SpawnedCalls(fail=True)))) as (a,):
        body = scripted(2)
        assert (await a.post("/rollouts", json=body)).status_code == 202
        seen = (await a.get(f"/runs/{body['run_id']}")).json()
        assert seen["status"] == "failed" and seen["error"]["code"] == "handover_failed"
        refused = await a.get(f"/runs/{body['run_id']}/result")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "run_failed"
        again = await a.post("/rollout", json=body)  # it never ran: the run_id is free for attempt 1
        assert again.status_code == 200 and (await a.get(f"/runs/{body['run_id']}")).json()["attempt"] == 1


# --- several app processes in one container (TASKAPP_MODAL_PROCESSES) --------------------------------


def test_several_processes_deploy_two_web_server_ports_without_a_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKAPP_MODAL_PROCESSES", "2")
    with fresh_modal_app() as module:
        assert module.CONFIG.processes == 2
        function, _ = function_create_request(module)
    assert function.checkpointing_enabled is False  # a snapshot of the parent would hold no app
    assert (function.max_concurrent_inputs, function.target_concurrent_inputs) == (512, 256)
    assert set(function.method_definitions) == {"serve_app", "serve_ors"}  # no run_accepted
    endpoints = {
        name: (webhook.type, webhook.web_server_port, webhook.web_server_startup_timeout, webhook.requested_suffix)
        for name, method in function.method_definitions.items()
        for webhook in [method.webhook_config]
    }
    web_server, timeout = api_pb2.WEBHOOK_TYPE_WEB_SERVER, modal_app.PROCESSES_STARTUP_S
    assert endpoints == {
        "serve_app": (web_server, modal_app.APP_PORT, timeout, "grpo-crafter-task-app"),
        "serve_ors": (web_server, modal_app.ORS_PORT, timeout, "grpo-crafter-task-app-ors"),
    }


def test_the_container_command_is_task_app_serve_with_its_processes_and_ors_port() -> None:
    from task_app.cli.main import build_parser

    config = modal_app.DeployConfig.from_environ({"TASKAPP_MODAL_PROCESSES": "3"})
    command = modal_app.serve_command(config)
    assert command[:3] == [sys.executable, "-m", "task_app.cli.main"]
    args = build_parser().parse_args(command[3:])
    assert (args.host, args.port, args.processes, args.ors_port) == ("0.0.0.0", 8000, 3, 8001)
    assert modal_app.DeployConfig.from_environ(config.image_env()) == config  # the container reads the same N
    for bad in ("0", "17", "two"):
        with pytest.raises(ValueError, match="TASKAPP_MODAL_PROCESSES"):
            modal_app.DeployConfig.from_environ({"TASKAPP_MODAL_PROCESSES": bad})


def _free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


@pytest.mark.e2e
def test_the_container_processes_share_env_sessions_runs_and_one_trace_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a container of TASKAPP_MODAL_PROCESSES=2 runs, on loopback: `AppProcesses` starts the real
    `serve_command`; both processes answer on the one port and ORS on the other; an env created on
    a new connection is stepped from 12 more (landing on either process: all on one has a chance of
    1 in 4,096) and runs are found from every process; at stop both processes' traces are in one
    consistent copy on the "volume". The Dict is replaced by a sqlite state store (the same store
    protocol; the Dict's semantics are tested against its double above): no Modal account here."""
    port, ors_port = _free_ports(2)
    for key, value in modal_app.CONFIG.image_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TASKAPP_STATE_BACKEND", f"sqlite:{tmp_path / 'state.db'}")
    monkeypatch.setenv("ENVIRONMENT_API_KEY", TEST_KEY)
    monkeypatch.setenv("TASKAPP_WARM_UP", "false")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("MODAL_TASK_ID", "ta-01PROCESSES")
    monkeypatch.setattr(modal_app, "LIVE_TRACES_DIR", tmp_path / "local-disk")
    monkeypatch.setattr(modal_app, "VOLUME_TRACES_DIR", tmp_path / "volume")
    monkeypatch.chdir(tmp_path)
    commits: list[int] = []

    async def commit() -> None:
        commits.append(1)

    config = modal_app.DeployConfig.from_environ({"TASKAPP_MODAL_PROCESSES": "2"})
    processes = modal_app.app_processes(config, commit)
    assert processes.sync is not None and processes.sync.live == tmp_path / "local-disk" / "ta-01PROCESSES.db"
    processes.command = modal_app.serve_command(config, port, ors_port, host="127.0.0.1")
    base_url = f"http://127.0.0.1:{port}"
    headers = {"X-API-Key": TEST_KEY, "Connection": "close"}  # each request on a new connection

    def fresh(method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
        return httpx.request(method, url, json=body, headers=headers, timeout=60.0, trust_env=False)

    processes.start()
    processes.start()  # a second call: the same processes
    try:
        pids: set[int] = set()

        def both_answer() -> bool:
            assert processes.process is not None and processes.process.poll() is None, "task-app serve exited"
            try:
                pids.add(fresh("GET", base_url + "/health").json()["runtime"]["pid"])
            except httpx.TransportError:
                return False
            return len(pids) == 2

        wait_until(both_answer, timeout=120.0, interval=0.02)
        assert processes.process is not None and processes.process.pid not in pids
        assert fresh("GET", f"http://127.0.0.1:{ors_port}/list_environments").json() == ["crafter"]
        env_id = fresh("POST", base_url + "/env/create", {"env_name": "crafter", "seed": 3}).json()["env_id"]
        for index in range(1, 13):
            stepped = fresh("POST", base_url + "/env/step", {"env_id": env_id, "action": {"actions": ["noop"]}})
            assert stepped.status_code == 200, stepped.text
            assert stepped.json()["step_idx"] == index  # one env, whichever process took the step
        runs = [scripted(2) for _ in range(4)]
        for body in runs:
            assert fresh("POST", base_url + "/rollout", body).status_code == 200
        for body in runs * 3:
            status = fresh("GET", f"{base_url}/runs/{body['run_id']}")
            assert (status.status_code, status.json()["status"]) == (200, "completed"), status.text
    finally:
        code = processes.stop()
    assert code == 0
    assert commits == [1]  # the last copy, after both processes closed the database
    copied = tmp_path / "volume" / "ta-01PROCESSES.db"
    assert sorted(path.name for path in copied.parent.iterdir()) == [copied.name]
    with closing(sqlite3.connect(copied)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        sessions = json.dumps(db.execute("SELECT session_id, metadata FROM session_traces").fetchall())
    assert all(body["run_id"] in sessions for body in runs)
