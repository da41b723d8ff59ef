"""pyproject.toml declares what the package imports, and imports what it declares.

The imports are every `import` / `from ... import` statement of task_app/ and modal_app.py (an `ast`
walk: function-local and TYPE_CHECKING imports included), by top-level name, the standard library and
the package itself left out; each name is mapped to its distribution by
`importlib.metadata.packages_distributions()`. Each must be a `[project] dependencies` entry, except
`modal`, which only modal_app.py and the modal-dict state store import and which is the `modal` extra
(Modal's containers install it). A declared dependency that nothing imports must be listed in
RUNTIME_ONLY with the reason it is needed.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
SOURCES = [*sorted((ROOT / "task_app").rglob("*.py")), ROOT / "modal_app.py"]
EXTRA_IMPORTS = {"modal": "modal"}  # import name -> the extra that declares it
RUNTIME_ONLY = {"websockets": "uvicorn's WebSocket protocol, which serves OpenEnv's /ws"}


def top_level_imports(source: str) -> set[str]:
    """The top-level names of every absolute import in `source`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
    return names


def third_party_imports() -> set[str]:
    names = set().union(*(top_level_imports(path.read_text(encoding="utf-8")) for path in SOURCES))
    return {name for name in names if name not in sys.stdlib_module_names and name != "task_app"}


def declared(requirements: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(Requirement(line).name): Requirement(line) for line in requirements}


@functools.cache
def _import_names() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()  # a walk of every installed distribution: once


def distributions_of(name: str) -> set[str]:
    return {canonicalize_name(dist) for dist in _import_names().get(name, [])}


def test_every_import_is_declared() -> None:
    dependencies = declared(PYPROJECT["dependencies"])
    extras = {extra: declared(lines) for extra, lines in PYPROJECT["optional-dependencies"].items()}
    undeclared = []
    for name in sorted(third_party_imports()):
        allowed = set(dependencies) | set(extras.get(EXTRA_IMPORTS.get(name, ""), {}))
        found = distributions_of(name)
        if not found & allowed:
            undeclared.append(f"{name} ({', '.join(sorted(found)) or 'no installed distribution'})")
    assert undeclared == []


def test_every_dependency_is_imported_or_documented() -> None:
    imported = set().union(*(distributions_of(name) for name in third_party_imports()))
    unused = sorted(set(declared(PYPROJECT["dependencies"])) - imported - set(RUNTIME_ONLY))
    assert unused == []
    assert not set(RUNTIME_ONLY) & imported  # a runtime-only entry that became an import leaves the list


def test_opensimplex_is_pinned_to_the_installed_version() -> None:
    """The world generator uses a private function of it: the exact version its worlds were checked with."""
    pin = declared(PYPROJECT["dependencies"])["opensimplex"]
    assert str(pin.specifier) == f"=={importlib.metadata.version('opensimplex')}"


def test_the_walk_sees_every_form_of_import() -> None:
    source = (
        "import numpy as np\n"
        "import crafter.constants\n"
        "from PIL import Image\n"
        "from . import sibling\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from yarl import URL\n"
        "def later():\n"
        "    import modal\n"
    )
    assert top_level_imports(source) == {"numpy", "crafter", "PIL", "typing", "yarl", "modal"}
    assert distributions_of("PIL") == {"pillow"}
