"""The app's version: the one in pyproject.toml, read from the installed distribution's metadata."""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from pathlib import Path

DISTRIBUTION = "task-app"
_CHECKOUT_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@functools.cache
def app_version() -> str:
    """What `/info` (`service.version`), the OpenAPI document and `task-app --version` report.

    Without installed metadata (Modal's image carries the source and pyproject.toml beside it, not an
    installed distribution) the pyproject.toml next to the package says it."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        project = tomllib.loads(_CHECKOUT_PYPROJECT.read_text(encoding="utf-8"))["project"]
        return str(project["version"])
