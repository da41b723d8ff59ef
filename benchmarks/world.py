"""World benchmark: what a reset and a decision cost, next to stock crafter.

    python benchmarks/world.py [--repeats 5] [--quick] [--out benchmarks/results/world.json] [--check]

Measures, in one process, each as the median over `--repeats` runs of the per-call median:

- fresh reset    `WorldFactory.generate` (the compiled generator, warmed up first), new seeds every time
- cached reset   `WorldFactory.world` on a seed already in the snapshot cache
- stock reset    `crafter.Env(seed=...).reset()` (crafter's generator, numba compiling its noise), the
                 env constructed before the clock starts, for reference
- fresh, 1 / 2 threads  wall time per world when one or two threads generate new worlds at once: the
                 kernels release the GIL, so the second thread overlaps them with the first
- decision/text  `Game.step` with a one-action plan: the step plus the observation dict and text
- decision/image the same with a 64x64 PNG frame (`image_size=64`)
- bare step      stock `crafter.Env.step` (which renders its 64x64 frame), same seeds and actions

and the ratios stock reset over fresh reset, 1 over 2 threads, and decision/text over bare step. Targets: cached reset
<= 5 ms, fresh reset <= 5 ms, decision/text <= 1.5x bare step. Prints a table and writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from time import perf_counter

import crafter
import numpy as np
from rich.console import Console
from rich.table import Table

from task_app.core.stats import percentile
from task_app.game import ACTIONS, Game, WorldFactory, warm_up
from task_app.game.actions import plan_from_names

AREA = (64, 64)
LENGTH = 10_000
SEGMENT_STEPS = 120  # steps per game before a new one starts (a random walker dies after ~150-250)
DEFAULT_OUT = Path(__file__).parent / "results" / "world.json"
TARGETS = {  # metric -> (limit, unit)
    "cached_reset": (5.0, "ms"),
    "fresh_reset": (5.0, "ms"),
    "decision_over_bare": (1.5, "x"),
}


@dataclass
class Metric:
    name: str
    label: str
    runs: list[list[float]] = field(default_factory=list)  # per repeat, per call, milliseconds

    @property
    def run_medians(self) -> list[float]:
        return [statistics.median(run) for run in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.run_medians)

    def as_dict(self) -> dict[str, object]:
        samples = sorted(value for run in self.runs for value in run)
        return {
            "label": self.label,
            "median_ms": round(self.median, 4),
            "run_medians_ms": [round(value, 4) for value in self.run_medians],
            "p90_ms": round(percentile(samples, 90), 4),
            "calls": len(samples),
            "repeats": len(self.runs),
        }


def _time_each(calls: list[Callable[[], object]]) -> list[float]:
    timings = []
    for fn in calls:
        start = perf_counter()
        fn()
        timings.append((perf_counter() - start) * 1000)
    return timings


def _resets(factory: WorldFactory, fresh_seeds: list[int], cached_seeds: list[int], stock_seeds: list[int]) -> tuple:
    fresh = _time_each([lambda s=s: factory.generate(s, AREA, LENGTH) for s in fresh_seeds])
    cached = _time_each([lambda s=s: factory.world(s, AREA, LENGTH) for s in cached_seeds])
    stock_envs = [crafter.Env(area=AREA, length=LENGTH, seed=s) for s in stock_seeds]
    stock = _time_each([env.reset for env in stock_envs])
    return fresh, cached, stock


def _threaded_fresh(factory: WorldFactory, seeds: list[int], threads: int) -> float:
    """Wall milliseconds per world while `threads` threads generate `seeds` between them."""
    with ThreadPoolExecutor(threads) as pool:
        start = perf_counter()
        list(pool.map(lambda seed: factory.generate(seed, AREA, LENGTH), seeds))
        return (perf_counter() - start) * 1000 / len(seeds)


def _steps(factory: WorldFactory, seed: int, actions: list[int]) -> tuple[list[float], list[float], list[float]]:
    """Per-step milliseconds of stock crafter, our text decision and our image decision on one game."""
    bare_env = crafter.Env(area=AREA, length=LENGTH, seed=seed)
    bare_env.reset()
    text_game = Game(factory.world(seed, AREA, LENGTH))
    image_game = Game(factory.world(seed, AREA, LENGTH), image_size=64)
    plans = [plan_from_names([ACTIONS[action]], 1) for action in actions]
    bare, text, image = [], [], []
    for action, plan in zip(actions, plans, strict=True):
        start = perf_counter()
        bare_env.step(action)
        middle = perf_counter()
        text_game.step(plan)
        end = perf_counter()
        image_game.step(plan)
        done = perf_counter()
        bare.append((middle - start) * 1000)
        text.append((end - middle) * 1000)
        image.append((done - end) * 1000)
        if text_game.done or image_game.done:
            break
    return bare, text, image


def run(repeats: int, quick: bool) -> dict[str, Metric]:
    metrics = {
        "fresh_reset": Metric("fresh_reset", "fresh reset (generate)"),
        "cached_reset": Metric("cached_reset", "cached reset (cache hit)"),
        "stock_reset": Metric("stock_reset", "stock Env(seed).reset()"),
        "fresh_1_thread": Metric("fresh_1_thread", "fresh reset, 1 thread (wall per world)"),
        "fresh_2_threads": Metric("fresh_2_threads", "fresh reset, 2 threads at once (wall per world)"),
        "decision_text": Metric("decision_text", "decision, text obs"),
        "decision_image": Metric("decision_image", "decision, text + 64px PNG"),
        "bare_step": Metric("bare_step", "bare crafter.Env.step"),
    }
    resets, segments = (4, 2) if quick else (12, 6)
    factory = WorldFactory(cache_size=64)
    warm_up(factory)
    factory.generate(0, AREA, LENGTH)  # first full-size world: numba cache loaded, textures resized
    crafter.Env(area=AREA, length=LENGTH, seed=0).reset()
    cached_seeds = [1, 2, 3]
    for seed in cached_seeds:
        factory.world(seed, AREA, LENGTH)
    rng = np.random.RandomState(0)
    for repeat in range(repeats):
        gc.collect()
        base = 10_000 + repeat * 1000
        fresh, cached, stock = _resets(
            factory,
            [base + i for i in range(resets)],
            [cached_seeds[i % len(cached_seeds)] for i in range(resets * 10)],
            [base + 500 + i for i in range(max(3, resets // 2))],
        )
        metrics["fresh_reset"].runs.append(fresh)
        metrics["cached_reset"].runs.append(cached)
        metrics["stock_reset"].runs.append(stock)
        batch = [base + 100 + i for i in range(resets * 4)]
        metrics["fresh_1_thread"].runs.append([_threaded_fresh(factory, batch, 1)])
        metrics["fresh_2_threads"].runs.append([_threaded_fresh(factory, [seed + 50 for seed in batch], 2)])
        bare, text, image = [], [], []
        for segment in range(segments):
            seed = 100 + segment
            factory.world(seed, AREA, LENGTH)  # cache it (not timed here)
            actions = [int(a) for a in rng.randint(0, len(ACTIONS), size=SEGMENT_STEPS)]
            b, t, i = _steps(factory, seed, actions)
            bare += b
            text += t
            image += i
        metrics["bare_step"].runs.append(bare)
        metrics["decision_text"].runs.append(text)
        metrics["decision_image"].runs.append(image)
    return metrics


def _versions() -> dict[str, str]:
    found = {}
    for package in ("crafter", "numba", "numpy", "opensimplex", "pillow"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "missing"
    return found


def report(metrics: dict[str, Metric], out: Path, console: Console) -> dict[str, object]:
    ratio = metrics["decision_text"].median / metrics["bare_step"].median
    speedup = metrics["stock_reset"].median / metrics["fresh_reset"].median
    threads = metrics["fresh_1_thread"].median / metrics["fresh_2_threads"].median
    values = {
        "cached_reset": metrics["cached_reset"].median,
        "fresh_reset": metrics["fresh_reset"].median,
        "decision_over_bare": ratio,
    }
    targets = {
        name: {"limit": limit, "unit": unit, "value": round(values[name], 4), "ok": values[name] <= limit}
        for name, (limit, unit) in TARGETS.items()
    }
    table = Table(title="Crafter worlds and decisions (median of per-run medians)")
    for column, justify in (
        ("measure", "left"),
        ("median ms", "right"),
        ("run medians ms", "right"),
        ("p90 ms", "right"),
        ("calls", "right"),
        ("target", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for name, metric in metrics.items():
        data = metric.as_dict()
        target = targets.get(name)
        verdict = f"<= {target['limit']} {'ok' if target['ok'] else 'MISSED'}" if target else ""
        table.add_row(
            metric.label,
            f"{data['median_ms']:.3f}",
            " ".join(f"{value:.2f}" for value in metric.run_medians),
            f"{data['p90_ms']:.3f}",
            str(data["calls"]),
            verdict,
        )
    target = targets["decision_over_bare"]
    table.add_row("ratio stock reset/fresh reset", f"{speedup:.1f}x", "", "", "", "")
    table.add_row("ratio fresh 1 thread/2 threads", f"{threads:.2f}x", "", "", "", "")
    table.add_row("ratio decision/bare", f"{ratio:.2f}x", "", "", "", f"<= 1.5x {'ok' if target['ok'] else 'MISSED'}")
    console.print(table)
    body: dict[str, object] = {
        "benchmark": "world",
        "created_at": datetime.now(UTC).isoformat(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": _versions(),
        "metrics": {name: metric.as_dict() for name, metric in metrics.items()},
        "ratio_decision_over_bare": round(ratio, 4),
        "ratio_stock_over_fresh_reset": round(speedup, 2),
        "ratio_fresh_1_over_2_threads": round(threads, 3),
        "targets": targets,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(body, indent=2) + "\n")
    temporary.replace(out)
    console.print(f"wrote {out}")
    return body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=5, help="independent runs; the report is their median")
    parser.add_argument("--quick", action="store_true", help="fewer calls per run (a smoke test)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON figures")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    body = report(run(max(1, args.repeats), args.quick), args.out, Console(width=max(120, Console().width)))
    missed = [name for name, target in body["targets"].items() if not target["ok"]]  # type: ignore[attr-defined]
    if missed:
        Console(stderr=True).print(f"[red]targets missed: {', '.join(missed)}[/red]")
    return 1 if (missed and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
