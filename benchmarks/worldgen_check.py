"""Equivalence sweep: the compiled world generator against crafter's own, seed by seed.

    python -m benchmarks.worldgen_check [--seeds 2000] [--areas 64x64,48x40] [--steps 1000]
                                        [--step-every 10] [--json]

For every seed and area, one env is reset by crafter (`crafter.Env.reset`, crafter's `worldgen`) and
steps with crafter's own `Env.step` (`CrafterEnv`), one is a `GameEnv` made by
`GameEnv.generate` (the compiled generator) that steps with `GameEnv.step`, and one is that world rebuilt
from what its generation kept (`GameEnv.rebuild`: what a cached seed gets); their complete states must be
equal: the material and object maps, every object with every attribute (and its references to the
world, the world's RNG and the player), the chunk index in its insertion order, the world RNG's full
MT19937 state, the env's counters. Every `--step-every`-th seed is then stepped `--steps` steps with
the same random actions (vitals refilled each step so the walk lasts; the generated env on even
seeds, the rebuilt one on odd ones) and compared every 100 steps and at the end. Run it with
NUMBA_DISABLE_JIT=1 to check the pure-Python path. Exit status 1 on any difference; `--json` prints
the report as one JSON line (the tests read it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, cast

import crafter
import numpy as np

from task_app.game import GameEnv, WorldFactory, warm_up, worldgen

_REFERENCES = ("world", "random", "player")


class CrafterEnv(GameEnv):
    """Crafter's own `Env.step` (GameEnv's lighter step undone), still without the per-step render and
    with the reproducible despawn order."""

    step = crafter.Env.step

    def _balance_chunk(self, chunk: Any, objs: Any) -> None:
        """Crafter's own balancing, with the despawn order GameEnv gives it (its `_balance`)."""
        crafter.Env._balance_chunk(self, chunk, sorted(objs, key=lambda obj: obj.pos.tolist()))


def crafter_env(env: GameEnv) -> CrafterEnv:
    """`env` stepping as stock crafter does (crafter's `Env.step`), still without the render."""
    env.__class__ = CrafterEnv
    return cast(CrafterEnv, env)


COMPARE_EVERY = 100


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _object_state(obj: Any, world: Any, player: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"type": type(obj).__name__, "pos_dtype": str(obj.pos.dtype)}
    for name, value in vars(obj).items():
        if name in _REFERENCES:
            expected = {"world": world, "random": world.random, "player": player}[name]
            state[name] = value is expected
        else:
            state[name] = _plain(value)
    return state


def fingerprint(env: GameEnv) -> dict[str, Any]:
    """The complete state of an env, comparable with `==`."""
    world, player = env._world, env._player
    _, key, pos, has_gauss, cached = world.random.get_state()
    return {
        "materials": world._mat_map.tobytes(),
        "object_map": world._obj_map.tobytes(),
        "objects": [_object_state(obj, world, player) if obj else None for obj in world._objects],
        "chunks": [
            (tuple(int(v) for v in chunk), sorted((int(o.pos[0]), int(o.pos[1])) for o in members))
            for chunk, members in world._chunks.items()
        ],
        "random": (key.tobytes(), int(pos), int(has_gauss), float(cached)),
        "daylight": float(world.daylight),
        "counters": (env._step, env._episode, env._last_health, sorted(env._unlocked)),
    }


def _first_difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    return next((name for name in theirs if ours.get(name) != theirs[name]), "")


def _walk(ours: GameEnv, theirs: GameEnv, steps: int, seed: int) -> str:
    """Step both envs with the same random actions; the first difference found, or ''."""
    actions = np.random.RandomState(seed).randint(0, len(crafter.constants.actions), size=steps)
    for step, action in enumerate(actions.tolist(), start=1):
        for env in (ours, theirs):
            for vital in ("health", "food", "drink", "energy"):
                env._player.inventory[vital] = 9
            env.step(action)
        if step % COMPARE_EVERY == 0 or step == steps:
            difference = _first_difference(fingerprint(ours), fingerprint(theirs))
            if difference:
                return f"step {step}: {difference}"
    return ""


def _parse_areas(text: str) -> list[tuple[int, int]]:
    return [(int(w), int(h)) for w, h in (item.lower().split("x") for item in text.split(","))]


def check(seeds: list[int], areas: list[tuple[int, int]], steps: int, step_every: int) -> dict[str, Any]:
    factory = WorldFactory(cache_size=1)  # each seed generated once, then rebuilt from the cache
    warm_up(factory)
    compared = stepped = 0
    mismatches: list[dict[str, Any]] = []
    started = time.perf_counter()
    for index, seed in enumerate(seeds):
        area = areas[index % len(areas)]
        theirs = crafter_env(factory.blank(area, 10_000))
        theirs._seed = seed
        theirs.reset()
        ours = factory.world(seed, area, 10_000)  # generated
        rebuilt = factory.world(seed, area, 10_000)  # what a cached seed gets
        expected = fingerprint(theirs)
        difference = next(
            (
                f"{label}: {found}"
                for label, env in (("generated", ours), ("rebuilt", rebuilt))
                if (found := _first_difference(fingerprint(env), expected))
            ),
            "",
        )
        compared += 1
        if not difference and steps and index % step_every == 0:
            difference = _walk(rebuilt if index % 2 else ours, theirs, steps, seed)
            stepped += 1
        if difference:
            mismatches.append({"seed": seed, "area": list(area), "difference": difference})
    return {
        "jit": type(worldgen._terrain).__name__ != "function",
        "compared": compared,
        "stepped": stepped,
        "steps": steps,
        "areas": [list(area) for area in areas],
        "mismatches": mismatches,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.worldgen_check", description=__doc__)
    parser.add_argument("--seeds", type=int, default=2000, help="seeds to compare")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--areas", default="64x64,48x40,32x32,16x16,9x9,20x70", help="areas, used in turn")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the stepped seeds")
    parser.add_argument("--step-every", type=int, default=10, help="step every N-th seed (1: all)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    args = parser.parse_args(argv)
    seeds = [args.first_seed + i * 7919 for i in range(args.seeds)]
    report = check(seeds, _parse_areas(args.areas), args.steps, max(1, args.step_every))
    if args.json:
        print(json.dumps(report))
    else:
        mode = "numba" if report["jit"] else "pure Python (NUMBA_DISABLE_JIT)"
        print(
            f"{report['compared']} worlds compared, {report['stepped']} stepped {report['steps']} steps, {mode}, "
            f"{len(report['mismatches'])} different, {report['elapsed_s']} s"
        )
        for mismatch in report["mismatches"][:20]:
            print(f"  seed {mismatch['seed']} area {mismatch['area']}: {mismatch['difference']}")
    return 1 if report["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
