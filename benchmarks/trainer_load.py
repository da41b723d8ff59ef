"""B10 trainer load: env sessions in flight as a trainer's own agent loop keeps them, at the defaults.

    1024 sessions at once in one app process, each on a new seed: create, then 50 times a 2 s think
    time (the model's turn) and one /step, then terminate; driven through the client library
    (`task_app_client.AsyncClient`, no retries) from a process of its own (`benchmarks.session_driver`)

    ideal       sessions / think time steps per second (512/s): every session always thinking
    achieved    steps / wall time from the go to the last session's end (creates and terminates inside)
    stepping    the same share with the create ramp left out: steps x think time / the sessions'
                summed time from their create's answer to their end (1.0: no step waited at all)
    CPU/call    server and client CPU per call (creates, steps, resets, terminates): unlike the
                shares, little moved by other load on the machine
    429s        answers 429 of any kind (too_many_live_envs, too_many_envs, env_rate_limited); none at
                the defaults is the target, so the driver does not retry
    loop lag    p99 and max inside the server over the window (the probe of B3)
    RSS peak    the server's resident memory, sampled every 0.25 s

The server runs with its defaults (only the key, the trace file and the lag probe set), so the
figures say whether the defaults carry a trainer's load: docs/modal.md#sizing-sessions.
"""

from __future__ import annotations

from typing import Any

import anyio

from task_app.core.stats import percentile

from .concurrency import PROBE_INTERVAL_S, lag_by_process, lag_max_ms, lag_p99_ms, sample_rss, worst_lag
from .driver import driver
from .processes import Served, app_server
from .report import Figure

BENCH = "B10"
SESSIONS, STEPS, THINK_S = 1024, 50, 2.0


async def _window(app: Served, sessions: int, steps: int, first_seed: int) -> dict[str, float]:
    args = [app.url, "--first-seed", str(first_seed), "--sessions", str(sessions)]
    args += ["--steps", str(steps), "--think-s", str(THINK_S)]
    rss_peak = [app.rss_bytes()]
    with driver("benchmarks.session_driver", args) as load:
        before = await lag_by_process(app.url, 1)
        cpu = app.cpu_s()
        async with anyio.create_task_group() as sampler:
            sampler.start_soon(sample_rss, app, rss_peak)
            load.go()
            outcome: dict[str, Any] = await anyio.to_thread.run_sync(load.result)
            sampler.cancel_scope.cancel()
        cpu = app.cpu_s() - cpu
        after = await lag_by_process(app.url, 1)
    wall, errors = outcome["wall_s"], outcome["errors"]
    latencies = outcome["step_s"] or [float("nan")]
    return {
        "ratio": outcome["steps"] / wall / (sessions / THINK_S),
        "ratio_stepping": outcome["steps"] * THINK_S / max(outcome["stepping_s"], 1e-9),
        "rate": outcome["steps"] / wall,
        "step_p50": percentile(latencies, 50) * 1000,
        "step_p99": percentile(latencies, 99) * 1000,
        "lag_p99": worst_lag(before, after, lag_p99_ms),
        "lag_max": worst_lag(before, after, lag_max_ms),
        "rejected": float(sum(count for kind, count in errors.items() if kind.startswith("HTTP 429"))),
        "failed": float(sum(count for kind, count in errors.items() if not kind.startswith("HTTP 429"))),
        "rss_peak": rss_peak[0] / 2**20,
        "cpu_share": cpu / wall,
        "client_cpu_share": outcome["cpu_s"] / wall,
        "cpu_per_call": cpu / max(outcome["calls"], 1) * 1000,
        "client_cpu_per_call": outcome["cpu_s"] / max(outcome["calls"], 1) * 1000,
    }


def _figures(sessions: int, steps: int) -> dict[str, Figure]:
    what = f"{sessions} sessions x {steps} steps, {THINK_S:g} s think, new seeds, defaults"
    tag = f"{sessions}x{steps}"

    def figure(key: str, label: str, unit: str, **kwargs: Any) -> Figure:
        return Figure(BENCH, f"{key}_{tag}", f"{label} ({what})", unit, **kwargs)

    return {
        "rate": figure("steps_per_s", f"steps/s (ideal {sessions / THINK_S:g})", "1/s", digits=1),
        "ratio": figure("ratio_to_ideal", "share of ideal", "", target=(">=", 0.95)),
        "ratio_stepping": figure("ratio_to_ideal_stepping", "share of ideal, the create ramp left out", ""),
        "step_p50": figure("step_p50_ms", "/step latency p50, client", "ms", digits=1),
        "step_p99": figure("step_p99_ms", "/step latency p99, client", "ms", digits=1),
        "lag_p99": figure("loop_lag_p99_ms", "event-loop lag p99, in server", "ms", target=("<=", 20.0), digits=1),
        "lag_max": figure("loop_lag_max_ms", "event-loop lag max, in server", "ms", digits=1),
        "rejected": figure("rejected_429", "sessions ended by a 429", "", target=("<=", 0.0), digits=0),
        "failed": figure("failed", "sessions ended by another error", "", target=("<=", 0.0), digits=0),
        "rss_peak": figure("rss_peak_mb", "server RSS peak", "MB", digits=0),
        "cpu_share": figure("server_cpu_cores", "server CPU, cores busy", "cores"),
        "client_cpu_share": figure("client_cpu_cores", "client library CPU, cores", "cores"),
        "cpu_per_call": figure("server_cpu_per_call_ms", "server CPU per call", "ms"),
        "client_cpu_per_call": figure("client_cpu_per_call_ms", "client library CPU per call", "ms"),
    }


def run(repetitions: int, quick: bool) -> list[Figure]:
    sessions, steps = (SESSIONS // 4, STEPS // 5) if quick else (SESSIONS, STEPS)
    figures = _figures(sessions, steps)
    with app_server(loop_lag_probe_s=PROBE_INTERVAL_S) as app:
        for repetition in range(repetitions):
            values = anyio.run(_window, app, sessions, steps, 20_000_000 + repetition * sessions)
            for key, figure in figures.items():
                figure.values.append(values[key])
    return list(figures.values())
