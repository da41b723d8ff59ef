"""Figures, their targets, the rich table and the JSON files under benchmarks/results/.

A `Figure` holds one value per repetition; the report shows their median (machines are shared and
noisy, so one run proves little) next to every repetition's value and the target.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_COMPARE: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


@dataclass
class Figure:
    bench: str  # "B1" .. "B8"
    name: str  # machine-readable key, unique within its benchmark
    label: str  # what a reader of the table sees
    unit: str
    values: list[float] = field(default_factory=list)  # one per repetition
    target: tuple[str, float] | None = None  # ("<=", 2.0)
    digits: int = 2

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def ok(self) -> bool | None:
        if self.target is None or not self.values:
            return None
        comparison, limit = self.target
        return _COMPARE[comparison](self.median, limit)

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "unit": self.unit,
            "median": round(self.median, 6),
            "values": [round(value, 6) for value in self.values],
            "repetitions": len(self.values),
            "target": None if self.target is None else {"op": self.target[0], "limit": self.target[1]},
            "ok": self.ok,
        }


def median_of(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def environment() -> dict[str, Any]:
    versions = {}
    for package in ("fastapi", "starlette", "uvicorn", "httpx", "pydantic", "orjson", "crafter", "numba", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return {
        "created_at": datetime.now(UTC).isoformat(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "versions": versions,
    }


def _fmt(value: float, digits: int) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:,.{digits}f}"


def table(figures: Sequence[Figure], title: str) -> Table:
    out = Table(title=title)
    for column, justify in (
        ("bench", "left"),
        ("figure", "left"),
        ("median", "right"),
        ("unit", "left"),
        ("repetitions", "right"),
        ("target", "right"),
        ("", "left"),
    ):
        out.add_column(column, justify=justify)  # type: ignore[arg-type]
    for figure in figures:
        target = "" if figure.target is None else f"{figure.target[0]} {_fmt(figure.target[1], figure.digits)}"
        verdict = {True: "[green]ok[/green]", False: "[red]MISSED[/red]", None: ""}[figure.ok]
        out.add_row(
            figure.bench,
            figure.label,
            _fmt(figure.median, figure.digits),
            figure.unit,
            " ".join(_fmt(value, figure.digits) for value in figure.values),
            target,
            verdict,
        )
    return out


def write_json(name: str, figures: Sequence[Figure], extra: dict[str, Any] | None = None) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    body = {
        "benchmark": name,
        **environment(),
        "figures": {f"{figure.bench}.{figure.name}": figure.as_dict() for figure in figures},
        **(extra or {}),
    }
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(body, indent=2) + "\n")
    temporary.replace(path)
    return path


def markdown(figures: Sequence[Figure]) -> str:
    """The figures as a README-ready markdown table."""
    lines = ["| | figure | median | target | |", "|---|---|---:|---:|---|"]
    for figure in figures:
        target = "" if figure.target is None else f"{figure.target[0]} {_fmt(figure.target[1], figure.digits)}"
        verdict = {True: "ok", False: "missed", None: ""}[figure.ok]
        value = f"{_fmt(figure.median, figure.digits)} {figure.unit}".strip()
        lines.append(f"| {figure.bench} | {figure.label} | {value} | {target} | {verdict} |")
    return "\n".join(lines)


def console() -> Console:
    return Console(width=max(140, Console().width))
