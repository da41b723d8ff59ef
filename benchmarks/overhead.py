"""B1 overhead: the app server's CPU per decision at zero model latency, against the crafter floor.

    server   rollouts of `decisions` decisions, one at a time, against a zero-latency fake model;
             CPU = the server process's utime + stime over the measured rollouts / decisions executed
    floor    in this process, the same seeds and the same actions (the fake model's are a function of
             the observed step): `Game.observe()` once per episode, then `Game.step(plan)` per decision,
             i.e. crafter executing the actions plus the text observation, nothing else

The ratio server / floor is taken per repetition (both measured back to back) and reported as the
median over repetitions. Worlds are generated once before measuring (B2 measures that cost), so
both sides restore cached worlds. Variants: 1 and 4 actions per decision with tracing on (every
rollout committed to SQLite), and 1 action with tracing off, to show what storage costs.
"""

from __future__ import annotations

import time

from task_app.crafter import Game, WorldFactory
from task_app.crafter.actions import plan_from_names

from .client import rollout_body, run_sync
from .fake_model import bench_actions
from .processes import Served, app_server, fake_model
from .report import Figure

BENCH = "B1"
AREA, LENGTH = (64, 64), 10_000
MAX_ACTIONS = 8


def floor_cpu_s(factory: WorldFactory, seeds: list[int], decisions: int, actions: int) -> tuple[float, int]:
    """CPU seconds of bare `Game.observe` + `Game.step` for the rollouts the server ran, and decisions."""
    spent, executed = 0.0, 0
    for seed in seeds:
        game = Game(factory.world(seed, AREA, LENGTH), decision_limit=decisions)
        start = time.process_time()
        observation = game.observe()
        spent += time.process_time() - start
        for _ in range(decisions):
            if game.done:  # on_done = reset: a new episode on the same seed
                game = Game(factory.world(seed, AREA, LENGTH), decision_limit=decisions)
                start = time.process_time()
                observation = game.observe()
                spent += time.process_time() - start
            step = int(observation.data["num_steps_taken"])
            plan = plan_from_names(bench_actions(step, actions), MAX_ACTIONS)
            start = time.process_time()
            _, observation = game.step(plan)
            spent += time.process_time() - start
            executed += 1
    return spent, executed


def _measure(app: Served, model_url: str, seeds: list[int], decisions: int, actions: int) -> tuple[float, float]:
    """(server CPU ms per decision, wall ms per decision) for one repetition."""
    bodies = [rollout_body(model_url, seed, decisions, actions=actions) for seed in seeds]
    before = app.cpu_s()
    outcomes, wall = run_sync(app.url, bodies, concurrency=1)
    spent = app.cpu_s() - before
    executed = sum(outcome.decisions for outcome in outcomes)
    return spent / executed * 1000, wall / executed * 1000


def run(repetitions: int, quick: bool) -> list[Figure]:
    rollouts, decisions = (4, 50) if quick else (10, 50)
    seeds = [7000 + index for index in range(rollouts)]
    factory = WorldFactory(cache_size=len(seeds) + 1)
    factory.warm_up()
    for seed in seeds:
        factory.world(seed, AREA, LENGTH)
    figures: list[Figure] = []
    with fake_model() as model:
        for tracing in (True, False):
            variants = (1, 4) if tracing else (1,)
            with app_server(tracing_enabled=tracing) as app:
                run_sync(app.url, [rollout_body(model.url, seed, 5, actions=4) for seed in seeds])  # warm up
                for actions in variants:
                    figures += _variant(app, model.url, factory, seeds, decisions, actions, tracing, repetitions)
    return figures


def _variant(
    app: Served, model_url: str, factory: WorldFactory, seeds: list[int], decisions: int, actions: int,
    tracing: bool, repetitions: int,
) -> list[Figure]:  # fmt: skip
    tag = f"{actions}a_{'traced' if tracing else 'untraced'}"
    what = f"{actions} action{'s' if actions > 1 else ''}/decision, tracing {'on' if tracing else 'off'}"
    server = Figure(BENCH, f"server_cpu_ms_{tag}", f"server CPU per decision ({what})", "ms", digits=3)
    floor = Figure(BENCH, f"floor_cpu_ms_{actions}a", f"floor: crafter + text obs ({actions} action(s))", "ms",
                   digits=3)  # fmt: skip
    ratio = Figure(
        BENCH, f"ratio_{tag}", f"ratio server/floor ({what})", "x",
        target=("<=", 2.0) if tracing else None,
    )  # fmt: skip
    wall = Figure(BENCH, f"wall_ms_{tag}", f"wall per decision, trainer view ({what})", "ms", digits=3)
    for _ in range(repetitions):
        server_ms, wall_ms = _measure(app, model_url, seeds, decisions, actions)
        floor_s, executed = floor_cpu_s(factory, seeds, decisions, actions)
        floor_ms = floor_s / executed * 1000
        server.values.append(server_ms)
        floor.values.append(floor_ms)
        ratio.values.append(server_ms / floor_ms)
        wall.values.append(wall_ms)
    return [server, floor, ratio, wall] if tracing else [server, ratio, wall]
