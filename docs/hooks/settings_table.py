"""MkDocs hook: the configuration page's tables, generated from `task_app.core.settings.Settings`.

A page line `<!-- settings-table -->` becomes one table per section of the class (its `# --- name ---`
comments), one row per field: its environment variable and name, type, default and docstring. A
field without a docstring is a warning, which `mkdocs build --strict` turns into a failed build, so
the page cannot fall behind the class.
"""

from __future__ import annotations

import inspect
import logging
import re
import types
from enum import Enum
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from task_app.core.settings import Settings

MARKER = "<!-- settings-table -->"
SECTION = re.compile(r"^    # --- (.+?) -+$")
FIELD = re.compile(r"^    ([a-z_0-9]+): ")
log = logging.getLogger("mkdocs.plugins.settings_table")

_TYPE_NAMES: dict[Any, str] = {
    int: "integer",
    float: "number",
    bool: "boolean",
    str: "string",
    Path: "path",
    SecretStr: "secret",
}


def sections() -> list[tuple[str, list[str]]]:
    """The class's fields in source order, grouped under its `# --- name ---` comments."""
    grouped: list[tuple[str, list[str]]] = [("general", [])]
    for line in inspect.getsource(Settings).splitlines():
        if match := SECTION.match(line):
            grouped.append((match.group(1), []))
        elif (match := FIELD.match(line)) and match.group(1) in Settings.model_fields:
            grouped[-1][1].append(match.group(1))
    return [(title, names) for title, names in grouped if names]


def variables(name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field is read from, the first one preferred."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str) and choice.isupper()]
    return [f"{Settings.model_config.get('env_prefix', '')}{name}".upper()]


def _type_name(annotation: Any) -> str:
    if annotation in _TYPE_NAMES:
        return _TYPE_NAMES[annotation]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        return " or ".join(_type_name(arg) for arg in kept) + (", optional" if len(kept) < len(args) else "")
    if origin is list:
        return f"comma-separated {_type_name(args[0])}s"
    if origin is tuple:
        return f"{len(args)} comma-separated {_type_name(args[0])}s"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(member.value) for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def type_text(field: FieldInfo) -> str:
    """The field's type with its bounds, e.g. `integer, 1 to 100 000` or `number, > 0`."""
    bounds: dict[str, str] = {}
    for constraint in field.metadata:
        for kind, symbol in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(constraint, getattr(annotated_types, kind.capitalize())):
                bounds[symbol] = _number(getattr(constraint, kind))
    text = _type_name(field.annotation)
    if set(bounds) == {"≥", "≤"}:
        return f"{text}, {bounds['≥']} to {bounds['≤']}"
    return ", ".join([text, *(f"{symbol} {value}" for symbol, value in bounds.items())])


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}".replace(",", "\u202f") if isinstance(value, int) and abs(value) >= 100_000 else str(value)


def default_text(field: FieldInfo) -> str:
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if value is None or value is PydanticUndefined or value == []:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, tuple | list):
        value = ",".join(str(item) for item in value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table() -> str:
    out: list[str] = []
    for title, names in sections():
        out += [f"### {title[:1].upper()}{title[1:]}", "", "| Variable (setting) | Type | Default | Description |"]
        out.append("|---|---|---|---|")
        for name in names:
            field = Settings.model_fields[name]
            if not field.description:
                log.warning("Settings.%s has no docstring: the configuration page cannot describe it", name)
            names = " or ".join(f"`{variable}`" for variable in variables(name, field))
            row = (f"{names}<br>(`{name}`)", type_text(field), default_text(field), _cell(field.description or ""))
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace(MARKER, table()) if MARKER in markdown else markdown
