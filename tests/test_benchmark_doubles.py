"""The benchmarks load the tests' modal.Dict double by path (B6, B9): the path must stay true."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND_TRIP = """
from benchmarks.sessions import modal_dict_double
double = modal_dict_double()(latency_s=0.0)
double.put("k", b"v")
print(double.get("k"))
"""


@pytest.mark.e2e
def test_the_benchmarks_find_the_modal_dict_double() -> None:
    done = subprocess.run([sys.executable, "-c", ROUND_TRIP], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "b'v'"
