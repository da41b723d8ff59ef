"""The folders are the layers (task_app/__init__.py): no module imports a layer above its own.

Walks every import statement of the package with `ast` (TYPE_CHECKING imports and imports inside
functions included), so a violation fails here whether or not the import runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import task_app

PACKAGE = Path(task_app.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every `import` / `from ... import` of task_app in `module`'s source."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "task_app" or name.startswith("task_app.")]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_lives_in_a_layer() -> None:
    stray = [str(path.relative_to(PACKAGE)) for path in _modules() if _layer(_module_name(path)) not in task_app.LAYERS]
    assert stray == ["__init__.py"]  # the package's own docstring and LAYERS, nothing else at the top


def test_no_module_imports_a_higher_layer() -> None:
    rank = {name: index for index, name in enumerate(task_app.LAYERS)}
    upward: list[str] = []
    for path in _modules():
        here = _layer(_module_name(path))
        if here is None:
            continue
        source = path.read_text(encoding="utf-8")
        for line, target in _imports(source, _module_name(path), is_package=path.name == "__init__.py"):
            there = _layer(target)
            if there is None or rank[there] > rank[here]:
                upward.append(f"{path.relative_to(PACKAGE)}:{line} ({here}) imports {target}")
    assert upward == []


def test_the_walker_resolves_every_form_of_import() -> None:
    """The check above cannot pass by seeing nothing: relative, absolute, TYPE_CHECKING and local imports."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .actions import ACTIONS\n"
        "from .. import LAYERS\n"
        "import task_app.core.settings\n"
        "if TYPE_CHECKING:\n"
        "    from ..web.server import create_app\n"
        "def later():\n"
        "    from ...task_app.cli import main\n"
    )
    assert _imports(source, "task_app.game.worlds")[:4] == [
        (2, "task_app.game.actions"),
        (3, "task_app"),
        (4, "task_app.core.settings"),
        (6, "task_app.web.server"),
    ]
    assert _imports("from .routes import health\n", "task_app.web", is_package=True) == [(1, "task_app.web.routes")]


@pytest.mark.parametrize("layer", task_app.LAYERS)
def test_the_architecture_page_lists_every_module(layer: str) -> None:
    """The module tree of docs/architecture.md names every module of every layer, under its layer's folder."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    tree = re.search(r"## The module tree\n.*?```text\n(.*?)```", text, re.S)
    assert tree is not None
    block = tree.group(1)
    section = re.search(rf"^  {layer}/(.*?)(?=^  \w+/|\Z)", block, re.S | re.M)
    assert section is not None, f"{layer}/ is missing from the architecture page's module tree"
    names = {path.stem for path in (PACKAGE / layer).rglob("*.py") if path.name != "__init__.py"}
    missing = sorted(name for name in names if not re.search(rf"\b{name}\b", section.group(1)))
    assert missing == []
