"""The distribution: its wheel requires httpx and pydantic only, and installing it into a fresh
virtualenv brings none of the server's dependencies (pip reaches the package index, as any install).

The wheel is the one .ci/client built (`TASK_APP_CLIENT_WHEEL`), or built here from a copy of client/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

CLIENT = Path(__file__).resolve().parents[1]
# The server's own dependencies (pyproject.toml of task-app) and the heavy ones beneath them.
SERVER_DISTRIBUTIONS = {
    "task-app",
    "crafter",
    "numpy",
    "numba",
    "llvmlite",
    "fastapi",
    "starlette",
    "uvicorn",
    "aiohttp",
    "aiosqlite",
    "orjson",
    "httptools",
    "rich",
    "pydantic-settings",
    "websockets",
    "prometheus-client",
    "imageio",
    "pillow",
}
# httpx and pydantic, and what they require.
CLIENT_CLOSURE = {
    "task-app-client",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "sniffio",
    "certifi",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-extensions",
    "typing-inspection",
}
INSTALLER = {"pip", "setuptools", "wheel"}
WHEEL_VARIABLE = "TASK_APP_CLIENT_WHEEL"


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()


def _run(*command: str | Path) -> str:
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, f"{command}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


def _wheel(tmp_path: Path) -> Path:
    built = os.environ.get(WHEEL_VARIABLE)
    if built:
        return Path(built)
    source = tmp_path / "client"  # a copy: building writes egg-info and build/ into the source tree
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, source)
    (wheel,) = wheels.glob("task_app_client-*.whl")
    return wheel


def test_ci_tests_the_installed_wheel_not_the_sources() -> None:
    """Under .ci/client the package under test is the wheel in the fresh virtualenv."""
    import task_app_client

    installed = Path(task_app_client.__file__).resolve()
    assert (CLIENT in installed.parents) is not bool(os.environ.get(WHEEL_VARIABLE)), installed


def test_a_fresh_virtualenv_gets_the_client_and_none_of_the_server(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)

    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
        assert "task_app_client/py.typed" in archive.namelist()
    requires = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    required = {_name(re.split(r"[<>=!~;\[ ]", line)[0]) for line in requires if "extra ==" not in line}
    assert required == {"httpx", "pydantic"}, requires

    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)  # this pip installs into it: nothing else there
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check")
    _run(*pip, "install", "--quiet", wheel)
    listed = json.loads(_run(*pip, "list", "--format", "json"))
    installed = {_name(entry["name"]) for entry in listed}
    assert not installed & SERVER_DISTRIBUTIONS
    assert installed - INSTALLER <= CLIENT_CLOSURE, sorted(installed - INSTALLER - CLIENT_CLOSURE)
    assert {"task-app-client", "httpx", "pydantic"} <= installed
    imported = _run(
        python, "-c", "import task_app_client, sys; print(task_app_client.__version__, 'crafter' in sys.modules)"
    )
    assert imported.split() == ["0.1.0", "False"]
