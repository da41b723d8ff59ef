"""The compiled world generator equals crafter's: complete states, RNG included, then long walks;
and the worlds are the ones recorded with the pinned opensimplex.

Both runs go through `python -m benchmarks.worldgen_check` (the long sweep's code) in a child process,
once with numba and once with NUMBA_DISABLE_JIT=1 (the same generator as plain Python).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import crafter
import pytest
from support.worlds import world_digest

from task_app.core import json_codec
from task_app.game import WorldFactory

ROOT = Path(__file__).resolve().parent.parent


def _check(*arguments: str, jit: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_DISABLE_JIT", None)
    if not jit:
        env["NUMBA_DISABLE_JIT"] = "1"
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.worldgen_check", "--json", *arguments],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert completed.stdout, completed.stderr
    report: dict[str, Any] = json_codec.loads(completed.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.e2e
def test_compiled_worlds_equal_crafters_for_240_seeds_in_six_areas() -> None:
    report = _check(
        "--seeds",
        "240",
        "--areas",
        "64x64,48x40,32x32,16x16,9x9,20x70",
        "--steps",
        "1000",
        "--step-every",
        "30",
        jit=True,
    )
    assert report["jit"] is True
    assert report["mismatches"] == []
    assert (report["compared"], report["stepped"], report["steps"]) == (240, 8, 1000)


@pytest.mark.e2e
def test_pure_python_worlds_equal_crafters_for_200_seeds() -> None:
    report = _check("--seeds", "200", "--areas", "9x9,12x10,10x16", "--steps", "1000", "--step-every", "100", jit=False)
    assert report["jit"] is False
    assert report["mismatches"] == []
    assert (report["compared"], report["stepped"]) == (200, 2)


# Worlds as crafter 1.8.3 makes them with opensimplex 0.4.5.1 (the pinned versions), by `world_digest`.
# The sweeps above compare the compiled generator with crafter's, and crafter's noise is opensimplex's
# too: a change to opensimplex's noise would change both sides alike. These recorded worlds would not.
RECORDED_WORLDS = [
    (0, (64, 64), "c3a48b1cea05148a"),
    (1, (64, 64), "e842c985d297a9fc"),
    (12345, (48, 40), "c15a0d3bc22bbc9e"),
]


@pytest.mark.parametrize(("seed", "area", "digest"), RECORDED_WORLDS)
def test_worlds_are_the_ones_recorded_with_the_pinned_noise(
    worlds: WorldFactory, seed: int, area: tuple[int, int], digest: str
) -> None:
    stock = crafter.Env(area=area, seed=seed)
    stock.reset()
    assert world_digest(stock)[:16] == digest, "crafter's or opensimplex's worlds changed: see pyproject.toml's pin"
    assert world_digest(worlds.world(seed, area))[:16] == digest
