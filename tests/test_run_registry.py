"""The run registry across processes (rollout/registry.py, rollout/fleet.py) on every state-store backend:
two or three registries on one store are processes of one fleet, on a clock the test moves.

The HTTP end of the same, with real app processes, is tests/test_run_fleet.py."""

from __future__ import annotations

import pytest
from support.fakes import FakeClock

from task_app.core.errors import CapacityExceeded, Conflict, Gone, NotFound, RateLimited
from task_app.rollout import fleet as fleet_module
from task_app.rollout.control import RunStatus
from task_app.rollout.fleet import FleetRuns, RunLimits
from task_app.rollout.registry import RunEntry, RunRegistry
from task_app.store import StateStore

pytestmark = pytest.mark.anyio

LIMITS = RunLimits(ttl_s=86_400, result_ttl_s=3600, heartbeat_s=2, lost_after_s=30)


def process(store: StateStore, name: str, **options: int) -> RunRegistry:
    """One process of the fleet: its own instance id, the shared store."""
    return RunRegistry(FleetRuns(store, name, LIMITS), options.pop("max_active", 4), **options)


async def run_to_end(
    registry: RunRegistry, run_id: str, body: bytes | None, status: RunStatus = RunStatus.COMPLETED
) -> None:
    entry = await registry.admit(run_id)
    assert isinstance(entry, RunEntry)
    await registry.finish(entry, status, body)


async def test_one_submission_wins_and_the_other_process_sees_it(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    a, b = process(store, "proc-a"), process(store, "proc-b")
    entry = await a.admit("r1")
    assert isinstance(entry, RunEntry) and entry.attempt == 0
    with pytest.raises(Conflict) as running:
        await b.admit("r1")
    assert running.value.code == "run_in_progress" and running.value.retryable
    assert (await b.status("r1")).status is RunStatus.RUNNING  # claimed, its first heartbeat yet to come
    entry.control.progress["decisions"] = 3
    await a.beat()
    assert (await b.status("r1")).progress == {**entry.control.progress}
    await a.finish(entry, RunStatus.COMPLETED, b'{"run_id": "r1"}')
    assert await b.admit("r1") == b'{"run_id": "r1"}'  # byte for byte, no second run
    view = await b.status("r1")
    assert (view.status, view.attempt, view.finished_at is not None) == (RunStatus.COMPLETED, 0, True)
    assert b.active == 0 and a.active == 0


async def test_a_silent_owner_makes_its_run_lost_and_a_resubmission_takes_the_next_attempt(
    backend: tuple[StateStore, FakeClock],
) -> None:
    store, clock = backend
    a, b = process(store, "proc-a"), process(store, "proc-b")
    doomed = await a.admit("r1")
    assert isinstance(doomed, RunEntry)
    await a.beat()
    clock.now += LIMITS.lost_after_s  # exactly the bound: still running
    assert (await b.status("r1")).status is RunStatus.RUNNING
    clock.now += 1  # a's process stopped beating (it died with the run)
    assert (await b.status("r1")).status is RunStatus.LOST
    with pytest.raises(Conflict) as lost:
        await b.result("r1")
    assert lost.value.code == "run_lost" and not lost.value.retryable
    again = await b.admit("r1")
    assert isinstance(again, RunEntry) and again.attempt == 1
    await b.finish(again, RunStatus.COMPLETED, b"second")
    c = process(store, "proc-c")
    assert (await c.status("r1")).attempt == 1
    assert await c.admit("r1") == b"second"


async def test_a_beating_owner_that_no_longer_lists_the_run_lost_it(backend: tuple[StateStore, FakeClock]) -> None:
    """E.g. the end record could not be written: the owner is alive, the run is gone."""
    store, clock = backend
    a, b = process(store, "proc-a"), process(store, "proc-b")
    entry = await a.admit("r1")
    assert isinstance(entry, RunEntry)
    await a.beat()
    a._drop(entry)  # left without an end record
    clock.now += 1
    await a.beat()  # a fresh beat, later than the claim, without the run
    assert (await b.status("r1")).status is RunStatus.LOST


async def test_an_abort_reaches_the_owner_through_its_bell(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    a, b = process(store, "proc-a"), process(store, "proc-b")
    entry, other = await a.admit("r1"), await a.admit("r2")
    assert isinstance(entry, RunEntry) and isinstance(other, RunEntry)
    await a.poll_aborts()  # nothing rung yet
    assert not entry.control.aborted
    assert (await b.abort("r1")).status is RunStatus.RUNNING
    await a.poll_aborts()
    assert entry.control.aborted and not other.control.aborted
    await a.finish(entry, RunStatus.ABORTED, b"partial")
    assert (await b.abort("r1")).status is RunStatus.ABORTED  # idempotent: a finished run as it is


async def test_budgets_forget_responses_by_bytes_and_runs_by_count(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    a = process(store, "proc-a", keep_finished=4, keep_bytes=100)
    b = process(store, "proc-b")
    for run_id, size in (("r1", 40), ("r2", 40), ("r3", 10)):
        await run_to_end(a, run_id, b"x" * size)
    await run_to_end(a, "r4", b"x" * 30)  # 120 bytes: r1's response goes, r1 is still remembered
    with pytest.raises(Conflict) as used:
        await b.admit("r1")
    assert used.value.code == "run_id_used" and not used.value.retryable
    with pytest.raises(Gone) as expired:
        await b.result("r1")
    assert expired.value.code == "result_expired"
    assert await b.admit("r2") == b"x" * 40
    await run_to_end(a, "r5", None, RunStatus.ABORTED)  # five finished > 4: r1 is forgotten altogether
    with pytest.raises(NotFound):
        await b.status("r1")
    fresh = await b.admit("r1")  # a forgotten run_id is free again
    assert isinstance(fresh, RunEntry) and fresh.attempt == 0


async def test_a_run_that_ended_without_a_response_may_run_again(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    a, b = process(store, "proc-a"), process(store, "proc-b")
    entry = await a.admit("r1")
    assert isinstance(entry, RunEntry)
    await a.finish(entry, RunStatus.FAILED, None, {"code": "missing_openai_api_key", "message": "no key"})
    with pytest.raises(Conflict) as failed:
        await b.result("r1")
    assert failed.value.code == "run_failed" and "no key" in failed.value.message
    again = await b.admit("r1")
    assert isinstance(again, RunEntry) and again.attempt == 1


async def test_the_cap_and_the_queue(backend: tuple[StateStore, FakeClock]) -> None:
    store, _ = backend
    a = process(store, "proc-a", max_active=1, max_queued=1)
    held = await a.admit("r1")
    with pytest.raises(CapacityExceeded):
        await a.admit("r2")
    queued = await a.accept("r3")
    assert queued.accepted and queued.entry is not None and queued.view.status is RunStatus.QUEUED
    assert (await a.accept("r3")).accepted is False  # the same run_id again: reported, not run twice
    with pytest.raises(RateLimited) as full:
        await a.accept("r4")
    assert full.value.code == "queue_full"
    assert isinstance(held, RunEntry)
    await a.finish(held, RunStatus.COMPLETED, b"done")
    await a.take_slot(queued.entry)
    assert (a.active, a.queued, queued.entry.status) == (1, 0, RunStatus.RUNNING)


async def test_a_handed_over_run_starts_once_and_sees_an_earlier_abort(backend: tuple[StateStore, FakeClock]) -> None:
    store, clock = backend
    submitter, first, second = process(store, "submitter"), process(store, "exec-1"), process(store, "exec-2")
    accepted = await submitter.accept("r1", request=b'{"run_id": "r1"}')
    assert accepted.accepted and accepted.entry is None and accepted.view.status is RunStatus.QUEUED
    assert await submitter.fleet.request("r1", 0) == b'{"run_id": "r1"}'
    await submitter.fleet.mark_queued("r1", 0)
    clock.now += LIMITS.lost_after_s * 10  # handed over: queued for as long as the platform holds it
    assert (await second.status("r1")).status is RunStatus.QUEUED
    await second.abort("r1")  # before anyone started it: the flag waits for the executor
    entry = await first.take_over("r1", 0)
    assert entry is not None and entry.control.aborted
    assert await second.take_over("r1", 0) is None  # delivered twice: run once
    await first.beat()
    assert (await submitter.status("r1")).status is RunStatus.QUEUED  # listed by its executor, waiting for a slot


async def test_a_hand_over_that_never_happened_is_lost_after_the_bound(backend: tuple[StateStore, FakeClock]) -> None:
    store, clock = backend
    submitter = process(store, "submitter")
    await submitter.accept("r1", request=b"{}")  # the submitter died before handing it over
    clock.now += LIMITS.lost_after_s + 1
    assert (await process(store, "other").status("r1")).status is RunStatus.LOST


async def test_large_responses_are_stored_in_parts(
    backend: tuple[StateStore, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = backend
    monkeypatch.setattr(fleet_module, "PART_BYTES", 1000)
    a, b = process(store, "proc-a"), process(store, "proc-b")
    body = bytes(range(256)) * 10  # 2560 bytes: three parts
    await run_to_end(a, "r1", body)
    assert await b.admit("r1") == body
    assert len(await store.scan("run/r1/0/res/")) == 3
