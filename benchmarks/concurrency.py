"""B3 concurrency: many rollouts in flight against a slow model, as an RL trainer runs them.

    N rollouts of D decisions start together; the fake model answers each call after L seconds.
    ideal       N / L decisions per second (every rollout always waiting on the model, zero overhead)
    achieved    decisions executed / wall time from the first request to the last response
    rollout     p50 / p99 of each rollout's wall time (the ideal is D x L)
    loop lag    p99 measured inside the server: a probe task (TASKAPP_LOOP_LAG_PROBE_S=0.005) sleeps
                5 ms in a loop and records how late it wakes; /health exposes cumulative histogram
                counts, and the difference of two reads bounds the p99 (and max) of exactly this
                window. This is the delay every request in flight suffers, without the client in it.
                One sample per wake-up: a single long stall (e.g. N requests arriving at once) is one
                sample, so it shows in the max and in /health below, not in the p99.
    /health     p99 latency of GET /health polled every 50 ms during the window by a process of its own
                (what a load balancer's health check sees: HTTP included)

    RSS peak    the server's resident memory, sampled every 0.25 s during the window
    failed      rollouts that did not answer 200 (every one must)

Worlds: the repeated-seed phases run in groups of 4 rollouts per seed (as GRPO groups do) on seeds
generated before the window, so the window measures the per-decision path at steady state. The
new-seed phases (`_new`) give every rollout a seed the server has never seen, as every eval seed and
every GRPO group's first rollout are: its world is generated inside the window. A phase with
`workers` set runs the server with that many worker threads (`TASKAPP_WORKER_THREADS`); one with
`processes` > 1 serves the app as that many processes on one port (`task-app serve --processes N`, a
sqlite state store): CPU and RSS are summed over them, loop lag is the worst process's. One with
`separate_driver` has the rollouts posted by a process of its own with plain aiohttp
(`benchmarks.rollout_driver`), as a trainer's script would, instead of by this process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio

from task_app.core.stats import percentile

from .client import client, get_json, post_rollout, rollout_body
from .driver import driver
from .processes import Served, app_server, environment, fake_model, health_by_process
from .report import Figure

BENCH = "B3"
GROUP = 4
PROBE_INTERVAL_S = 0.005
HEALTH_POLL_S = 0.05
RSS_SAMPLE_S = 0.25


@dataclass(frozen=True)
class Phase:
    concurrency: int
    decisions: int
    latency_ms: int
    target_ratio: float | None = 0.9
    target_lag_ms: float | None = 20.0
    new_seeds: bool = False  # every rollout on a seed never seen before (else groups of 4 on warm seeds)
    workers: int | None = None  # the server's worker threads (None: the default)
    target_rss_mb: float | None = None
    processes: int = 1  # app processes on the port (`task-app serve --processes N`)
    separate_driver: bool = False  # rollouts posted by a process of its own (`benchmarks.rollout_driver`)

    def __post_init__(self) -> None:
        if self.separate_driver and not self.new_seeds:
            raise ValueError("the driver process takes consecutive seeds: new_seeds only")

    @property
    def tag(self) -> str:
        seeds = "_new" if self.new_seeds else ""
        workers = f"_w{self.workers}" if self.workers is not None else ""
        processes = f"_p{self.processes}" if self.processes > 1 else ""
        driver = "_driver" if self.separate_driver else ""
        return f"{self.concurrency}x{self.decisions}_{self.latency_ms}ms{seeds}{workers}{processes}{driver}"

    def seeds(self, repetition: int, warm: list[int]) -> list[int]:
        """The seed of each rollout of one repetition."""
        if not self.new_seeds:
            return [warm[index // GROUP] for index in range(self.concurrency)]
        first = 10_000_000 + (repetition + 1) * self.concurrency
        return list(range(first, first + self.concurrency))

    @property
    def ideal(self) -> float:
        return self.concurrency / (self.latency_ms / 1000)


def lag_max_ms(before: dict[str, int], after: dict[str, int]) -> float:
    """Upper bound of the highest bucket that gained a sample between two reads (the worst stall)."""
    bounds = list(after)
    counts = [after[bound] - before.get(bound, 0) for bound in bounds]  # cumulative
    for index in range(len(bounds) - 1, 0, -1):
        if counts[index] > counts[index - 1]:
            return float("inf") if bounds[index] == "+Inf" else float(bounds[index])
    return float(bounds[0]) if counts and counts[0] else float("nan")


def lag_p99_ms(before: dict[str, int], after: dict[str, int]) -> float:
    """Upper bound of the bucket holding the 99th percentile of the samples between two reads."""
    bounds = list(after)
    diffs = [after[bound] - before.get(bound, 0) for bound in bounds]  # cumulative counts per bound
    total = diffs[-1]
    if total <= 0:
        return float("nan")
    for bound, count in zip(bounds, diffs, strict=True):
        if count >= 0.99 * total:
            return float("inf") if bound == "+Inf" else float(bound)
    return float("inf")


class _HealthPoller:
    """GET /health every HEALTH_POLL_S from a process of its own (`benchmarks.health_poll`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies_ms: list[float] = []
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> _HealthPoller:
        command = [sys.executable, "-m", "benchmarks.health_poll", self.url, "--interval", str(HEALTH_POLL_S)]
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=environment())
        if self._process.stdout is None or self._process.stdout.readline().strip() != "ready":
            raise RuntimeError("the /health poller did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process is None or self._process.stdout is None:
            return
        self._process.send_signal(signal.SIGINT)
        output = self._process.stdout.read()
        self._process.wait(timeout=30)
        self._process.stdout.close()
        self.latencies_ms = json.loads(output.strip().splitlines()[-1]) if output.strip() else []


def _lag_buckets(health: dict[str, Any]) -> dict[str, int] | None:
    """The probe's histogram, or None from a server without the probe (e.g. an older build)."""
    return (health.get("event_loop") or {}).get("buckets_ms")


async def lag_by_process(url: str, processes: int) -> dict[int, dict[str, int] | None]:
    """Each app process's histogram, by pid."""
    found = await anyio.to_thread.run_sync(health_by_process, url, processes)
    return {pid: _lag_buckets(health) for pid, health in found.items()}


def worst_lag(
    before: dict[int, dict[str, int] | None],
    after: dict[int, dict[str, int] | None],
    of: Callable[[dict[str, int], dict[str, int]], float],
) -> float:
    """`of` (lag_p99_ms or lag_max_ms) of each process's window; the worst process's."""
    values = [of(old, new) for pid, new in after.items() if (old := before.get(pid)) and new]
    return max(values) if values else float("nan")


async def sample_rss(app: Served, peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], app.rss_bytes())
        await anyio.sleep(RSS_SAMPLE_S)


@dataclass
class _Load:
    """What the load generator saw: each rollout's wall time and decisions, failures, its wall and CPU."""

    rollout_s: list[float]
    decisions: int
    failures: list[str]
    wall_s: float
    cpu_s: float


async def _inline(app: Served, phase: Phase, bodies: list[dict[str, Any]], go: Callable[[], None]) -> _Load:
    """The rollouts sent from this process (one pooled aiohttp session)."""
    outcomes, failures = [], []
    async with client(phase.concurrency + 4) as http:
        go()
        cpu, started = time.process_time(), time.perf_counter()
        async with anyio.create_task_group() as group:

            async def one(body: dict[str, Any]) -> None:
                try:
                    outcomes.append(await post_rollout(http, app.url, body))
                except (RuntimeError, aiohttp.ClientError, TimeoutError) as exc:
                    failures.append(repr(exc))

            for body in bodies:
                group.start_soon(one, body)
        wall = time.perf_counter() - started
    walls = [outcome.wall_s for outcome in outcomes]
    return _Load(walls, sum(outcome.decisions for outcome in outcomes), failures, wall, time.process_time() - cpu)


async def _separate(app: Served, model: Served, phase: Phase, seeds: list[int], go: Callable[[], None]) -> _Load:
    """The rollouts sent by `benchmarks.rollout_driver`, a process of its own (seeds consecutive)."""
    args = [app.url, model.url, "--first-seed", str(seeds[0]), "--rollouts", str(len(seeds))]
    args += ["--decisions", str(phase.decisions), "--latency-ms", str(phase.latency_ms)]
    with driver("benchmarks.rollout_driver", args) as load:
        go()
        load.go()
        outcome = await anyio.to_thread.run_sync(load.result)
    return _Load(outcome["rollout_s"], outcome["decisions"], outcome["failures"], outcome["wall_s"], outcome["cpu_s"])


async def _window(app: Served, model: Served, phase: Phase, seeds: list[int]) -> dict[str, Any]:
    bodies = [rollout_body(model.url, seed, phase.decisions, latency_ms=phase.latency_ms) for seed in seeds]
    rss_peak = [app.rss_bytes()]
    with _HealthPoller(app.url) as poller:  # started (a new process) before the clock, not inside it
        before = await lag_by_process(app.url, phase.processes)
        counters: dict[str, float] = {}

        def go() -> None:  # the clock starts: the server's and the model's CPU from here
            counters.update(cpu=app.cpu_s(), model=model.cpu_s())

        async with anyio.create_task_group() as sampler:
            sampler.start_soon(sample_rss, app, rss_peak)
            if phase.separate_driver:
                load = await _separate(app, model, phase, seeds, go)
            else:
                load = await _inline(app, phase, bodies, go)
            sampler.cancel_scope.cancel()
        cpu, model_cpu = app.cpu_s() - counters["cpu"], model.cpu_s() - counters["model"]
        after = await lag_by_process(app.url, phase.processes)
    rollout_s, failures, wall = load.rollout_s, load.failures, load.wall_s
    if failures:
        print(f"{phase.tag}: {len(failures)} failed rollouts, e.g. {failures[0]}", file=sys.stderr)
    elif load.decisions != phase.concurrency * phase.decisions:
        raise RuntimeError(f"{phase.tag}: {load.decisions} ran, expected {phase.concurrency * phase.decisions}")
    health_ms = poller.latencies_ms
    return {
        "failed": float(len(failures)),
        "rss_peak": rss_peak[0] / 2**20,
        "rate": load.decisions / wall,
        "p50": percentile(rollout_s, 50) if rollout_s else float("nan"),
        "p99": percentile(rollout_s, 99) if rollout_s else float("nan"),
        "lag_p99": worst_lag(before, after, lag_p99_ms),
        "lag_max": worst_lag(before, after, lag_max_ms),
        "health_p99": percentile(health_ms, 99) if health_ms else float("nan"),
        "cpu_share": cpu / wall,
        "model_cpu_share": model_cpu / wall,
        "client_cpu_share": load.cpu_s / wall,
    }


async def _warm(app: Served, model_url: str, seeds: list[int]) -> None:
    async with client(8) as http:
        for start in range(0, len(seeds), 64):
            await get_json(http, app.url + "/task_info", params=[("seed", s) for s in seeds[start : start + 64]])
        await post_rollout(http, app.url, rollout_body(model_url, seeds[0], 3))


def _figures(phase: Phase, bench: str) -> dict[str, Figure]:
    seeds = ", new seeds" if phase.new_seeds else ""
    workers = f", {phase.workers} worker thread{'s' if phase.workers != 1 else ''}" if phase.workers else ""
    processes = f", {phase.processes} app processes" if phase.processes > 1 else ""
    driver = ", aiohttp driver process" if phase.separate_driver else ""
    what = (
        f"{phase.concurrency} concurrent, {phase.decisions} decisions, {phase.latency_ms} ms model"
        f"{seeds}{workers}{processes}{driver}"
    )
    ideal_s = phase.decisions * phase.latency_ms / 1000
    ratio_target = None if phase.target_ratio is None else (">=", phase.target_ratio)
    lag_target = None if phase.target_lag_ms is None else ("<=", phase.target_lag_ms)
    rss_target = None if phase.target_rss_mb is None else ("<=", phase.target_rss_mb)
    return {
        "rate": Figure(
            bench, f"decisions_per_s_{phase.tag}", f"decisions/s ({what}; ideal {phase.ideal:g})", "1/s", digits=1
        ),
        "ratio": Figure(bench, f"ratio_to_ideal_{phase.tag}", f"share of ideal ({what})", "", target=ratio_target),
        "p50": Figure(bench, f"rollout_p50_s_{phase.tag}", f"rollout p50 ({what}; ideal {ideal_s:g} s)", "s"),
        "p99": Figure(bench, f"rollout_p99_s_{phase.tag}", f"rollout p99 ({what})", "s"),
        "lag_p99": Figure(
            bench,
            f"loop_lag_p99_ms_{phase.tag}",
            f"event-loop lag p99, in server ({what})",
            "ms",
            target=lag_target,
            digits=1,
        ),
        "lag_max": Figure(
            bench, f"loop_lag_max_ms_{phase.tag}", f"event-loop lag max, in server ({what})", "ms", digits=1
        ),
        "health_p99": Figure(
            bench, f"health_p99_ms_{phase.tag}", f"/health latency p99, separate poller ({what})", "ms", digits=1
        ),
        "cpu_share": Figure(bench, f"server_cpu_cores_{phase.tag}", f"server CPU, cores busy ({what})", "cores"),
        "model_cpu_share": Figure(bench, f"model_cpu_cores_{phase.tag}", f"fake model CPU, cores ({what})", "cores"),
        "client_cpu_share": Figure(bench, f"client_cpu_cores_{phase.tag}", f"client CPU, cores ({what})", "cores"),
        "rss_peak": Figure(
            bench, f"rss_peak_mb_{phase.tag}", f"server RSS peak ({what})", "MB", target=rss_target, digits=0
        ),
        "failed": Figure(bench, f"failed_{phase.tag}", f"failed rollouts ({what})", "", target=("<=", 0.0), digits=0),
    }


def run_phase(phase: Phase, repetitions: int, bench: str = BENCH, **settings: Any) -> list[Figure]:
    figures = _figures(phase, bench)
    warm = [3_000_000 + phase.concurrency * 10 + index for index in range(-(-phase.concurrency // GROUP))]
    if phase.workers is not None:
        settings = {"worker_threads": phase.workers, **settings}
    served = app_server(loop_lag_probe_s=PROBE_INTERVAL_S, processes=phase.processes, **settings)
    with fake_model() as model, served as app:
        anyio.run(_warm, app, model.url, warm)
        for repetition in range(repetitions):
            values = anyio.run(_window, app, model, phase, phase.seeds(repetition, warm))
            values["ratio"] = values["rate"] / phase.ideal
            for key, figure in figures.items():
                figure.values.append(values[key])
    return list(figures.values())


def run(repetitions: int, quick: bool) -> list[Figure]:
    """The targets' phases (repeated seeds; new seeds with 1 and 2 app processes), then two without
    targets that the Modal sizing reads: half the concurrency at 200 ms, and 64 rollouts at a 1 s model
    (docs/performance.md, "Sizing a container")."""
    decisions = 10 if quick else 20
    phases = [
        Phase(64, 20, 200),
        Phase(64, 20, 200, new_seeds=True),
        Phase(64, 20, 200, new_seeds=True, processes=2),
        Phase(256, decisions, 1000),
        Phase(32, 20, 200, target_ratio=None, target_lag_ms=None),
        Phase(64, decisions, 1000, target_ratio=None, target_lag_ms=None),
    ]
    figures: list[Figure] = []
    for phase in phases:
        figures += run_phase(phase, repetitions)
    return figures
