"""The event-loop lag probe and its /health report."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import anyio
import pytest
from support.polling import wait_until
from support.servers import AppServer, start_app_server

from task_app.web.loop_lag import BUCKETS_MS, LoopLagProbe

pytestmark = pytest.mark.anyio


def test_snapshot_counts_and_percentiles() -> None:
    """/health's buckets are the prometheus histogram's, in milliseconds."""
    probe = LoopLagProbe(0.01)
    assert probe.snapshot()["recent"]["p99_ms"] is None
    for lag in (0.2, 0.4, 3.0, 40.0, -1.0):
        probe.record(lag)
    snapshot = probe.snapshot()
    assert snapshot["samples"] == 5 and snapshot["max_ms"] == 40.0
    buckets = snapshot["buckets_ms"]
    assert list(buckets) == [f"{bound:g}" for bound in BUCKETS_MS] + ["+Inf"]
    assert buckets["0.5"] == 3 and buckets["3"] == 4 and buckets["50"] == 5 and buckets["+Inf"] == 5  # cumulative
    assert snapshot["recent"] == {"samples": 5, "p50_ms": 0.4, "p99_ms": 40.0, "max_ms": 40.0}


async def test_a_blocked_loop_shows_as_lag() -> None:
    probe = LoopLagProbe(0.005)
    probe.start()
    await anyio.sleep(0.05)
    time.sleep(0.08)  # noqa: ASYNC251 - blocking the event loop is the point, as a crafter step on it would
    await anyio.sleep(0.02)
    await probe.close()
    snapshot = probe.snapshot()
    assert snapshot["max_ms"] >= 60
    assert snapshot["buckets_ms"]["50"] < snapshot["buckets_ms"]["+Inf"]


@pytest.mark.e2e
def test_health_and_metrics_report_the_probe_only_when_enabled(make_app_server: Callable[..., AppServer]) -> None:
    plain = make_app_server(warm_up=False)
    assert "event_loop" not in plain.health()
    assert "taskapp_event_loop_lag_seconds" not in plain.client().get("/metrics").text
    probed = make_app_server(warm_up=False, loop_lag_probe_s=0.005)
    wait_until(lambda: probed.health()["event_loop"]["samples"] > 0, timeout=5.0)
    health = probed.health()["event_loop"]
    assert health["interval_ms"] == 5.0
    exposition = probed.client().get("/metrics").text
    counts = {
        line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("taskapp_event_loop_lag_seconds_bucket{")
    }
    assert list(counts) == [f"{bound / 1000}" for bound in BUCKETS_MS] + ["+Inf"]
    assert counts["+Inf"] >= health["samples"] > 0  # the same histogram, scraped a little later


@pytest.mark.e2e
def test_start_up_objects_are_kept_out_of_full_collections_while_serving(tmp_path: Path) -> None:
    """A full GC pass over start-up's objects would stall every rollout in flight (~110 ms, B3)."""
    with ExitStack() as stack:
        server = start_app_server(stack, tmp_path, warm_up=False)
        assert server.health()["healthy"] is True
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0  # handed back at shutdown
