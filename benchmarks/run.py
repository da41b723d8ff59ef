"""Run the benchmark suite: `python -m benchmarks [--quick] [--only B1,B3] [--repetitions N]`.

    B1 overhead     server CPU per decision vs bare crafter + text observation      (overhead.py)
    B2 start-up     first-decision latency for new / cached seeds, /task_info         (startup.py)
    B3 concurrency  64 x 200 ms (repeated / new seeds), 256 x 1 s: share of ideal, loop lag (concurrency.py)
    B4 memory       RSS idle, per in-flight rollout, after 1000 rollouts              (memory.py)
    B5 payload      response bytes per trace format (+gzip), SQLite bytes per rollout (payload.py)
    B6 sessions     /step CPU and latency (memory, sqlite), rebuilds, WebSocket steps/s, bytes (sessions.py)
    B7 ops          server CPU of a 100000-op request vs a 2-op one; parse + plan in-process  (ops.py)
    B8 density      1024 rollouts in flight, 2 s model, new seeds; 2 processes; an aiohttp driver process  (density.py)
    B9 fleet        the run registry in the state store: calls and CPU per rollout, abort across processes  (fleet.py)
    B10 trainer     1024 env sessions, 2 s think time, 50 steps, defaults, via the client library  (trainer_load.py)
    W  world        crafter resets and steps in-process (`python benchmarks/world.py`, not run here)
    worldgen_check  the generator against crafter's, thousands of seeds (`python -m benchmarks.worldgen_check`)

Every benchmark starts its own app server and fake model as separate processes on 127.0.0.1 and
stops them. Figures are medians over `--repetitions` (default 3; `--quick` shrinks the workloads,
not the repetitions). Prints one table, writes benchmarks/results/<B>.json per benchmark and
benchmarks/results/summary.json (+ summary.md), and, after a full run of every benchmark,
benchmarks/RESULTS.md: the committed page the docs' performance page includes (`--results FILE`
writes that page elsewhere, for any run). Exit status 1 with `--check` when a target is missed.
`--profile DIR` adds a py-spy flame graph (SVG) of each app server (py-spy is in the `dev` extra; it
samples only the GIL holder, so idle waits are left out, and its sampling inflates the figures of
that run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import concurrency, density, fleet, memory, ops, overhead, payload, sessions, startup, trainer_load
from .processes import PROFILE
from .report import RESULTS_DIR, RESULTS_PAGE, Figure, console, markdown, results_page, table, write_json

SUITE: dict[str, tuple[str, Callable[[int, bool], list[Figure]]]] = {
    "B1": ("overhead", overhead.run),
    "B2": ("startup", startup.run),
    "B3": ("concurrency", concurrency.run),
    "B4": ("memory", memory.run),
    "B5": ("payload", payload.run),
    "B6": ("sessions", sessions.run),
    "B7": ("ops", ops.run),
    "B8": ("density", density.run),
    "B9": ("fleet", fleet.run),
    "B10": ("trainer load", trainer_load.run),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description="the task app's benchmark suite")
    parser.add_argument("--quick", action="store_true", help="smaller workloads: a few minutes in all")
    parser.add_argument("--only", default=",".join(SUITE), help="comma-separated benchmarks, e.g. B1,B3")
    parser.add_argument("--repetitions", type=int, default=3, help="repetitions per figure (median reported)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy flame graphs of the app server, in DIR")
    parser.add_argument(
        "--profile-format", choices=("flamegraph", "raw"), default="flamegraph", help="raw: collapsed stacks"
    )
    parser.add_argument(
        "--results", type=Path, default=None, help="write the results page here (default: RESULTS.md after a full run)"
    )
    args = parser.parse_args(argv)
    PROFILE.directory, PROFILE.format = args.profile, args.profile_format
    chosen = [name.strip().upper() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in SUITE]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(SUITE)}")
    out = console()
    figures: list[Figure] = []
    started = time.perf_counter()
    for name in chosen:
        title, run = SUITE[name]
        began = time.perf_counter()
        out.print(f"[bold]{name} {title}[/bold] ...")
        produced = run(max(1, args.repetitions), args.quick)
        elapsed = time.perf_counter() - began
        write_json(name, produced, {"title": title, "quick": args.quick, "elapsed_s": round(elapsed, 1)})
        out.print(table(produced, f"{name} {title} ({elapsed:.0f} s)"))
        figures += produced
    mode = "quick" if args.quick else "full"
    elapsed_s = round(time.perf_counter() - started, 1)
    summary = write_json("summary", figures, {"quick": args.quick, "elapsed_s": elapsed_s})
    (RESULTS_DIR / "summary.md").write_text(markdown(figures) + "\n")
    page = args.results or (RESULTS_PAGE if not args.quick and set(chosen) == set(SUITE) else None)
    if page is not None:
        titles = {name: title for name, (title, _) in SUITE.items()}
        page.write_text(results_page(json.loads(summary.read_text()), titles))
        out.print(f"results page: {page}")
    out.print(table(figures, f"Summary ({mode}, medians of {args.repetitions} repetitions)"))
    out.print(f"results: {RESULTS_DIR}")
    missed = [f"{figure.bench} {figure.label}" for figure in figures if figure.ok is False]
    if missed:
        out.print("[red]targets missed:[/red] " + "; ".join(missed))
    return 1 if (missed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
