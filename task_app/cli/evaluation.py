"""Drive rollouts against a task app over HTTP, as a trainer does, and report the results.

Used by `task-app demo` (local server, scripted policy) and `task-app eval` (any server, any
OpenAI-compatible model).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..game import ACHIEVEMENTS
from ..inspection.scoring import EpisodeRow, crafter_score, mean_achievements, success_rates


def parse_seeds(text: str) -> list[int]:
    """`0-7`, `1,5,9` or `0-3,10` → a list of seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            seeds.extend(range(int(low), int(high) + 1))
        else:
            seeds.append(int(part))
    return seeds


def rollout_request(
    run_id: str, seed: int, decisions: int, policy_name: str, policy_config: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "mode": "eval",
        "env": {"env_name": "crafter", "seed": seed, "config": {}},
        "policy": {"policy_name": policy_name, "config": {"max_llm_calls": decisions, **(policy_config or {})}},
        "ops": ["agent", "env"] * decisions,
        "record": {"return_trace": False, "trace_format": "compact"},
        "on_done": "terminate",
    }


def _row(seed: int, run_id: str, started: float, response: httpx.Response) -> EpisodeRow:
    row = EpisodeRow(seed=seed, run_id=run_id, duration_s=time.perf_counter() - started)
    if response.status_code != httpx.codes.OK:
        try:
            row.error = f"{response.status_code}: {response.json()['error']['message']}"
        except (ValueError, KeyError, TypeError):
            row.error = f"HTTP {response.status_code}"
        return row
    body = response.json()
    details = body["metrics"]["details"]
    first = details["episodes"][0] if details.get("episodes") else {}
    row.achievements = list(first.get("achievements", []))
    row.episode_return = float(first.get("return", 0.0))
    row.decisions = int(body["metrics"]["num_steps"])
    row.stop_reason = details.get("stop_reason", "")
    row.response = body
    return row


async def run_rollouts(
    base_url: str,
    api_key: str,
    requests: Sequence[dict[str, Any]],
    concurrency: int,
    timeout_s: float = 3700.0,
    console: Console | None = None,
) -> list[EpisodeRow]:
    """POST every request (at most `concurrency` at once) with a progress bar; rows in request order."""
    rows: list[EpisodeRow | None] = [None] * len(requests)
    limiter = anyio.Semaphore(concurrency)
    headers = {"X-API-Key": api_key}
    progress = Progress(
        TextColumn("rollouts"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=timeout_s, follow_redirects=True
    ) as client:

        async def one(index: int, request: dict[str, Any]) -> None:
            async with limiter:
                started = time.perf_counter()
                seed = int(request["env"]["seed"])
                try:
                    response = await client.post("/rollout", json=request)
                    rows[index] = _row(seed, request["run_id"], started, response)
                except httpx.HTTPError as exc:
                    rows[index] = EpisodeRow(
                        seed=seed,
                        run_id=request["run_id"],
                        error=type(exc).__name__,
                        duration_s=time.perf_counter() - started,
                    )
                progress.advance(task)

        with progress:
            task = progress.add_task("rollouts", total=len(requests))
            async with anyio.create_task_group() as group:
                for index, request in enumerate(requests):
                    group.start_soon(one, index, request)
    return [row for row in rows if row is not None]


def report(rows: Sequence[EpisodeRow], console: Console) -> dict[str, float]:
    """Print the per-seed table, achievement success rates and the two summary lines."""
    table = Table(title="Rollouts")
    for column in ("seed", "achievements", "return", "steps", "time (s)", "stop"):
        table.add_column(column, justify="right" if column != "stop" else "left")
    for row in rows:
        table.add_row(
            str(row.seed),
            str(len(row.achievements)),
            f"{row.episode_return:.1f}",
            str(row.decisions),
            f"{row.duration_s:.2f}",
            row.error or row.stop_reason,
        )
    console.print(table)
    episodes = [row.achievements for row in rows if row.error is None]
    rates = success_rates(episodes)
    rate_table = Table(title="Achievement success rate")
    rate_table.add_column("achievement")
    rate_table.add_column("success", justify="right")
    for name in ACHIEVEMENTS:
        rate_table.add_row(name, f"{rates[name]:.0f}%")
    console.print(rate_table)
    failed = len(rows) - len(episodes)
    if failed:
        console.print(f"[red]{failed} rollout(s) failed[/red]")
    summary = {"mean_achievements": mean_achievements(episodes), "crafter_score": crafter_score(episodes)}
    console.print(f"Mean achievements per episode: {summary['mean_achievements']:.1f}", highlight=False)
    console.print(f"Crafter score: {summary['crafter_score']:.1f}", highlight=False)
    return summary
