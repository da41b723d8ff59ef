"""The compiled world generator equals crafter's: complete states, RNG included, then 1,000 steps.

Both runs go through `python -m benchmarks.worldgen_check` (the long sweep's code) in a child process,
once with numba and once with NUMBA_DISABLE_JIT=1 (the same generator as plain Python).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e  # every test here starts a server or a child process

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
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return report


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


def test_pure_python_worlds_equal_crafters_for_200_seeds() -> None:
    report = _check("--seeds", "200", "--areas", "9x9,12x10,10x16", "--steps", "1000", "--step-every", "100", jit=False)
    assert report["jit"] is False
    assert report["mismatches"] == []
    assert (report["compared"], report["stepped"]) == (200, 2)
