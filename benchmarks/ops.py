"""B7 ops: what a long `ops` list costs the server.

    short     POST /rollout, a one-decision rollout with ops = ["agent", "env"]
    long      the same with ops = ["agent", "env"] * 50000 (the seed's safety.max_ops; a trainer relies on
              the truncation to 2 x max_llm_calls), as aiohttp and requests write it (~0.8 MB)
    objects   ops = [{"type": "agent"}, {"type": "env"}] * 50000 (~1.8 MB; the app runs with a 4 MiB limit)
    in-process  the long body's orjson.loads, RolloutRequest validation and build_plan (the ops check), apart

The three HTTP cases run against one server, alternated request by request; a case's figure is the
server's CPU per request (its own counters, every thread) over a repetition's requests, and the
long/short extra is measured in the same run. One seed (a cached world), zero model latency, tracing on.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import orjson

from task_app.core.contracts import RolloutRequest
from task_app.core.settings import Settings
from task_app.rollout.plan import build_plan

from .client import client, post_rollout, rollout_body
from .processes import Served, app_server, fake_model
from .report import Figure, median_of

BENCH = "B7"
PAIRS = 50_000
BODY_LIMIT = 4 * 1024 * 1024
SEED = 7  # one cached world for every request: the cases differ only in their ops
CASES = {
    "short": ["agent", "env"],
    "long": ["agent", "env"] * PAIRS,
    "objects": [{"type": "agent"}, {"type": "env"}] * PAIRS,
}


async def _cpu_per_request(app: Served, model_url: str, requests: int) -> dict[str, float]:
    """Server CPU ms per request of each case, the cases alternated so load drifts hit them alike."""
    spent = dict.fromkeys(CASES, 0.0)
    async with client(2) as http:
        for _ in range(requests):
            for name, ops in CASES.items():
                body = {**rollout_body(model_url, SEED, 1), "ops": ops}
                before = app.cpu_s()
                outcome = await post_rollout(http, app.url, body)
                spent[name] += app.cpu_s() - before
                if outcome.decisions != 1:
                    raise RuntimeError(f"{name}: {outcome.decisions} decisions, expected 1")
    return {name: total / requests * 1000 for name, total in spent.items()}


def _in_process_ms(rounds: int) -> tuple[float, float, float]:
    """Medians of the three steps a long body takes before any world is built: parse, validate, plan."""
    raw = json.dumps({**rollout_body("http://127.0.0.1:9", 1, 1), "ops": CASES["long"]}).encode()
    settings = Settings(warm_up=False)
    parse, validate, plan = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        data = orjson.loads(raw)
        parsed = time.perf_counter()
        request = RolloutRequest.model_validate(data)
        validated = time.perf_counter()
        build_plan(request, settings)
        planned = time.perf_counter()
        parse.append(parsed - started)
        validate.append(validated - parsed)
        plan.append(planned - validated)
    return median_of(parse) * 1000, median_of(validate) * 1000, median_of(plan) * 1000


def run(repetitions: int, quick: bool) -> list[Figure]:
    requests = 10 if quick else 30
    figures = {
        name: Figure(BENCH, f"{name}_cpu_ms", f"server CPU per one-decision rollout, {name} ops", "ms", digits=2)
        for name in CASES
    }
    extra = Figure(BENCH, "long_extra_cpu_ms", "extra server CPU of 100000 string ops", "ms", digits=2)
    steps = [
        Figure(BENCH, f"long_{step}_ms", f"100000 string ops, in-process: {what}", "ms", digits=2)
        for step, what in (("parse", "orjson.loads"), ("validate", "RolloutRequest"), ("plan", "build_plan"))
    ]
    sizes: dict[str, Any] = {
        name: len(json.dumps({**rollout_body("http://127.0.0.1:9", 1, 1), "ops": ops})) for name, ops in CASES.items()
    }
    with fake_model() as model, app_server(max_body_bytes=BODY_LIMIT) as app:
        anyio.run(_cpu_per_request, app, model.url, 2)  # warm-up: imports, the first worlds
        for _ in range(repetitions):
            per_request = anyio.run(_cpu_per_request, app, model.url, requests)
            for name, value in per_request.items():
                figures[name].values.append(value)
            extra.values.append(per_request["long"] - per_request["short"])
            for figure, value in zip(steps, _in_process_ms(requests), strict=True):
                figure.values.append(value)
    for name, figure in figures.items():
        figure.label += f" ({sizes[name] / 1e6:.2f} MB body)"
    return [*figures.values(), extra, *steps]
