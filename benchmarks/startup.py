"""B2 start-up: how long a trainer waits before a rollout's first decision is back.

    new seed      a one-decision rollout on a seed the server has never seen (world generated)
    cached seed   the same request again on a seed already in the world cache (snapshot restored)
    /task_info    one GET for 10 seeds the server has never seen (each world generated once)

Wall-clock latency at the trainer (HTTP included), zero model latency, tracing on. Each repetition
uses fresh seeds; a repetition's figure is the median of its calls, the report the median of those.
"""

from __future__ import annotations

import time

import anyio

from .client import client, get_json, post_rollout, rollout_body
from .processes import app_server, fake_model
from .report import Figure, median_of

BENCH = "B2"
TASK_INFO_SEEDS = 10


async def _repetition(app_url: str, model_url: str, seeds: list[int], info_seeds: list[int]) -> tuple[float, ...]:
    async with client(4) as http:
        new = [(await post_rollout(http, app_url, rollout_body(model_url, seed, 1))).wall_s for seed in seeds]
        cached = [(await post_rollout(http, app_url, rollout_body(model_url, seed, 1))).wall_s for seed in seeds]
        started = time.perf_counter()
        traits = await get_json(http, app_url + "/task_info", params=[("seed", seed) for seed in info_seeds])
        task_info = time.perf_counter() - started
        if len(traits) != len(info_seeds):
            raise RuntimeError(f"/task_info answered {len(traits)} seeds, asked {len(info_seeds)}")
    return median_of(new) * 1000, median_of(cached) * 1000, task_info * 1000


def run(repetitions: int, quick: bool) -> list[Figure]:
    per_repetition = 4 if quick else 8
    new = Figure(BENCH, "new_seed_ms", "one-decision rollout, new seed", "ms", target=("<=", 15.0), digits=1)
    cached = Figure(BENCH, "cached_seed_ms", "one-decision rollout, cached seed", "ms", target=("<=", 15.0), digits=1)
    info = Figure(BENCH, "task_info_10_new_ms", "/task_info for 10 new seeds", "ms", target=("<=", 1000.0), digits=0)
    with fake_model() as model, app_server() as app:
        anyio.run(_warm_up, app.url, model.url)
        for repetition in range(repetitions):
            base = 2_000_000 + repetition * 1000
            seeds = [base + index for index in range(per_repetition)]
            info_seeds = [base + 500 + index for index in range(TASK_INFO_SEEDS)]
            values = anyio.run(_repetition, app.url, model.url, seeds, info_seeds)
            for figure, value in zip((new, cached, info), values, strict=True):
                figure.values.append(value)
    return [new, cached, info]


async def _warm_up(app_url: str, model_url: str) -> None:
    """One rollout and one /task_info call first: the first request of a process pays for imports."""
    async with client(2) as http:
        await post_rollout(http, app_url, rollout_body(model_url, 1_999_999, 2))
        await get_json(http, app_url + "/task_info", params={"seed": 1_999_998})
