"""Figures, their targets, the rich table, the JSON files under benchmarks/results/ and RESULTS.md.

A `Figure` holds one value per repetition; the report shows their median (machines are shared and
noisy, so one run proves little) next to every repetition's value and the target. `results_page`
turns a run's summary JSON into benchmarks/RESULTS.md, the committed page the docs include: dated,
the machine described, each figure's median and spread, each target met or missed.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import statistics
import subprocess
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
RESULTS_PAGE = Path(__file__).resolve().parent / "RESULTS.md"
_SYMBOLS = {"<=": "≤", ">=": "≥"}
# The machine's speed, for readers comparing runs: B1's render-free floor, and its value on the run the
# targets were set by (2026-12-03); the absolute figures (CPU per step, shares of a CPU-bound ideal) scale with it.
SPEED_FIGURE = "B1.floor_render_free_cpu_ms_1a"
REFERENCE_FLOOR_MS = 0.386
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
        return median_of(self.values)

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
            "digits": self.digits,
            "median": round(self.median, 6),
            "values": [round(value, 6) for value in self.values],
            "repetitions": len(self.values),
            "target": None if self.target is None else {"op": self.target[0], "limit": self.target[1]},
            "ok": self.ok,
        }


def median_of(values: Sequence[float]) -> float:
    """The median of the values measured: a NaN is a repetition that measured nothing, and
    `statistics.median` would sort it anywhere."""
    measured = _measured(values)
    return statistics.median(measured) if measured else float("nan")


def _measured(values: Sequence[float]) -> list[float]:
    return [value for value in values if value == value]


def environment() -> dict[str, Any]:
    versions = {}
    for package in ("fastapi", "starlette", "uvicorn", "httpx", "pydantic", "orjson", "crafter", "numba", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return {
        "created_at": datetime.now(UTC).isoformat(),
        "commit": _commit(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "memory_gb": round(int((_proc_field("/proc/meminfo", "MemTotal") or "0 kB").split()[0]) / 1024**2, 1),
        "load_average": os.getloadavg(),
        "versions": versions,
    }


def _proc_field(path: str, name: str) -> str | None:
    """The value of the first `name: value` line of a /proc file (None off Linux)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.split(":", 1)[0].strip() == name), None)


def _commit() -> str | None:
    """The checkout's commit, with `-dirty` when it has uncommitted changes (None outside git)."""
    try:
        described = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return described.stdout.strip() or None


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
    """The figures as a markdown table (results/summary.md)."""
    lines = ["| | figure | median | target | |", "|---|---|---:|---:|---|"]
    for figure in figures:
        target = "" if figure.target is None else f"{figure.target[0]} {_fmt(figure.target[1], figure.digits)}"
        verdict = {True: "ok", False: "missed", None: ""}[figure.ok]
        value = f"{_fmt(figure.median, figure.digits)} {figure.unit}".strip()
        lines.append(f"| {figure.bench} | {figure.label} | {value} | {target} | {verdict} |")
    return "\n".join(lines)


def console() -> Console:
    return Console(width=max(140, Console().width))


def results_page(summary: dict[str, Any], titles: dict[str, str]) -> str:
    """benchmarks/RESULTS.md from a run's summary JSON (`write_json("summary", ...)`'s body).

    `titles` names each benchmark ("B1": "overhead"). The spread is the repetitions' range, also as a
    share of the median: a figure that moves by less than its spread between two runs has not moved.
    """
    figures: dict[str, dict[str, Any]] = summary["figures"]
    benches = sorted({key.split(".")[0] for key in figures}, key=lambda name: (len(name), name))
    missed = [f"{key.split('.')[0]} {figure['label']}" for key, figure in figures.items() if figure["ok"] is False]
    judged = [figure for figure in figures.values() if figure["ok"] is not None]
    created = datetime.fromisoformat(summary["created_at"])
    load = ", ".join(f"{value:.1f}" for value in summary["load_average"])
    versions = ", ".join(f"{name} {version}" for name, version in summary["versions"].items())
    # the run's --repetitions: the commonest count (a floor may pool the samples of several phases)
    repetitions = statistics.mode(figure["repetitions"] for figure in figures.values()) if figures else 0
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python -m benchmarks` on {created:%Y-%m-%d %H:%M} UTC:"
        f" a {'quick' if summary['quick'] else 'full'} run of {', '.join(benches)},"
        f" medians of {repetitions} repetitions, {summary['elapsed_s'] / 60:.0f} min,"
        f" code {summary.get('commit') or 'unknown'}.",
        "",
        f"- Machine: {summary.get('cpu_model', 'unknown')}, {summary['cpu_count']} CPUs,"
        f" {summary.get('memory_gb', '?')} GB; load average {load} at the end.",
        f"- Software: Python {summary['python']} on {summary['platform']}; {versions}.",
        *_speed_line(figures),
        f"- Targets: {len(judged) - len(missed)} of {len(judged)} met"
        + (f"; missed: {'; '.join(missed)}." if missed else "."),
        "",
        "The spread is the range of the repetitions (and that range as a share of the median).",
    ]
    for bench in benches:
        lines += ["", f"## {bench} {titles.get(bench, '')}".rstrip(), ""]
        lines += ["| figure | median | spread | target | |", "|---|---:|---:|---:|---|"]
        for key, figure in figures.items():
            if key.split(".")[0] == bench:
                lines.append(_results_row(figure))
    return "\n".join(lines) + "\n"


def _speed_line(figures: dict[str, dict[str, Any]]) -> list[str]:
    floor = figures.get(SPEED_FIGURE)
    if floor is None:
        return []
    median = floor["median"]
    return [
        f"- Speed: B1's render-free floor {median:.3f} ms a step, {median / REFERENCE_FLOOR_MS:.1f}x the"
        f" {REFERENCE_FLOOR_MS} ms of the run the targets were set by: absolute times scale with it."
    ]


def _results_row(figure: dict[str, Any]) -> str:
    values, median, unit = figure["values"], figure["median"], figure["unit"]
    digits = figure.get("digits", 2)
    value = f"{_fmt(median, digits)} {unit}".strip()
    spread = ""
    measured = _measured(values)
    if len(measured) > 1:
        low, high = min(measured), max(measured)
        spread = f"{_fmt(low, digits)}-{_fmt(high, digits)}"
        if median:
            spread += f" ({(high - low) / abs(median):.0%})"
    target = "" if figure["target"] is None else f"{_SYMBOLS[figure['target']['op']]} {figure['target']['limit']:g}"
    verdict = {True: "met", False: "**missed**", None: ""}[figure["ok"]]
    return f"| {figure['label']} | {value} | {spread} | {target} | {verdict} |"
