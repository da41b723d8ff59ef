"""B1 overhead: the app server's CPU per decision at zero model latency, against the crafter floor.

    server   rollouts of `decisions` decisions, one at a time, against a zero-latency fake model;
             CPU = the server process's utime + stime over the measured rollouts / decisions executed;
             beside it the same for its main thread alone (the event loop: HTTP, policy, trace rows;
             the rest is the worker threads' steps and observations and the trace store's SQLite)
    floors   in this process, the same seeds and the same actions (the fake model's are a function of
             the observed step), CPU of:
             bare         stock `crafter.Env.step` for each action (it renders its 64x64 frame every
                          step, as crafter does) plus our text observation
             render-free  the issue's floor: crafter's own `Env.step` without the frame (the app
                          renders one only when a rollout asks for images), driven by `Game` as the
                          app drives it, plus the app's text observation: the stricter floor. (The
                          app's `GameEnv.step` does the same to the world with less work: no `info`
                          dict, one array operation for the objects' distances; that saving counts for
                          the app, not the floor.)

The ratios server / floor are taken per repetition (all measured back to back) and reported as the
median over repetitions; the target (<= 2.0, 1 action, tracing on) applies to the issue's floor, the
render-free one: the app's own cost per decision against the cheapest crafter there is. Worlds are generated
once before measuring (B2 measures that cost), so both sides restore cached worlds. Variants: 1 and 4
actions per decision with tracing on (every rollout committed to SQLite), and 1 action with tracing
off, to show what storage costs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import crafter

from task_app.game import Game, Observation, WorldFactory, warm_up
from task_app.game.actions import ACTION_IDS, plan_from_names

from .client import rollout_body, run_sync
from .fake_model import bench_actions
from .processes import Served, app_server, fake_model
from .report import Figure
from .worldgen_check import crafter_env

BENCH = "B1"
AREA, LENGTH = (64, 64), 10_000
MAX_ACTIONS = 8


@dataclass
class Floors:
    """CPU seconds of the two floors over the same decisions."""

    bare_s: float = 0.0
    render_free_s: float = 0.0
    decisions: int = 0


def floor_cpu_s(factory: WorldFactory, seeds: list[int], decisions: int, actions: int) -> Floors:
    """Both floors for the rollouts the server ran (see the module docstring)."""
    floors = Floors()
    for seed in seeds:
        game, stock, observation = _episode(factory, seed, decisions, floors)
        for _ in range(decisions):
            if game.done:  # on_done = reset: a new episode on the same seed
                game, stock, observation = _episode(factory, seed, decisions, floors)
            step = int(observation.data["num_steps_taken"])
            plan = plan_from_names(bench_actions(step, actions), MAX_ACTIONS)
            start = time.process_time()
            game.apply(plan)
            applied = time.process_time()
            observation = game.observe()
            observed = time.process_time()
            for action in plan.actions:
                stock.step(ACTION_IDS[action])
            stepped = time.process_time()
            floors.render_free_s += observed - start
            floors.bare_s += (stepped - observed) + (observed - applied)
            floors.decisions += 1
    return floors


def _episode(factory: WorldFactory, seed: int, decisions: int, floors: Floors) -> tuple[Game, crafter.Env, Observation]:
    """A new episode on both sides: our game and stock crafter's env on the same seed; the first
    observation counts on both floors."""
    game = Game(crafter_env(factory.world(seed, AREA, LENGTH)), decision_limit=decisions)
    stock = crafter.Env(area=AREA, length=LENGTH, seed=seed)
    stock.reset()
    start = time.process_time()
    observation = game.observe()
    spent = time.process_time() - start
    floors.bare_s += spent
    floors.render_free_s += spent
    return game, stock, observation


def _measure(app: Served, model_url: str, seeds: list[int], decisions: int, actions: int) -> tuple[float, float, float]:
    """(server CPU, its event loop's CPU, wall), ms per decision, for one repetition."""
    bodies = [rollout_body(model_url, seed, decisions, actions=actions) for seed in seeds]
    before, loop_before = app.cpu_s(), app.loop_cpu_s()
    outcomes, wall = run_sync(app.url, bodies, concurrency=1)
    spent, loop_spent = app.cpu_s() - before, app.loop_cpu_s() - loop_before
    executed = sum(outcome.decisions for outcome in outcomes)
    return spent / executed * 1000, loop_spent / executed * 1000, wall / executed * 1000


def run(repetitions: int, quick: bool) -> list[Figure]:
    rollouts, decisions = (4, 50) if quick else (10, 50)
    seeds = [7000 + index for index in range(rollouts)]
    factory = WorldFactory(cache_size=len(seeds) + 1)
    warm_up(factory)
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
    app: Served,
    model_url: str,
    factory: WorldFactory,
    seeds: list[int],
    decisions: int,
    actions: int,
    tracing: bool,
    repetitions: int,
) -> list[Figure]:
    tag = f"{actions}a_{'traced' if tracing else 'untraced'}"
    what = f"{actions} action{'s' if actions > 1 else ''}/decision, tracing {'on' if tracing else 'off'}"
    server = Figure(BENCH, f"server_cpu_ms_{tag}", f"server CPU per decision ({what})", "ms", digits=3)
    loop = Figure(BENCH, f"loop_cpu_ms_{tag}", f"of which the event loop's thread ({what})", "ms", digits=2)
    bare = Figure(
        BENCH,
        f"floor_bare_cpu_ms_{actions}a",
        f"floor: stock crafter step + text obs ({actions} action{'s' if actions > 1 else ''})",
        "ms",
        digits=3,
    )
    render_free = Figure(
        BENCH,
        f"floor_render_free_cpu_ms_{actions}a",
        f"floor: render-free step + text obs ({actions} action{'s' if actions > 1 else ''})",
        "ms",
        digits=3,
    )
    ratio = Figure(
        BENCH,
        f"ratio_bare_{tag}",
        f"ratio server/stock-crafter floor ({what})",
        "x",
    )
    strict = Figure(
        BENCH,
        f"ratio_render_free_{tag}",
        f"ratio server/render-free floor ({what})",
        "x",
        target=("<=", 2.0) if tracing and actions == 1 else None,
    )
    wall = Figure(BENCH, f"wall_ms_{tag}", f"wall per decision, trainer view ({what})", "ms", digits=3)
    for _ in range(repetitions):
        server_ms, loop_ms, wall_ms = _measure(app, model_url, seeds, decisions, actions)
        floors = floor_cpu_s(factory, seeds, decisions, actions)
        bare_ms = floors.bare_s / floors.decisions * 1000
        render_free_ms = floors.render_free_s / floors.decisions * 1000
        server.values.append(server_ms)
        loop.values.append(loop_ms)
        bare.values.append(bare_ms)
        render_free.values.append(render_free_ms)
        ratio.values.append(server_ms / bare_ms)
        strict.values.append(server_ms / render_free_ms)
        wall.values.append(wall_ms)
    if tracing:
        return [server, loop, bare, render_free, ratio, strict, wall]
    return [server, loop, ratio, strict, wall]
