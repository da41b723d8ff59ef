"""Drive rollouts against a task app over HTTP, as a trainer does, and report the results.

Used by `task-app demo` (local server, scripted policy) and `task-app eval` (any server, any
OpenAI-compatible model). Two ways to drive them: `run_rollouts` holds one `POST /rollout` open per
rollout (at most `concurrency` at once); `submit_rollouts` (`task-app eval --async`) submits every
rollout with `POST /rollouts`, one group per seed, and polls `GET /runs/{run_id}/result` (at most
`concurrency` polls at once), submitting a run that was lost with its container again.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..game import ACHIEVEMENTS
from ..inspection.eval_stats import MeanSE, mean_se
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
    metrics = body["metrics"]
    details = metrics["details"]
    first = details["episodes"][0] if details.get("episodes") else {}
    row.achievements = list(first.get("achievements", []))
    row.episode_return = float(first.get("return", 0.0))
    row.decisions = int(metrics["num_steps"])
    row.stop_reason = details.get("stop_reason", "")
    row.outcome_score = first.get("outcome_score", metrics.get("outcome_score"))
    row.events_score = first.get("events_score", metrics.get("events_score"))
    steps = body["trajectories"][0]["steps"] if body.get("trajectories") else []
    noops = sum(1 for step in steps if ((step.get("info") or {}).get("meta") or {}).get("fallback_noop"))
    row.rejected_actions = int(details.get("rejected_actions", 0))
    row.proposed_actions = int(details.get("actions_executed", 0)) - noops + row.rejected_actions
    row.response = body
    return row


def _progress(console: Console | None) -> Progress:
    return Progress(
        TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True
    )


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
    progress = _progress(console)
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
                    rows[index] = _failed(request, type(exc).__name__, started)
                progress.advance(task)

        with progress:
            task = progress.add_task("rollouts", total=len(requests))
            async with anyio.create_task_group() as group:
                for index, request in enumerate(requests):
                    group.start_soon(one, index, request)
    return [row for row in rows if row is not None]


MAX_RESUBMITS = 2  # a lost run is submitted again at most this often
POLL_MAX_S = 10.0


class _Submitted:
    """The runs of `submit_rollouts`: submitted by group, each polled until its result is there."""

    def __init__(self, client: httpx.AsyncClient, requests: Sequence[dict[str, Any]], concurrency: int) -> None:
        self.client, self.requests = client, requests
        self.rows: list[EpisodeRow | None] = [None] * len(requests)
        self.limiter = anyio.Semaphore(concurrency)
        self.started = time.perf_counter()

    async def submit(self, indices: list[int]) -> bool:
        try:
            response = await self.client.post("/rollouts", json=[self.requests[index] for index in indices])
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        else:
            if response.status_code == httpx.codes.ACCEPTED:
                return True
            error = _row(0, "", self.started, response).error or f"HTTP {response.status_code}"
        for index in indices:
            self.rows[index] = _failed(self.requests[index], error, self.started)
        return False

    async def collect(self, index: int, deadline: float) -> None:
        request, resubmits = self.requests[index], 0
        while anyio.current_time() < deadline:
            async with self.limiter:
                try:
                    response = await self.client.get(f"/runs/{request['run_id']}/result")
                except httpx.HTTPError as exc:
                    self.rows[index] = _failed(request, type(exc).__name__, self.started)
                    return
            if response.status_code == httpx.codes.ACCEPTED:
                await anyio.sleep(min(POLL_MAX_S, float(response.headers.get("Retry-After", "1"))))
                continue
            if _code(response) == "run_lost" and resubmits < MAX_RESUBMITS:
                resubmits += 1
                if await self.submit([index]):
                    continue
                return
            self.rows[index] = _row(int(request["env"]["seed"]), request["run_id"], self.started, response)
            return
        self.rows[index] = _failed(request, "timed out waiting for the result", self.started)


async def submit_rollouts(
    base_url: str,
    api_key: str,
    requests: Sequence[dict[str, Any]],
    concurrency: int,
    timeout_s: float = 3700.0,
    console: Console | None = None,
) -> list[EpisodeRow]:
    """Submit every request (`POST /rollouts`, the repeats of a seed as one group), then poll each
    result until it is there; rows in request order."""
    groups: dict[int, list[int]] = defaultdict(list)
    for index, request in enumerate(requests):
        groups[int(request["env"]["seed"])].append(index)
    progress = _progress(console)
    deadline = anyio.current_time() + timeout_s
    async with httpx.AsyncClient(base_url=base_url, headers={"X-API-Key": api_key}, timeout=60.0) as client:
        runs = _Submitted(client, requests, concurrency)
        with progress:
            task = progress.add_task("rollouts", total=len(requests))

            async def one(index: int) -> None:
                await runs.collect(index, deadline)
                progress.advance(task)

            submitted = [indices for indices in groups.values() if await runs.submit(indices)]
            async with anyio.create_task_group() as group:
                for index in (index for indices in submitted for index in indices):
                    group.start_soon(one, index)
    return [row for row in runs.rows if row is not None]


def _code(response: httpx.Response) -> str | None:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None


def _failed(request: dict[str, Any], error: str, started: float) -> EpisodeRow:
    seed, run_id = int(request["env"]["seed"]), str(request["run_id"])
    return EpisodeRow(seed=seed, run_id=run_id, error=error, duration_s=time.perf_counter() - started)


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(rows: Sequence[EpisodeRow], console: Console) -> dict[str, float]:
    """Print the per-seed table, achievement success rates and the summary lines."""
    table = Table(title="Rollouts", caption="ach = achievements unlocked; outcome, events = rubric scores")
    for column in ("seed", "ach", "return", "outcome", "events", "steps", "time (s)", "stop"):
        table.add_column(column, justify="right" if column != "stop" else "left")
    for row in rows:
        table.add_row(
            str(row.seed),
            str(len(row.achievements)),
            f"{row.episode_return:.1f}",
            _score(row.outcome_score),
            _score(row.events_score),
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
    scored = [row for row in rows if row.error is None]
    summary = {
        "mean_achievements": mean_achievements(episodes),
        "crafter_score": crafter_score(episodes),
        "outcome_score": mean_se(row.outcome_score for row in scored).mean or 0.0,
        "events_score": mean_se(row.events_score for row in scored).mean or 0.0,
    }
    console.print(f"Mean achievements per episode: {summary['mean_achievements']:.1f}", highlight=False)
    console.print(f"Crafter score: {summary['crafter_score']:.1f}", highlight=False)
    console.print(
        f"Rubric scores (mean per episode): outcome {summary['outcome_score']:.3f}, "
        f"events {summary['events_score']:.3f}",
        highlight=False,
    )
    return summary


def print_eval_summary(summary: dict[str, Any], console: Console) -> None:
    """The figures of `eval_stats.eval_summary`: mean ± SE over seeds, the Crafter score's interval, ..."""
    repeats, seeds = summary["repeats"], summary["seeds"]
    table = Table(title=f"Over {seeds} seed(s), {repeats} rollout(s) each: mean ± standard error over seeds")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, key, digits in (
        ("achievements per episode", "achievements_per_episode", 2),
        ("return", "return", 2),
        ("outcome score (rubric)", "outcome_score", 3),
        ("events score (rubric)", "events_score", 3),
        ("BALROG progression (%)", "balrog_progression", 1),
    ):
        figure = summary[key]
        table.add_row(name, MeanSE(figure["mean"], figure["se"], figure["n"]).text(digits))
    crafter = summary["crafter_score"]
    low, high = crafter["ci95"]
    table.add_row("Crafter score (95% CI, seeds resampled)", f"{crafter['score']:.1f} [{low:.1f}, {high:.1f}]")
    table.add_row("invalid actions", f"{100 * summary['invalid_action_share']:.1f}%")
    console.print(table)
    passes = Table(title="pass@k per achievement")
    passes.add_column("achievement")
    columns = list(next(iter(summary["pass_at_k"].values())))
    for column in columns:
        passes.add_column(column, justify="right")
    for name, values in summary["pass_at_k"].items():
        passes.add_row(name, *("-" if values[column] is None else f"{values[column]:.2f}" for column in columns))
    console.print(passes)
