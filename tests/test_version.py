"""The app's version is the package's (pyproject.toml), said in one place: /info, the OpenAPI
document and `task-app --version` all report it."""

from __future__ import annotations

import importlib.metadata
import tomllib

import httpx
import pytest
from support.processes import ROOT
from support.servers import AppServer

from task_app.cli.main import main
from task_app.core import version

PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_the_installed_metadata_is_pyprojects() -> None:
    assert version.app_version() == importlib.metadata.version("task-app") == PYPROJECT_VERSION


@pytest.mark.e2e
def test_info_and_openapi_say_it(app_server: AppServer, client: httpx.Client) -> None:
    assert client.get("/info").json()["service"]["version"] == PYPROJECT_VERSION
    with httpx.Client(base_url=app_server.base_url, trust_env=False) as anonymous:
        assert anonymous.get("/openapi.json").json()["info"]["version"] == PYPROJECT_VERSION


def test_the_cli_says_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"task-app {PYPROJECT_VERSION}"


def test_without_installed_metadata_pyproject_says_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Modal's image carries the source and pyproject.toml, not an installed distribution."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert version.app_version.__wrapped__() == PYPROJECT_VERSION
